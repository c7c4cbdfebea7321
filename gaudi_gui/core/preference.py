"""Preference tuning (DPO, ORPO, KTO), Qt-free and torch-free: the objectives, and which columns of a
dataset file each one takes.

A job's ``objective`` (absent: ``sft``) picks TRL's trainer and config class in the worker
(``DPOTrainer``/``DPOConfig``, ``ORPOTrainer``/``ORPOConfig`` from ``trl.experimental.orpo``,
``KTOTrainer``/``KTOConfig``); the loss is TRL's. The files people bring, as TRL takes them:

- paired preference: ``prompt``, ``chosen``, ``rejected``, each plain text or a list of chat messages
  (``{"role", "content"}``);
- the chat-style pairs of the Hub (Anthropic HH, UltraFeedback's ``chosen``/``rejected`` conversations):
  ``chosen`` and ``rejected`` only, the prompt being their shared beginning (TRL's ``extract_prompt``);
  a text ``prompt`` beside such conversations (HuggingFaceH4/ultrafeedback_binarized: the user's turn is
  also the conversations' first message) is left out, so the prompt is again their shared beginning;
- KTO's unpaired ``prompt``, ``completion``, ``label`` (true: a desirable answer). KTO also takes paired
  files (TRL unpairs them: chosen rows labelled true, rejected false).

``layout`` says which columns a file's column names give an objective; ``check`` what is missing, in
one line that names the objective and the column ("DPO needs a 'rejected' column; this file has
prompt, chosen"). The CLI (exit 2, through ``JobConfig.validate``) and the form's dataset field both
use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gaudi_gui.core.metrics import REWARD_SERIES

#: The training objectives a job may name; "sft" is the default (a job file without the key).
OBJECTIVES = ("sft", "dpo", "orpo", "kto")
LABELS = {"sft": "SFT", "dpo": "DPO", "orpo": "ORPO", "kto": "KTO"}
#: The TRL config class of each objective (the schema child introspects these).
CONFIG_CLASSES = {"sft": "SFTConfig", "dpo": "DPOConfig", "orpo": "ORPOConfig", "kto": "KTOConfig"}
#: The objectives that learn from preferences (not SFT).
PREFERENCE = ("dpo", "orpo", "kto")
#: TRL's reward metrics, under TRL's names, as the worker puts them in a run's metrics events: the
#: charted rewards (``core.metrics.REWARD_SERIES``) and what else the trainers log beside them.
REWARD_KEYS = (*REWARD_SERIES, "logps/chosen", "logps/rejected", "nll_loss", "log_odds_ratio",
               "log_odds_chosen", "kl")
#: How many rows the form and the checks look at.
PREVIEW_ROWS = 3


def is_preference(objective: str) -> bool:
    return objective in PREFERENCE


def objective_problem(value: Any) -> str | None:
    """Why ``value`` is not an objective (None: it is one)."""
    if isinstance(value, str) and value in OBJECTIVES:
        return None
    return f"unknown objective {value!r}: choose one of {', '.join(OBJECTIVES)}"


@dataclass(frozen=True)
class Layout:
    """The columns of a file an objective trains on."""

    #: "paired" (prompt, chosen, rejected), "implicit" (chosen, rejected: the prompt is their shared
    #: beginning), "unpaired" (prompt, completion, label: KTO).
    shape: str
    columns: tuple[str, ...]
    #: "text", "conversational" (lists of messages), or "" (no rows read).
    style: str = ""

    def describe(self) -> str:
        how = {"text": " (plain text)", "conversational": " (chat messages)"}.get(self.style, "")
        implicit = "; the prompt is what chosen and rejected share" if self.shape == "implicit" else ""
        return f"took columns {', '.join(self.columns)}{how}{implicit}"


def layout(objective: str, columns: Sequence[str]) -> Layout | None:
    """The columns ``objective`` takes from a file with ``columns`` (None: it lacks what it needs)."""
    have = set(columns)
    if objective == "kto" and {"prompt", "completion", "label"} <= have:
        return Layout("unpaired", ("prompt", "completion", "label"))
    if {"chosen", "rejected"} <= have:
        if "prompt" in have:
            return Layout("paired", ("prompt", "chosen", "rejected"))
        return Layout("implicit", ("chosen", "rejected"))
    return None


def missing_message(objective: str, columns: Sequence[str]) -> str:
    """What a file with ``columns`` lacks for ``objective``, in one line."""
    name = LABELS.get(objective, objective)
    have = set(columns)
    if objective == "kto" and not ({"chosen", "rejected"} & have) and ({"completion", "label"} & have):
        need: Sequence[str] = ("prompt", "completion", "label")
    else:
        need = ("chosen", "rejected")
    lacking = [c for c in need if c not in have]
    said = ", ".join(columns) if columns else "no columns"
    if len(lacking) == 1:
        what = f"a {lacking[0]!r} column"
    else:
        what = " and ".join(f"{c!r}" for c in lacking) + " columns"
    alternative = ("" if objective != "kto" else
                   " (or prompt, chosen, rejected pairs)" if need[0] == "prompt" else
                   " (or unpaired prompt, completion, label)")
    return f"{name} needs {what}{alternative}; this file has {said}"


def _style(value: Any) -> str | None:
    """"text" for a string, "conversational" for a list of {role, content} messages, else None."""
    if isinstance(value, str):
        return "text"
    if isinstance(value, list) and value and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        return "conversational"
    return None


def row_problem(found: Layout, row: Mapping[str, Any]) -> str | None:
    """Why one file row cannot train under ``found`` (None: it can)."""
    for column in found.columns:
        value = row.get(column)
        if column == "label":
            if not isinstance(value, bool):
                return f"'label' must be true or false (got {value!r})"
            continue
        if value is None or value == "" or value == []:
            return f"{column!r} is empty"
        if _style(value) is None:
            return (f"{column!r} must be text or a list of chat messages ({{\"role\", \"content\"}}), "
                    f"got {type(value).__name__}")
    return None


def check(objective: str, columns: Sequence[str] | None, rows: Sequence[Mapping[str, Any]] | None = None,
          field: str = "dataset.source") -> list[tuple[str, str]]:
    """The problems of a dataset file for ``objective``, as (field, message); nothing for SFT and for
    what cannot be read here (``columns`` None: a Hub dataset, which the worker checks)."""
    if not is_preference(objective) or columns is None:
        return []
    found = detect(objective, columns, rows)
    if found is None:
        return [(field, missing_message(objective, columns))]
    styles = set()
    for index, row in enumerate(rows or ()):
        why = row_problem(found, row)
        if why:
            return [(field, f"row {index + 1}: {why}")]
        styles |= {s for c in found.columns if c != "label" and (s := _style(row.get(c)))}
    if len(styles) > 1:
        return [(field, "mixes plain text and chat messages: TRL takes one or the other in a file")]
    return []


def detect(objective: str, columns: Sequence[str] | None,
           rows: Sequence[Mapping[str, Any]] | None = None) -> Layout | None:
    """The layout with its style (text or conversational) read from the first rows."""
    if columns is None:
        return None
    found = layout(objective, columns)
    if found is None:
        return None
    first = next(iter(rows or ()), None)
    if first is not None and found.shape == "paired" and _style(first.get("prompt")) == "text" \
            and _style(first.get("chosen")) == _style(first.get("rejected")) == "conversational":
        # UltraFeedback's shape: the conversations hold the prompt; TRL finds it as their shared start.
        found = Layout("implicit", ("chosen", "rejected"))
    for row in rows or ():
        for column in found.columns:
            style = _style(row.get(column)) if column != "label" else None
            if style:
                return Layout(found.shape, found.columns, style)
    return found


__all__ = ["CONFIG_CLASSES", "LABELS", "OBJECTIVES", "PREFERENCE", "PREVIEW_ROWS", "REWARD_KEYS", "Layout",
           "check", "detect", "is_preference", "layout", "missing_message", "objective_problem",
           "row_problem"]
