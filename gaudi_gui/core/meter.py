"""The run meter: what a run's own cards did while it ran, sampled by the run's supervisor.

The supervisor (``core.supervisor.supervise``, the one loop of every placement: this machine, a host,
each machine of a multi-host run) starts a :class:`Meter` for the run's own cards before its launcher
and stops it when the run has ended. The meter lives with the run, not with a window: a run that
nobody watches is metered the same.

Sources, by the run's device:

- **hpu**: this machine's agent's device loop (``devices.watch`` on a blocking
  ``core.agentwire.Connection``, its ``devices`` events: one ``hl-smi -l`` per machine, shared with
  Devices and Health); where no agent answers or ``GAUDI_GUI_NO_AGENT=1`` (or the agent goes away
  mid-run), its own long-running ``hl-smi -Q index,module_id,utilization.aip,memory.used,memory.total,
  power.draw,temperature.aip -f csv,noheader,nounits -l 1`` (the arguments from
  ``core.hlsmi.query_args``, the rows parsed by ``core.hlsmi.CsvStream``: the same code as the
  Devices poller), keeping the run's modules only (``HABANA_VISIBLE_MODULES`` of the launch, else the
  cards env.json records, else every card). hl-smi's ``timestamp`` field is not asked for: its
  value is free text (a locale's date could hold a comma and break the row); each snapshot is stamped
  with this machine's clock when its rows arrive.
- **cuda**: ``nvidia-smi --query-gpu=... -l 1`` (``core.host.nvidia_args``/``parse_nvidia``), the
  GPUs of ``CUDA_VISIBLE_DEVICES`` (indices; else every GPU).
- **cpu**: the package counters ``<root>/intel-rapl:N/energy_uj`` (root ``RAPL_ROOT``, or
  ``GAUDI_GUI_RAPL_ROOT``), when readable (since 2020 kernels make them root-only): a counter, so
  the energy is its difference (with its wrap at ``max_energy_range_uj``), not an integral.

Every sample is one JSON line in ``<run>/meter.jsonl``, written with one ``os.write`` on an
``O_APPEND`` file. This module is the sampler only; the meter's other concerns live beside it:
``core.meter_account`` (readings to energy, coverage and the summary; a job's parts combined),
``core.meter_counters`` (RAPL and the vendors' energy counters), ``core.meter_files`` (the files in
a run folder and their readers), ``core.meter_work`` (tokens and pace: what the energy bought) and
``core.meter_words`` (what the views say).

Cost: one thread blocked on hl-smi's pipe (a few rows a second) or waking once a second for RAPL;
hl-smi's child is ended with its whole tree (``core.proctree.ProcessTree``) when the meter stops.
Qt-free and torch-free.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from gaudi_gui.core import atomic, hlsmi
from gaudi_gui.core.devices import DeviceSample
from gaudi_gui.core.events import EventType
from gaudi_gui.core.meter_account import (
    GAP_S,
    NOT_MEASURED,
    SOURCE_HLSMI,
    SOURCE_NVIDIA,
    SOURCE_RAPL,
    THROTTLE_INTERVAL_S,
    Accounts,
    ThrottleClock,
    clean,
    finite,
    summarize,
    throttle_summary,
)
from gaudi_gui.core.meter_counters import EnergyCounter, energy_counter, rapl_root, rapl_zones, with_counter
from gaudi_gui.core.meter_files import METER_NAME, SUMMARY_NAME, parse_ids, recorded_cards
from gaudi_gui.core.meter_work import pace, token_figures

#: Seconds between two samples (hl-smi's ``-l`` takes whole seconds; 1 is its least).
INTERVAL_S = 1.0


#: When hl-smi / nvidia-smi ends by itself while the run goes on, it is started again after this;
#: ``GAUDI_GUI_METER_RESTART_S`` in the launch's environment overrides it (tests: a run at a tenth of
#: the real scale).
RESTART_S = 5.0


#: What the Gaudi meter asks hl-smi for.
HLSMI_FIELDS = ("index", "module_id", "utilization.aip", "memory.used", "memory.total", "power.draw",
                "temperature.aip")


#: Seconds between two looks at a Gaudi run's compile meter for compilations that keep rising after
#: warm-up (``core.compile_rise``); ``GAUDI_GUI_METER_COMPILE_S`` in the launch's environment overrides it.
COMPILE_WATCH_S = 10.0


#: A ``hl-smi -q`` that has not answered after this long is ended (and that read is lost).
THROTTLE_TIMEOUT_S = 30.0


#: The throttle reasons hl-smi -q lists under "Clocks Throttle Reasons", by the word the meter uses.
THROTTLE_REASONS = {"power": "power slowdown", "thermal": "thermal slowdown", "hw": "hw slowdown"}


def throttle_reasons(card: Mapping[str, str]) -> list[str] | None:
    """The active throttle reasons of one ``hl-smi -q`` card (``hlsmi.parse_query``): ["power"], [],
    or None when the card's report has no throttle lines (the release does not print them)."""
    found: list[str] | None = None
    for reason, label in THROTTLE_REASONS.items():
        for key, value in card.items():
            if key == f"clocks throttle reasons/{label}" or key.endswith(f"/{label}"):
                found = found if found is not None else []
                if value.strip().lower() == "active":
                    found.append(reason)
                break
    return found


def query_card_name(card: Mapping[str, str]) -> tuple[str, int | None]:
    """('module 3', 3) of a ``hl-smi -q`` card (its index when the report has no module id)."""
    module = next((v for k, v in card.items() if k == "module id" or k.endswith("/module id")), "")
    if module.strip().isdigit():
        return f"module {int(module)}", int(module)
    index = card.get("_index", "")
    return f"index {index}", None


class Meter:
    """The sampler of one run. ``start()`` it before the launcher, ``stop()`` it once the run has
    ended: stop ends the tool's child tree, joins the thread and returns (and writes) the summary.

    ``device``: the run's device ('hpu', 'cuda', 'cpu'); ``env``: the launch's environment (its
    ``HABANA_VISIBLE_MODULES`` / ``CUDA_VISIBLE_DEVICES`` and PATH are the run's)."""

    def __init__(self, folder: str | Path, *, device: str, env: Mapping[str, str] | None = None,
                 interval_s: float = INTERVAL_S, gap_s: float = GAP_S,
                 clock: Callable[[], float] = time.time, events_path: str | Path | None = None,
                 part: str = "") -> None:
        self.folder = Path(folder)
        #: The run's events (its logged steps; the compile warning goes there): ``folder``'s own, or
        #: a Slurm node's part's run folder's (the folder every node shares).
        self.events_path = Path(events_path) if events_path is not None else self.folder / "events.jsonl"
        #: The part of a job this meter is (a Slurm node's name): its warning names it.
        self.part = part
        self.device = device
        self.env = dict(os.environ if env is None else env)
        self.interval_s = interval_s
        self.clock = clock
        self.accounts = Accounts(gap_s)
        self.source = "none"
        self.energy_source = NOT_MEASURED
        self.note = ""
        self.cards: list[int] | None = None
        self.errors: list[str] = []
        self.restarts = 0
        #: Where the card samples came from (said in the summary's ``samples_from``): "agent" (this
        #: machine's one device loop, ``agent.devices``), else the meter's own tool loop.
        self.samples_from = ""
        self._hl_smi = ""
        self._agent: Any = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._fd = -1
        self._started_at = 0.0
        self._rapl_energy_uj = 0
        #: (first, last) time the RAPL counters were read: what their difference covers.
        self._rapl_span: tuple[float, float] | None = None
        self._summary: dict[str, Any] | None = None
        #: The vendor's energy counter of the run's cards (NVML / HLML where their library imports).
        self.counter: EnergyCounter | None = None
        #: A module object standing in for pynvml / pyhlml (tests); None: imported when present.
        self.counter_module: Any = None
        self._program: list[str] = []
        self._parse: Callable[[str], tuple[list[DeviceSample] | None, bool]] | None = None
        #: Each card's time throttled (hpu: ``hl-smi -q`` every ``throttle_interval_s``), by card name.
        self.throttle: dict[str, ThrottleClock] = {}
        self.throttle_interval_s = THROTTLE_INTERVAL_S
        with contextlib.suppress(ValueError):
            wanted = float(self.env.get("GAUDI_GUI_METER_THROTTLE_S") or THROTTLE_INTERVAL_S)
            if math.isfinite(wanted) and wanted > 0:
                self.throttle_interval_s = wanted
        self.restart_s = RESTART_S
        with contextlib.suppress(ValueError):
            wanted = float(self.env.get("GAUDI_GUI_METER_RESTART_S") or RESTART_S)
            if math.isfinite(wanted) and wanted > 0:
                self.restart_s = wanted
        self._throttle_program: list[str] = []
        self._throttle_thread: threading.Thread | None = None
        self._throttle_proc: subprocess.Popen[str] | None = None
        self._throttle_errors: list[str] = []
        #: Gaudi: the bridge's metrics file the launch was given, watched for compilations that keep
        #: rising after warm-up; the finding once made (also written as a "warning" event).
        self.compile_base = self.env.get("PT_HPU_METRICS_FILE", "") if device == "hpu" else ""
        self.compile_interval_s = COMPILE_WATCH_S
        with contextlib.suppress(ValueError):
            wanted = float(self.env.get("GAUDI_GUI_METER_COMPILE_S") or COMPILE_WATCH_S)
            if math.isfinite(wanted) and wanted > 0:
                self.compile_interval_s = wanted
        self.compile_warning: dict[str, Any] | None = None
        #: Steps of warm-up before compilations count (``GAUDI_GUI_METER_RISE_WARMUP``: tests).
        self.rise_warmup_steps: int | None = None
        with contextlib.suppress(ValueError):
            self.rise_warmup_steps = max(1, int(self.env["GAUDI_GUI_METER_RISE_WARMUP"])) \
                if self.env.get("GAUDI_GUI_METER_RISE_WARMUP") else None
        self._steps: list[tuple[float, int]] = []
        self._step_follower: Any = None
        self._compile_thread: threading.Thread | None = None

    # -- what to meter --------------------------------------------------------------------------------

    def _choose(self) -> None:
        if self.device == "hpu":
            self.cards = parse_ids(self.env.get("HABANA_VISIBLE_MODULES")) or recorded_cards(self.folder)
            chosen, named = hlsmi.hl_smi_program(env=self.env)
            program: str | None = chosen if named else hlsmi.find_hl_smi(env=self.env)
            if not program:
                self.note = "hl-smi not found: the cards' energy is not measured"
                return
            self._program = [program, *hlsmi.query_args(HLSMI_FIELDS, loop_s=max(1, round(self.interval_s)),
                                                        header=False, units=False)]
            self.source, self.energy_source = "hl-smi", SOURCE_HLSMI
            self._parse = self._hlsmi_parser(hlsmi.CsvStream(HLSMI_FIELDS))
            self._throttle_program = [program, "-q"]
            self._hl_smi = program
        elif self.device == "cuda":
            self.cards = parse_ids(self.env.get("CUDA_VISIBLE_DEVICES")) or recorded_cards(self.folder)
            program = shutil.which("nvidia-smi", path=self.env.get("PATH"))
            if not program:
                self.note = "nvidia-smi not found: the GPUs' energy is not measured"
                return
            from gaudi_gui.core import host
            self._program = [program, *host.nvidia_args(), "-l", str(max(1, round(self.interval_s)))]
            self.source, self.energy_source = "nvidia-smi", SOURCE_NVIDIA
            self._parse = self._nvidia_parser()
        else:
            self.cards = None
            if rapl_zones():
                self.source, self.energy_source = "rapl", SOURCE_RAPL
            else:
                self.note = f"no readable RAPL counter under {rapl_root()}"

    def _wanted(self, sample: DeviceSample) -> bool:
        if not self.cards:
            return True
        ident = sample.module_id if sample.kind == "hpu" and sample.module_id is not None else sample.index
        return ident in self.cards

    # -- start / stop ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._started_at = self.clock()
        self._choose()
        with contextlib.suppress(Exception):  # a cross-check: whatever it meets, the meter goes on
            self.counter = energy_counter(self.device, self.cards, self.counter_module)
            if self.counter is not None:
                self.counter.start = self.counter.read()
        try:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            self._fd = os.open(self.folder / METER_NAME, flags, 0o600)
        except OSError as exc:
            self.errors.append(f"cannot write {METER_NAME}: {exc}")
        if self.compile_base:  # the bridge writes its file whether or not hl-smi can be read
            self._compile_thread = threading.Thread(target=self._run_compile_watch, name="run-meter-compile",
                                                    daemon=True)
            self._compile_thread.start()
        if self.source == "hl-smi" and self._connect_agent():
            target: Callable[[], None] = self._run_agent
        elif self.source in ("hl-smi", "nvidia-smi"):
            self.samples_from = self.samples_from or f"own {self.source} loop"
            target = self._run_tool
        elif self.source == "rapl":
            target = self._run_rapl
        else:
            return
        self._thread = threading.Thread(target=target, name="run-meter", daemon=True)
        self._thread.start()
        if self._throttle_program:
            self._throttle_thread = threading.Thread(target=self._run_throttle, name="run-meter-throttle",
                                                     daemon=True)
            self._throttle_thread.start()

    def stop(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """End the sampler (and hl-smi's whole tree), write meter-summary.json (with ``extra``'s
        keys added: the compile meter), return the summary."""
        if self._summary is not None:
            return self._summary
        self._stop.set()
        agent = self._agent
        if agent is not None:
            agent.close()  # the reader's receive ends at once; the agent drops this listener
        self._end_child()
        self._end_child(self._throttle_proc)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._throttle_thread is not None:
            self._throttle_thread.join(timeout=10)
        if self._compile_thread is not None:
            self._compile_thread.join(timeout=10)
        if self.compile_base:
            with contextlib.suppress(Exception):  # an observer: nothing here may fail the summary
                self.check_compiles()  # the last steps and dumps, after the ranks have ended
        with self._lock:
            # The last read's state holds until the run's end, for at most one poll interval.
            end = self.clock()
            for clock in self.throttle.values():
                clock.close(end, cap=self.throttle_interval_s)
        if self.source == "rapl":
            self._sample_rapl()  # the last stretch up to the end
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        summary = self.summary(final=True)
        summary.update(extra or {})
        if self.counter is not None:
            with contextlib.suppress(Exception):
                self.counter.end = self.counter.read()
                self.counter.close()
                summary.update(with_counter(summary, self.counter.result()))
        if "generated_tokens" in summary:  # a Serve or Evaluate run: what the energy bought
            summary.update(token_figures(summary))
        if self.compile_warning is not None:
            summary["compile_warning"] = self.compile_warning
        with contextlib.suppress(Exception):  # an observer: the summary is written whatever this meets
            pace = self.pace()
            if pace is not None:
                summary["rates"] = pace
        try:
            atomic.write_json(self.folder / SUMMARY_NAME, summary)
        except OSError as exc:
            summary["note"] = (summary["note"] + "; " if summary["note"] else "") + f"not saved: {exc}"
        self._summary = summary
        return summary

    def summary(self, final: bool = False) -> dict[str, Any]:
        """The summary so far (a live strip may ask while it runs)."""
        with self._lock:
            wall = self.clock() - self._started_at
            count = None if self.device == "cpu" else (
                len(self.cards) if self.cards else len(self.accounts.cards) or None)
            note = "; ".join(x for x in (self.note, *self.errors[-3:]) if x)
            if self.restarts:
                note = "; ".join(x for x in (note, f"{self.source} restarted {self.restarts} time(s)") if x)
            out = summarize(self.accounts, source=self.source, energy_source=self.energy_source,
                            wall_s=wall, card_count=count, cards=self.cards or (), kind=self.device,
                            note=note, counter_energy_j=self._rapl_energy_uj / 1e6
                            if self.source == "rapl" and self.accounts.samples > 1 else None,
                            counter_covered_s=self._rapl_span[1] - self._rapl_span[0]
                            if self._rapl_span else None)
            if self._throttle_program:
                out["throttle"] = throttle_summary(self.throttle, interval_s=self.throttle_interval_s,
                                                   wall_s=wall, note="; ".join(self._throttle_errors[-2:]))
        out["final"] = final
        if self.samples_from:
            out["samples_from"] = self.samples_from
        # When the meter started (this machine's clock): what the run's share of coverage is counted
        # from, for a reader of meter.jsonl (the export's coverage series).
        out["started_t"] = round(self._started_at, 3)
        return out

    def _end_child(self, proc: subprocess.Popen[str] | None = None) -> None:
        """SIGKILL the tool (or ``proc``), its group and every descendant, then reap it. Only while it
        is not yet reaped: an unreaped child (a zombie included) still owns its pid and group id, so
        nobody else's process can be hit."""
        proc = proc or self._proc
        if proc is None or proc.returncode is not None:
            return
        from gaudi_gui.core.proctree import ProcessTree
        ProcessTree(proc.pid).kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)

    # -- writing --------------------------------------------------------------------------------------

    def _write(self, record: Mapping[str, Any]) -> None:
        if self._fd < 0:
            return
        data = (json.dumps(record, separators=(",", ":"), allow_nan=False, default=str) + "\n").encode()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        except (OSError, ValueError) as exc:  # a full disk must not end the run
            self.errors.append(f"cannot write {METER_NAME}: {exc}")
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def take(self, t: float, samples: Iterable[DeviceSample]) -> None:
        """One snapshot of the tool: the run's cards are accounted and written as one line."""
        # The time as written (ms): the summary's energy and every reader of meter.jsonl (the export,
        # a follower) integrate the same instants (full precision here, ms in the file, once made
        # them differ by up to 1e-4 of the energy: a fresh clone's failure).
        t = round(t, 3)
        cards = []
        for s in samples:
            if not self._wanted(s):
                continue
            cards.append({"name": f"module {s.module_id}" if s.kind == "hpu" and s.module_id is not None
                          else f"{'GPU' if s.kind == 'cuda' else 'index'} {s.index}",
                          "module_id": s.module_id, "index": s.index,
                          "power_w": clean(s.power_w), "utilization": clean(s.utilization),
                          "memory_used_mib": clean(s.memory_used_mib),
                          "memory_total_mib": clean(s.memory_total_mib),
                          "temperature_c": clean(s.temperature_c)})
        if not cards:
            return
        with self._lock:
            self.accounts.add(t, cards)
        self._write({"t": t, "source": self.source, "cards": cards})

    # -- hl-smi / nvidia-smi --------------------------------------------------------------------------

    @staticmethod
    def _hlsmi_parser(stream: hlsmi.CsvStream) -> Callable[[str], tuple[list[DeviceSample] | None, bool]]:
        def feed(line: str) -> tuple[list[DeviceSample] | None, bool]:
            # Before the card set is known, a snapshot ends only when the next period's first row
            # comes (the index wraps); after, on its own last row.
            by_wrap = stream.known is None
            return stream.feed_line(line), by_wrap
        return feed

    @staticmethod
    def _nvidia_parser() -> Callable[[str], tuple[list[DeviceSample] | None, bool]]:
        from gaudi_gui.core import host
        pending: dict[int, DeviceSample] = {}

        def feed(line: str) -> tuple[list[DeviceSample] | None, bool]:
            found = host.parse_nvidia(line)
            if not found:
                return None, True
            sample = found[0]
            done = None
            if sample.index in pending:  # the index wrapped: one loop period is whole
                done = sorted(pending.values(), key=lambda s: s.index)
                pending.clear()
            pending[sample.index] = sample
            return done, True
        return feed

    def _run_tool(self) -> None:
        while not self._stop.is_set():
            try:
                proc = subprocess.Popen(self._program, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        stdin=subprocess.DEVNULL, text=True, errors="replace", bufsize=1,
                                        env=self.env, start_new_session=True, close_fds=True)
            except OSError as exc:
                self.errors.append(f"cannot start {self._program[0]}: {exc}")
                return
            self._proc = proc
            if self._stop.is_set():  # stop() came while it started: it may have missed this child
                self._end_child()
            assert proc.stdout is not None
            with proc.stdout:
                self._read(proc.stdout)
            self._end_child()  # EOF: it ended or closed its output; its helpers go too, then it is reaped
            if self._stop.is_set():
                return
            self.restarts += 1
            self._stop.wait(self.restart_s)

    # -- the agent's device loop (one hl-smi -l per machine) ------------------------------------------

    def _connect_agent(self) -> bool:
        """Listen to this machine's agent's device loop instead of starting a second ``hl-smi -l`` on
        the same cards; False (the meter's own loop, said in ``samples_from``) where no agent answers or
        ``GAUDI_GUI_NO_AGENT=1``. The agent is not started for this: a run without one meters itself."""
        if self.env.get("GAUDI_GUI_NO_AGENT") == "1":
            self.samples_from = "own hl-smi loop (GAUDI_GUI_NO_AGENT=1)"
            return False
        from gaudi_gui.core import agentwire
        sock = None
        try:
            sock = agentwire.try_connect()
            if sock is None:
                self.samples_from = "own hl-smi loop (no agent answers)"
                return False
            conn = agentwire.Connection(sock, client="meter")
            conn.request("devices.watch", timeout=10.0, interval_s=self.interval_s, hl_smi=self._hl_smi)
        except (OSError, agentwire.AgentError, ValueError) as exc:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
            self.samples_from = f"own hl-smi loop (the agent did not serve devices: {exc})"
            return False
        self._agent = conn
        self.samples_from = "agent"
        return True

    def _run_agent(self) -> None:
        """Take each ``devices`` event's cards; where the agent goes away mid-run, go on with the
        meter's own loop (said in ``samples_from``)."""
        from gaudi_gui.core import agentwire
        conn = self._agent
        try:
            while not self._stop.is_set():
                for message in conn.stream(timeout=0.5):
                    if message.get("ev") == agentwire.Ev.DEVICES.value:
                        self._take_event(message)
                    if self._stop.is_set():
                        return
        except (OSError, agentwire.AgentError, ValueError) as exc:
            if self._stop.is_set():
                return
            self.errors.append(f"the agent's device loop ended: {exc}")
        finally:
            conn.close()
        if not self._stop.is_set():
            self.samples_from = "agent, then own hl-smi loop (the agent went away)"
            self._run_tool()

    def _take_event(self, message: Mapping[str, Any]) -> None:
        if message.get("source") != "hl-smi":
            return  # a stand-in (nvidia-smi, the host's CPU) is not the run's cards
        samples = []
        for data in message.get("samples") or []:
            with contextlib.suppress(ValueError):
                samples.append(DeviceSample.from_dict(data))
        t = finite(message.get("t"))
        if samples:
            self.take(t if t is not None else self.clock(), samples)

    def _read(self, stdout: IO[str]) -> None:
        parse = self._parse
        assert parse is not None
        last_line_t = self.clock()
        for line in stdout:
            now = self.clock()
            snapshot, by_wrap = parse(line)
            if snapshot:
                # A snapshot ended by the next period's first row is stamped with its own last row.
                self.take(last_line_t if by_wrap else now, snapshot)
            last_line_t = now

    def pace(self) -> dict[str, Any] | None:
        """The run's steady-state pace from its logged steps (``meter_work.pace``)."""
        return pace(self.folder)

    # -- throttle reasons (hl-smi -q) -----------------------------------------------------------------

    #: Reads of the throttle reasons that fail in a row before the meter stops asking (a release
    #: whose -q lists no card, or no reasons: asking every 5 s for hours would only cost).
    THROTTLE_GIVE_UP = 3

    def _run_throttle(self) -> None:
        failed = 0
        while not self._stop.is_set():
            before = len(self._throttle_errors)
            self.read_throttle()
            failed = failed + 1 if len(self._throttle_errors) > before else 0
            if failed >= self.THROTTLE_GIVE_UP:
                self._throttle_errors.append(
                    f"throttle reasons not read after {failed} failed reads in a row")
                return
            if self._stop.wait(self.throttle_interval_s):
                return

    def read_throttle(self) -> None:
        """One ``hl-smi -q``: the run's cards' active throttle reasons, accounted and written as one
        line ``{"t", "source": "hl-smi -q", "throttle": {card: [reasons]}}``."""
        try:
            proc = subprocess.Popen(self._throttle_program, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    stdin=subprocess.DEVNULL, text=True, errors="replace", env=self.env,
                                    start_new_session=True, close_fds=True)
        except OSError as exc:
            self._throttle_errors.append(f"cannot start hl-smi -q: {exc}")
            return
        self._throttle_proc = proc
        try:
            out, _ = proc.communicate(timeout=THROTTLE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._end_child(proc)  # with its whole tree
            self._throttle_errors.append(f"hl-smi -q gave no answer in {THROTTLE_TIMEOUT_S:g} s")
            return
        if self._stop.is_set() and proc.returncode and proc.returncode < 0:
            return  # ended by stop(): not a read
        t = self.clock()
        seen: dict[str, list[str] | None] = {}
        for card in hlsmi.parse_query(out)[1]:
            name, module = query_card_name(card)
            if self.cards and module not in self.cards:
                continue
            seen[name] = throttle_reasons(card)
        if not seen:
            self._throttle_errors.append("hl-smi -q listed none of the run's cards")
            return
        with self._lock:
            for name, reasons in seen.items():
                self.throttle.setdefault(name, ThrottleClock()).add(t, reasons)
        self._write({"t": round(t, 3), "source": "hl-smi -q", "throttle": seen})

    # -- compilations that keep rising after warm-up (Gaudi) ------------------------------------------

    def _run_compile_watch(self) -> None:
        while not self._stop.wait(self.compile_interval_s):
            try:
                self.check_compiles()
            except Exception as exc:  # an observer: the run goes on, and this is said in its note
                self.errors.append(f"compile watch: {exc}")
                return

    def check_compiles(self) -> dict[str, Any] | None:
        """Read the run's new logged steps and its compile meter; the first time compilations are
        found rising after warm-up, write a "warning" event into the run's events.jsonl (once)."""
        from gaudi_gui.core import compile_rise
        from gaudi_gui.core.events import EventFollower, EventWriter
        if self._step_follower is None:
            self._step_follower = EventFollower(self.events_path)
        for event in self._step_follower.read():
            step, when = event.get("step"), finite(event.get("time"))
            if (event.get("type") in (EventType.METRICS, EventType.STEP) and isinstance(step, int)
                    and not isinstance(step, bool) and when is not None and not event.get("summary")
                    and (not self._steps or step > self._steps[-1][1])):
                self._steps.append((when, step))
        if self.compile_warning is not None:
            return self.compile_warning
        warmup = self.rise_warmup_steps or compile_rise.RISE_WARMUP_STEPS
        finding = compile_rise.compile_rise(compile_rise.compile_timeline(self.compile_base), self._steps,
                                            warmup_steps=warmup)
        if finding is None:
            return None
        finding = compile_rise.named(finding, self.part)
        self.compile_warning = finding
        with contextlib.suppress(OSError), EventWriter(self.events_path) as events:
            events.write(EventType.WARNING, **finding)
        return finding

    # -- RAPL -----------------------------------------------------------------------------------------

    def _run_rapl(self) -> None:
        self._rapl_prev: dict[Path, int] = {}
        self._rapl_t = 0.0
        self._sample_rapl()
        while not self._stop.wait(self.interval_s):
            self._sample_rapl()

    def _sample_rapl(self) -> None:
        prev: dict[Path, int] = getattr(self, "_rapl_prev", {})
        now = self.clock()
        delta_uj, values = 0, {}
        for zone, wrap in rapl_zones():
            try:
                value = int((zone / "energy_uj").read_text().strip())
            except (OSError, ValueError):
                continue
            values[zone] = value
            if zone in prev:
                step = value - prev[zone]
                if step < 0 and wrap:  # the counter wrapped at max_energy_range_uj
                    step += wrap + 1
                delta_uj += max(0, step)  # a wrap of unknown range: that second is lost, not negative
        first = not prev
        self._rapl_prev = values
        watts = None
        if not first and now > self._rapl_t:
            watts = delta_uj / 1e6 / (now - self._rapl_t)
        self._rapl_t = now
        with self._lock:
            self._rapl_energy_uj += delta_uj
            if values:
                self._rapl_span = (self._rapl_span[0] if self._rapl_span else now, now)
            self.accounts.add(now, [{"name": "CPU package", "power_w": watts}] if not first else [])
        record: dict[str, Any] = {"t": round(now, 3), "source": "rapl",
                                  "energy_uj": {z.name: v for z, v in values.items()}}
        if watts is not None:
            record["power_w"] = round(watts, 3)
        self._write(record)
