"""The doctor's gate before ``gaudi-gui train --hosts A,B`` over the real SSH test server (two aliases of
one server). Host B's remote command makes the fake hl-smi a sick 8-card server with another driver:
a held card, ports down on a chosen card (a multi-node run needs them) and the driver differing
between the hosts each refuse the start with exit 2, the reason and the fix, before anything starts;
``--no-preflight`` skips the gate (the hosts' own pre-flight still runs)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.remote import Host, save_hosts
from tests.helpers import free_port, sick_server_env
from tests.remote.conftest import SshHost

HOST_B = "gg-remote-b"


def _job(folder: Path, model: str) -> Path:
    job = JobConfig(model=model, training_args={"output_dir": str(folder / "out"), "max_steps": 1})
    job.launch.main_process_port = free_port()
    path = folder / "job.json"
    job.save(path)
    return path


def _train(job: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(job), "--hosts",
                           f"gg-remote,{HOST_B}", "--main-ip", "127.0.0.1", *extra],
                          capture_output=True, text=True, timeout=240, env=dict(os.environ))
    return done, time.monotonic() - started


def test_train_hosts_refused_by_the_card_gate_and_no_preflight_skips_it(ssh_host: SshHost,
                                                                         tmp_path: Path) -> None:
    env = {**sick_server_env(tmp_path / "sick"), "FAKE_HLSMI_DRIVER": "1.18.0"}
    command = "env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " python3 -m gaudi_gui"
    save_hosts([Host.parse(HOST_B, remote_command=command)])
    job = _job(tmp_path, "builtin:demo")
    done, elapsed = _train(job, "--cards", f"gg-remote=4,5;{HOST_B}=1,6")
    err = done.stderr
    assert done.returncode == 2, done.stdout + err
    assert "preflight refused the start" in err, err
    assert f"{HOST_B}: module 6: held by pid 4242 (python3 train.py)" in err, err
    assert f"{HOST_B}: module 1: ports 2,5 DOWN" in err, err  # an error on a multi-node run
    assert "driver differs: gg-remote 1.12.1" in err and f"{HOST_B} 1.18.0" in err, err
    assert f"{HOST_B}: modules 4 and 5 are healthy and free: use them" in err, err  # the fix
    assert "--no-preflight skips this check" in err and "machine rank" not in done.stdout
    assert "Traceback" not in err
    print(f"train --hosts refused by the gate in {elapsed:.1f} s")

    # --no-preflight: the card gate is not asked; the hosts' own pre-flight still is (a model path
    # missing on the hosts stops it there, before anything starts).
    missing = _job(tmp_path, str(tmp_path / "no-such-model"))
    skipped, _ = _train(missing, "--cards", f"gg-remote=4,5;{HOST_B}=1,6", "--no-preflight")
    assert skipped.returncode == 3, skipped.stdout + skipped.stderr
    assert "no-such-model is not on gg-remote" in skipped.stderr, skipped.stderr
    assert "preflight refused" not in skipped.stderr and "preflight warning" not in skipped.stderr
