"""``core.child.Child`` for a child whose two streams are one log (the serve engine): ``merge_stderr``
reads both in the order written, decodes each line and keeps the redacted tail; ``preexec`` runs in
the child before its program (the engine's ``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import sys

from gaudi_gui.core.child import Child

SCRIPT = """
import os, sys
for i in range(3):
    print(f"out {i}", flush=True)
    print(f"err {i} token=hf_abcdefghijklmnopqrstuvwxyz0123", file=sys.stderr, flush=True)
print(f"umask {oct(os.umask(0))}", flush=True)
"""


def test_merged_streams_are_one_log_in_order_with_a_redacted_tail() -> None:
    child = Child([sys.executable, "-c", SCRIPT], decode=lambda line: {"line": line.rstrip("\n")},
                  stdin=False, merge_stderr=True, tail_lines=50, preexec=lambda: _umask(0o027))
    lines = []
    while (message := child.next_message(30)) is not None:
        assert message, "the child said nothing within 30 s"
        lines.append(message["line"])
    assert child.end(5) == 0
    assert [line.split(" ")[0] + line.split(" ")[1] for line in lines[:6]] == \
        ["out0", "err0", "out1", "err1", "out2", "err2"]
    assert lines[-1] == "umask 0o27"  # preexec ran in the child
    assert len(child.tail) == 7 and "hf_abcdefghijklmnopqrstuvwxyz0123" not in child.tail_text()
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" in lines[1]  # what is decoded is as written


def _umask(mask: int) -> None:
    import os
    os.umask(mask)
