"""``gaudi-gui hosts --setup``: a host that has no gaudi-gui (or another version) gets this version in a
venv of its own, from a wheel built here and streamed over the app's ssh connection, then answers the
handshake through the venv's python, which is saved as the host's remote command.

The "host" is this machine behind the test SSH server. Its venv is made with --no-deps from the base
Python (tests never reach a package index): the handshake needs nothing beyond the standard library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gaudi_gui import __version__
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.remote import ssh_base
from tests.remote.conftest import SshHost


def gg(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ), check=False)


def base_python() -> str:
    # A plain interpreter with no gaudi-gui on it: what a fresh host has.
    return str(Path(sys.base_prefix) / "bin" / "python3")


def test_setup_installs_this_version_in_a_venv_and_saves_the_host(ssh_host: SshHost, tmp_path: Path) -> None:
    venv = tmp_path / "remote venv $(touch PWNED)"  # a path with a space and a substitution is data
    before = gg("devices", "--host", ssh_host.dest, "--remote-command", f"{base_python()} -m gaudi_gui",
                "--json")
    assert before.returncode == 3 and f"gaudi-gui hosts --setup {ssh_host.dest}" in before.stderr
    assert "Traceback" not in before.stderr

    res = gg("hosts", "--setup", ssh_host.dest, "--venv", str(venv), "--python", base_python(), "--no-deps")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"gaudi-gui {__version__} ready" in res.stdout
    assert "creating" in res.stdout and "Traceback" not in res.stderr
    assert (venv / "bin" / "python").exists() and not (Path.cwd() / "PWNED").exists()
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert list(site.glob(f"gaudi_gui-{__version__}.dist-info"))
    assert (venv / "pyvenv.cfg").read_text().count("include-system-site-packages = true") == 1

    saved = {h["name"]: h for h in json.loads(Path(os.environ["GAUDI_GUI_HOME"], "config",
                                                   "hosts.json").read_text())}
    command = saved[ssh_host.dest]["remote_command"]
    assert command.endswith(" -m gaudi_gui") and str(venv / "bin" / "python") in command

    # The saved remote command is what every later call uses: the handshake answers from the venv.
    hello = gg("hosts", "--host", ssh_host.dest, "--json")
    row = json.loads(hello.stdout)[0]
    assert row["reachable"] and row["gaudi_gui"] == __version__, row
    where = subprocess.run(["ssh", "-F", str(ssh_host.config), ssh_host.dest, f"{command} hello"],
                           capture_output=True, text=True, timeout=60, check=False)
    assert json.loads(where.stdout)["location"].startswith(str(venv)), where.stdout + where.stderr
    # Set up again: the venv is reused, the wheel reinstalled.
    again = gg("hosts", "--setup", ssh_host.dest, "--venv", str(venv), "--python", base_python(), "--no-deps")
    assert again.returncode == 0 and "creating" not in again.stdout, again.stderr
    assert ssh_host.wait_no_processes() == []


def test_setup_refuses_bad_input_with_one_line(ssh_host: SshHost, tmp_path: Path) -> None:
    res = gg("hosts", "--setup", "-oProxyCommand=touch /tmp/x")
    assert res.returncode == 2 and "cannot begin with '-'" in res.stderr and "Traceback" not in res.stderr
    res = gg("hosts", "--setup", "local")
    assert res.returncode == 2 and "make run" in res.stderr
    res = gg("hosts", "--setup", ssh_host.dest, "--remote-command", "docker exec -i box python3 -m gaudi_gui")
    assert res.returncode == 2 and "inside a container" in res.stderr
    # gg-nokey is the same account as gg-remote with a key the server refuses. With gg-remote's
    # multiplexed connection open, it is still refused: a fresh clone once saw it ride on that
    # connection (ssh's %C named both sockets alike) and set up into this machine's real
    # ~/.local/share; --venv in tmp keeps a regression from writing there.
    opened = subprocess.run([*ssh_base(ssh_host.dest), "--", ssh_host.dest, "true"], capture_output=True,
                            text=True, timeout=60, check=False)
    assert opened.returncode == 0, opened.stderr
    res = gg("hosts", "--setup", "gg-nokey", "--no-deps", "--venv", str(tmp_path / "venv"))
    assert res.returncode == 1 and "ssh-copy-id gg-nokey" in res.stderr, (res.stdout, res.stderr)


@pytest.fixture
def host_on_1_18(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's fake hl-smi reports Gaudi software 1.18.0, a row of the compatibility table (set
    before the SSH server starts: the host's programs get the server's environment)."""
    monkeypatch.setenv("FAKE_HLSMI_DRIVER", "1.18.0")


@pytest.mark.usefixtures("demo_model")
def test_a_host_set_up_from_the_wheel_checks_and_trains_with_no_source_tree(
        host_on_1_18: None, ssh_host: SshHost, tmp_path: Path) -> None:
    """The host as `hosts --setup` leaves it: gaudi-gui only from the wheel in the host's venv, run
    from the host's home, far from any source tree. Its doctor finds the compatibility table (the
    wheel's package data) and a 2-step run of the packaged demo data set finishes there.

    The host's venv gets the test venv's libraries (torch, transformers ...) through a `.pth` line, as
    an install with its dependencies would: a plain directory line, so the editable install's own hook
    in that folder is not run and `gaudi_gui` can only come from the wheel."""
    import sysconfig

    venv = tmp_path / "host-venv"
    res = gg("hosts", "--setup", ssh_host.dest, "--venv", str(venv), "--python", base_python(), "--no-deps")
    assert res.returncode == 0, res.stdout + res.stderr
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run(["ssh", "-F", str(ssh_host.config), ssh_host.dest,
                            f"{venv / 'bin' / 'python'} -c 'import gaudi_gui; print(gaudi_gui.__file__)'"],
                           capture_output=True, text=True, timeout=60, check=False)
    assert where.stdout.strip().startswith(str(site)), where.stdout + where.stderr

    doctor = gg("doctor", "--host", ssh_host.dest, timeout=180)
    assert "Traceback" not in doctor.stderr, doctor.stderr[-2000:]
    assert "not in the compatibility table" not in doctor.stdout and "incomplete" not in doctor.stdout, \
        doctor.stdout
    assert "Gaudi software 1.18.0 is in the compatibility table" in doctor.stdout, doctor.stdout

    job = tmp_path / "job.json"
    JobConfig(training_args={"output_dir": str(ssh_host.home / "out"), "max_steps": 2, "logging_steps": 1,
                             "per_device_train_batch_size": 2}).save(job)
    train = gg("train", "--host", ssh_host.dest, "--config", str(job), "--device", "cpu", timeout=300)
    assert train.returncode == 0, (train.stdout + train.stderr)[-3000:]
    (run,) = [p for p in ssh_host.runs_dir.glob("*") if (p / "status.json").exists()]
    status = json.loads((run / "status.json").read_text())
    assert (status["state"], status["step"]) == ("finished", 2), status
    assert ssh_host.wait_no_processes() == []
