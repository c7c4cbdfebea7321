"""``gaudi-gui doctor --hosts A,B`` over the real SSH test server: both hosts answer in parallel, the one
whose remote command runs another driver version (the fake hl-smi's FAKE_HLSMI_DRIVER) makes a
"hosts.versions" error, and a host that refuses the key is an unreachable host named in the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gaudi_gui.core.remote import Host, save_hosts
from tests.remote.conftest import SshHost

HOST_B = "gg-remote-b"  # the fixture's second alias of the same server


def test_two_hosts_other_driver_and_one_unreachable(ssh_host: SshHost) -> None:
    save_hosts([Host.parse(HOST_B, remote_command="env FAKE_HLSMI_DRIVER=1.18.0 python3 -m gaudi_gui")])
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "doctor", "--json", "--timeout", "60",
                           "--hosts", f"{ssh_host.dest},{HOST_B},gg-nokey"], capture_output=True,
                          text=True, timeout=180, env=dict(os.environ))
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    by = {h["host"]: h for h in report["hosts"]}
    assert by[ssh_host.dest]["reachable"] and by[HOST_B]["reachable"]
    assert by[ssh_host.dest]["versions"]["driver"].startswith("1.12.1")
    assert by[HOST_B]["versions"]["driver"].startswith("1.18.0")
    assert all(f["host"] == HOST_B for f in by[HOST_B]["findings"])
    assert not by["gg-nokey"]["reachable"] and by["gg-nokey"]["error"]
    drivers = [f for f in report["cross_host"] if f["check"] == "hosts.versions" and "driver" in f["seen"]]
    assert drivers and drivers[0]["severity"] == "error"
    assert "1.12.1" in drivers[0]["seen"] and "1.18.0" in drivers[0]["seen"]
    print(f"doctor on 3 hosts over ssh: {elapsed:.2f} s")


def test_one_host_human_output(ssh_host: SshHost) -> None:
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "doctor", "--host", ssh_host.dest],
                          capture_output=True, text=True, timeout=180, env=dict(os.environ))
    assert done.returncode == 1  # no /dev/accel nodes here for the fake's 8 cards
    assert f"{ssh_host.dest} module 0" in done.stdout and "stack.devices" in done.stdout
    assert "Traceback" not in done.stderr


def test_report_for_a_host_is_made_on_that_host(ssh_host: SshHost, tmp_path: Path) -> None:
    import tarfile
    save_hosts([Host.parse(HOST_B, remote_command="env FAKE_HLSMI_DRIVER=1.18.0 python3 -m gaudi_gui")])
    out = tmp_path / "report.tar.gz"
    argv = [sys.executable, "-m", "gaudi_gui", "doctor", "--host", HOST_B, "--report", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=dict(os.environ))
    assert done.returncode in (0, 1) and out.exists(), done.stderr
    with tarfile.open(out) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()  # type: ignore[union-attr]
                 for m in tar.getmembers()}
    assert {"findings.json", f"{HOST_B}/hl-smi-q.txt", f"{HOST_B}/kernel.txt", f"{HOST_B}/runs.txt",
            f"{HOST_B}/versions.json"} <= set(files), sorted(files)
    assert "1.18.0" in files[f"{HOST_B}/hl-smi-q.txt"]  # the host's own hl-smi, not this machine's


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=180, env=dict(os.environ))


def _gaudi_host_without_hl_smi_on_path(tmp_path: Path) -> tuple[str, Path]:
    """(remote command, hl-smi path) of a sick fake 8-card host (tests/helpers.sick_server_env: its
    /sys, /proc and /dev) whose PATH has no hl-smi: the fake is installed elsewhere."""
    from tests.helpers import sick_server_env
    program = tmp_path / "opt-habana" / "bin" / "hl-smi"
    program.parent.mkdir(parents=True)
    fake = Path(__file__).resolve().parents[1] / "fake_hl_smi.py"
    program.write_text(f"#!/bin/sh\nexec {sys.executable} {fake} \"$@\"\n")
    program.chmod(0o755)
    env = sick_server_env(tmp_path / "host")
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    settings = " ".join(f"{k}={v}" for k, v in {**env, "PATH": path}.items())
    return f"env {settings} {Path(sys.executable).parent / 'python3'} -m gaudi_gui", program


def test_a_saved_hosts_hl_smi_path_is_what_doctor_and_devices_use(ssh_host: SshHost, tmp_path: Path) -> None:
    """Item 3: a sick Gaudi host saved with ``hosts --add … --hl-smi PATH``, hl-smi not on its PATH.
    ``doctor --host`` said "no hl-smi: fine on a CPU" (exit 0), ``devices --host`` "hl-smi is not
    installed"; every view of the host now runs the saved hl-smi and the doctor names the sick cards."""
    command, program = _gaudi_host_without_hl_smi_on_path(tmp_path)
    added = _cli("hosts", "--add", HOST_B, "--remote-command", command, "--hl-smi", str(program))
    assert added.returncode == 0, added.stderr
    for args in (["--host", HOST_B], ["--hosts", HOST_B]):
        done = _cli("doctor", *args)
        assert done.returncode == 1, done.stdout + done.stderr
        out = done.stdout
        assert f"{HOST_B} module 1" in out and "2,5 DOWN" in out, out  # sick cards named by the host
        assert f"{HOST_B} module 2" in out and "ECC 2" in out
        assert "fine on a CPU" not in out and "no Gaudi cards" not in out
    devices = _cli("devices", "--json", "--host", HOST_B)
    assert devices.returncode == 0, devices.stderr
    assert "not installed" not in devices.stderr
    cards = json.loads(devices.stdout)
    assert [c["kind"] for c in cards] == ["hpu"] * 8


def test_doctor_host_takes_an_explicit_hl_smi_and_a_host_without_one_is_an_error(
        ssh_host: SshHost, tmp_path: Path) -> None:
    """The same host saved without a path: ``doctor --host H --hl-smi PATH`` runs that hl-smi there;
    without it, the host's /dev/accel nodes and loaded driver make the missing hl-smi an error."""
    command, program = _gaudi_host_without_hl_smi_on_path(tmp_path)
    save_hosts([Host.parse(HOST_B, remote_command=command)])
    named = _cli("doctor", "--json", "--host", HOST_B, "--hl-smi", str(program))
    assert named.returncode == 1, named.stderr
    (host,) = json.loads(named.stdout)["hosts"]
    bad = {(f["module_id"], f["check"]) for f in host["findings"] if f["severity"] == "error"}
    assert {(1, "net.ports"), (2, "card.ecc"), (3, "card.init")} <= bad and len(host["cards"]) == 8
    missing = _cli("doctor", "--host", HOST_B)
    assert missing.returncode == 1, missing.stdout + missing.stderr
    (line,) = [ln for ln in missing.stdout.splitlines() if "stack.hl-smi" in ln]
    assert line.startswith("ERROR") and "no hl-smi, but 8 /dev/accel nodes" in line
    assert "the habanalabs driver is loaded" in line and "fine on a CPU" not in missing.stdout
