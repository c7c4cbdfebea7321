"""Doctor benchmark: ``gaudi-gui doctor --json`` on the fake hl-smi's 8 cards without the smoke test
(goal < 2 s locally), interleaved with its baseline, the bare ``fake hl-smi -q`` call (one process
start of the fake, which is what every doctor run pays at least once); and over SSH (goal < 3 s per
host, hosts in parallel): ``doctor --hosts`` on four hosts against ``doctor --host`` on one,
interleaved. The hosts are aliases of one SSH server on 127.0.0.1 whose PATH holds the fake hl-smi,
so the four hosts' doctors share this machine's cores (on real servers each runs on its own)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import environ, interleaved, row

FAKE_HLSMI = Path(__file__).resolve().parents[1] / "tests" / "fake_hl_smi.py"


def _timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, capture_output=True, env=env, timeout=120, check=False)
    return time.perf_counter() - started


def run(quick: bool = False) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-doctor-") as tmp:
        program = Path(tmp) / "hl-smi"
        program.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_HLSMI} \"$@\"\n")
        program.chmod(0o755)
        env = dict(os.environ, GAUDI_GUI_HOME=tmp)
        doctor = [sys.executable, "-m", "gaudi_gui", "doctor", "--json", "--hl-smi", str(program)]
        bare = [str(program), "-q"]
        result = interleaved(lambda: _timed(doctor, env), lambda: _timed(bare, env),
                             repeats=3 if quick else 7, warmup=1)
        rows = [row("doctor: 8 fake cards, no smoke (baseline: fake hl-smi -q)", result, unit="s",
                    goal="< 2 s")]
        rows += _hosts(Path(tmp), program, repeats=3 if quick else 5)
    return rows


def _hosts(tmp: Path, program: Path, repeats: int) -> list[dict[str, Any]]:
    from bench.bench_remote import ALIAS, ssh_server

    aliases = [ALIAS, *(f"{ALIAS}-{i}" for i in range(2, 5))]
    # The hosts' hl-smi: the fake, first on the PATH the SSH server gives them.
    with environ(PATH=f"{program.parent}{os.pathsep}{os.environ.get('PATH', '')}"), \
            ssh_server(tmp / "ssh", tuple(aliases[1:])):
        host_env = dict(os.environ, GAUDI_GUI_HOME=str(tmp))
        base = [sys.executable, "-m", "gaudi_gui", "doctor", "--json"]
        four = interleaved(lambda: _timed([*base, "--hosts", ",".join(aliases)], host_env),
                           lambda: _timed([*base, "--host", ALIAS], host_env), repeats=repeats, warmup=1)
    return [row("doctor over ssh: 4 hosts in parallel (baseline: 1 host), 8 fake cards each", four,
                unit="s", goal="< 3 s per host; 1 host is the baseline")]


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(r)
