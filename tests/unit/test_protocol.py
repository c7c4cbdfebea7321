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


def test_prefix_inside_a_line_is_found() -> None:
    # launchers may prefix a rank tag to a worker's line
    assert protocol.decode("[rank0]: " + protocol.event("x")) == {"type": "x"}


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
