"""``gaudi-gui devices [--json] [--hl-smi PATH]``: one snapshot of the cards, through the same parser.

Exit codes: 0 with the cards (or, when hl-smi is simply not installed, the host and NVIDIA GPUs plus a
note on stderr); 1 when hl-smi ran but failed or printed nothing usable, or is missing where /dev/accel
nodes or the habanalabs driver say Gaudi cards are here (the fallback is still printed); 2 when an
explicitly chosen hl-smi (``--hl-smi``, ``GAUDI_GUI_HL_SMI``, a saved host's path) cannot be run, or
``--timeout`` is not a finite number of seconds above 0 (one line on stderr).

hl-smi runs in its own session: on a timeout, and after it exits (a wrapper script's helpers), its
process group and every descendant seen while it ran are killed, so nothing it forked is left.
Everything hl-smi printed passes ``hlsmi.clean_text`` before it reaches the terminal, and unparsable
rows are counted in a warning on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time

import psutil

from gaudi_gui.core import hlsmi, host
from gaudi_gui.core.devices import DeviceSample, attach_processes, card_warnings, value_problems


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("devices", help="print one snapshot of the cards (hl-smi; else NVIDIA GPUs, host)")
    p.add_argument("--json", action="store_true", help="print a JSON list of cards (unknown values: null)")
    p.add_argument("--hl-smi", dest="hl_smi", metavar="PATH",
                   help="the hl-smi program (default: $GAUDI_GUI_HL_SMI, then hl-smi on PATH)")
    # A string, checked in run(): argparse's own errors print the usage too (two lines, not one).
    p.add_argument("--timeout", default="15", metavar="SECONDS",
                   help="seconds to wait for each hl-smi call; then its whole process tree is ended "
                        "(default 15)")


def parse_timeout(text: object) -> float | None:
    """``--timeout`` as seconds, or None when it is not a finite number above 0."""
    try:
        value = float(str(text))
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def _run(argv: list[str], timeout: float) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``argv``; -1 when it could not start or did not finish in
    ``timeout`` seconds, in which case its whole process tree was ended (the doctor's bounded tool
    runner, core.health.run_tool: one way to run a tool that may hang or leave helpers)."""
    from gaudi_gui.core.health import run_tool
    code, out, err = run_tool(argv, timeout)
    return (-1 if code in (124, 127) else code), out, err


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
    if result.rejected:
        shown = "\n  ".join(result.errors[:5])
        _say(f"gaudi-gui devices: warning: {result.rejected} hl-smi row(s) could not be parsed and were "
             f"skipped:\n  {shown}")
    if result.warnings:
        shown = "\n  ".join(result.warnings[:5])
        _say(f"gaudi-gui devices: warning: {len(result.warnings)} hl-smi value(s) were not numbers and "
             f"are shown as unknown:\n  {shown}")
    flagged = [f"card {s.index}: {p}" for s in result.samples for p in value_problems(s)]
    if flagged:
        _say("gaudi-gui devices: warning: implausible values (shown as reported):\n  " + "\n  ".join(flagged))
    now = time.time()
    for s in result.samples:
        s.timestamp = now
    code, out, _err = _run([program], timeout)
    if code == 0:
        attach_processes(result.samples, host.describe_processes(hlsmi.parse_table(out).processes))
    return result.samples, None


def _say(text: str) -> None:
    """A message on stderr, without the terminal escapes hl-smi's output may carry."""
    print(hlsmi.clean_text(text), file=sys.stderr)


#: The least time over which the host's CPU utilization is measured. This command is one short
#: process (a host's poller runs it every interval over ssh): psutil's first reading would cover only
#: the interpreter's own start-up, so the window starts here and the command waits out the rest.
CPU_WINDOW_S = 0.2


def fallback(timeout: float) -> list[DeviceSample]:
    psutil.cpu_percent(interval=None)  # the window of host_sample()'s reading starts now
    begun = time.monotonic()
    samples: list[DeviceSample] = []
    if shutil.which("nvidia-smi"):
        code, out, _err = _run(["nvidia-smi", *host.nvidia_args()], timeout)
        if code == 0:
            samples += host.parse_nvidia(out)
    rest = CPU_WINDOW_S - (time.monotonic() - begun)
    if rest > 0:
        time.sleep(rest)
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
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
    return hlsmi.clean_text(text)


def run(args: argparse.Namespace) -> int:
    timeout = parse_timeout(args.timeout)
    if timeout is None:
        _say(f"gaudi-gui devices: --timeout must be a finite number of seconds above 0, not {args.timeout!r}")
        return 2
    args.timeout = timeout
    program, explicit = hlsmi.hl_smi_program(args.hl_smi)
    resolved = hlsmi.find_hl_smi(args.hl_smi) or None
    code = 0
    if resolved is None:
        if explicit:
            _say(f"gaudi-gui devices: cannot run hl-smi {program!r}: not found or not executable")
            return 2
        from gaudi_gui.core import health
        evidence = health.gaudi_evidence(health.Roots.from_env())
        if evidence:
            # Gaudi cards are here: their hl-smi missing is a failure, not a CPU machine.
            _say(f"gaudi-gui devices: no hl-smi on PATH, but {evidence}: the cards cannot be read (install "
                 "habanalabs-firmware-tools or name it: --hl-smi PATH, GAUDI_GUI_HL_SMI, hosts --add HOST "
                 "--hl-smi PATH); showing NVIDIA GPUs and the host")
            code = 1
        else:
            _say("gaudi-gui devices: hl-smi is not installed (not on PATH); showing NVIDIA GPUs and the host")
        samples = fallback(args.timeout)
    else:
        samples, problem = snapshot(resolved, args.timeout)
        if problem is not None:
            _say(f"gaudi-gui devices: hl-smi failed: {problem}\nshowing NVIDIA GPUs and the host instead")
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
