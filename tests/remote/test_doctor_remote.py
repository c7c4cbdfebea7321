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
