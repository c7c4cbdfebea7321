"""Introspect the training arguments in a child process (the GUI never imports transformers).

The class is TRL's ``SFTConfig`` (a TrainingArguments subclass with the SFT fields: packing,
max_length, completion_only_loss, assistant_only_loss, ...), or ``TrainingArguments`` where trl is
not installed. Where SFTConfig changes a TrainingArguments default (bf16, gradient_checkpointing,
learning_rate, logging_steps) gaudi-gui keeps TrainingArguments' value (``pinned_defaults``): a job
file stores only what differs from the defaults, so a version-1 job trains as it did, and bf16 is not
switched on where the device cannot run it. The schema reports those kept defaults.

``python -m gaudi_gui.workers.schema`` prints the fields as JSON on stdout:
``{"transformers_version": ..., "fields": [{"name", "kind", "default", "help", "choices"}, ...]}``.

``python -m gaudi_gui.workers.schema --validate FILE`` reads ``{"training_args": {...}, "env": {...},
"num_processes": N}`` (``env`` and ``num_processes`` optional; a plain dict of training arguments works
too), sets ``env`` in its own environment before transformers is imported (the job's device
environment: a null value unsets a variable), builds ``TrainingArguments`` from the whole dict through
``HfArgumentParser.parse_dict`` as the training worker does, and prints one line
``{"ok": bool, "errors": [{"field", "message"}]}`` (exit 1 when there are errors). ``num_processes``
above 1 says the job runs distributed, so checks only a launched rank can pass (a ``ddp_backend`` needs
a process group) are not reported as mistakes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import json
import math
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from gaudi_gui.workers.loader import hide_bitsandbytes


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


def _accepted(tp: Any) -> set[str]:
    """The JSON kinds one member of a field's type union takes."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return {_json_kind(type(a)) for a in typing.get_args(tp)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"str"}
    if origin in (list, tuple) or tp in (list, tuple):
        return {"list"}
    if origin is dict or tp is dict:
        return {"dict"}
    if tp in (bool, int, float, str):
        return {_json_kind(tp)}
    # A class (accelerate's ParallelismConfig, ...): TrainingArguments builds it from a dict or a path.
    return {"dict", "str"}


def _json_kind(tp: type) -> str:
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}.get(tp, "str")


def _describe_type(tp: Any) -> tuple[str, bool, list[str] | None, list[str]]:
    """(kind, optional, enum choices, accepted JSON kinds) for a dataclass field type."""
    optional = False
    choices: list[str] | None = None
    args: tuple[Any, ...] = ()
    origin = typing.get_origin(tp)
    args = typing.get_args(tp) if origin in (typing.Union, types.UnionType) else (tp,)
    if type(None) in args:
        optional = True
    rest = [a for a in args if a is not type(None)]
    accepts: set[str] = set()
    for a in rest:
        accepts |= _accepted(a)
    accepted = sorted(accepts)
    for a in rest:
        if isinstance(a, type) and issubclass(a, enum.Enum):
            choices = [str(m.value) for m in a]
            return "enum", optional, choices, accepted
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
            return preferred, optional, None, accepted
    if "str" in kinds and len(kinds) > 1:
        return "str", optional, None, accepted
    return (kinds[0] if kinds else "str"), optional, None, accepted


def config_class(objective: str = "sft") -> Any:
    """The config class of a job's objective: trl.SFTConfig (or TrainingArguments where trl is
    missing), trl.DPOConfig, ORPOConfig (``trl.experimental.orpo`` in TRL 1.x), trl.KTOConfig.
    ImportError for a preference objective where trl is missing."""
    if objective == "dpo":
        from trl import DPOConfig
        return DPOConfig
    if objective == "kto":
        from trl import KTOConfig
        return KTOConfig
    if objective == "orpo":
        import warnings
        with warnings.catch_warnings():
            # TRL 1.x keeps ORPO under trl.experimental and warns at each import of it; the worker says
            # so once in the run's log (workers/preference.py).
            warnings.simplefilter("ignore")
            from trl.experimental.orpo import ORPOConfig
        return ORPOConfig
    try:
        from trl import SFTConfig
    except ImportError:
        from transformers import TrainingArguments
        return TrainingArguments
    return SFTConfig


def _default_of(f: Any) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


#: The preference config classes: new in gaudi-gui, with no older job files to keep training as they
#: did, so they keep their own defaults (KTO's sequential sampling is required by its loss, DPO's
#: learning rate 1e-6 is its recipe's) but bf16, which must not switch on where the device cannot run it.
PREFERENCE_CLASSES = ("DPOConfig", "ORPOConfig", "KTOConfig")
PREFERENCE_PINNED = ("bf16",)


def _changed_defaults(cls: Any) -> dict[str, Any]:
    """{name: TrainingArguments' default} of the fields whose default ``cls`` changes."""
    from transformers import TrainingArguments

    base = {f.name: _default_of(f) for f in dataclasses.fields(TrainingArguments) if f.init}
    return {f.name: base[f.name] for f in dataclasses.fields(cls)
            if f.init and f.name in base and _json_safe(_default_of(f)) != _json_safe(base[f.name])}


def pinned_defaults(cls: Any = None) -> dict[str, Any]:
    """TrainingArguments' defaults for the fields whose default ``cls`` (SFTConfig) changes; of a
    preference class only bf16's (``PREFERENCE_PINNED``)."""
    cls = cls or config_class()
    out = _changed_defaults(cls)
    if cls.__name__ in PREFERENCE_CLASSES:
        out = {k: v for k, v in out.items() if k in PREFERENCE_PINNED}
    return out


def _describe_fields(cls: Any, only: set[str] | None = None) -> list[dict[str, Any]]:
    """The schema entries of ``cls``'s fields (``only``: of these names alone)."""
    pinned = pinned_defaults(cls)
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init or (only is not None and f.name not in only):
            continue
        kind, optional, choices, accepts = _describe_type(hints.get(f.name, f.type))
        if f.metadata.get("choices"):
            choices = [str(c) for c in f.metadata["choices"]]
            kind = "enum"
        help_text = str(f.metadata.get("help", ""))
        default = _json_safe(_default_of(f))
        if f.name in pinned:
            help_text += (f" (gaudi-gui keeps TrainingArguments' default {_json_safe(pinned[f.name])!r}; "
                          f"{cls.__name__}'s own is {default!r})")
            default = _json_safe(pinned[f.name])
        if kind == "bool" and default is not None and f.name in pinned:
            optional = False  # a pinned bool has a definite default: a check box, not a tri-state
        out.append({"name": f.name, "kind": kind, "optional": optional, "default": default,
                    "help": help_text, "choices": choices, "accepts": accepts})
    return out


def dump_schema() -> dict[str, Any]:
    """The SFTConfig fields (``fields``), and per preference objective its config class's own fields,
    those beyond TrainingArguments (``objectives``); ``sft_only`` names SFTConfig's own fields, which a
    preference objective does not take. Format 3."""
    import transformers
    from transformers import TrainingArguments

    cls = config_class()
    out = _describe_fields(cls)
    base = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    objectives: dict[str, Any] = {}
    for objective in ("dpo", "orpo", "kto"):
        try:
            other = config_class(objective)
        except ImportError:
            continue  # no trl: SFT alone (on TrainingArguments)
        # Its own fields, and the TrainingArguments fields whose default it changes and keeps.
        own = ({f.name for f in dataclasses.fields(other) if f.init} - base) | \
            (set(_changed_defaults(other)) - set(pinned_defaults(other)))
        objectives[objective] = {"config_class": other.__name__, "fields": _describe_fields(other, own)}
    try:
        import trl
        trl_version = str(trl.__version__) if cls.__name__ == "SFTConfig" else ""
    except ImportError:
        trl_version = ""
    return {"transformers_version": transformers.__version__, "config_class": cls.__name__,
            "trl_version": trl_version, "format": 3, "fields": out,
            "sft_only": sorted({f["name"] for f in out} - base), "objectives": objectives}


#: Messages of checks a single validating process cannot pass although the launched job will (the
#: launcher initialises the process group before TrainingArguments is built in each rank).
_NEEDS_PROCESS_GROUP = ("process group has not been initialized", "init_process_group")


def _signature(message: str) -> str:
    """The stable part of an error message: its first line without the values it quotes."""
    first = message.strip().splitlines()[0] if message.strip() else message
    return re.sub(r"\S*\d\S*", "#", first.split(" but found")[0])[:200]


def validate(args: dict[str, Any], num_processes: int = 1, objective: str = "sft") -> list[dict[str, str]]:
    """Problems building TrainingArguments from the whole of ``args`` (empty: it builds).

    The whole set is built first, so a combination that is valid together (bf16 with use_cpu,
    load_best_model_at_end with matching strategies) is never flagged. When it does not build, the
    fields to blame are found by elimination: the smallest subset of the set that still fails with
    the same error (removing any one of them makes that error go away) is found, blamed, taken out, and the
    rest built again until it builds — so independent mistakes are each named. Within that subset the
    fields whose removal lets it build are the ones named (load_best_model_at_end, not the default
    eval_strategy it contradicts; fp16 and bf16, not the use_cpu that makes bf16 possible).
    """
    from transformers import HfArgumentParser

    from gaudi_gui.core.training_args import Schema

    schema = Schema.from_dict(dump_schema()).for_objective(objective)
    errors: list[dict[str, str]] = []
    # Unknown names, wrong types, negative step counts: the same checks the form makes, so a job file
    # checked here (gaudi-gui train, a hand-edited file) gets the same answer as in the form.
    bad: set[str] = set()
    for name, problem in schema.check(args):
        errors.append({"field": name, "message": problem})
        bad.add(name)
    cls = config_class(objective)
    pinned = pinned_defaults(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    remaining = {k: v for k, v in args.items() if k in names and k not in bad}
    parser = HfArgumentParser(cls)

    def attempt(values: dict[str, Any]) -> str | None:
        try:
            # Built as the worker builds it: the kept TrainingArguments defaults under what is set.
            parser.parse_dict({**pinned, **values}, allow_extra_keys=False)
        except Exception as exc:  # TrainingArguments raises ValueError mostly, also ImportError, ...
            text = str(exc).strip()
            return " ".join(text.split("\n")[:3]) if text else type(exc).__name__
        return None

    for _ in range(len(remaining) + 1):
        message = attempt(remaining)
        if message is None:
            break
        signature = _signature(message)
        culprits = dict(remaining)
        for name in list(remaining):
            trial = {k: v for k, v in culprits.items() if k != name}
            again = attempt(trial)
            if again is not None and _signature(again) == signature:
                culprits = trial
        if not culprits:
            # Fails with nothing set: the installation or device, not the job.
            errors.append({"field": "", "message": message})
            break
        # Within that subset, blame the fields whose removal lets it build: with fp16 and bf16 both
        # set on a CPU, use_cpu belongs to the subset (without it bf16 fails differently) but is not
        # the mistake.
        fixing = {k: v for k, v in culprits.items()
                  if attempt({n: x for n, x in culprits.items() if n != k}) is None}
        culprits = fixing or culprits
        if any(needle in message for needle in _NEEDS_PROCESS_GROUP) and num_processes > 1:
            # Checked by the launched ranks, which have a process group; not a mistake in the job.
            pass
        else:
            if any(needle in message for needle in _NEEDS_PROCESS_GROUP):
                message = f"{message} (a single process has no process group: "\
                          "this needs more than one process)"
            for name in culprits:
                errors.append({"field": name, "message": message})
        for name in culprits:
            remaining.pop(name)
    return errors


def apply_env(env: Any) -> None:
    """The job's device environment (HABANA_VISIBLE_MODULES, CUDA_VISIBLE_DEVICES, ACCELERATE_USE_CPU,
    ...), set before transformers/torch are imported so device checks see what the run will see."""
    if isinstance(env, dict):
        for key, value in env.items():
            if value is None:
                os.environ.pop(str(key), None)
            else:
                os.environ[str(key)] = str(value)


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
        num_processes = 1
        objective = "sft"
        if isinstance(data, dict) and isinstance(data.get("training_args"), dict):
            if data.get("objective") in ("sft", "dpo", "orpo", "kto"):
                objective = str(data["objective"])
            apply_env(data.get("env"))
            with contextlib.suppress(TypeError, ValueError):
                num_processes = max(1, int(data.get("num_processes", 1)))
            data = data["training_args"]
        if not isinstance(data, dict):
            print(json.dumps({"ok": False, "errors": [{"field": "", "message": "not a JSON object"}]}))
            return 1
        hide_bitsandbytes(optim=data.get("optim"))
        errors = validate(data, num_processes, objective)
        print(json.dumps({"ok": not errors, "errors": errors}))
        return 0 if not errors else 1
    hide_bitsandbytes()  # the schema is the same without it, and comes seconds sooner
    print(json.dumps(dump_schema()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
