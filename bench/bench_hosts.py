"""Hosts overview: the GUI event loop's worst stall while the Hosts tab watches 4 hosts × 8 cards at
1 Hz over SSH, with and without health polling (a doctor per host every 10 s), each against the same
children started by bare QProcesses (bench/bare.py; interleaved), in a process table crowded to a
server's size (``BENCH_CROWD``, default 1000 idle processes), both measured once the streams have run
``SETTLE_S`` seconds (the app's first seconds after connecting are reported on their own), and the
time from connecting to a host's first sample. ``BENCH_STALL_SECONDS`` and ``BENCH_STALL_REPEATS``
override the length and number of the stall runs.

Each "host" is an alias of a real SSH server on 127.0.0.1 (bench_remote.ssh_server) whose PATH holds
the fake hl-smi replaying recorded 8-card output: every sample takes the real path (the system ssh
client, ``gaudi-gui guard`` on the host, the remote hl-smi loop, the CSV parser, the tab's tree).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bare import BareChildren, crowd, crowd_size  # noqa: E402
from bench.bench_remote import ALIAS, ssh_server  # noqa: E402
from bench.harness import environ, row, summarize  # noqa: E402

FAKE_HLSMI = ROOT / "tests" / "fake_hl_smi.py"
HOSTS = 4
#: Health polling in these runs: a doctor per host every 10 s (its shortest interval; default 300 s).
HEALTH_INTERVAL_S = 10.0
#: Seconds the streams run before a stall is measured (the app: after every host's first sample; the
#: bare baseline: after its streams started).
SETTLE_S = 3.0


def _worst_gap_ms(loop: Any, seconds: float) -> float:
    """Run ``loop`` for ``seconds`` with a 1 ms timer in it: the longest gap between two of its
    ticks, in ms (how long the event loop was kept from its work at worst)."""
    from PySide6.QtCore import QTimer

    gaps: list[float] = []
    last = [time.perf_counter()]

    def tick() -> None:
        t = time.perf_counter()
        gaps.append((t - last[0]) * 1000)
        last[0] = t

    probe = QTimer()
    probe.setInterval(1)
    probe.timeout.connect(tick)
    last[0] = time.perf_counter()
    probe.start()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()
    probe.stop()
    return max(gaps or [0.0])


def _measure(aliases: list[str], seconds: float,
             health: bool = False) -> tuple[list[float], float, int, int, float]:
    """(seconds from start to each host's first sample, worst 1 ms timer gap in ms from ``SETTLE_S``
    after every host answered, samples seen, doctor checks finished, worst gap in the ``SETTLE_S``
    before) for one fresh Hosts tab. With ``health`` the
    health service runs as in the app, but every 10 s (its shortest interval; the default is 300 s):
    a ``doctor --json --host`` child per host, its report and alerts shown in the tab."""
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from gaudi_gui.app import create_services
    from gaudi_gui.core import remote
    from gaudi_gui.ui.hosts_tab import HostsTab

    app = QApplication.instance() or QApplication([])
    remote.save_hosts([remote.Host.parse(a) for a in aliases])
    services = create_services()
    started = time.perf_counter()
    tab = HostsTab(services)
    tab.resize(1280, 800)
    tab.show()
    first: dict[str, float] = {}
    count = [0]
    for name in aliases:
        poller = tab.hosts.poller(name)
        assert poller is not None
        poller.samples_received.connect(
            lambda _s, n=name: (first.setdefault(n, time.perf_counter() - started),
                                count.__setitem__(0, count[0] + 1)))
    loop = QEventLoop()
    deadline = time.monotonic() + 60

    def wait_all() -> None:
        if len(first) == len(aliases) or time.monotonic() > deadline:
            loop.quit()
        else:
            QTimer.singleShot(20, wait_all)

    QTimer.singleShot(20, wait_all)
    loop.exec()
    if len(first) < len(aliases):
        tab.shutdown()
        raise RuntimeError(f"only {len(first)} of {len(aliases)} hosts answered within 60 s")
    # The first seconds after the last host answered: every host's first-contact children (its
    # version handshake, queue listing and process table: a Python start on the host each) share
    # these 2 cores with the window; the bare baseline's streams have run 3 s before it measures, so
    # the app's measure starts as late, and this burst is reported on its own.
    burst = _worst_gap_ms(loop, SETTLE_S)
    seen = count[0]
    checks = [0]
    if health:
        assert services.health is not None
        services.settings.set("health/interval_s", HEALTH_INTERVAL_S)
        services.health.report_changed.connect(lambda _h: checks.__setitem__(0, checks[0] + 1))
        services.health.start()
    worst = _worst_gap_ms(loop, seconds)
    samples = count[0] - seen
    if services.health is not None:
        services.health.shutdown()
    tab.shutdown()
    services.poller.stop()
    tab.close()
    tab.deleteLater()
    app.processEvents()
    return list(first.values()), worst, samples, checks[0], burst


def _measure_bare(aliases: list[str], seconds: float, health: bool = False) -> float:
    """The baseline: the worst 1 ms timer gap of an event loop that starts the same children the
    Hosts tab starts (per host the guarded ``hl-smi`` loop over ssh, and the plain ``hl-smi`` table
    every 5 s; with ``health`` the health service's ``doctor --json --background --host`` per host
    and the local ``doctor --json --background`` (the service always watches this machine too) every
    10 s) with bare QProcesses and throws their output away. It holds what the app cannot
    avoid on this machine: the hosts' own processes share its cores here (on a real workstation
    they run on the servers), and the ssh clients and forks are needed by any app watching them."""
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from gaudi_gui.core import hlsmi, remote

    app = QApplication.instance() or QApplication([])
    assert app is not None
    hosts = [remote.Host.parse(a) for a in aliases]
    children = BareChildren()
    args = hlsmi.query_args(hlsmi.QUERY_FIELDS, loop_s=1)
    for host in hosts:
        children.stream(host.wrap(host.gaudi_gui_argv("guard", "--grace", "0", "--", "hl-smi", *args)),
                        keep_stdin=True)
    children.every(5.0, lambda: [host.wrap(host.gaudi_gui_argv("guard", "--grace", "0", "--", "hl-smi"))
                                 for host in hosts])
    loop = QEventLoop()
    QTimer.singleShot(int(SETTLE_S * 1000), loop.quit)  # the streams going, as the app's
    loop.exec()
    if health:  # started with the measure, as the app's health service: this machine's doctor too
        children.every(HEALTH_INTERVAL_S, lambda: [
            [sys.executable, "-m", "gaudi_gui", "doctor", "--json", "--background"],
            *([sys.executable, "-m", "gaudi_gui", "doctor", "--json", "--background", "--host", host.name]
              for host in hosts)])
    worst = _worst_gap_ms(loop, seconds)
    children.stop()
    return worst


def run(quick: bool = False) -> list[dict[str, Any]]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    seconds, repeats = (8.0, 2) if quick else (30.0, 3)
    seconds = float(os.environ.get("BENCH_STALL_SECONDS", seconds))
    repeats = int(os.environ.get("BENCH_STALL_REPEATS", repeats))
    size = crowd_size()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        bin_dir = folder / "bin"
        bin_dir.mkdir()
        program = bin_dir / "hl-smi"
        program.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_HLSMI} \"$@\"\n")
        program.chmod(0o755)
        aliases = [ALIAS, *(f"{ALIAS}-{i}" for i in range(2, HOSTS + 1))]
        connect: list[float] = []
        stalls: list[float] = []
        bare: list[float] = []
        rates: list[float] = []
        health_stalls: list[float] = []
        health_bare: list[float] = []
        health_checks: list[int] = []
        bursts: list[float] = []
        # hl-smi -l 1: one snapshot a second per host.
        with environ(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", FAKE_HLSMI_PERIOD="1.0",
                     GAUDI_GUI_HOME=str(folder / "home")), \
                ssh_server(folder / "ssh", tuple(aliases[1:])), crowd(size):
            for _ in range(repeats):  # interleaved: app, bare, app with health, bare with doctors, app…
                firsts, worst, samples, _, burst = _measure(aliases, seconds)
                connect.append(statistics.median(firsts))
                bursts.append(burst)
                stalls.append(worst)
                rates.append(samples / seconds)
                bare.append(_measure_bare(aliases, seconds))
                _, worst, _, done, _ = _measure(aliases, seconds, health=True)
                health_stalls.append(worst)
                health_checks.append(done)
                health_bare.append(_measure_bare(aliases, seconds, health=True))

    def spread(values: list[float]) -> tuple[float, float]:
        return (round(min(values), 3), round(max(values), 3))

    where = f"{size} idle processes in the table"
    return [
        {**row(f"hosts: worst event-loop stall, {HOSTS} hosts x 8 cards at 1 Hz over ssh (baseline: bare "
               f"children; {where})", summarize(stalls, bare), unit="ms", goal="< 20 ms", digits=1),
         "app_samples": stalls, "base_samples": bare},
        {**row(f"hosts: same, health polling on (doctor per host every {HEALTH_INTERVAL_S:g} s; baseline: "
               "bare children and doctors)", summarize(health_stalls, health_bare), unit="ms",
               goal="< 20 ms", digits=1),
         "app_samples": health_stalls, "base_samples": health_bare,
         "note": f"doctor reports per run: {health_checks}"},
        {"name": "hosts: stall added by the app over the bare children, health on (pairwise)",
         "value": round(statistics.median(a - b for a, b in zip(health_stalls, health_bare, strict=True)), 2),
         "unit": "ms", "baseline": None, "ratio": None,
         "spread": spread([a - b for a, b in zip(health_stalls, health_bare, strict=True)]),
         "repeats": repeats, "goal": "informational"},
        {"name": f"hosts: worst stall in the {SETTLE_S:g} s after every host's first sample (each host's "
                 "handshake, queue listing and process table starting beside the streams)",
         "value": round(statistics.median(bursts), 1), "unit": "ms", "baseline": None, "ratio": None,
         "spread": spread(bursts), "repeats": repeats, "goal": "informational"},
        {"name": "hosts: connect to first sample (median of the hosts)",
         "value": round(statistics.median(connect) * 1000, 1), "unit": "ms", "baseline": None,
         "ratio": None, "spread": spread([c * 1000 for c in connect]), "repeats": repeats,
         "goal": "informational"},
        {"name": "hosts: snapshots per second received (all hosts)",
         "value": round(statistics.median(rates), 2), "unit": "/s", "baseline": None, "ratio": None,
         "spread": spread(rates), "repeats": repeats,
         "goal": f"~{HOSTS}"},
    ]


if __name__ == "__main__":
    for r in run(quick=True):
        print(r)
