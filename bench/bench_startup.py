"""Start-up: time from launching ``gaudi-gui`` to its first painted window, and the GUI process's RSS,
each against a bare PySide6 window started the same way, in interleaved repeats (bench/harness.py).

Both sides run bench/drive.py, which installs its own event filter on the QApplication (the product
has no benchmark hooks) and prints a JSON line at the first paint and when the app's tabs are built.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness import interleaved_metrics, row  # noqa: E402

DRIVE = Path(__file__).resolve().parent / "drive.py"


def measure(mode: str, env: dict[str, str]) -> dict[str, float]:
    """Seconds from launch (seen from this parent) to first paint and to ready, and RSS at ready."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(DRIVE), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env, cwd=str(ROOT))
    assert proc.stdout is not None
    out: dict[str, float] = {}
    for line in proc.stdout:
        if not line.startswith("{"):
            continue
        report = json.loads(line)
        if report["event"] == "first_paint":
            out["first_paint_s"] = time.perf_counter() - start
        elif report["event"] == "ready":
            out["ready_s"] = time.perf_counter() - start
            out["rss_mib"] = report["rss_bytes"] / 2**20
            out["torch"] = float(bool(report.get("torch_loaded") or report.get("transformers_loaded")))
            break
    proc.stdout.close()
    proc.wait(timeout=60)
    if "ready_s" not in out:
        raise RuntimeError(f"bench/drive.py {mode} reported no ready event (exit {proc.returncode})")
    return out


def compiled() -> None:
    """Byte-compile the package, as ``pip install`` does for every user: a process with
    ``PYTHONDONTWRITEBYTECODE`` set (some CI and sandbox images) never writes ``__pycache__``, and
    every start would then compile each module it imports, a cost the bare window (PySide6 is
    installed compiled) never pays and no installed gaudi-gui has."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "gaudi_gui")], check=True,
                   stdout=subprocess.DEVNULL)


def run(quick: bool = False) -> list[dict[str, Any]]:
    repeats = 5 if quick else 11
    compiled()
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, QT_QPA_PLATFORM=os.environ.get("QT_QPA_PLATFORM", "offscreen"),
                   GAUDI_GUI_HOME=home, PYTHONPATH=str(ROOT))
        env.pop("GAUDI_GUI_HL_SMI", None)
        result = interleaved_metrics(lambda: measure("app", env), lambda: measure("bare", env),
                                     repeats, warmup=1)
    if any(s["app"] for s in result["torch"]["samples"]):
        raise AssertionError("the GUI process imported torch or transformers")
    return [
        row("startup: launch to first painted window", result["first_paint_s"], unit="ms", scale=1000,
            goal="ratio <= 1.3"),
        row("startup: launch to every tab built", result["ready_s"], unit="ms", scale=1000,
            goal="(report)"),
        row("startup: GUI process RSS, all tabs built", result["rss_mib"], unit="MiB", goal="(report)"),
        {"name": "startup: torch in the GUI process", "value": 0.0, "unit": "modules",
         "baseline": None, "ratio": None, "goal": "0 (asserted)"},
    ]


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(r)
