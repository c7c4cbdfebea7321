"""gaudi-gui installed from its wheel, as ``gaudi-gui hosts --setup`` installs it on a host: no source
tree anywhere on ``sys.path``, only what the wheel carries.

The wheel is built by ``host_setup.build_wheel`` (the setup's own step: offline, no build isolation)
and installed with ``pip install --no-deps`` into a fresh venv. Its dependencies (torch,
transformers ...) are this test venv's: a ``.pth`` file in the fresh venv lists this venv's
site-packages (a plain directory line: the editable install's own ``.pth`` hook there is not run,
so ``gaudi_gui`` can only come from the wheel). Then, from an empty working folder: ``doctor`` on the
fake hl-smi finds the compatibility table, the installed package builds the demo model from the corpus
its wheel carries and ``generate --model builtin:demo`` writes text, and a 2-step ``train`` on the
packaged demo dataset finishes. Then, with those data files deleted, each reader says the installation
is incomplete (never an empty table).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from gaudi_gui.core import host_setup, paths
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import RunStore

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel_install")]


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages"))
    assert found, f"no site-packages in {venv}"
    return found[0]


@pytest.fixture
def installed(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """(the fresh venv, the environment to run its gaudi-gui in)."""
    wheel = host_setup.build_wheel(tmp_path / "wheel")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {f"gaudi_gui/resources/{name}" for name in paths.DATA_FILES} <= names, sorted(names)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (_site_packages(venv) / "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, timeout=300,
                   capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    for var, folder in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"),
                        ("XDG_CACHE_HOME", "cache")):
        env[var] = str(tmp_path / "xdg" / folder)
    env["HOME"] = str(tmp_path / "user")
    # Where the installed package builds the demo model (from the corpus its wheel carries).
    env["GAUDI_GUI_DEMO_MODEL_DIR"] = str(tmp_path / "demo-model")
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    return venv, env


def run(venv: Path, cwd: Path, env: dict[str, str], *args: str,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "gaudi-gui"), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def test_the_wheel_carries_its_data(installed: tuple[Path, dict[str, str]], tmp_path: Path,
                                    fake_hl_smi: Path) -> None:
    venv, env = installed
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import gaudi_gui, json, sys; print(json.dumps([gaudi_gui.__file__, sys.path]))"],
                           capture_output=True, text=True, timeout=60, env=env, cwd=work, check=True)
    package_file, search_path = json.loads(where.stdout)
    assert Path(package_file).is_relative_to(venv), where.stdout
    # No other gaudi_gui anywhere on the path (the source tree, an editable install's mapping).
    others = [e for e in search_path if (Path(e or work) / "gaudi_gui").exists()]
    assert others == [str(_site_packages(venv))], search_path

    # doctor on the fake hl-smi (the recorded 1.18.0 server): the table is found, its row checked.
    env = dict(env, PATH=f"{fake_hl_smi.parent}{os.pathsep}{env['PATH']}", FAKE_HLSMI_DRIVER="1.18.0")
    doctor = run(venv, work, env, "doctor", timeout=120)
    assert "Traceback" not in doctor.stderr, doctor.stderr[-2000:]
    assert "not in the compatibility table" not in doctor.stdout, doctor.stdout
    assert "Gaudi software 1.18.0 is in the compatibility table" in doctor.stdout, doctor.stdout

    # The installed package builds the demo model from the corpus its wheel carries (30 pre-training
    # steps as in conftest's tiny model, not the default 300: this test is not about the model).
    built = subprocess.run([str(venv / "bin" / "python"), "-m", "gaudi_gui.workers.demo",
                            env["GAUDI_GUI_DEMO_MODEL_DIR"], "--steps", "30"], capture_output=True,
                           text=True, timeout=300, env=env, cwd=work)
    assert built.returncode == 0, built.stderr[-2000:]
    generate = run(venv, work, env, "generate", "--model", "builtin:demo", "--prompt", "The learning rate",
                   "--max-new-tokens", "8")
    assert generate.returncode == 0, generate.stderr[-2000:]
    assert generate.stdout.strip(), generate.stderr[-2000:]

    job = JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 2,
                                   "per_device_train_batch_size": 2, "logging_steps": 1})
    assert paths.is_demo(job.model) and paths.is_demo(job.dataset.source)  # the packaged demo data
    job.save(tmp_path / "job.json")
    train = run(venv, work, env, "train", "--config", str(tmp_path / "job.json"), "--runs-dir",
                str(tmp_path / "runs"), "--device", "cpu")
    assert train.returncode == 0, train.stderr[-3000:]
    (folder,) = [r.folder for r in RunStore(tmp_path / "runs").runs()]
    status = json.loads((folder / "status.json").read_text())
    assert (status["state"], status["step"]) == ("finished", 2), status

    # The same installation without its data: each reader says so, none goes on with an empty table.
    resources = Path(package_file).parent / "resources"
    (resources / "gaudi-compat.json").unlink()
    (resources / "demo" / "corpus.txt").unlink()
    doctor = run(venv, work, env, "doctor", timeout=120)
    assert "gaudi-compat.json is missing" in doctor.stdout and "incomplete" in doctor.stdout, doctor.stdout
    assert "not in the compatibility table" not in doctor.stdout, doctor.stdout
    env["GAUDI_GUI_DEMO_MODEL_DIR"] = str(tmp_path / "demo-model-unbuilt")
    generate = run(venv, work, env, "generate", "--model", "builtin:demo", "--prompt", "x")
    assert generate.returncode != 0
    assert "demo/corpus.txt is missing" in generate.stderr and "incomplete" in generate.stderr, \
        generate.stderr[-2000:]
