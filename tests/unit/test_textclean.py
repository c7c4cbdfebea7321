"""The one cleaner of text from children (hl-smi, training logs, hosts, models): escape sequences go
whole, other control characters go, tab and newline stay."""

from __future__ import annotations

from gaudi_gui.commands.terminal import printable
from gaudi_gui.core import hlsmi, textclean


def test_escape_sequences_and_controls_go_tab_and_newline_stay() -> None:
    # A model's output (was generation.terminal_safe): screen clear, OSC 52 clipboard write, 8-bit CSI.
    raw = "ok\x1b[2J\x1b]52;c;ZXZpbA==\x07 tab\there\nline\rback\x9b31m\x00"
    safe = textclean.clean(raw)
    assert "\x1b" not in safe and "\x07" not in safe and "\r" not in safe and "\x9b" not in safe
    assert safe == "ok tab\there\nlineback"


def test_log_lines_read_as_a_terminal_shows_them() -> None:
    # tqdm's cursor-up after a nested bar, colours, a window title, NUL and backspace.
    bar = "Writing: 100%|##| 1/1 [00:03<00:00]"
    assert textclean.clean(bar + "\x1b[A\x1b[A") == bar
    assert textclean.clean("\x1b[1;31mWARNING\x1b[0m\tdisk \x1b]0;title\x07almost full\x00\x08") == \
        "WARNING\tdisk almost full"


def test_the_terminal_and_hl_smi_use_it() -> None:
    line = "\x1b[31mred\x1b[0m\tcell\x1b]0;pwned\x07"
    assert printable(line) == textclean.clean(line) == "red\tcell"
    assert hlsmi.clean_text(line) == "red cell"  # a tab would break a table's columns
