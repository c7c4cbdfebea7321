"""``gaudi-gui doctor``: say why a card or the stack will fail before a job does, on every host.

One line per finding (severity, card, check, what was seen, the fix) or ``--json`` (exactly
``core.health.Report.to_json()``). Hosts run ``<remote command> doctor --json`` over the system ssh,
in parallel, each with a timeout; a host that does not answer is an error naming it. Exit 0 when no
finding is an error, 1 when one is, 2 for bad input. This process never imports torch.

Every tool it runs (hl-smi, dmesg, nvidia-smi) runs in a session of its own and is ended with
everything it started when it hangs (``core.health.run_tool``); ``GAUDI_GUI_DOCTOR_TOOL_TIMEOUT``
(seconds, default 20) bounds each call, as ``GAUDI_GUI_DOCTOR_SYSFS`` / ``_PROC`` / ``_DEV`` move the
folders it reads (tests, containers). The smoke children are ended when anything fails after they
started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gaudi_gui.commands.flags import positive_seconds
from gaudi_gui.core import health, hlsmi
from gaudi_gui.core.health import Finding, HostHealth, Report

HOST_TIMEOUT_S = 60.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check the Gaudi stack, cards, holders and network (exit 1 on errors)")
    p.add_argument("--hosts", default="", metavar="A,B", help="check these hosts in parallel over ssh")
    p.add_argument("--hl-smi", dest="hl_smi", default="", metavar="PATH", help="the hl-smi to run")
    p.add_argument("--cards", default="", metavar="IDS", help="only these module ids (e.g. 0,1)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON document")
    p.add_argument("--report", default="", metavar="FILE.tar.gz",
                   help="also pack the findings, versions, hl-smi -q, kernel messages and the running "
                        "runs' last log lines (secrets redacted) for a bug report; a .txt path writes "
                        "it as text, '-' prints that text alone (each host's part is made there)")
    p.add_argument("--background", action="store_true",
                   help="run at low CPU priority (nice 10), here and on the hosts: the app's periodic "
                        "checks, which must not take the cores from the window or a run")
    p.add_argument("--smoke", action="store_true",
                   help="also acquire each card in its own child and run a tensor operation")
    p.add_argument("--smoke-timeout", dest="smoke_timeout", type=positive_seconds, default=120.0, metavar="S",
                   help="seconds each smoke child may take (default 120)")
    p.add_argument("--fp8", default="", metavar="RUN",
                   help="check a calibrate run (its folder or name) against this machine: device type and "
                        "card generation, INC's major version, its measurement files (exit 2 on a mismatch)")
    p.add_argument("--model", default="", help="with --fp8: the model to serve, checked against the "
                                               "calibrated revision")
    p.add_argument("--timeout", type=positive_seconds, default=HOST_TIMEOUT_S, metavar="S",
                   help=f"seconds to wait for each host (default {HOST_TIMEOUT_S:g})")


def _roots(hl_smi: str) -> health.Roots:
    return health.Roots.from_env(hl_smi)


def check_remote(name: str, remote_command: str, cards: str, timeout: float, *,
                 smoke: bool = False, background: bool = False, hl_smi: str = "") -> HostHealth:
    """``doctor --json`` on one host (with ``hl_smi``: that hl-smi there; else the host's saved
    one, which ``Host.gaudi_gui_argv`` carries); any failure becomes an unreachable HostHealth."""
    from gaudi_gui.core.remote import HostError, RemoteError, call, find_host
    try:
        host = find_host(name, remote_command, hl_smi)
        argv = host.gaudi_gui_argv("doctor", "--json", *(["--cards", cards] if cards else []),
                                   *(["--smoke"] if smoke else []),
                                   *(["--background"] if background else []))
        code, out, err = call(host, argv, timeout=timeout)
    except (HostError, RemoteError) as exc:
        return HostHealth(name, False, str(exc))
    try:
        data = json.loads(out)
        got = Report.from_json(data).hosts[0]
    except (ValueError, KeyError, IndexError, TypeError):
        last = (err.strip().splitlines() or ["no output"])[-1]
        return HostHealth(name, False, f"doctor failed there (exit {code}): {last}")
    # The host calls itself "local": name it as the user did.
    return HostHealth(name, True, got.error,
                      tuple(Finding(f.check, f.severity, f.seen, f.fix, f.module_id, f.index, name)
                            for f in got.findings), got.cards, got.free_modules, got.versions)


def with_smoke(found: HostHealth, cards: list[int] | None, timeout: float) -> HostHealth:
    """Add the smoke findings: one child per Gaudi card (or CUDA GPU), else one CPU child."""
    import shutil
    targets: list[tuple[int | None, int | None]] = [
        (int(c["module_id"]), int(c["index"])) for c in found.cards
        if cards is None or int(c["module_id"]) in cards]
    kind = "hpu" if found.cards else "cpu"
    if not found.cards and shutil.which("nvidia-smi"):
        code, listed, _err = health.run_tool(["nvidia-smi", "-L"], health.tool_timeout_s())
        gpus = [ln for ln in listed.splitlines() if ln.startswith("GPU ")] if code == 0 else []
        if gpus:
            kind = "cuda"
            targets = [(None, i) for i in range(len(gpus)) if cards is None or i in cards]
    if kind == "cpu":
        targets = [(None, None)]
    smoke = health.run_smoke(kind, targets, timeout_s=timeout, host=found.host)
    return HostHealth(found.host, found.reachable, found.error, found.findings + tuple(smoke), found.cards,
                      found.free_modules, found.versions)


def build_report(hosts: list[str], remote_command: str, cards: list[int] | None, cards_text: str, *,
                 hl_smi: str, timeout: float, smoke: bool = False, smoke_timeout: float = 120.0,
                 background: bool = False) -> Report:
    if not hosts:
        here = health.check_host(_roots(hl_smi), cards=cards)
        return Report(hosts=(with_smoke(here, cards, smoke_timeout) if smoke else here,))
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        found = list(pool.map(lambda h: check_remote(h, remote_command, cards_text, timeout, smoke=smoke,
                                                     background=background, hl_smi=hl_smi), hosts))
    return Report(hosts=tuple(found), cross_host=tuple(health.cross_host_findings(found)))


#: Each part's heading in the plain-text form of the report (``--report -`` / ``--report FILE.txt``).
PART_MARK = "==== gaudi-doctor/{} ===="


def findings_parts(report: Report) -> dict[str, str]:
    """The report's findings, as JSON and as the lines the doctor prints."""
    return {"findings.json": json.dumps(report.to_json(), indent=1),
            "findings.txt": "\n".join(format_finding(f) for f in report.all_findings()) + "\n"}


def report_parts(report: Report, hl_smi: str) -> dict[str, str]:
    """The files of a bug report made on this machine: findings, versions, ``hl-smi -q``, the
    driver's kernel messages (or why they could not be read), the running runs' last log lines."""
    import shutil

    def text_of(argv: list[str]) -> str:
        # Each tool in its own session, ended with everything it started when it hangs.
        code, out, err = health.run_tool(argv, health.tool_timeout_s())
        if code == 127:
            return f"could not run {' '.join(argv)}: {err}\n"
        if code != 0:
            return f"{' '.join(argv)} failed (exit {code}): {err.strip()[-500:]}\n" + out
        return out

    parts: dict[str, str] = {
        **findings_parts(report),
        "versions.json": json.dumps({h.host: h.versions for h in report.hosts}, indent=1),
    }
    program, chosen = hlsmi.hl_smi_program(hl_smi)
    program = program if chosen else hlsmi.find_hl_smi()  # a chosen one that fails says so in the file
    parts["hl-smi-q.txt"] = text_of([program, "-q"]) if program else "no hl-smi on this machine\n"
    # dmesg often needs root (kernel.dmesg_restrict): the report says so instead of failing.
    kernel = text_of(["dmesg", "--ctime"]) if shutil.which("dmesg") else "dmesg is not installed\n"
    habana = [ln for ln in kernel.splitlines() if "habana" in ln.lower() or "accel" in ln.lower()]
    parts["kernel.txt"] = "\n".join(habana[-300:]) + "\n" if habana else kernel[-20000:]
    from gaudi_gui.core.runstore import RunStore
    logs = []
    for run in RunStore().runs():
        try:
            if run.status().state != "running" or not run.log_path.exists():
                continue
            tail = run.log_path.read_text(errors="replace").splitlines()[-200:]
        except OSError:
            continue
        logs.append(f"==== {run.name} ====\n" + "\n".join(tail))
    parts["runs.txt"] = "\n".join(logs) + "\n" if logs else "no running runs\n"
    return parts


def parts_text(parts: dict[str, str]) -> str:
    """The parts as one redacted text (what "Copy report" puts on the clipboard)."""
    from gaudi_gui.core.secrets import redact
    return "".join(f"{PART_MARK.format(name)}\n{redact(text).rstrip()}\n\n" for name, text in parts.items())


def text_parts(text: str) -> dict[str, str]:
    """``parts_text`` read back (a host's ``doctor --report -``); text before any heading is dropped."""
    import re
    out: dict[str, str] = {}
    pieces = re.split(r"^==== gaudi-doctor/(\S+) ====$", text, flags=re.MULTILINE)
    for name, body in zip(pieces[1::2], pieces[2::2], strict=True):
        out[name] = body.strip("\n") + "\n"
    return out


def remote_parts(name: str, remote_command: str, timeout: float, hl_smi: str = "") -> dict[str, str]:
    """A host's own report parts: its ``doctor --report -`` (its hl-smi, kernel messages and runs)."""
    from gaudi_gui.core.remote import HostError, RemoteError, call, find_host
    try:
        host = find_host(name, remote_command, hl_smi)
        code, out, err = call(host, host.gaudi_gui_argv("doctor", "--report", "-"), timeout=timeout)
    except (HostError, RemoteError) as exc:
        return {"error.txt": f"{name}: no report: {exc}\n"}
    got = text_parts(out)
    return got or {"error.txt": f"{name}: doctor --report - printed no report (exit {code}): "
                                f"{err.strip()[-500:]}\n"}


def write_report(path: Path, report: Report, hl_smi: str, *, hosts: list[str] | None = None,
                 remote_command: str = "", timeout: float = HOST_TIMEOUT_S) -> None:
    """A tar.gz (or, for a ``.txt`` path, the plain-text form) for a bug report; every text in it goes
    through core.secrets.redact (as ``--report -`` and the app's "Copy report", which reads the .txt
    form, do). With ``hosts`` each host's files are made on that host (its hl-smi, its kernel
    messages, its runs) under ``HOST/``, beside this report's findings. The file is written at once
    (core.atomic) and readable by its owner only (0600), as run folders are."""
    import io
    import tarfile

    from gaudi_gui.core.atomic import write_bytes, write_text
    from gaudi_gui.core.secrets import redact

    if hosts:
        parts = findings_parts(report)
        with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
            for name, got in zip(hosts, pool.map(lambda h: remote_parts(h, remote_command, timeout, hl_smi),
                                                 hosts),
                                 strict=True):
                parts.update({f"{name}/{k}": v for k, v in got.items()})
    else:
        parts = report_parts(report, hl_smi)
    if str(path).endswith(".txt"):
        write_text(path, parts_text(parts))
        return
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        for name, text in parts.items():
            data = redact(text).encode()
            info = tarfile.TarInfo(f"gaudi-doctor/{name}")
            info.size = len(data)
            info.mode = 0o600
            tar.addfile(info, io.BytesIO(data))
    write_bytes(path, packed.getvalue())


def format_finding(f: Finding) -> str:
    card = f.card_label() or "-"
    where = "" if f.host == "local" else f"{f.host} "
    fix = f" -> {f.fix}" if f.fix else ""
    return f"{f.severity.upper():7} {where}{card:18} {f.check:19} {f.seen}{fix}"


def fp8_check(name: str, model: str = "") -> int:
    """``doctor --fp8 RUN``: the calibrate run's manifest against this machine (core.fp8), each mismatch
    with what to do; 0 when it fits, 2 when it does not (or is no calibrate run)."""
    from gaudi_gui.core import fp8
    try:
        folder = fp8.find_run(name)
        manifest, found = fp8.check(folder, model=model)
    except fp8.Fp8Error as exc:
        print(f"gaudi-gui doctor: --fp8: {exc}", file=sys.stderr)
        return 2
    inc = fp8.inc_version()
    print(f"Intel Neural Compressor: {inc or 'not installed (' + fp8.INC_INSTALL + ')'}")
    said = manifest.get("model") or {}
    print(f"calibration {folder.name}: {said.get('model')} @ {said.get('revision')}, {manifest.get('rows')} "
          f"rows on {manifest.get('device')} ({manifest.get('generation')}), "
          f"INC {manifest.get('inc_version')}, torch {manifest.get('torch_version')}, "
          f"scale method {manifest.get('scale_method')}")
    ranks = fp8.ranks_of(manifest)
    if ranks > 1:
        cards = ",".join(str(c) for c in manifest.get("cards") or [])
        print(f"ranks: {ranks}{f' (cards {cards})' if cards else ''}, a file set each: serve --fp8 with "
              f"--cards of {ranks} ids (tensor parallel {ranks}); eval --fp8 (one process) needs a "
              "calibration on one")
    for m in found:
        print(f"mismatch: {m.line()}")
    if found:
        print(f"{len(found)} mismatch(es): this calibration cannot be used here")
        return 2
    print("the calibration fits this machine")
    return 0


def run(args: argparse.Namespace) -> int:
    if getattr(args, "fp8", ""):
        return fp8_check(args.fp8, args.model)
    if getattr(args, "model", ""):
        print("gaudi-gui doctor: --model goes with --fp8", file=sys.stderr)
        return 2
    if getattr(args, "background", False):
        # Low priority for this process and everything it starts (hl-smi, ssh, the smoke children).
        with contextlib.suppress(OSError):
            os.nice(10)
    host = (getattr(args, "host", "") or "").strip()
    hosts_text = (args.hosts or "").strip()
    remote_command = (getattr(args, "remote_command", "") or "").strip()
    if host and host != "local" and hosts_text:
        print("gaudi-gui doctor: takes --host (one host) or --hosts (several), not both", file=sys.stderr)
        return 2
    if remote_command and not (hosts_text or (host and host != "local")):
        print("gaudi-gui doctor: --remote-command needs --host or --hosts", file=sys.stderr)
        return 2
    cards: list[int] | None = None
    if args.cards:
        from gaudi_gui.core.visibility import parse_cards
        try:
            cards = parse_cards(args.cards)
        except ValueError as exc:
            print(f"gaudi-gui doctor: {exc}", file=sys.stderr)
            return 2
    names = [h.strip() for h in hosts_text.split(",") if h.strip()] if hosts_text else []
    if host and host != "local":
        names = [host]
    report = build_report(names, remote_command, cards, args.cards, hl_smi=args.hl_smi,
                          timeout=args.timeout, smoke=args.smoke, smoke_timeout=args.smoke_timeout,
                          background=args.background)
    if cards is not None:
        seen = {int(c["module_id"]) for h in report.hosts for c in h.cards}
        unknown = sorted(set(cards) - seen) if seen else []
        if unknown:
            print(f"gaudi-gui doctor: --cards: no card with module id {','.join(map(str, unknown))} "
                  f"(cards here: {','.join(map(str, sorted(seen)))})", file=sys.stderr)
            return 2
    if args.report == "-":
        # The plain-text form on stdout, nothing else (a host's part of a report made elsewhere).
        sys.stdout.write(parts_text(report_parts(report, args.hl_smi)))
        return report.exit_code
    if args.report:
        try:
            write_report(Path(args.report), report, args.hl_smi, hosts=names, remote_command=remote_command,
                         timeout=args.timeout)
        except OSError as exc:
            print(f"gaudi-gui doctor: --report: cannot write {args.report}: {exc.strerror}", file=sys.stderr)
            return 2
        print(f"report written to {args.report}", file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_json()))
        return report.exit_code
    for f in report.all_findings():
        print(format_finding(f))
    for h in report.hosts:
        failed = any(f.check == "stack.hl-smi" and f.severity == "error" for f in h.findings)
        if h.reachable and not h.cards and not failed:
            print(f"{h.host}: no Gaudi cards (hl-smi not found): only the Python stack was checked")
        elif h.reachable and h.cards:
            print(f"{h.host}: {h.free_text()}")
    print(f"{report.errors} error(s), {report.warnings} warning(s)")
    return report.exit_code


def preflight(cards: list[int] | None, *, multi_node: bool = False) -> str:
    """The start gate of ``gaudi-gui train``: "" to go on, else the reason (and the fix) to refuse.

    A no-op without hl-smi, /dev/accel nodes and the habanalabs driver (no Gaudi cards here: nothing
    of the cards' to check). Warnings are printed to stderr and let the run go on."""
    roots = _roots("")
    # No hl-smi and nothing else that says Gaudi (/dev/accel, the driver): no cards to check. With
    # either, the check runs and a missing or failing hl-smi refuses the start.
    if not hlsmi.hl_smi_program()[1] and not hlsmi.find_hl_smi() and not health.gaudi_evidence(roots):
        return ""
    # All cards are checked (not only the chosen ones) so the refusal can name free, healthy ones.
    report = Report(hosts=(health.check_host(roots),))
    result = health.gate(report, cards, multi_node=multi_node)
    for warning in result.warnings:
        print(f"gaudi-gui train: preflight warning: {warning}", file=sys.stderr)
    if result.ok:
        return ""
    fix = f"; {result.suggestion}" if result.suggestion else ""
    return ("preflight refused the start: " + "; ".join(result.errors) + fix
            + " (gaudi-gui doctor shows all; --no-preflight skips this check)")
