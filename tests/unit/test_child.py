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


def test_run_keeps_stdout_whole_and_the_tail_of_both_streams() -> None:
    """``core.child.run``: what the doctors of the gate, the health checks and ``preflight.check`` use."""
    from gaudi_gui.core.child import run

    script = "import sys; print('{\"a\":'); print('1}'); print('oops', file=sys.stderr); sys.exit(3)"
    got = run([sys.executable, "-c", script], 60, tail_lines=2)
    assert got.stdout == '{"a":\n1}\n' and got.code == 3 and not got.timed_out
    assert got.tail == ("1}", "oops")  # stdout's last lines, then stderr's
    missing = run(["gaudi-gui-no-such-program"], 60)
    assert missing.code is None and "could not start gaudi-gui-no-such-program" in missing.tail[0]


def test_run_kills_the_tree_at_its_deadline_or_when_stopped(tmp_path) -> None:
    import threading
    import time

    import psutil

    from gaudi_gui.core.child import run

    pids = tmp_path / "pids"
    # A helper in a session of its own is reached through the tree the runner records at the end.
    script = (f"import subprocess, sys, time\n"
              f"b = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
              f"start_new_session=True)\n"
              f"open({str(pids)!r}, 'w').write(str(b.pid)); print('half', flush=True); time.sleep(600)\n")
    late = run([sys.executable, "-c", script], 3)
    assert late.timed_out and late.code is not None and late.code < 0 and late.stdout == "half\n"
    helper = int(pids.read_text())

    def gone() -> bool:
        try:
            return psutil.Process(helper).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + 30
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)  # polling a condition with a deadline (SIGKILL was sent; its delivery is async)
    assert gone()
    stop = threading.Event()
    stopped = run([sys.executable, "-c", "import time; time.sleep(600)"], 600, stop=stop,
                  started=lambda _child: stop.set())
    assert not stopped.timed_out and stopped.code is not None and stopped.code < 0


def test_run_never_raises_for_a_child_that_cannot_start() -> None:
    """"Never raises for the child": not only OSError. A NUL in an argument is a ValueError from Popen;
    escaping, it ended the doctor's thread, whose check then never ended ("running" for good)."""
    from gaudi_gui.core.child import run

    got = run([sys.executable, "-c", "print(1)\0"], 60)
    assert got.code is None and got.tail and "could not start" in got.tail[0], got
    assert "null" in got.tail[0], got
