"""``gaudi-gui devices [--json] [--hl-smi PATH]``: one snapshot of the cards, through the same parser.

Exit codes: 0 with the cards (or, when hl-smi is simply not installed, the host and NVIDIA GPUs plus a
note on stderr); 1 when hl-smi ran but failed or printed nothing usable (the fallback is still
printed); 2 when an explicitly chosen hl-smi (``--hl-smi`` or ``GAUDI_GUI_HL_SMI``) cannot be run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from gaudi_gui.core import hlsmi, host
from gaudi_gui.core.devices import DeviceSample, attach_processes, card_warnings


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("devices", help="print one snapshot of the cards (hl-smi; else NVIDIA GPUs, host)")
    p.add_argument("--json", action="store_true", help="print a JSON list of cards (unknown values: null)")
    p.add_argument("--hl-smi", dest="hl_smi", metavar="PATH",
                   help="the hl-smi program (default: $GAUDI_GUI_HL_SMI, then hl-smi on PATH)")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for hl-smi (default 15)")


def _run(argv: list[str], timeout: float) -> tuple[int, str, str]:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, text=True, errors="replace")
    except subprocess.TimeoutExpired:
        return -1, "", f"timed out after {timeout:.0f} s"
    except OSError as exc:
        return -1, "", str(exc)
    return done.returncode, done.stdout, done.stderr


def snapshot(program: str, timeout: float) -> tuple[list[DeviceSample], str | None]:
    """The cards from ``program``; (samples, None) or ([], what went wrong)."""
    argv = [program, *hlsmi.query_args(hlsmi.QUERY_FIELDS)]
    code, out, err = _run(argv, timeout)
    result = hlsmi.parse_csv(out)
    if code != 0 or not result.samples:
        said = (err.strip() or out.strip())[-800:] or "(no output)"
        what = f"exit code {code}" if code >= 0 else "did not finish"
        extra = ("\nunparsed lines:\n" + "\n".join(result.errors[:5])) if result.errors else ""
        return [], f"{' '.join(argv)}: {what}; it said:\n{said}{extra}"
    now = time.time()
    for s in result.samples:
        s.timestamp = now
    code, out, _err = _run([program], timeout)
    if code == 0:
        attach_processes(result.samples, host.describe_processes(hlsmi.parse_table(out).processes))
    return result.samples, None


def fallback(timeout: float) -> list[DeviceSample]:
    samples: list[DeviceSample] = []
    if shutil.which("nvidia-smi"):
        code, out, _err = _run(["nvidia-smi", *host.nvidia_args()], timeout)
        if code == 0:
            samples += host.parse_nvidia(out)
    samples.append(host.host_sample())
    return samples


def _table(samples: list[DeviceSample]) -> str:
    head = ("idx", "module", "name", "bus id", "util%", "memory MiB", "temp C", "power W", "warnings")
    rows = [head]

    def n(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    for s in samples:
        name = s.name or "-"
        if s.generation:
            name = f"{s.generation} ({name})"
        rows.append((str(s.index) if s.kind != "host" else "host", n(s.module_id), name, s.bus_id or "-",
                     n(s.utilization), f"{n(s.memory_used_mib)} / {n(s.memory_total_mib)}",
                     n(s.temperature_c), n(s.power_w), "; ".join(card_warnings(s))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def run(args: argparse.Namespace) -> int:
    explicit = args.hl_smi or os.environ.get("GAUDI_GUI_HL_SMI", "").strip() or None
    program = explicit or "hl-smi"
    resolved = shutil.which(program)
    code = 0
    if resolved is None:
        if explicit:
            print(f"gaudi-gui devices: cannot run hl-smi {program!r}: not found or not executable",
                  file=sys.stderr)
            return 2
        print("gaudi-gui devices: hl-smi is not installed (not on PATH); showing NVIDIA GPUs and the host",
              file=sys.stderr)
        samples = fallback(args.timeout)
    else:
        samples, problem = snapshot(resolved, args.timeout)
        if problem is not None:
            print(f"gaudi-gui devices: hl-smi failed: {problem}\nshowing NVIDIA GPUs and the host instead",
                  file=sys.stderr)
            samples = fallback(args.timeout)
            code = 1
    text = json.dumps([s.to_dict() for s in samples], indent=2) if args.json else _table(samples)
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # `gaudi-gui devices | head`: the reader left; not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code
