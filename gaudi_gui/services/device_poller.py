"""The window's device poller: it paints the cards of this machine's (or a saved host's) agent.

The window runs no hl-smi (issue 38, "a thin window"): the ONE ``hl-smi -Q ... -l N`` loop of a machine
is its agent's (``gaudi_gui.agent.devices``: snapshots keyed on the card index, hang watchdog, back-off
restarts, the plain table's processes, the nvidia-smi / host fallback, each child in its own session).
A saved host's loop is that host's agent's, reached over this machine's agent's one ssh session to it.

Here:
- ``start`` asks the agent for its loop at this poller's intervals (``devices.watch``) and subscribes to
  its ``devices`` and ``devices_state`` events; ``stop`` unwatches; ``restart`` asks for a new loop
  (Retry, a changed hl-smi program or interval). A reconnected agent (or a host link that came back)
  is asked again; an agent that does not answer is asked again with back-off.
- Each ``devices`` event becomes ``samples_received`` (the cards), ``host_received`` (the machine's
  CPU/RAM), ``processes_received`` (when they changed) and ``rows_rejected`` (when the agent counted
  more unparsable rows); each ``devices_state`` the ``state`` / ``message`` / ``command`` shown.
- The history, the job's card selection (restored from the settings at construction) and the kind of
  cards shown are kept here, for the views.
- The interval settings are clamped here (``interval_note`` says what was done) before they are sent;
  the agent clamps again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core import hlsmi
from gaudi_gui.core.agentwire import Ev
from gaudi_gui.core.backoff import Backoff
from gaudi_gui.core.device_loop import (
    STATE_ABSENT,
    STATE_FAILED,
    STATE_OK,
    STATE_STARTING,
    STATE_STOPPED,
    STATE_UNREACHABLE,
    clamp_interval,
)
from gaudi_gui.core.devices import DeviceSample, History, ProcessInfo, attach_processes
from gaudi_gui.services.device_selection import DeviceSelection
from gaudi_gui.services.settings import SCHEMA, Settings, setting_bounds

if TYPE_CHECKING:
    import numpy as np

    from gaudi_gui.services.agent_client import AgentClient

__all__ = ["INTERVAL_RANGE_S", "PROCESS_INTERVAL_RANGE_S", "STATE_ABSENT", "STATE_FAILED", "STATE_OK",
           "STATE_STARTING", "STATE_STOPPED", "STATE_UNREACHABLE", "DevicePoller", "clamp_interval"]

HISTORY_SECONDS = 3600
#: Interval bounds (seconds), the settings schema's: below, hl-smi would be spawned too often; above,
#: any sense of "live" ends. A non-number or NaN takes the default.
INTERVAL_RANGE_S = setting_bounds("devices/interval_s")
PROCESS_INTERVAL_RANGE_S = setting_bounds("devices/process_interval_s")


class DevicePoller(QObject):
    """The cards of one machine for the whole window, as its agent's device loop reads them (Gaudi via
    hl-smi, else NVIDIA, else the host only)."""

    #: A complete snapshot of the accelerator cards: list[DeviceSample] sorted by index.
    samples_received = Signal(list)
    #: The host's CPU and RAM (a DeviceSample of kind "host"), every interval.
    host_received = Signal(object)
    #: The processes on the cards (list[ProcessInfo]), read from the hl-smi table now and then.
    processes_received = Signal(list)
    #: (state, human-readable message): one of the STATE_* values and what was run / what it said.
    state_changed = Signal(str, str)
    #: hl-smi printed rows that could not be parsed, or values that are not numbers: (how many since the
    #: agent's loop began, the newest reason). Skipped rows and unknown values are counted, never dropped
    #: silently.
    rows_rejected = Signal(int, str)

    def __init__(self, settings: Settings, selection: DeviceSelection, parent: QObject | None = None,
                 host: Any = None, *, agent: Callable[[], AgentClient]) -> None:
        super().__init__(parent)
        #: The machine's agent (``AppServices.ensure_agent``): the cards come from ITS one device loop
        #: (``devices.watch``, its ``devices`` events; a host's through the agent's one ssh session to
        #: it). Called at each start, never before: making the poller starts nothing.
        self._agent = agent
        self._client: AgentClient | None = None
        self._watch_token = 0
        self._agent_command = ""
        #: The ``core.remote.Host`` whose cards this poller shows (None: this machine); its loop is
        #: the host's agent's, and a lost link to it is the "unreachable" state.
        self.host = host if host is not None and not host.is_local else None
        self._settings = settings
        self._selection = selection
        self.interval_s = 1.0
        self.process_interval_s = 5.0
        #: What clamping did to the interval settings ("" when they were used as given).
        self.interval_note = ""
        self._read_intervals()
        #: First and largest delay before asking an agent that did not answer again; tests change them.
        self.backoff_initial_s = 1.0
        self.backoff_max_s = 30.0
        self._backoff = Backoff(self.backoff_initial_s, self.backoff_max_s)
        self.history_store = History(capacity=max(60, int(HISTORY_SECONDS / max(self.interval_s, 1.0))))
        self._state = STATE_STOPPED
        self._message = ""
        self._running = False
        self._latest: list[DeviceSample] = []
        self._processes: list[ProcessInfo] = []
        self._rejected_total = 0
        self._source = "hl-smi"

        #: Asks the agent again after it refused or did not answer ``devices.watch``.
        self._restart_timer = QTimer(self)
        self._restart_timer.setSingleShot(True)
        self._restart_timer.timeout.connect(self._watch)
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
        """The hl-smi command line the agent last ran (for the state panel)."""
        line = self._agent_command
        return f"{line} (on {self.host.name})" if self.host is not None else line

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
        self._start_via_agent()

    def stop(self) -> None:
        """Stop watching (called when the window closes); the agent ends its loop when nobody listens."""
        self._running = False
        self._stop_via_agent()

    def restart(self) -> None:
        """Re-read the settings and ask for a new loop (after the user changed the program or interval,
        or pressed Retry)."""
        if self._running:
            self._read_intervals()
            self._watch(restart=True)  # the agent's loop anew, listeners kept
            return
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
        """Publish a snapshot as if it came from the agent (benchmarks and demos drive the panel so)."""
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
        client = self._client = self._agent()
        host = self.host.name if self.host is not None else None
        client.subscribe(Ev.DEVICES, self._on_agent_devices, host=host)
        client.subscribe(Ev.DEVICES_STATE, self._on_agent_state, host=host)
        if host is not None:  # the link's state, said by this machine's agent
            client.subscribe(Ev.HOST, self._on_host_link, key=host)
        client.state_changed.connect(self._on_agent_link)
        note = f" ({self.interval_note})" if self.interval_note else ""
        self._set_state(STATE_STARTING, f"asking {self._where()} for its device loop{note}")
        self._watch()

    def _stop_via_agent(self) -> None:
        self._watch_token += 1
        self._restart_timer.stop()
        client, self._client = self._client, None
        if client is None:
            self._set_state(STATE_STOPPED, "stopped")
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
            # The Devices setting, else this window's GAUDI_GUI_HL_SMI; neither: the agent's choice.
            program, explicit = hlsmi.hl_smi_program(str(self._settings.get("devices/hl_smi") or ""))
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
        words = hlsmi.clean_text(str(message.get("message") or ""))
        if message.get("state") == "up":
            self._watch()  # the host's agent (maybe a new one) hears this poller's intervals again
        elif message.get("state") == "connecting" and not message.get("retry_s"):
            self._set_state(STATE_STARTING, words)  # a first try, not a failed one
        else:
            self._set_state(STATE_UNREACHABLE, words)

    def _on_agent_state(self, message: dict[str, Any]) -> None:
        if not self._running or not message.get("state"):
            return
        if message["state"] == STATE_STOPPED:
            return  # not started yet (the watch's reply) or ended for others: this poller asked for it
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

