"""Every kind of work, declared once: its name (one spelling in files, on the command line, in the window
and on the wire), how a job of it is checked where it enters, how its detached supervisor is started,
what its record shows, and what a stop does to it.

The names are the command line's verbs: ``train``, ``serve``, ``eval``, ``download``, ``benchmark``,
``calibrate``.
Run folders of earlier versions say ``training`` and ``evaluate`` in their status.json: ``canonical``
reads them (a status is read through it, so no reader meets the old spellings).

A job enters as the words of its kind's command (``{"args": [...]}``; a training job also carries its
``config``, the JSON the Training tab saves). Its shape is checked here; what it says is checked once,
by the kind's own command (its parser, the rules of ``commands/flags.py``, the kind's checks) as it
starts the job detached: its ``--detach`` is the one start of every kind (a supervisor in a session of
its own, the job's output in its run folder), and its refusal is the one line the client reads.
Qt-free and torch-free.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class KindError(ValueError):
    """A kind or a job that cannot be: the words say which field and why."""


@dataclass(frozen=True)
class Kind:
    """One kind of work."""

    #: The one spelling (the command line's verb, the run folder's ``kind``, the wire's ``kind``).
    name: str
    #: What a person reads ("training", "evaluation").
    text: str
    #: What a stop does to it, said when one is asked for.
    stop_words: str
    #: Spellings of earlier versions' run folders and of the queue's ``--kind``.
    old: tuple[str, ...] = ()
    #: Its run meter reads the cards (a download holds none; a training run meters itself).
    metered: bool = False
    #: A stop lets it save a checkpoint first.
    checkpoints: bool = False


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("train", "training", "the ranks save a checkpoint at the end of their current step, then end",
         old=("training",), checkpoints=True),
    Kind("serve", "serve", "the server ends its engine (answers in progress end, said as stopped) and frees "
                           "its port", metered=True),
    Kind("eval", "evaluation", "the evaluation ends; the results it has so far are kept",
         old=("evaluate", "evaluation"), metered=True),
    Kind("download", "download", "the download ends; the files already complete stay in the cache"),
    Kind("benchmark", "benchmark", "the benchmark ends; nothing is kept but its log (a verdict needs every "
                                   "repeat)"),
    Kind("calibrate", "FP8 calibration", "the calibration ends; measurements are written only when every "
                                         "row has run", metered=True),
)}
NAMES: tuple[str, ...] = tuple(KINDS)
#: Options the agent sets itself when it starts a job: a job's words may not carry them.
_OWN_OPTIONS = ("--detach", "--json", "--runs-dir", "--host", "--remote-command", "--announce", "--events",
                "--no-agent", "--config", "--origin")


def canonical(name: str) -> str:
    """Any spelling of a kind (``training``, ``Evaluate``) as its one name; "" for none."""
    word = str(name or "").strip().lower()
    if word in KINDS:
        return word
    return next((k.name for k in KINDS.values() if word in k.old), "")


def get(name: str) -> Kind:
    """The kind ``name`` spells; KindError naming the known ones."""
    found = canonical(name)
    if not found:
        raise KindError(f"kind {name!r}: one of {', '.join(NAMES)}")
    return KINDS[found]


def stop_words(kind: str) -> str:
    """What stopping a job of ``kind`` does (any spelling), for the line that says a stop was asked for."""
    found = canonical(kind)
    return KINDS[found].stop_words if found else "the job ends"


def text(kind: str) -> str:
    found = canonical(kind)
    return KINDS[found].text if found else kind


# -- a job as it enters ---------------------------------------------------------------------------


def job_words(kind: str, job: Any) -> list[str]:
    """The command words of ``job`` (``{"args": [...]}``): their shape is checked here (KindError, one
    line); what they say is checked once, by the kind's own command as it starts the job. A training
    job's words may send it to Slurm (``--slurm`` and its options, ``commands/slurm_run.py``): its
    ``--detach`` starts the supervisor that submits and follows the job."""
    found = get(kind)
    if not isinstance(job, Mapping):
        raise KindError("job: an object with the command's words in 'args'")
    words = job.get("args", [])
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise KindError("job.args: a list of words (strings)")
    for word in words:
        own = next((o for o in _OWN_OPTIONS if word == o or word.startswith(o + "=")), None)
        if own is not None:
            raise KindError(f"job.args: {own} is the agent's to set, not the job's")
    if found.name == "train" and not isinstance(job.get("config"), Mapping):
        raise KindError("job.config: the training job (the JSON the Training tab saves) as an object")
    return list(words)


def start_argv(kind: str, words: list[str], *, runs_dir: str, config_path: str = "",
               origin: str = "") -> list[str]:
    """The command that starts a job of ``kind`` detached (its ``--detach``: a supervisor in a session
    of its own, the output in its run folder) and prints its announce as JSON. ``origin``: who asked
    (a training run's status records it; the agent's to set, from its request)."""
    found = get(kind)
    argv = [sys.executable, "-m", "gaudi_gui", found.name, *words]
    if found.name == "train":
        argv += ["--config", config_path, *(["--origin", origin] if origin else [])]
    argv += ["--detach", "--json"]
    if runs_dir:
        argv += ["--runs-dir", runs_dir]
    return argv


__all__ = ["KINDS", "NAMES", "Kind", "KindError", "canonical", "get", "job_words", "start_argv", "stop_words",
           "text"]
