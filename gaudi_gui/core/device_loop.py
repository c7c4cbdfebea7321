"""What the one device loop of a machine (``gaudi_gui.agent.devices``) and its clients (the window's
``services.device_poller``, the run meter) agree on, Qt-free: the loop's states, its timing rules, and
the words for a tool that ended.

Real hl-smi's ``-l`` takes whole seconds, so the loop always passes ``max(1, round(interval))``; the
interval itself may be fractional: it drives the hang watchdog and the host sample. Tests make the fake
hl-smi faster with its own ``FAKE_HLSMI_PERIOD`` variable, never through ``-l``.
"""

from __future__ import annotations

import math
import signal

#: The loop's states (``Ev.DEVICES_STATE``'s ``state``).
STATE_STARTING = "starting"
STATE_OK = "ok"  # hl-smi streams samples
STATE_ABSENT = "absent"  # hl-smi is not installed / not found (on a host: the guard there cannot start it)
STATE_UNREACHABLE = "unreachable"  # a remote host's ssh failed (auth, network, dropped): retrying
STATE_FAILED = "failed"  # hl-smi ran but died, hung or printed nothing usable (retrying)
STATE_STOPPED = "stopped"

#: A loop that prints no complete snapshot for this many intervals counts as hung.
HANG_FACTOR = 3.0
#: hl-smi needs time to open the driver before its first line.
FIRST_OUTPUT_GRACE_S = 10.0
#: Interval bounds (seconds), the settings schema's ``devices/interval_s`` and ``process_interval_s``.
INTERVAL_RANGE_S = (0.1, 3600.0)
PROCESS_INTERVAL_RANGE_S = (0.5, 3600.0)


def clamp_interval(value: object, default: float, bounds: tuple[float, float]) -> tuple[float, str | None]:
    """(seconds, note): ``value`` as a float within ``bounds``; the note says what was changed."""
    low, high = bounds
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return default, f"{value!r} is not a number of seconds; {default:g} s is used"
    if math.isnan(seconds):
        return default, f"{value!r} is not a number of seconds; {default:g} s is used"
    if seconds < low:
        return low, f"{seconds:g} s is below {low:g} s; {low:g} s is used"
    if seconds > high:
        return high, f"{seconds:g} s is above {high:g} s; {high:g} s is used"
    return seconds, None


def loop_seconds(interval_s: float) -> int:
    """The ``-l`` argument for real hl-smi: a whole number of seconds, at least 1."""
    if not math.isfinite(interval_s):
        return 1
    return max(1, round(interval_s))


def describe_returncode(code: int | None) -> str:
    """A sentence for a person: 'exited with code 1', 'killed by signal 9 (SIGKILL)'."""
    if code is None:
        return "did not end"
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return "crashed"
    return f"exited with code {code}"
