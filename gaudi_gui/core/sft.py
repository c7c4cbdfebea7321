"""Instruction and chat fine-tuning data, Qt-free and torch-free: dataset kinds, column mappings, the
alpaca/sharegpt shapes, eval splits, and where a run's result lies.

TRL's SFTTrainer takes three dataset shapes as they are: ``{"text"}`` (language modelling),
``{"prompt", "completion"}`` and ``{"messages"}``. A job names its kind and which of the file's columns
feed those fields (``dataset.columns``); this module turns one file row into one SFTTrainer row, and
nothing more (tokenizing, chat templates, loss masks, packing are TRL's).

A field is fed by one column (``"answer"``) or, when the mapping holds braces, by a template over
several columns (``"{instruction}\\n\\n{input}"``, alpaca's case). An empty column leaves no empty
section behind: alpaca rows without an input render as the instruction alone.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

KINDS = ("text", "prompt_completion", "conversational")
#: The SFTTrainer fields each kind fills from the file's columns.
FIELDS: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "prompt_completion": ("prompt", "completion"),
    "conversational": ("messages",),
}
#: SFTConfig fields that the dataset part of the form sets (one editor per value, never two).
PANEL_FIELDS = ("max_length", "dataset_text_field", "chat_template_path", "completion_only_loss",
                "assistant_only_loss")
#: sharegpt's speaker names, as chat templates know them.
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "bot": "assistant",
         "model": "assistant", "system": "system", "tool": "tool", "function": "tool"}
#: The column layouts people bring, best first: (kind, {field: column or template}).
KNOWN_SHAPES: tuple[tuple[str, dict[str, str]], ...] = (
    ("conversational", {"messages": "messages"}),
    ("conversational", {"messages": "conversations"}),
    ("prompt_completion", {"prompt": "{instruction}\n\n{input}", "completion": "output"}),  # alpaca
    ("prompt_completion", {"prompt": "instruction", "completion": "output"}),
    ("prompt_completion", {"prompt": "prompt", "completion": "completion"}),
    ("prompt_completion", {"prompt": "question", "completion": "answer"}),
    ("prompt_completion", {"prompt": "query", "completion": "response"}),
    ("prompt_completion", {"prompt": "input", "completion": "output"}),
    ("text", {"text": "text"}),
)


class MappingError(ValueError):
    """A column mapping that does not fit the data; ``field`` is the job key to mark."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def columns_used(spec: str) -> list[str]:
    """The columns a mapping reads: the one it names, or every ``{name}`` of a template, those nested
    in a format spec too (``{prompt:>{width}}`` reads prompt and width). A template fills whole
    columns: ``{name.attr}`` and ``{name[0]}`` are refused (MappingError)."""
    if "{" not in spec:
        return [spec] if spec else []
    names: list[str] = []

    def collect(text: str, depth: int) -> None:
        for _literal, name, fmt, _conv in string.Formatter().parse(text):
            if name is None:
                continue
            if not name or "." in name or "[" in name:
                # str.format would look up an attribute or an item of the text: never a column.
                raise MappingError("", f"template {spec!r}: {{{name}}} is not a column name (a template "
                                       f"fills whole columns: {{question}}, {{input}})")
            if name not in names:
                names.append(name)
            if fmt and "{" in fmt and depth < 2:
                collect(fmt, depth + 1)

    try:
        collect(spec, 0)
    except MappingError:
        raise
    except ValueError as exc:
        raise MappingError("", f"template {spec!r} does not parse: {exc}") from None
    return names


def default_columns(kind: str, available: Sequence[str]) -> dict[str, str]:
    """The mapping a file's columns suggest for ``kind`` (a known shape first, else the first columns)."""
    have = set(available)
    for shape_kind, mapping in KNOWN_SHAPES:
        if shape_kind == kind and all(set(columns_used(v)) <= have for v in mapping.values()):
            return dict(mapping)
    fields = FIELDS.get(kind, ())
    cols = list(available)
    return {f: cols[i] if i < len(cols) else "" for i, f in enumerate(fields)}


def check_columns(kind: str, columns: Mapping[str, str], available: Sequence[str] | None,
                  text_column: str = "text") -> list[tuple[str, str]]:
    """(field, message) for a mapping that cannot work; ``available`` None: columns not known here."""
    if kind not in KINDS:
        return [("dataset.kind", f"kind must be one of {', '.join(KINDS)} (got {kind!r})")]
    problems: list[tuple[str, str]] = []
    names = ", ".join(available) if available else "(none)"
    if kind == "text":
        extra = sorted(set(columns) - {"text"})
        if extra:
            problems.append(("dataset.columns", f"a text dataset takes no {', '.join(extra)} mapping"))
        return problems
    extra = sorted(set(columns) - set(FIELDS[kind]))
    if extra:
        problems.append(("dataset.columns", f"{kind} takes {', '.join(FIELDS[kind])}, not "
                                            f"{', '.join(extra)}"))
    for field in FIELDS[kind]:
        key = f"dataset.columns.{field}"
        spec = columns.get(field, "")
        if not isinstance(spec, str) or not spec.strip():
            problems.append((key, f"choose the column for {field}; the dataset's columns: {names}"))
            continue
        try:
            used = columns_used(spec)
        except MappingError as exc:
            problems.append((key, str(exc)))
            continue
        if available is None:
            continue
        missing = [c for c in used if c not in available]
        if missing:
            problems.append((key, f"the dataset has no column {', '.join(repr(m) for m in missing)} for "
                                  f"{field}; its columns: {names}"))
    return problems


def render(spec: str, row: Mapping[str, Any], field: str = "") -> str:
    """One field's text from a row: the named column, or the template filled in."""
    if "{" not in spec:
        return _as_text(row.get(spec), spec, field)
    values = {name: _as_text(row.get(name), name, field) for name in columns_used(spec)}
    where = f"dataset.columns.{field}" if field else "dataset.columns"
    try:
        text = spec.format_map(values)
    except KeyError as exc:
        raise MappingError(where, f"template {spec!r} uses {{{exc.args[0]}}}, which the row does not "
                                  f"have") from None
    except (IndexError, AttributeError, ValueError, TypeError) as exc:
        raise MappingError(where, f"template {spec!r} cannot be filled: {exc}") from None
    # An empty column (alpaca's input) leaves no run of blank lines nor a trailing separator.
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _as_text(value: Any, column: str, field: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise MappingError(f"dataset.columns.{field}" if field else "dataset.columns",
                       f"column {column!r} holds {type(value).__name__}, not text "
                       f"({str(value)[:60]!r})")


def to_messages(value: Any, column: str) -> list[dict[str, str]]:
    """A conversation as role/content messages; sharegpt's from/value and human/gpt are mapped."""
    if isinstance(value, Mapping) and isinstance(value.get("messages"), list):
        value = value["messages"]
    if not isinstance(value, list) or not value:
        raise MappingError("dataset.columns.messages",
                           f"column {column!r} must hold a list of messages, got {str(value)[:60]!r}")
    out: list[dict[str, str]] = []
    for message in value:
        if not isinstance(message, Mapping):
            raise MappingError("dataset.columns.messages",
                               f"column {column!r}: a message must be an object, got {str(message)[:60]!r}")
        role = message.get("role", message.get("from"))
        content = message.get("content", message.get("value"))
        if not isinstance(role, str) or not isinstance(content, str):
            raise MappingError("dataset.columns.messages",
                               f"column {column!r}: each message needs role/content (or sharegpt's "
                               f"from/value), got keys {', '.join(map(str, message))}")
        out.append({"role": ROLES.get(role.lower(), role), "content": content})
    return out


def to_sft_row(kind: str, columns: Mapping[str, str], row: Mapping[str, Any], *,
               chat: bool, text_column: str = "text") -> dict[str, Any]:
    """The SFTTrainer row for one file row. ``chat``: prompt/completion become one user and one
    assistant message, so the model's chat template renders them (a model without one gets the plain
    strings, which TRL joins as they are)."""
    if kind == "text":
        value = row.get(text_column)
        if not isinstance(value, str):
            # A null is a hole in a text dataset, not an empty section (unlike alpaca's input).
            raise MappingError("dataset.text_column", f"column {text_column!r} is not text "
                                                      f"({type(value).__name__}: {str(value)[:60]!r})")
        return {"text": value}
    if kind == "prompt_completion":
        prompt = render(columns["prompt"], row, "prompt")
        completion = render(columns["completion"], row, "completion")
        if chat:
            return {"prompt": [{"role": "user", "content": prompt}],
                    "completion": [{"role": "assistant", "content": completion}]}
        return {"prompt": prompt, "completion": completion}
    column = columns["messages"]
    return {"messages": to_messages(row.get(column), column)}


def row_problem(kind: str, columns: Mapping[str, str], row: Mapping[str, Any],
                text_column: str = "text") -> str | None:
    """Why one file row cannot train (None: it can): a field whose columns the row lacks or holds
    empty, or a value ``to_sft_row`` refuses. A loader fills a missing column with null, and an empty
    answer would train the model to say nothing: the worker drops such rows and counts them
    (``core.datafile`` counts them before the launch). An empty column inside a template (alpaca's
    input) is fine while the field's text is not empty."""
    if kind == "text":
        value = row.get(text_column)
        if value is None:
            return f"no {text_column!r}"
        if isinstance(value, str) and not value.strip():
            return f"{text_column!r} is empty"
    try:
        sft_row = to_sft_row(kind, columns, row, chat=False, text_column=text_column)
    except MappingError as exc:
        return str(exc)
    if kind != "prompt_completion":
        return None
    for field in FIELDS[kind]:
        if str(sft_row[field]).strip():
            continue
        try:
            missing = [c for c in columns_used(columns[field]) if row.get(c) is None]
        except MappingError:
            missing = []
        return f"{field}: no {', '.join(map(repr, missing))}" if missing else f"the {field} is empty"
    return None


def check_rows(kind: str, columns: Mapping[str, str], rows: Sequence[Mapping[str, Any]],
               text_column: str = "text") -> list[tuple[str, str]]:
    """(field, message) for each mapped field that does not render every one of ``rows`` (the
    preview's first rows of the file) with ``to_sft_row``, the function the worker runs on each row:
    a template that passes the column check can still fail on a value (a nested format field, a
    format code the text does not take, a column holding a list)."""
    problems: dict[str, str] = {}
    for n, row in enumerate(rows, start=1):
        try:
            to_sft_row(kind, columns, row, chat=False, text_column=text_column)
        except MappingError as exc:
            problems.setdefault(exc.field or "dataset.columns", f"row {n} of the file: {exc}")
    return list(problems.items())


# -- eval split --------------------------------------------------------------------------------------

def check_eval(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``dataset.eval``: {} (none), {"fraction": f}, {"source": FILE}, or {"split": NAME} (a Hub split)."""
    problems: list[tuple[str, str]] = []
    keys = set(spec) - {"fraction", "source", "split", "format"}
    if keys:
        return [("dataset.eval", f"unknown key(s) in dataset.eval: {', '.join(sorted(keys))}")]
    given = [k for k in ("fraction", "source", "split") if spec.get(k) not in (None, "")]
    if len(given) > 1:
        problems.append(("dataset.eval", f"choose one eval split: {' or '.join(given)}"))
    fraction = spec.get("fraction")
    if fraction not in (None, "") and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                                       or not math.isfinite(fraction) or not 0 < fraction < 1):
        problems.append(("dataset.eval.fraction", f"eval fraction must be between 0 and 1 (got "
                                                  f"{fraction!r})"))
    source = spec.get("source")
    if source not in (None, "") and (not isinstance(source, str)
                                     or not Path(source).expanduser().is_file()):
        problems.append(("dataset.eval.source", f"eval file not found: {source}"))
    return problems


def has_eval(spec: Mapping[str, Any]) -> bool:
    return any(spec.get(k) not in (None, "", 0) for k in ("fraction", "source", "split"))


# -- results -----------------------------------------------------------------------------------------

def is_adapter_dir(path: str | Path) -> bool:
    folder = Path(path).expanduser()
    return (folder / "adapter_config.json").is_file()


def runner_target(output_dir: str | Path | None) -> Path | None:
    """What "Try in runner" loads from a run's output folder: the full model (``final/``), else a merged
    one (``merged/``), else the adapter (``adapter/``, loaded over its base model, unmerged)."""
    if not output_dir:
        return None
    out = Path(output_dir)
    for name in ("final", "merged", "adapter"):
        if (out / name).is_dir() and ((out / name / "config.json").is_file() or is_adapter_dir(out / name)):
            return out / name
    return None


def chat_template_choices() -> list[tuple[str, str]]:
    """TRL's bundled training chat templates (with ``{% generation %}`` markers), as (label, path):
    a base model without a template, or with one TRL has no training version of, can use one. Found
    on disk, without importing trl (it imports torch)."""
    import importlib.util

    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(next(iter(spec.submodule_search_locations))) / "chat_templates"
    try:
        files = sorted(folder.glob("*_training.jinja"))
    except OSError:
        return []
    return [(f"{p.stem.removesuffix('_training')} (TRL training template)", str(p)) for p in files]
