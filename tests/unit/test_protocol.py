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
