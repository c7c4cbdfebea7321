from __future__ import annotations

import math

import pytest

from gaudi_gui.core import protocol


def test_round_trip_event_and_command() -> None:
    line = protocol.event("token", text="héllo\nworld", n=3)
    assert "\n" not in line
    assert protocol.decode(line) == {"type": "token", "text": "héllo\nworld", "n": 3}
    assert protocol.decode(protocol.command("cancel")) == {"cmd": "cancel"}


def test_plain_text_is_not_a_message() -> None:
    assert protocol.decode("{'loss': '6.209'}") is None
    assert protocol.decode("") is None


@pytest.mark.parametrize("before", ["[rank0]: ", " ", "text ", "col_@gaudi-gui,", "\ufeff"])
def test_prefix_inside_a_line_is_ordinary_text(before: str) -> None:
    # Only a line that begins with the prefix is a message: a dataset row or a column name that
    # quotes an event must not spoof one (it once put final_loss -123 into status.json).
    spoof = before + protocol.event("finished", final_loss=-123)
    assert protocol.decode(spoof) is None


def test_trailing_newline_and_carriage_return_are_ignored() -> None:
    assert protocol.decode(protocol.event("x") + "\r\n") == {"type": "x"}


@pytest.mark.parametrize("payload", [
    "[" * 100_000,                       # RecursionError inside json
    "{" * 100_000,
    '{"type": "x", "n": ' + "9" * 5000 + "}",  # int longer than Python's digit limit: ValueError
    '{"type": "x", "s": "\\ud800"}' + "]" * 10,
])
def test_choking_lines_raise_protocol_error_only(payload: str) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(protocol.PREFIX + payload)


def test_non_text_is_a_protocol_error() -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(b"@gaudi-gui {}")  # type: ignore[arg-type]


def test_nan_and_inf_become_null() -> None:
    line = protocol.event("metrics", loss=math.nan, lr=math.inf, nested=[1.0, -math.inf])
    assert protocol.decode(line) == {"type": "metrics", "loss": None, "lr": None, "nested": [1.0, None]}


@pytest.mark.parametrize("payload", ["{", "[1, 2]", '{"no_type": 1}', "nonsense"])
def test_corrupt_messages_raise(payload: str) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(protocol.PREFIX + payload)


def test_encode_requires_type_or_cmd() -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.encode({"x": 1})



_STOPPED_MID_PRINT = """
import signal
from gaudi_gui.commands.serve import _Out

class Stop(Exception):
    pass

def raise_stop(*_):
    raise Stop()

signal.signal(signal.SIGUSR1, raise_stop)  # as serve's SIGTERM handler: raise, then say "stopped"
out = _Out(events=True)
stops = 0
while stops < 200:
    try:
        while True:
            out.state("ready", "x" * 170)
    except Stop:
        stops += 1
        out.state("stopped", "stopped")
"""


def test_a_stop_signal_in_the_middle_of_an_event_never_leaves_half_a_line() -> None:
    # CI read '{"type":"serve_request",...}@gaudi-gui {"type":"serve_state",...' after SIGTERM: serve's
    # handler raised between print's two writes (the text, then its newline), so the next event was
    # glued to the cut one. Before the fix this child wrote ~230 broken lines of ~300,000; now none.
    import signal
    import subprocess
    import sys
    import threading
    import time

    child = subprocess.Popen([sys.executable, "-c", _STOPPED_MID_PRINT], stdout=subprocess.PIPE, text=True)
    broken: list[str] = []
    count = [0]

    def pump() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            count[0] += 1
            try:
                protocol.decode(line.rstrip("\n"))
            except protocol.ProtocolError:
                broken.append(line[:120])

    reader = threading.Thread(target=pump)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while count[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        while child.poll() is None and time.monotonic() < deadline:
            child.send_signal(signal.SIGUSR1)
            time.sleep(0.005)
    finally:
        child.kill()
        child.wait(30)
        reader.join(30)
    assert count[0] > 1000
    assert broken == []
