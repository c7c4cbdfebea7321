"""``python bench/stall_profile.py devices|hosts [--health] [--seconds N] [--over MS]``: where the
window's thread spends the worst gaps of the stall benches (bench_devices' ``worst_stall``, bench_hosts'
app run with its 4 hosts over the tests' sshd).

A thread samples every thread's Python stack each millisecond (``sys._current_frames``) while the
bench's 1 ms probe timer runs; every gap of the probe longer than ``--over`` ms is then printed with
the window thread's most frequent frames inside it (project and pyqtgraph frames first) and what the
other threads were doing, so a stall reads as "this slot" or "waiting for the GIL another thread held".
Each gap also says how the window's thread spent it, from its own counters (``/proc/self/task/TID/
schedstat``): ``cpu`` (it ran: a slot or Qt's own work), ``runq`` (runnable, waiting for a core the
machine's other processes held) and the rest, ``blocked`` (asleep: waiting for the GIL another
thread of this process held, or for I/O). A tool for finding causes, not a figure: the sampler itself
costs the loop a little."""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from bench import bare

GAPS: list[tuple[float, float]] = []
SAMPLES: list[tuple[float, dict[int, list[str]]]] = []
#: (perf_counter, the window thread's cpu ns, its run-queue wait ns) at each sample.
SCHED: list[tuple[float, int, int]] = []


def _schedstat(native_id: int) -> tuple[int, int]:
    """(ns on a cpu, ns runnable but waiting for one) of a thread of this process."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as f:
            cpu, wait, _slices = f.read().split()
        return int(cpu), int(wait)
    except (OSError, ValueError):
        return 0, 0


def _frames(frame: Any) -> list[str]:
    out = []
    while frame is not None:
        code = frame.f_code
        out.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return out


def _sampler(stop: threading.Event, main_native: int) -> None:
    while not stop.is_set():
        now = time.perf_counter()
        SCHED.append((now, *_schedstat(main_native)))
        SAMPLES.append((now, {tid: _frames(f) for tid, f in sys._current_frames().items()
                              if tid != threading.get_ident()}))
        time.sleep(0.001)


def _recording_gap_ms(seconds: float, *, skip_s: float = 0.0) -> list[float]:
    """bare.worst_gap_ms, keeping each gap's span in GAPS."""
    from bench.bare import worst_gap_ms

    return worst_gap_ms(seconds, skip_s=skip_s, spans=GAPS)


def _hosts_stall(seconds: float, health: bool) -> float:
    """bench_hosts' app run (4 hosts over the tests' sshd, fake hl-smi) with the probe recording."""
    import tempfile

    from bench import bench_hosts as bh

    def recording(loop: Any, secs: float) -> float:
        return max(_recording_gap_ms(secs))

    bh._worst_gap_ms = recording  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        bin_dir = folder / "bin"
        bin_dir.mkdir()
        program = bin_dir / "hl-smi"
        program.write_text(f"#!/bin/sh\nexec {sys.executable} {bh.FAKE_HLSMI} \"$@\"\n")
        program.chmod(0o755)
        aliases = [bh.ALIAS, *(f"{bh.ALIAS}-{i}" for i in range(2, bh.HOSTS + 1))]
        path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        with bh.environ(PATH=path, FAKE_HLSMI_PERIOD="1.0", GAUDI_GUI_HOME=str(folder / "home")), \
                bh.ssh_server(folder / "ssh", tuple(aliases[1:])):
            return bh._measure(aliases, seconds, health=health)[1]


def _spent(start: float, end: float) -> str:
    """How the window's thread spent [start, end]: cpu, run-queue wait, the rest (blocked)."""
    before = [r for r in SCHED if r[0] <= start]
    after = [r for r in SCHED if r[0] >= end]
    if not before or not after:
        return "cpu/runq unknown"
    (t0, cpu0, wait0), (t1, cpu1, wait1) = before[-1], after[0]
    cpu, wait = (cpu1 - cpu0) / 1e6, (wait1 - wait0) / 1e6
    blocked = max(0.0, (t1 - t0) * 1000 - cpu - wait)
    return f"main cpu {cpu:.1f} ms, runq {wait:.1f} ms, blocked {blocked:.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("area", choices=["devices", "hosts"])
    parser.add_argument("--health", action="store_true")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--over", type=float, default=15.0)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    import importlib

    module = importlib.import_module(f"bench.bench_{args.area}")
    if args.area == "devices":
        module.worst_gap_ms = _recording_gap_ms  # type: ignore[attr-defined]
    main_id = threading.get_ident()
    stop = threading.Event()
    sampler = threading.Thread(target=_sampler, args=(stop, threading.get_native_id()), daemon=True)
    sampler.start()
    with bare.crowd(bare.crowd_size()):
        if args.area == "devices":
            result = module.worst_stall(args.seconds, health=args.health)
        else:
            result = _hosts_stall(args.seconds, args.health)
    stop.set()
    sampler.join()
    print("worst_stall:", result)
    worst = sorted((g for g in GAPS if (g[1] - g[0]) * 1000 > args.over), key=lambda g: g[0] - g[1])
    for start, end in worst[: args.top]:
        inside = [s for t, s in SAMPLES if start <= t <= end]
        at = start - GAPS[0][0]
        print(f"\n=== gap {(end - start) * 1000:.1f} ms at +{at:.2f} s, {len(inside)} samples, "
              f"{_spent(start, end)}")
        main_stacks: collections.Counter[str] = collections.Counter()
        others: collections.Counter[str] = collections.Counter()
        for sample in inside:
            stack = sample.get(main_id, [])
            ours = [f for f in stack if any(k in f for k in ("gaudi_gui", ".py"))][:6]
            main_stacks[" < ".join(ours)] += 1
            for tid, st in sample.items():
                if tid != main_id and st:
                    others[st[0]] += 1
        for text, n in main_stacks.most_common(5):
            print(f"  main x{n}: {text}")
        for leaf, n in others.most_common(4):
            print(f"  other x{n}: {leaf}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
