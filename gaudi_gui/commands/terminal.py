"""What the long-running subcommands (``train`` here, on a host, on several hosts, on Slurm) share
about the terminal they run in: one-line messages on stderr, text made safe to print, and the count of
stop signals (the first asks for a stop with a checkpoint, the second kills). Qt-free, torch-free."""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import Any

from gaudi_gui.core import textclean


def say(text: str) -> None:
    """One message on stderr (a closed terminal is not an error)."""
    with contextlib.suppress(OSError):
        sys.stderr.write(text.rstrip("\n") + "\n")
        sys.stderr.flush()


def printable(line: str) -> str:
    """``line`` cleaned (``core.textclean``): escape sequences from a library or a dataset must not
    drive the user's terminal."""
    return textclean.clean(line)


class StopSignals:
    """Counts SIGINT / SIGTERM / SIGHUP (install ``handler``); ``last`` names the newest."""

    def __init__(self) -> None:
        self.count = 0
        self.last = ""

    def handler(self, signum: int, _frame: Any) -> None:
        self.count += 1
        self.last = signal.Signals(signum).name




def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0 (``--grace``, ``--reconnect-s``)."""
    import argparse
    import math
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, not {text!r}")
    return value


__all__ = ["StopSignals", "printable", "say", "seconds"]
