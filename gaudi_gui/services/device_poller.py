"""The one device poller of the window: a long-running ``hl-smi -Q ... -l N`` child, parsed as it streams.

Design:
- ONE hl-smi process in loop mode (cheaper than spawning hl-smi every tick); its CSV stream goes
  through ``core.hlsmi.CsvStream`` which keys rows on the ``index`` column. A snapshot ends when the
  index wraps or when every known card (from the plain table, read at launch, or the previous complete
  snapshot) has reported, never on a timer: rows seconds apart still make one whole snapshot, and a
  stall publishes no partial snapshot (the hang watchdog below ends it). Unparsable rows are counted
  and reported through ``rows_rejected``.
- Every child of the poller is started, read and reaped on a thread of its own
  (``services.threaded_process.ThreadedRunner``): the window's thread neither forks nor reads pipes,
  it gets each read's complete lines and the child's end as queued events.
- Every hl-smi child runs in its own session (process group). Many installs wrap hl-smi in a script
  that forks helpers (``hl-smi.real "$@" | cat``): stop, restart and the hang watchdog kill the whole
  group plus every descendant seen while it ran, and a run that ended by itself has its group swept,
  so no helper outlives its hl-smi.
- It is restarted with exponential back-off when it dies, and killed when it hangs (no complete
  snapshot for ``HANG_FACTOR`` intervals); the plain ``hl-smi`` table is read every
  ``devices/process_interval_s`` for the Compute Processes section (the only place PIDs appear).
- When hl-smi is absent or fails, the poller falls back to the host (psutil) and, when ``nvidia-smi``
  is on PATH, NVIDIA GPUs, and says in ``state``/``message`` what was run and what it printed.
- On a remote host the fallbacks run on the host: when the guard there cannot start hl-smi (exit 127,
  "gaudi-gui guard: cannot run ..."), the poller runs the host's own ``gaudi-gui devices --json`` (its
  CPU/RAM and nvidia-smi GPUs) once per interval, one short ssh call through the multiplexed
  connection at a time, and parses the JSON here. Card processes of a host always come from the host
  (its hl-smi table, or the JSON, described by the host's psutil), never from this machine's table.
- Real hl-smi's ``-l`` takes whole seconds, so the poller always passes ``max(1, round(interval))``.
  The interval setting may be fractional: it drives the host timer and the hang watchdog. Tests make
  the fake hl-smi faster with its own ``FAKE_HLSMI_PERIOD`` variable, never through ``-l``.
- Intervals are clamped here, where they feed QTimer (whose milliseconds are a C int): a stored 3e6,
  inf or NaN must not raise OverflowError in ``QTimer.start``; ``interval_note`` says what was done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import shutil
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core import hlsmi
from gaudi_gui.core.agentwire import Ev
from gaudi_gui.core.backoff import Backoff
from gaudi_gui.core.device_loop import (
    FIRST_OUTPUT_GRACE_S,
    HANG_FACTOR,
    STATE_ABSENT,
    STATE_FAILED,
    STATE_OK,
    STATE_STARTING,
    STATE_STOPPED,
    STATE_UNREACHABLE,
    clamp_interval,
)
from gaudi_gui.core.devices import DeviceSample, History, ProcessInfo, attach_processes
from gaudi_gui.core.health import Roots, gaudi_evidence
from gaudi_gui.services.device_selection import DeviceSelection
from gaudi_gui.services.phased_timer import PhasedTimer
from gaudi_gui.services.process import EXIT_FAILED_TO_START, describe_exit
from gaudi_gui.services.settings import SCHEMA, Settings, setting_bounds
from gaudi_gui.services.threaded_process import ThreadedRunner

if TYPE_CHECKING:
    import numpy as np

    from gaudi_gui.services.agent_client import AgentClient

# ``gaudi_gui.core.host`` (and with it psutil, ~40 ms) is imported by the methods that read the host
# or nvidia-smi: this module is loaded before the window's first paint, they all run after it.

HISTORY_SECONDS = 3600
#: Interval bounds (seconds), the settings schema's: below, hl-smi would be spawned too often; above,
#: QTimer's int ms and any sense of "live" end. A non-number or NaN takes the default.
INTERVAL_RANGE_S = setting_bounds("devices/interval_s")
PROCESS_INTERVAL_RANGE_S = setting_bounds("devices/process_interval_s")
#: ``gaudi-gui guard`` on a host says so, and exits 127, when it cannot start its command.
GUARD_CANNOT_RUN = "gaudi-gui guard: cannot run"
#: ``--timeout`` of a host's ``gaudi-gui devices`` (each nvidia-smi call there); a call of ours that
#: outlives REMOTE_STUCK_S (or three intervals) is killed so the next one can run.
REMOTE_DEVICES_TIMEOUT_S = 10.0
REMOTE_STUCK_S = 30.0
#: A host's ``devices --json`` prints a few hundred lines; more is not that command's output.
REMOTE_MAX_LINES = 20000


def resolve_program(settings: Settings) -> tuple[str, bool]:
    """(program, explicit): settings ``devices/hl_smi``, then ``GAUDI_GUI_HL_SMI``, then ``hl-smi``."""
    return hlsmi.hl_smi_program(str(settings.get("devices/hl_smi") or ""))


def _digest_table(lines: list[str], *, local: bool) -> tuple[hlsmi.TableResult, list[ProcessInfo]]:
    """The plain table's cards and processes, on the table child's thread: user and command line
    come from this machine's process table, so only for local cards."""
    result = hlsmi.parse_table("\n".join(lines))
    if not local:
        return result, result.processes
    from gaudi_gui.core import host

    return result, host.describe_processes(result.processes)


def loop_seconds(interval_s: float) -> int:
    """The ``-l`` argument for real hl-smi: a whole number of seconds, at least 1."""
    if not math.isfinite(interval_s):
        return 1
    return max(1, round(interval_s))


class DevicePoller(QObject):
    """Streams device samples for the whole window (Gaudi via hl-smi, else NVIDIA, else host only)."""

    #: A complete snapshot of the accelerator cards: list[DeviceSample] sorted by index.
    samples_received = Signal(list)
    #: The host's CPU and RAM (a DeviceSample of kind "host"), every interval.
    host_received = Signal(object)
    #: The processes on the cards (list[ProcessInfo]), read from the hl-smi table now and then.
    processes_received = Signal(list)
    #: (state, human-readable message): one of the STATE_* values and what was run / what it said.
    state_changed = Signal(str, str)
    #: hl-smi printed rows that could not be parsed, or values that are not numbers: (how many since
    #: start(), the newest reason). Skipped rows and unknown values are counted, never dropped silently.
    rows_rejected = Signal(int, str)

    def __init__(self, settings: Settings, selection: DeviceSelection, parent: QObject | None = None,
                 host: Any = None, agent: Callable[[], AgentClient] | None = None) -> None:
        super().__init__(parent)
        #: The machine's agent (``AppServices.ensure_agent``): where given, the cards come from ITS one
        #: device loop (``devices.watch``, its ``devices`` events; a host's through the agent's one ssh
        #: session to it) and this poller starts no child of its own. Without one (tests of the
        #: loop's own rules, the agent's absence) it runs hl-smi itself as below.
        self._agent = agent
        self._client: AgentClient | None = None
        self._watch_token = 0
        self._agent_command = ""
        #: The ``core.remote.Host`` whose cards this poller reads (None: this machine). A remote
        #: host's hl-smi loop runs there over ssh under ``gaudi-gui guard`` (it ends with the
        #: connection), parsed here by the same parser; a failed or dropped connection is the
        #: "unreachable" state, retried with back-off like a dead hl-smi.
        self.host = host if host is not None and not host.is_local else None
        self._settings = settings
        self._selection = selection
        self.interval_s = 1.0
        self.process_interval_s = 5.0
        #: What clamping did to the interval settings ("" when they were used as given).
        self.interval_note = ""
        self._read_intervals()
        #: First and largest restart delay; tests make them small.
        self.backoff_initial_s = 1.0
        self.backoff_max_s = 30.0
        self._backoff = Backoff(self.backoff_initial_s, self.backoff_max_s)
        self.history_store = History(capacity=max(60, int(HISTORY_SECONDS / max(self.interval_s, 1.0))))
        self._state = STATE_STOPPED
        self._message = ""
        self._running = False
        self._program = ""
        self._explicit = False
        self._argv: list[str] = []
        self._snapshots_this_run = 0
        self._last_output_at = 0.0
        self._latest: list[DeviceSample] = []
        self._processes: list[ProcessInfo] = []
        self._stream = hlsmi.CsvStream()
        #: Indices of the cards of the last complete snapshot or table: seeds the next stream.
        self._known_cards: list[int] = []
        self._rejected_total = 0
        self._rejected_seen = 0
        self._source = "hl-smi"
        self._hung_for: float | None = None
        self._discard_exit = False

        self._runner = ThreadedRunner(self, tail_lines=40)
        self._runner.started.connect(self._on_started)
        self._runner.line_received.connect(self._on_line)
        self._runner.finished.connect(self._on_finished)

        self._table_runner = ThreadedRunner(self, tail_lines=400)
        self._table_runner.finished.connect(self._on_table_finished)
        self._table_for_count = False
        self._nvidia_runner = ThreadedRunner(self, tail_lines=64)
        self._nvidia_runner.finished.connect(self._on_nvidia_finished)
        #: A host without hl-smi: its ``gaudi-gui devices --json``, one call per interval.
        self._remote_runner = ThreadedRunner(self, tail_lines=40)
        self._remote_runner.line_received.connect(self._on_remote_line)
        self._remote_runner.finished.connect(self._on_remote_finished)
        self._remote_out: list[str] = []
        #: The host's fallback runs (its hl-smi cannot be started there).
        self._remote_fallback = False
        #: The state and message that the fallback's answers stand for (restored after a failed call).
        self._fallback_state: tuple[str, str] = (STATE_ABSENT, "")

        self._restart_timer = QTimer(self)
        self._restart_timer.setSingleShot(True)
        self._restart_timer.timeout.connect(self._launch)
        self._watchdog = QTimer(self)
        self._watchdog.setInterval(250)
        self._watchdog.timeout.connect(self._check_hang)
        self._host_timer = QTimer(self)
        self._host_timer.timeout.connect(self._poll_host)
        # Hosts' tables apart, not together (each host's first period longer by its phase).
        self._table_timer = PhasedTimer(self.host.name if self.host is not None else None, self)
        self._table_timer.timeout.connect(self._poll_table)
        settings.value_changed.connect(self._on_setting_changed)
        # The job selection survives restarts even before the Devices tab is built.
        saved = ([i for i in settings.get("devices/selected_modules") if isinstance(i, int)]
                 if self.host is None else [])
        if saved:
            selection.set_selected(saved)

    # -- public ---------------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        return self._state

    @property
    def message(self) -> str:
        return self._message

    @property
    def source(self) -> str:
        """Where the card samples come from: 'hl-smi', 'nvidia-smi' or 'host'."""
        return self._source

    @property
    def command(self) -> str:
        """The hl-smi command line as last run (for the state panel)."""
        line = self._agent_command if self._agent is not None else " ".join(self._argv)
        return f"{line} (on {self.host.name})" if self.host is not None else line

    def _start_hl_smi(self, runner: ThreadedRunner, args: list[str],
                      digest: Callable[[list[str]], Any] | None = None) -> None:
        if self.host is None:
            runner.start(self._program, args, new_session=True, digest=digest)
            return
        argv = self.host.wrap(self.host.guard_argv([self._program, *args], grace=0))
        # stdin stays open: the guard on the host ends hl-smi when it closes (this app or ssh gone).
        runner.start(argv[0], argv[1:], new_session=True, stdin_open=True, digest=digest)

    def latest(self) -> list[DeviceSample]:
        return list(self._latest)

    def processes(self) -> list[ProcessInfo]:
        return list(self._processes)

    def history(self, key: str, metric: str, since: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(timestamps, values) numpy arrays of one card's metric (see ``core.devices.METRICS``)."""
        return self.history_store.series(key, metric, since)

    def is_running(self) -> bool:
        return self._running

    def start(self) -> None:
        if self._running:
            return
        self._running = True
        self._backoff = Backoff(self.backoff_initial_s, self.backoff_max_s)
        self._rejected_total = 0
        self._rejected_seen = 0
        # The first host sample comes after one interval: start() runs before the window's first
        # paint, which should not wait for psutil and numpy.
        if self._agent is not None:
            self._start_via_agent()
            return
        if self.host is None:  # a remote host's CPU and RAM are not this machine's psutil
            self._host_timer.start(int(self.interval_s * 1000))
        self._launch()

    def stop(self) -> None:
        """Stop every child and timer (called when the window closes)."""
        self._running = False
        if self._agent is not None:
            self._stop_via_agent()
        for timer in (self._restart_timer, self._watchdog, self._host_timer, self._table_timer):
            timer.stop()
        # The killed loop's exit belongs to this stop, not to a run started right after (restart).
        self._discard_exit = self._runner.is_running()
        self._remote_fallback = False
        for runner in (self._runner, self._table_runner, self._nvidia_runner, self._remote_runner):
            if runner.is_running():
                runner.kill_tree()
        self._set_state(STATE_STOPPED, "stopped")

    def restart(self) -> None:
        """Re-read the settings and start over (after the user changed the program or interval)."""
        if self._agent is not None and self._running:
            self._read_intervals()
            self._watch(restart=True)  # the agent's loop anew (Retry), listeners kept
            return
        self.stop()
        self._read_intervals()
        self.start()

    def _read_intervals(self) -> None:
        notes = []
        for attr, key, bounds in (("interval_s", "devices/interval_s", INTERVAL_RANGE_S),
                                  ("process_interval_s", "devices/process_interval_s",
                                   PROCESS_INTERVAL_RANGE_S)):
            try:
                raw = self._settings.get(key)
            except Exception as exc:  # a broken stored value must not stop the poller
                raw = f"unreadable ({exc})"
            value, note = clamp_interval(raw, SCHEMA[key].default, bounds)
            setattr(self, attr, value)
            if note:
                notes.append(f"{key}: {note}")
        self.interval_note = "; ".join(notes)

    def _on_setting_changed(self, key: str, value: object) -> None:
        if key in ("devices/hl_smi", "devices/interval_s", "devices/process_interval_s") and self._running:
            # A new program or interval takes a new hl-smi loop (its -l is fixed when it starts).
            self.restart()

    def feed_samples(self, samples: list[DeviceSample]) -> None:
        """Publish a snapshot as if it came from hl-smi (benchmarks and demos drive the panel so)."""
        self._publish(samples)

    # -- hl-smi loop ----------------------------------------------------------------------------------

    def _launch(self) -> None:
        if not self._running:
            return
        if self._agent is not None:
            self._watch()
            return
        if self._runner.is_running():
            # A restart killed the old loop; it is reaped asynchronously. Try again shortly.
            self._restart_timer.start(50)
            return
        if self.host is not None:
            # The host's saved path, else its PATH: this machine's setting and variable are not the host's.
            self._program, self._explicit = hlsmi.hl_smi_program(self.host.hl_smi, env={})
        else:
            self._program, self._explicit = resolve_program(self._settings)
        args = hlsmi.query_args(hlsmi.QUERY_FIELDS, loop_s=loop_seconds(self.interval_s))
        self._argv = [self._program, *args]
        self._stream = hlsmi.CsvStream(expected=self._known_cards or None)
        self._rejected_seen = 0
        self._snapshots_this_run = 0
        self._last_output_at = time.monotonic()
        if self._state in (STATE_STOPPED, STATE_STARTING):
            note = f" ({self.interval_note})" if self.interval_note else ""
            self._set_state(STATE_STARTING, f"running {self.command}{note}")
        # Its own session: a wrapper script's helpers share its process group, which a stop kills.
        self._start_hl_smi(self._runner, list(args))
        if not self._known_cards:
            # The plain table lists every card: its count ends the first snapshot without waiting
            # for the index to wrap one period later.
            self._table_for_count = True
            self._poll_table()

    def _on_started(self, pid: int) -> None:
        if not self._running or self._discard_exit:
            return  # a loop killed before its start was delivered: no watchdog for it (it ticked on)
        self._last_output_at = time.monotonic()
        self._watchdog.start()

    def _on_line(self, stream: str, line: str) -> None:
        if stream != "stdout" or not self._running or self._discard_exit:
            # A stopped (or killed and restarting) loop's last reads, queued before the kill: they
            # must start nothing (a snapshot of them restarted the table timer of a stopped poller).
            return
        self._last_output_at = time.monotonic()
        snapshot = self._stream.feed_line(line)
        self._report_rejected()
        if snapshot:
            self._on_snapshot(snapshot)

    def _report_rejected(self) -> None:
        seen = self._stream.rejected + self._stream.bad_values
        new = seen - self._rejected_seen
        if new > 0:
            self._rejected_seen = seen
            self._rejected_total += new
            reason = hlsmi.clean_text(self._stream.errors[-1]) if self._stream.errors else ""
            self.rows_rejected.emit(self._rejected_total, reason)

    def _on_snapshot(self, samples: list[DeviceSample]) -> None:
        if not self._running:
            return  # nothing of a stopped poller starts again (its table timer, a table read)
        self._snapshots_this_run += 1
        self._known_cards = [s.index for s in samples]
        self._backoff = Backoff(self.backoff_initial_s, self.backoff_max_s)
        self._source = "hl-smi"
        if self._state != STATE_OK:
            self._stop_fallback()
            self._set_state(STATE_OK, f"{self.command}: {len(samples)} card(s)")
            if not self._table_timer.isActive():
                self._table_timer.start_phased(self.process_interval_s)
                self._poll_table()
        self._publish(samples)

    def _publish(self, samples: list[DeviceSample]) -> None:
        now = time.time()
        for s in samples:
            if not s.timestamp:
                s.timestamp = now
        if self._processes and samples and samples[0].kind == "hpu":
            attach_processes(samples, self._processes)
        self._latest = list(samples)
        self.history_store.add(samples)
        kind = samples[0].kind if samples else "cpu"
        if kind == "hpu":
            ids = [s.module_id if s.module_id is not None else s.index for s in samples]
            self._selection.set_kind("hpu", ids)
        elif kind == "cuda":
            self._selection.set_kind("cuda", [s.index for s in samples])
        self.samples_received.emit(samples)

    def _check_hang(self) -> None:
        if not self._runner.is_running() or self._runner.is_stopping():
            return
        limit = max(HANG_FACTOR * self.interval_s, 1.0)
        if self._snapshots_this_run == 0:
            limit = max(limit, FIRST_OUTPUT_GRACE_S)
        silent = time.monotonic() - self._last_output_at
        if silent > limit:
            self._hung_for = silent
            self._runner.kill_tree()

    def _on_finished(self, code: int, status: str) -> None:
        # Helpers of a wrapper that exited on its own are still in its group: none may outlive it.
        self._runner.sweep()
        if self._discard_exit:
            self._discard_exit = False
            return
        self._watchdog.stop()
        # The last rows of a dying loop: a whole snapshot only when no card set is known yet (then
        # they are all hl-smi printed); a partial one is dropped, never shown as every card.
        tail = self._stream.flush()
        if tail and self._running:
            self._on_snapshot(tail)
        if not self._running:
            return
        said = hlsmi.clean_text(self._said(self._runner.tail(8), self._stream.errors[-3:]))
        if self.host is not None and (code == 255 or status == EXIT_FAILED_TO_START):
            from gaudi_gui.core.remote import explain_ssh_failure
            _kind, why = explain_ssh_failure(self.host.name, "\n".join(self._runner.tail(8)))
            if status == EXIT_FAILED_TO_START:
                why = self._runner.tail(1)[0] if self._runner.tail(1) else "ssh could not start"
            self._fail(STATE_UNREACHABLE, f"{why}\nretrying in {self._backoff.delay_s:.0f} s", retry=True)
            return
        if self.host is not None and code == 3:
            self._fail(STATE_FAILED, f"{said}\nretrying in {self._backoff.delay_s:.0f} s", retry=True)
            return
        cannot = next((ln for ln in self._runner.tail(8) if ln.startswith(GUARD_CANNOT_RUN)), None)
        if self.host is not None and code == 127 and cannot is not None:
            self._host_lacks_hl_smi(hlsmi.clean_text(cannot))
            return
        if status == EXIT_FAILED_TO_START:
            reason = self._runner.tail(1)[0] if self._runner.tail(1) else "could not start"
            evidence = "" if self._explicit or self.host is not None else gaudi_evidence(Roots.from_env())
            if self._explicit or shutil.which(self._program) is not None:
                self._fail(STATE_FAILED, f"{self.command}\n{reason}\nCheck the hl-smi path in the "
                                         "settings or GAUDI_GUI_HL_SMI.", retry=True)
            elif evidence:
                # Gaudi cards are here (/dev/accel nodes, the driver): hl-smi missing is a failure,
                # never "absent" as on a CPU machine.
                self._fail(STATE_FAILED, f"{self.command}\n{reason}\nno hl-smi, but {evidence}: the cards "
                                         "cannot be read. Install habanalabs-firmware-tools or give its "
                                         "path in the settings or GAUDI_GUI_HL_SMI.", retry=True)
            else:
                # Each fact once: the Devices tab adds what it shows instead.
                self._fail(STATE_ABSENT, f"{self.command}\n{reason}\nhl-smi comes with Intel Gaudi's "
                                         "driver package (habanalabs-firmware-tools); install it or set "
                                         "GAUDI_GUI_HL_SMI.", retry=False)
            return
        hung = self._hung_for
        self._hung_for = None
        if hung is not None:
            what = f"printed nothing for {hung:.1f} s and was killed (hung)"
        else:
            what = describe_exit(code, status)
        detail = f"{self.command}\n{what}" + (f"\nit said:\n{said}" if said else "\nit printed nothing")
        if self._snapshots_this_run == 0:
            detail += "\nno card rows were read: is the habanalabs driver loaded and a card present?"
        self._fail(STATE_FAILED, detail + f"\nretrying in {self._backoff.delay_s:.0f} s", retry=True)

    @staticmethod
    def _said(lines: list[str], errors: list[str]) -> str:
        out = [line for line in lines if line.strip()]
        out += [f"(unparsed: {e})" for e in errors]
        return "\n".join(out[-10:])

    def _host_lacks_hl_smi(self, said: str) -> None:
        """The guard on the host could not start hl-smi: show the host's CPU/RAM and NVIDIA GPUs,
        read there. Not on the host's PATH is "absent" (as locally, not retried); an hl-smi path set
        for the host that cannot be run is a failure of that setting, retried."""
        assert self.host is not None
        name = self.host.name
        self._remote_fallback = True
        if self._explicit:
            retry = f"retrying in {self._backoff.delay_s:.0f} s"
            state, message = STATE_FAILED, (f"{self._program} cannot be run on {name}: showing its CPU/RAM "
                                            f"and NVIDIA GPUs meanwhile\n{self.command}\n{said}\nCheck "
                                            f"the host's hl-smi path.\n{retry}")
        else:
            state, message = STATE_ABSENT, (f"no hl-smi on {name}: showing its CPU/RAM and NVIDIA GPUs\n"
                                            f"{self.command}\n{said}\nhl-smi comes with Intel Gaudi's "
                                            "driver package (habanalabs-firmware-tools).")
        self._fallback_state = (state, message)
        self._fail(state, message, retry=self._explicit)

    def _fail(self, state: str, message: str, *, retry: bool) -> None:
        self._table_timer.stop()
        # The fallback first: listeners of state_changed read ``source`` to say what is shown instead.
        self._start_fallback()
        self._set_state(state, message)
        if retry and self._running:
            self._restart_timer.start(int(self._backoff.next() * 1000))

    def _set_state(self, state: str, message: str) -> None:
        if state == self._state and message == self._message:
            return
        self._state = state
        self._message = message
        self.state_changed.emit(state, message)

    # -- through the agent: its one device loop --------------------------------------------------------

    def _where(self) -> str:
        return f"{self.host.name}'s agent" if self.host is not None else "this machine's agent"

    def _start_via_agent(self) -> None:
        assert self._agent is not None
        client = self._client = self._agent()
        host = self.host.name if self.host is not None else None
        client.subscribe(Ev.DEVICES, self._on_agent_devices, host=host)
        client.subscribe(Ev.DEVICES_STATE, self._on_agent_state, host=host)
        if host is not None:  # the link's state, said by this machine's agent
            client.subscribe(Ev.HOST, self._on_host_link, key=host)
        client.state_changed.connect(self._on_agent_link)
        self._set_state(STATE_STARTING, f"asking {self._where()} for its device loop")
        self._watch()

    def _stop_via_agent(self) -> None:
        self._watch_token += 1
        self._restart_timer.stop()
        client, self._client = self._client, None
        if client is None:
            return
        host = self.host.name if self.host is not None else None
        with contextlib.suppress(RuntimeError):  # its C++ side went first (the window closing)
            client.state_changed.disconnect(self._on_agent_link)
        client.request("devices.unwatch", None, **({"host": host} if host else {}))
        client.unsubscribe(Ev.DEVICES, self._on_agent_devices, host=host)
        client.unsubscribe(Ev.DEVICES_STATE, self._on_agent_state, host=host)
        if host is not None:
            client.unsubscribe(Ev.HOST, self._on_host_link, key=host)
        self._set_state(STATE_STOPPED, "stopped")

    def _watch(self, *, restart: bool = False) -> None:
        """Ask the agent for its loop at this poller's intervals (again after a reconnect)."""
        if not self._running or self._client is None:
            return
        if self.host is not None:
            hl_smi = self.host.hl_smi  # the host's saved path, else its PATH there
        else:
            program, explicit = resolve_program(self._settings)
            hl_smi = program if explicit else ""
        self._watch_token += 1
        token = self._watch_token
        args: dict[str, Any] = {"interval_s": self.interval_s, "process_interval_s": self.process_interval_s,
                                "hl_smi": hl_smi, "restart": restart}
        if self.host is not None:
            args["host"] = self.host.name
        self._client.request("devices.watch", lambda reply: self._on_watched(token, reply), **args)

    def _on_watched(self, token: int, reply: dict[str, Any]) -> None:
        if token != self._watch_token or not self._running:
            return
        if not reply.get("ok"):
            words = str(reply.get("error") or f"{self._where()} did not answer")
            state = STATE_UNREACHABLE if self.host is not None else STATE_FAILED
            delay = self._backoff.next()
            self._set_state(state, f"{words}\nasking again in {delay:.0f} s")
            self._restart_timer.start(int(delay * 1000))
            return
        self._backoff = Backoff(self.backoff_initial_s, self.backoff_max_s)
        if reply.get("note"):
            self.interval_note = str(reply["note"])
        self._on_agent_state(reply)

    def _on_agent_link(self, state: str, message: str) -> None:
        if state == "up" and self._running:
            self._watch()  # a new agent knows nobody's interval: ask again
        elif state != "up" and self._running and self.host is None:
            self._set_state(STATE_STARTING, f"{message} (the device loop is the agent's)")

    def _on_host_link(self, message: dict[str, Any]) -> None:
        if not self._running:
            return
        if message.get("state") == "up":
            self._watch()  # the host's agent (maybe a new one) hears this poller's intervals again
        else:
            self._set_state(STATE_UNREACHABLE, hlsmi.clean_text(str(message.get("message") or "")))

    def _on_agent_state(self, message: dict[str, Any]) -> None:
        if not self._running or not message.get("state"):
            return
        self._agent_command = str(message.get("command") or self._agent_command)
        self._set_state(str(message["state"]), str(message.get("message") or ""))

    def _on_agent_devices(self, message: dict[str, Any]) -> None:
        if not self._running:
            return
        now = time.time()
        try:
            cards = [DeviceSample.from_dict(d) for d in message.get("samples") or []]
            processes = [ProcessInfo.from_dict(p) for p in message.get("processes") or []]
            machine = DeviceSample.from_dict(message["machine"]) if message.get("machine") else None
        except (TypeError, ValueError, KeyError) as exc:
            self._set_state(STATE_FAILED, f"{self._where()} sent samples this window cannot read: {exc}")
            return
        self._source = str(message.get("source") or "hl-smi")
        rejected = int(message.get("rejected") or 0)
        if rejected > self._rejected_total:
            self._rejected_total = rejected
            self.rows_rejected.emit(rejected, hlsmi.clean_text(str(message.get("rejected_reason") or "")))
        if cards:
            if self.host is not None:
                for sample in cards:  # the host's clock is not this machine's: placed at arrival
                    sample.timestamp = now
            self._known_cards = [s.index for s in cards]
            self._publish(cards)
        elif not self._latest or self._latest[0].kind != "hpu":
            self._selection.set_kind("cpu", [])
        if processes != self._processes:  # after the cards: a process is named by its card's module
            self._processes = processes
            self.processes_received.emit(list(processes))
        if machine is not None:
            machine.timestamp = now
            self.history_store.add([machine])
            self.host_received.emit(machine)

    # -- processes (plain table) ----------------------------------------------------------------------

    def _poll_table(self) -> None:
        if not self._program or not self._running:
            return
        if self._table_runner.is_running():
            # A table read that outlives two periods is stuck: end it so the next one can run.
            if time.time() - self._table_runner.started_at > max(10.0, 2 * self.process_interval_s):
                self._table_runner.kill_tree()
            return
        # Parsed (and this machine's processes described by psutil) on the table's own thread.
        self._start_hl_smi(self._table_runner, [], functools.partial(_digest_table, local=self.host is None))

    def _on_table_finished(self, code: int, status: str) -> None:
        self._table_runner.sweep()
        for_count, self._table_for_count = self._table_for_count, False
        if not self._running or code != 0 or self._table_runner.digested is None:
            return
        result, processes = self._table_runner.digested
        if for_count and result.samples and self._runner.is_running():
            snapshot = self._stream.expect(s.index for s in result.samples)
            if snapshot:
                self._on_snapshot(snapshot)
        self._processes = processes
        if self._latest and self._latest[0].kind == "hpu":
            attach_processes(self._latest, self._processes)
        self.processes_received.emit(list(self._processes))

    # -- fallback: host + nvidia-smi ------------------------------------------------------------------

    def _start_fallback(self) -> None:
        if self.host is not None:
            if not self._remote_fallback:
                # Its hl-smi failed or ssh did: the host's fallback is read only where hl-smi
                # cannot start (else each call would run a failing hl-smi there again).
                self._source = "hl-smi"
                return
            if self._source not in ("nvidia-smi", "host"):
                self._source = "host"  # until its first answer says whether it has NVIDIA GPUs
            if not self._host_timer.isActive():
                self._host_timer.start(int(self.interval_s * 1000))
                self._poll_remote_devices()
            return
        if shutil.which("nvidia-smi") is not None:
            self._source = "nvidia-smi"
            self._poll_nvidia()
        else:
            self._source = "host"
            if not self._latest or self._latest[0].kind != "hpu":
                self._selection.set_kind("cpu", [])

    def _stop_fallback(self) -> None:
        if self._nvidia_runner.is_running():
            self._nvidia_runner.kill_tree()
        if self.host is not None:
            self._remote_fallback = False
            self._host_timer.stop()
            if self._remote_runner.is_running():
                self._remote_runner.kill_tree()

    def _poll_host(self) -> None:
        if self.host is not None:
            self._poll_remote_devices()
            return
        from gaudi_gui.core import host

        sample = host.host_sample()
        self.history_store.add([sample])
        self.host_received.emit(sample)
        if self._source == "nvidia-smi" and self._state in (STATE_ABSENT, STATE_FAILED):
            self._poll_nvidia()

    def _poll_nvidia(self) -> None:
        if self._nvidia_runner.is_running() or not self._running:
            return
        from gaudi_gui.core import host

        self._nvidia_runner.start("nvidia-smi", host.nvidia_args(), new_session=True)

    def _on_nvidia_finished(self, code: int, status: str) -> None:
        self._nvidia_runner.sweep()
        if not self._running or self._state == STATE_OK:
            return
        if code != 0:
            self._source = "host"
            return
        from gaudi_gui.core import host

        samples = host.parse_nvidia("\n".join(self._nvidia_runner.tail(64)))
        if samples:
            self._publish(samples)

    # -- fallback on a host: its own ``gaudi-gui devices --json`` -------------------------------------

    def _poll_remote_devices(self) -> None:
        if not self._running or not self._remote_fallback or self.host is None:
            return
        if self._remote_runner.is_running():
            # Calls never overlap; one that outlives its limit is stuck (a hung link): end it.
            limit = max(REMOTE_STUCK_S, 3 * self.interval_s)
            if time.time() - self._remote_runner.started_at > limit:
                self._remote_runner.kill_tree()
            return
        self._remote_out = []
        # Not under the guard: a second interpreter per tick would cost the host CPU, and the command
        # ends by itself (each nvidia-smi call within --timeout) when this side is gone.
        # The fallback runs because the host's hl-smi could not be started there: its own `devices`
        # reads what its PATH has instead (said as the saved path's failure), not that path again.
        host = dataclasses.replace(self.host, hl_smi="")
        argv = host.wrap(host.gaudi_gui_argv(
            "devices", "--json", "--timeout", f"{REMOTE_DEVICES_TIMEOUT_S:g}"))
        self._remote_runner.start(argv[0], argv[1:], new_session=True)

    def _on_remote_line(self, stream: str, line: str) -> None:
        if stream == "stdout" and len(self._remote_out) < REMOTE_MAX_LINES:
            self._remote_out.append(line)

    def _on_remote_finished(self, code: int, status: str) -> None:
        self._remote_runner.sweep()
        if not self._running or not self._remote_fallback or self.host is None:
            return
        name = self.host.name
        what = f"gaudi-gui devices --json on {name}"
        if code == 255 or status == EXIT_FAILED_TO_START:
            from gaudi_gui.core.remote import explain_ssh_failure
            _kind, why = explain_ssh_failure(name, "\n".join(self._remote_runner.tail(8)))
            if status == EXIT_FAILED_TO_START:
                why = self._remote_runner.tail(1)[0] if self._remote_runner.tail(1) else "ssh could not start"
            self._set_state(STATE_UNREACHABLE, f"{why}\n({what}: trying again every {self.interval_s:g} s)")
            return
        said = hlsmi.clean_text("\n".join(ln for ln in self._remote_runner.tail(6) if ln.strip()))
        # Exit 1: the host's hl-smi ran and failed; its fallback is printed all the same.
        if code not in (0, 1):
            said = said or "it printed nothing"
            self._set_state(STATE_FAILED, f"{what}: {describe_exit(code, status)}\n{said}")
            return
        try:
            data = json.loads("\n".join(self._remote_out))
            if not isinstance(data, list):
                raise ValueError(f"a JSON list was expected, not {type(data).__name__}")
            samples = [DeviceSample.from_dict(item) for item in data]
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            why = hlsmi.clean_text(str(exc))
            self._set_state(STATE_FAILED, f"{what}: its output could not be read ({why})")
            return
        self._set_state(*self._fallback_state)
        self._show_remote(samples)

    def _show_remote(self, samples: list[DeviceSample]) -> None:
        # The host's clock is not this machine's: the charts place a sample at its arrival.
        now = time.time()
        for s in samples:
            s.timestamp = now
        cards = [s for s in samples if s.kind in ("hpu", "cuda")]
        hosts = [s for s in samples if s.kind == "host"]
        if cards:
            self._source = {"hpu": "hl-smi", "cuda": "nvidia-smi"}[cards[0].kind]
            # Processes on the cards as the host saw and described them (its hl-smi table, its psutil).
            self._processes = [p for s in cards for p in s.processes]
            self._publish(cards)
            self.processes_received.emit(list(self._processes))
        else:
            self._source = "host"
            if not self._latest or self._latest[0].kind != "hpu":
                self._selection.set_kind("cpu", [])
        for sample in hosts[:1]:
            self.history_store.add([sample])
            self.host_received.emit(sample)
