"""One decision of the "auto" device (issue 26): the runner, Serve, Evaluate and training agree, even
where habana_frameworks is installed but unusable (Serve said hpu, the runner cpu)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_ASK = """
import json
from gaudi_gui.core import serve, prepare
from gaudi_gui.workers import device
print(json.dumps({"serve": serve.device_here("auto"), "probe": prepare.probe_device(),
                  "worker": device.auto()}))
"""


def _ask(env: dict[str, str]) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-c", _ASK], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_kind_of_job_decides_auto_the_same_way(tmp_path: Path) -> None:
    answers = _ask(dict(os.environ))
    assert set(answers.values()) == {"cpu"}  # no accelerator here


def test_a_habana_install_that_cannot_run_is_the_cpu_for_everyone(tmp_path: Path) -> None:
    """A habana_frameworks that imports but has no working bridge (what a mismatched accelerate or a
    broken install looks like): importable, so a look-up alone said "hpu"."""
    stub = tmp_path / "stub" / "habana_frameworks"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("__version__ = '1.18.0'\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(stub.parent),
                                                                       os.environ.get("PYTHONPATH", "")]))}
    answers = _ask(env)
    assert answers == {"serve": "cpu", "probe": "cpu", "worker": "cpu"}, answers


_COUNT_CHILDREN = """
import json, sys
started = []
sys.addaudithook(lambda event, args: started.append(list(map(str, args[1] or [])))
                 if event == "subprocess.Popen" else None)
from gaudi_gui.core import environment, prepare
print(json.dumps({"cpu_only": environment.cpu_only_install(), "device": prepare.probe_device(),
                  "children": started}))
"""


def _torch_stub(root: Path, cuda: str) -> Path:
    """A torch package's version file as an install of that build has it (nothing else: only read)."""
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text("")
    (root / "torch" / "version.py").write_text(
        "from typing import Optional\n\n__version__ = '2.13.0'\ndebug = False\n"
        f"cuda: Optional[str] = {cuda}\ngit_version = 'x'\nhip: Optional[str] = None\n"
        "rocm: Optional[str] = None\nxpu: Optional[str] = None\n")
    return root


def _children(extra_path: Path | None = None) -> dict[str, object]:
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _COUNT_CHILDREN], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_cpu_only_install_is_the_cpu_without_a_probe_child(tmp_path: Path) -> None:
    """This machine's torch is a CPU build and no habana_frameworks is installed: "auto" is the cpu at
    once (the probe child imports torch and transformers: seconds at every start). A CUDA build of
    torch, or a habana_frameworks that can be found, leaves it to the probe child, which answers for
    the device alone."""
    here = _children()
    assert here == {"cpu_only": True, "device": "cpu", "children": []}, here
    cuda_build = _children(_torch_stub(tmp_path / "cuda", "'12.4'"))
    assert cuda_build["cpu_only"] is False and cuda_build["device"] == "cpu"
    assert cuda_build["children"] == [[sys.executable, "-m", "gaudi_gui.workers.probe", "--device"]]
    cpu_build = _children(_torch_stub(tmp_path / "cpu", "None"))
    assert cpu_build == {"cpu_only": True, "device": "cpu", "children": []}, cpu_build
