"""Introspect ``transformers.TrainingArguments`` in a child process (the GUI never imports transformers).

``python -m gaudi_gui.workers.schema`` prints the fields as JSON on stdout:
``{"transformers_version": ..., "fields": [{"name", "kind", "default", "help", "choices"}, ...]}``.

``python -m gaudi_gui.workers.schema --validate FILE`` reads a job config (or a plain dict of training
arguments), builds ``TrainingArguments`` through ``HfArgumentParser.parse_dict`` exactly as the training
worker does, and prints ``{"ok": bool, "errors": [{"field", "message"}]}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import math
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any


def _json_safe(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return _json_safe(value.value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return str(value)


def _describe_type(tp: Any) -> tuple[str, bool, list[str] | None]:
    """(kind, optional, enum choices) for a dataclass field type."""
    optional = False
    choices: list[str] | None = None
    args: tuple[Any, ...] = ()
    origin = typing.get_origin(tp)
    args = typing.get_args(tp) if origin in (typing.Union, types.UnionType) else (tp,)
    if type(None) in args:
        optional = True
    rest = [a for a in args if a is not type(None)]
    for a in rest:
        if isinstance(a, type) and issubclass(a, enum.Enum):
            choices = [str(m.value) for m in a]
            return "enum", optional, choices
    kinds = []
    for a in rest:
        o = typing.get_origin(a)
        if a is bool:
            kinds.append("bool")
        elif a is int:
            kinds.append("int")
        elif a is float:
            kinds.append("float")
        elif a is str:
            kinds.append("str")
        elif o in (list, tuple) or a in (list, tuple):
            kinds.append("list")
        elif o is dict or a is dict:
            kinds.append("dict")
        else:
            kinds.append("str")
    # "str | list[str]" edits best as a string; dict-or-str likewise (JSON text).
    for preferred in ("bool", "int", "float"):
        if kinds == [preferred]:
            return preferred, optional, None
    if "str" in kinds and len(kinds) > 1:
        return "str", optional, None
    return (kinds[0] if kinds else "str"), optional, None


def dump_schema() -> dict[str, Any]:
    import transformers
    from transformers import TrainingArguments

    hints = typing.get_type_hints(TrainingArguments)
    out = []
    for f in dataclasses.fields(TrainingArguments):
        if not f.init:
            continue
        kind, optional, choices = _describe_type(hints.get(f.name, f.type))
        if f.metadata.get("choices"):
            choices = [str(c) for c in f.metadata["choices"]]
            kind = "enum"
        if f.default is not dataclasses.MISSING:
            default = _json_safe(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = _json_safe(f.default_factory())
        else:
            default = None
        out.append({"name": f.name, "kind": kind, "optional": optional, "default": default,
                    "help": str(f.metadata.get("help", "")), "choices": choices})
    return {"transformers_version": transformers.__version__, "fields": out}


def _field_from_message(message: str, names: set[str]) -> str:
    for match in re.finditer(r"[A-Za-z_][A-Za-z0-9_]*", message):
        word = match.group(0)
        if word in names:
            return word
    return ""


def validate(args: dict[str, Any]) -> list[dict[str, str]]:
    """Problems building TrainingArguments from ``args`` (empty: it builds)."""
    from transformers import HfArgumentParser, TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    errors: list[dict[str, str]] = []
    unknown = sorted(set(args) - names)
    for name in unknown:
        errors.append({"field": name, "message": f"unknown argument '{name}' in this transformers "
                                                 "version (removed or misspelled)"})
    clean = {k: v for k, v in args.items() if k in names}
    parser = HfArgumentParser(TrainingArguments)  # type: ignore[arg-type]
    base = {"output_dir": clean.get("output_dir", "out")}

    def attempt(values: dict[str, Any]) -> str | None:
        try:
            parser.parse_dict(values, allow_extra_keys=False)
        except (ValueError, TypeError, ImportError) as exc:
            text = str(exc).strip()
            return text.splitlines()[0] if text else type(exc).__name__
        return None

    # One field at a time first, so an error lands on the field that caused it even when the
    # message does not name it ("bogus is not a valid IntervalStrategy").
    for name, value in clean.items():
        message = attempt({**base, name: value})
        if message:
            errors.append({"field": name, "message": message})
    if not errors:
        message = attempt({**base, **clean})
        if message:
            errors.append({"field": _field_from_message(message, names), "message": message})
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gaudi_gui.workers.schema")
    parser.add_argument("--validate", metavar="FILE", help="job config or training-args JSON to check")
    ns = parser.parse_args(argv)
    if ns.validate:
        try:
            data = json.loads(Path(ns.validate).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(json.dumps({"ok": False, "errors": [{"field": "", "message": f"cannot read "
                                                       f"{ns.validate}: {exc}"}]}))
            return 1
        if isinstance(data, dict) and isinstance(data.get("training_args"), dict):
            data = data["training_args"]
        if not isinstance(data, dict):
            print(json.dumps({"ok": False, "errors": [{"field": "", "message": "not a JSON object"}]}))
            return 1
        errors = validate(data)
        print(json.dumps({"ok": not errors, "errors": errors}))
        return 0 if not errors else 1
    print(json.dumps(dump_schema()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
