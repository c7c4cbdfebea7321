"""The one device poller of the window: a long-running ``hl-smi -Q ... -l N`` child, parsed as it streams.

Design:
- ONE hl-smi process in loop mode (cheaper than spawning hl-smi every tick); its CSV stream goes
  through ``core.hlsmi.CsvStream`` which keys rows on the ``index`` column.
- It is restarted with exponential back-off when it dies, and killed when it hangs (no complete
  snapshot for ``HANG_FACTOR`` intervals); the plain ``hl-smi`` table is read every
  ``devices/process_interval_s`` for the Compute Processes section (the only place PIDs appear).
- When hl-smi is absent or fails, the poller falls back to the host (psutil) and, when ``nvidia-smi``
  is on PATH, NVIDIA GPUs, and says in ``state``/``message`` what was run and what it printed.
- Real hl-smi's ``-l`` takes whole seconds, so the poller always passes ``max(1, round(interval))``.
  The interval setting may be fractional: it drives the host timer and the hang watchdog. Tests make
  the fake hl-smi faster with its own ``FAKE_HLSMI_PERIOD`` variable, never through ``-l``.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core import hlsmi, host
from gaudi_gui.core.devices import DeviceSample, History, ProcessInfo, attach_processes
from gaudi_gui.services.device_selection import DeviceSelection
from gaudi_gui.services.process import EXIT_FAILED_TO_START, ProcessRunner, describe_exit
from gaudi_gui.services.settings import Settings

if TYPE_CHECKING:
    import numpy as np

#: Poller states (the ``state`` of ``state_changed``).
STATE_STARTING = "starting"
STATE_OK = "ok"  # hl-smi streams samples
STATE_ABSENT = "absent"  # hl-smi is not installed / not found
STATE_FAILED = "failed"  # hl-smi ran but died, hung or printed nothing usable (retrying)
STATE_STOPPED = "stopped"

#: A loop that prints no complete snapshot for this many intervals counts as hung.
HANG_FACTOR = 3.0
#: hl-smi needs time to open the driver before its first line.
FIRST_OUTPUT_GRACE_S = 10.0
HISTORY_SECONDS = 3600
#: Quiet time (ms) after a row that ends a snapshot's burst of rows.
SETTLE_MS = 60


def resolve_program(settings: Settings) -> tuple[str, bool]:
    """(program, explicit): settings ``devices/hl_smi``, then ``GAUDI_GUI_HL_SMI``, then ``hl-smi``."""
    chosen = str(settings.get("devices/hl_smi") or "").strip()
    if chosen:
        return chosen, True
    env = os.environ.get("GAUDI_GUI_HL_SMI", "").strip()
    if env:
        return env, True
    return "hl-smi", False


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

    def __init__(self, settings: Settings, selection: DeviceSelection, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._settings = settings
        self._selection = selection
        self.interval_s = max(0.05, float(settings.get("devices/interval_s")))
        self.process_interval_s = max(0.1, float(settings.get("devices/process_interval_s")))
        #: First and largest restart delay; tests make them small.
        self.backoff_initial_s = 1.0
        self.backoff_max_s = 30.0
        self._backoff_s = self.backoff_initial_s
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
        self._source = "hl-smi"
        self._hung_for: float | None = None
        self._discard_exit = False

        self._runner = ProcessRunner(self, parse_protocol=False, tail_lines=40)
        self._runner.started.connect(self._on_started)
        self._runner.line_received.connect(self._on_line)
        self._runner.finished.connect(self._on_finished)

        self._table_runner = ProcessRunner(self, parse_protocol=False, tail_lines=400)
        self._table_runner.finished.connect(self._on_table_finished)
        self._nvidia_runner = ProcessRunner(self, parse_protocol=False, tail_lines=64)
        self._nvidia_runner.finished.connect(self._on_nvidia_finished)

        self._restart_timer = QTimer(self)
        self._restart_timer.setSingleShot(True)
        self._restart_timer.timeout.connect(self._launch)
        # Rows of one snapshot arrive in one burst: a short quiet gap ends it, so the first snapshot
        # does not wait for the second period's first row (the card count is unknown until then).
        self._settle = QTimer(self)
        self._settle.setSingleShot(True)
        self._settle.setInterval(SETTLE_MS)
        self._settle.timeout.connect(self._flush_pending)
        self._watchdog = QTimer(self)
        self._watchdog.setInterval(250)
        self._watchdog.timeout.connect(self._check_hang)
        self._host_timer = QTimer(self)
        self._host_timer.timeout.connect(self._poll_host)
        self._table_timer = QTimer(self)
        self._table_timer.timeout.connect(self._poll_table)
        settings.value_changed.connect(self._on_setting_changed)
        # The job selection survives restarts even before the Devices tab is built.
        saved = [i for i in settings.get("devices/selected_modules") if isinstance(i, int)]
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
        return " ".join(self._argv)

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
        self._backoff_s = self.backoff_initial_s
        # The first host sample comes after one interval: start() runs before the window's first
        # paint, which should not wait for psutil and numpy.
        self._host_timer.start(int(self.interval_s * 1000))
        self._launch()

    def stop(self) -> None:
        """Stop every child and timer (called when the window closes)."""
        self._running = False
        for timer in (self._restart_timer, self._watchdog, self._host_timer, self._table_timer,
                      self._settle):
            timer.stop()
        # The killed loop's exit belongs to this stop, not to a run started right after (restart).
        self._discard_exit = self._runner.is_running()
        for runner in (self._runner, self._table_runner, self._nvidia_runner):
            if runner.is_running():
                runner.kill_tree()
        self._set_state(STATE_STOPPED, "stopped")

    def restart(self) -> None:
        """Re-read the settings and start over (after the user changed the program or interval)."""
        self.stop()
        self.interval_s = max(0.05, float(self._settings.get("devices/interval_s")))
        self.process_interval_s = max(0.1, float(self._settings.get("devices/process_interval_s")))
        self.start()

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
        if self._runner.is_running():
            # A restart killed the old loop; it is reaped asynchronously. Try again shortly.
            self._restart_timer.start(50)
            return
        self._program, self._explicit = resolve_program(self._settings)
        args = hlsmi.query_args(hlsmi.QUERY_FIELDS, loop_s=loop_seconds(self.interval_s))
        self._argv = [self._program, *args]
        self._stream = hlsmi.CsvStream()
        self._snapshots_this_run = 0
        self._last_output_at = time.monotonic()
        if self._state in (STATE_STOPPED, STATE_STARTING):
            self._set_state(STATE_STARTING, f"running {self.command}")
        self._runner.start(self._program, args)

    def _on_started(self, pid: int) -> None:
        self._last_output_at = time.monotonic()
        self._watchdog.start()

    def _on_line(self, stream: str, line: str) -> None:
        if stream != "stdout":
            return
        self._last_output_at = time.monotonic()
        snapshot = self._stream.feed_line(line)
        if snapshot:
            self._on_snapshot(snapshot)
        self._settle.start()

    def _flush_pending(self) -> None:
        if self._stream.expected:
            # The card count is known: a quiet gap mid-burst (a loaded machine) must not publish half
            # a snapshot; the next row completes it.
            return
        snapshot = self._stream.flush()
        if snapshot and self._running:
            self._on_snapshot(snapshot)

    def _on_snapshot(self, samples: list[DeviceSample]) -> None:
        self._snapshots_this_run += 1
        self._backoff_s = self.backoff_initial_s
        self._source = "hl-smi"
        if self._state != STATE_OK:
            self._stop_fallback()
            self._set_state(STATE_OK, f"{self.command}: {len(samples)} card(s)")
            if not self._table_timer.isActive():
                self._table_timer.start(int(self.process_interval_s * 1000))
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
        if self._discard_exit:
            self._discard_exit = False
            return
        self._watchdog.stop()
        self._settle.stop()
        # The last rows of a dying loop may be a partial snapshot: keep them.
        tail = self._stream.flush()
        if tail and self._running:
            self._on_snapshot(tail)
        if not self._running:
            return
        said = self._said(self._runner.tail(8), self._stream.errors[-3:])
        if status == EXIT_FAILED_TO_START:
            reason = self._runner.tail(1)[0] if self._runner.tail(1) else "could not start"
            if self._explicit or shutil.which(self._program) is not None:
                self._fail(STATE_FAILED, f"{self.command}\n{reason}\nCheck the hl-smi path in the "
                                         "settings or GAUDI_GUI_HL_SMI.", retry=True)
            else:
                self._fail(STATE_ABSENT, f"{self.command}\n{reason}\nhl-smi comes with Intel Gaudi's "
                                         "driver package (habanalabs-firmware-tools); install it or set "
                                         "GAUDI_GUI_HL_SMI. Showing the host instead.", retry=False)
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
        self._fail(STATE_FAILED, detail + f"\nretrying in {self._backoff_s:.0f} s", retry=True)

    @staticmethod
    def _said(lines: list[str], errors: list[str]) -> str:
        out = [line for line in lines if line.strip()]
        out += [f"(unparsed: {e})" for e in errors]
        return "\n".join(out[-10:])

    def _fail(self, state: str, message: str, *, retry: bool) -> None:
        self._table_timer.stop()
        self._set_state(state, message)
        self._start_fallback()
        if retry and self._running:
            self._restart_timer.start(int(self._backoff_s * 1000))
            self._backoff_s = min(self.backoff_max_s, self._backoff_s * 2)

    def _set_state(self, state: str, message: str) -> None:
        if state == self._state and message == self._message:
            return
        self._state = state
        self._message = message
        self.state_changed.emit(state, message)

    # -- processes (plain table) ----------------------------------------------------------------------

    def _poll_table(self) -> None:
        if not self._program:
            return
        if self._table_runner.is_running():
            # A table read that outlives two periods is stuck: end it so the next one can run.
            if time.time() - self._table_runner.started_at > max(10.0, 2 * self.process_interval_s):
                self._table_runner.kill_tree()
            return
        self._table_runner.start(self._program, [])

    def _on_table_finished(self, code: int, status: str) -> None:
        if not self._running or code != 0:
            return
        result = hlsmi.parse_table("\n".join(self._table_runner.tail(400)))
        self._processes = host.describe_processes(result.processes)
        if self._latest and self._latest[0].kind == "hpu":
            attach_processes(self._latest, self._processes)
        self.processes_received.emit(list(self._processes))

    # -- fallback: host + nvidia-smi ------------------------------------------------------------------

    def _start_fallback(self) -> None:
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

    def _poll_host(self) -> None:
        sample = host.host_sample()
        self.history_store.add([sample])
        self.host_received.emit(sample)
        if self._source == "nvidia-smi" and self._state in (STATE_ABSENT, STATE_FAILED):
            self._poll_nvidia()

    def _poll_nvidia(self) -> None:
        if self._nvidia_runner.is_running() or not self._running:
            return
        self._nvidia_runner.start("nvidia-smi", host.nvidia_args())

    def _on_nvidia_finished(self, code: int, status: str) -> None:
        if not self._running or self._state == STATE_OK:
            return
        if code != 0:
            self._source = "host"
            return
        samples = host.parse_nvidia("\n".join(self._nvidia_runner.tail(64)))
        if samples:
            self._publish(samples)

