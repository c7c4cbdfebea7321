"""Text from a child process made safe to show: one policy for the terminal and for the window.

What hl-smi, a training log, a remote host or a model prints may carry terminal escape sequences
(tqdm's cursor-up after a nested bar, colours, screen clears, window titles, OSC 52 clipboard writes)
and other control characters. A terminal would act on them; a text view shows them as boxes and "[A".
The policy: escape sequences go whole (they are formatting, not text), every other control character
goes too, except tab and newline, which are text. Qt-free, torch-free.
"""

from __future__ import annotations

import re

# ANSI escape sequences (CSI ... final byte, OSC ... BEL/ST, and two-byte ESC x), then any other C0/C1
# control character except tab and newline.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, screen clears
                      r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window titles, hyperlinks, clipboard
                      r"|\x1b[@-Z\\-_]?"  # other two-byte escapes (and a lone ESC)
                      r"|\x9b[0-?]*[ -/]*[@-~]")  # the 8-bit CSI
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: str) -> str:
    """``text`` without terminal escape sequences and control characters (tab and newline stay)."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text))


__all__ = ["clean"]
