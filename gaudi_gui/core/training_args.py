"""The training-arguments schema as the form sees it: Qt-free, torch-free, transformers-free.

The fields are those of TRL's SFTConfig (TrainingArguments and the SFT options), or of
TrainingArguments where trl is not installed; ``Schema.config_class`` says which. Since format 3 the
schema also holds each preference objective's own fields (DPOConfig, ORPOConfig, KTOConfig beyond
TrainingArguments): ``Schema.for_objective`` gives the schema of a job's objective.

The schema itself comes from a child (``python -m gaudi_gui.workers.schema``) so the installed
transformers version decides which fields exist; it is cached per transformers version in
``paths.cache_dir()`` so the form opens instantly the second time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gaudi_gui.core import atomic, paths

#: The fields shown at the top of the form, in this order (those missing from a version are skipped).
COMMON: tuple[str, ...] = (
    "output_dir", "num_train_epochs", "max_steps", "per_device_train_batch_size",
    "gradient_accumulation_steps", "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay",
    "bf16", "torch_compile", "logging_steps", "save_strategy", "save_steps", "save_total_limit",
    "eval_strategy", "eval_steps", "load_best_model_at_end", "seed", "use_cpu", "packing",
    "push_to_hub", "hub_model_id", "beta",
)
#: Schemas cached before this format lack the SFTConfig fields (format 2) or the preference objectives'
#: (format 3): read again from the child.
SCHEMA_FORMAT = 3

#: Fields of transformers 4.x that 5.x removed, with what to use instead (shown when a loaded job uses
#: one; the worker would otherwise reject the whole job).
REMOVED: dict[str, str] = {
    "overwrite_output_dir": "removed in transformers 5: the Trainer no longer checks the folder",
    "evaluation_strategy": "removed in transformers 5: use eval_strategy",
    "warmup_ratio": "removed in transformers 5: use warmup_steps below 1 (read as a ratio)",
    "logging_dir": "removed in transformers 5: loggers choose their own folder",
    "no_cuda": "removed in transformers 5: use use_cpu",
}

KINDS = ("bool", "int", "float", "str", "enum", "list", "dict")


#: Lowest sensible value per field (TrainingArguments itself accepts most of these and fails later,
#: or silently trains nothing): (minimum, what to say).
MINIMUM: dict[str, tuple[float, str]] = {
    "max_steps": (-1, "max_steps must be -1 (train for num_train_epochs) or a number of steps"),
    "logging_steps": (0, "logging_steps may not be negative"),
    "save_steps": (0, "save_steps may not be negative"),
    "eval_steps": (0, "eval_steps may not be negative"),
    "warmup_steps": (0, "warmup_steps may not be negative"),
    "eval_delay": (0, "eval_delay may not be negative"),
    "num_train_epochs": (0, "num_train_epochs may not be negative"),
    "learning_rate": (0, "learning_rate may not be negative"),
    "per_device_train_batch_size": (1, "per_device_train_batch_size must be at least 1"),
    "per_device_eval_batch_size": (1, "per_device_eval_batch_size must be at least 1"),
    "gradient_accumulation_steps": (1, "gradient_accumulation_steps must be at least 1"),
    "dataloader_num_workers": (0, "dataloader_num_workers may not be negative"),
    "save_total_limit": (0, "save_total_limit may not be negative"),
}

#: How a type problem names the kind a field expects ("max_steps: expected an integer, got 'ten'").
_KIND_WORDS = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "text",
               "enum": "one of its choices", "list": "a list", "dict": "an object"}

_PY_TYPES: dict[str, tuple[type, ...]] = {"bool": (bool,), "int": (int,), "float": (int, float),
                                          "str": (str,), "enum": (str,), "list": (list,), "dict": (dict,)}


@dataclass(frozen=True)
class FieldSpec:
    name: str
    kind: str
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] = ()
    optional: bool = False
    #: Every JSON kind the field's type accepts ("str | dict" edits as str but takes a dict too); None:
    #: not reported (a schema cached by an older gaudi-gui), so values are not type-checked beyond kind.
    accepts: tuple[str, ...] | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FieldSpec:
        kind = str(data.get("kind", "str"))
        accepts = data.get("accepts")
        return cls(name=str(data["name"]), kind=kind if kind in KINDS else "str",
                   default=data.get("default"), help=str(data.get("help") or ""),
                   choices=tuple(str(c) for c in (data.get("choices") or ())),
                   optional=bool(data.get("optional", False)),
                   accepts=tuple(str(a) for a in accepts) if isinstance(accepts, (list, tuple)) else None)

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "kind": self.kind, "default": self.default, "help": self.help,
               "choices": list(self.choices), "optional": self.optional}
        if self.accepts is not None:
            out["accepts"] = list(self.accepts)
        return out

    @property
    def mixed(self) -> bool:
        """A text field that also takes JSON values (dict, list, bool): editor text is read as JSON
        when it looks like JSON."""
        return self.kind == "str" and any(a != "str" for a in self.accepts or ())

    def parse(self, text: str) -> Any:
        """The value typed in an editor as this field's type; ValueError with a readable message."""
        text = text.strip()
        if text == "" and (self.optional or self.default is None):
            return None
        if self.kind == "bool":
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"{self.name}: expected true or false, got {text!r}")
        if self.kind == "int":
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"{self.name}: expected a whole number, got {text!r}") from None
        if self.kind == "float":
            try:
                # "3" stays the int 3: the job keeps what the user typed (TrainingArguments takes both).
                return int(text)
            except ValueError:
                pass
            try:
                return float(text)
            except ValueError:
                raise ValueError(f"{self.name}: expected a number, got {text!r}") from None
        if self.kind == "enum":
            if self.choices and text not in self.choices:
                raise ValueError(f"{self.name}: expected one of {', '.join(self.choices)}")
            return text
        if self.kind in ("list", "dict"):
            if not text:
                return [] if self.kind == "list" else {}
            try:
                value = json.loads(text)
            except ValueError:
                if self.kind == "list":
                    return [part.strip() for part in text.split(",") if part.strip()]
                raise ValueError(f"{self.name}: expected a JSON object") from None
            return value
        if self.kind == "str" and text == '""':
            return ""  # an empty string typed as such (a blank editor means "default")
        if self.mixed:
            accepts = self.accepts or ()
            if "bool" in accepts and text.lower() in ("true", "false"):
                return text.lower() == "true"
            if text[:1] in ('"', "{", "["):
                try:
                    value = json.loads(text)
                except ValueError:
                    return text
                if isinstance(value, str) or (isinstance(value, dict) and "dict" in accepts) \
                        or (isinstance(value, list) and "list" in accepts):
                    return value
        return text

    def format(self, value: Any) -> str:
        """A value as editor text (the inverse of ``parse``)."""
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (list, dict)):
            return json.dumps(value)
        text = str(value)
        if value == "" and self.kind == "str":
            return '""'
        if self.mixed and isinstance(value, str):
            # A string that would read back as something else ("true", "{...}", " x") is quoted.
            try:
                same = self.parse(text) == value and text == text.strip()
            except ValueError:
                same = False
            if not same:
                return json.dumps(value)
        return text

    def check(self, value: Any) -> str | None:
        """A type or range problem with ``value`` (as stored in a job file), or None."""
        if value is None:
            return None if (self.optional or self.default is None) else f"{self.name} may not be empty"
        allowed: tuple[type, ...] = ()
        if self.accepts is not None:
            for kind in (self.kind, *self.accepts):
                allowed += _PY_TYPES.get(kind, ())
        else:
            allowed = {"bool": (bool,), "int": (int,), "float": (int, float), "list": (list, str),
                       "dict": (dict, str)}.get(self.kind, ())
        if allowed and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            return f"{self.name}: expected {_KIND_WORDS.get(self.kind, self.kind)}, got {value!r}"
        if self.kind == "enum" and self.choices and str(value) not in self.choices:
            return f"{self.name}: {value!r} is not one of {', '.join(self.choices)}"
        minimum = MINIMUM.get(self.name)
        if minimum and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and value < minimum[0]:
            return f"{minimum[1]} (got {value})"
        return None


@dataclass
class Schema:
    transformers_version: str
    fields: dict[str, FieldSpec] = field(default_factory=dict)
    #: "SFTConfig" or "TrainingArguments".
    config_class: str = "TrainingArguments"
    trl_version: str = ""
    format: int = SCHEMA_FORMAT
    #: SFTConfig's own fields (beyond TrainingArguments): not a preference objective's.
    sft_only: tuple[str, ...] = ()
    #: objective -> (its config class, its own fields beyond TrainingArguments).
    objectives: dict[str, tuple[str, dict[str, FieldSpec]]] = field(default_factory=dict)
    #: The objective this schema's fields are for.
    objective: str = "sft"
    #: The SFT schema this one was derived from (``for_objective``); None: this is it.
    root: Schema | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schema:
        specs = [FieldSpec.from_dict(f) for f in data.get("fields", [])]
        fmt = data.get("format", 1)
        objectives: dict[str, tuple[str, dict[str, FieldSpec]]] = {}
        raw = data.get("objectives")
        for name, part in (raw.items() if isinstance(raw, Mapping) else ()):
            if isinstance(part, Mapping):
                own = [FieldSpec.from_dict(f) for f in part.get("fields", [])]
                objectives[str(name)] = (str(part.get("config_class") or name), {f.name: f for f in own})
        return cls(str(data.get("transformers_version", "")), {s.name: s for s in specs},
                   config_class=str(data.get("config_class") or "TrainingArguments"),
                   trl_version=str(data.get("trl_version") or ""),
                   format=fmt if isinstance(fmt, int) else 1,
                   sft_only=tuple(str(n) for n in data.get("sft_only") or ()), objectives=objectives)

    def to_dict(self) -> dict[str, Any]:
        return {"transformers_version": self.transformers_version, "config_class": self.config_class,
                "trl_version": self.trl_version, "format": self.format,
                "fields": [f.to_dict() for f in self.fields.values()], "sft_only": list(self.sft_only),
                "objectives": {name: {"config_class": cls_name, "fields": [f.to_dict() for f in own.values()]}
                               for name, (cls_name, own) in self.objectives.items()}}

    def for_objective(self, objective: str) -> Schema:
        """The schema of a job whose objective is ``objective``: this one for SFT (or an objective this
        schema does not know: the check then names its fields as unknown), else TrainingArguments'
        fields with that objective's own (DPOConfig's beta, loss_type, max_length, ...)."""
        if self.root is not None:
            return self.root.for_objective(objective)
        if objective == "sft" or objective not in self.objectives:
            return self
        cls_name, own = self.objectives[objective]
        base = {n: f for n, f in self.fields.items() if n not in set(self.sft_only)}
        return Schema(self.transformers_version, {**base, **own}, config_class=cls_name,
                      trl_version=self.trl_version, format=self.format, sft_only=self.sft_only,
                      objectives=self.objectives, objective=objective, root=self)

    def describe(self) -> str:
        trl = f", trl {self.trl_version}" if self.trl_version else ""
        return f"{self.config_class} (transformers {self.transformers_version}{trl})"

    def common(self) -> list[FieldSpec]:
        return [self.fields[n] for n in COMMON if n in self.fields]

    def others(self) -> list[FieldSpec]:
        common = set(COMMON)
        return sorted((f for f in self.fields.values() if f.name not in common), key=lambda f: f.name)

    def search(self, text: str) -> list[FieldSpec]:
        """Fields whose name or help contains every word of ``text`` (case-insensitive)."""
        words = text.lower().split()
        return [f for f in self.fields.values()
                if all(w in f.name.lower() or w in f.help.lower() for w in words)]

    def check(self, values: Mapping[str, Any]) -> list[tuple[str, str]]:
        """Unknown/removed fields, type and range errors, and the few combinations that can never train,
        without a child. Anything TrainingArguments decides from the whole set (bf16 needs use_cpu on a
        CPU, matching strategies for load_best_model_at_end, ...) is left to the child, which knows the
        device: a per-field check here must never refuse a combination that builds."""
        problems: list[tuple[str, str]] = []
        for name, value in values.items():
            spec = self.fields.get(name)
            if spec is None:
                unknown = f"unknown argument '{name}' in transformers {self.transformers_version}" \
                    if self.objective == "sft" else \
                    f"'{name}' is not a {self.config_class} argument (the {self.objective.upper()} objective)"
                problems.append((name, REMOVED.get(name, unknown)))
                continue
            message = spec.check(value)
            if message:
                problems.append((name, message))
        flagged = {name for name, _ in problems}
        steps, epochs = self.value(values, "max_steps"), self.value(values, "num_train_epochs")
        if "num_train_epochs" in self.fields and "num_train_epochs" not in flagged \
                and _number(steps) and _number(epochs) and steps <= 0 and epochs <= 0:
            problems.append(("num_train_epochs", f"nothing to train: num_train_epochs is {epochs} and "
                                                 f"max_steps {steps}; set one of them above 0"))
        return problems

    def value(self, values: Mapping[str, Any], name: str) -> Any:
        """``values[name]``, else the field's default (a job file stores only what differs)."""
        if name in values:
            return values[name]
        spec = self.fields.get(name)
        return spec.default if spec else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def hints(device: str, values: Mapping[str, Any], num_processes: int = 1) -> list[tuple[str, str]]:
    """Device-aware advice for a set of training arguments: (field, text)."""
    out: list[tuple[str, str]] = []
    if device == "cpu":
        if values.get("bf16") and not values.get("use_cpu"):
            out.append(("bf16", "bf16 on CPU needs use_cpu=true (otherwise TrainingArguments refuses)"))
        if values.get("fp16"):
            out.append(("fp16", "fp16 does nothing on CPU (accepted and silently ignored)"))
    if device == "hpu":
        backend = values.get("ddp_backend")
        if num_processes > 1 and backend not in (None, "", "hccl"):
            out.append(("ddp_backend", "use ddp_backend=hccl on Gaudi"))
        if values.get("fp16"):
            out.append(("fp16", "Gaudi trains in bf16; prefer bf16=true"))
    if num_processes <= 1 and values.get("ddp_backend"):
        out.append(("ddp_backend", "ddp_backend needs more than one process"))
    warmup = values.get("warmup_steps")
    if isinstance(warmup, (int, float)) and 0 < warmup < 1:
        out.append(("warmup_steps", f"warmup_steps {warmup} < 1 is read as a ratio of the total steps"))
    return out


def cache_path(transformers_version: str) -> Path:
    safe = "".join(c if c.isalnum() or c in ".-_" else "_" for c in transformers_version)
    return paths.cache_dir() / f"training-args-{safe}.json"


def load_cached(transformers_version: str) -> Schema | None:
    try:
        data = json.loads(cache_path(transformers_version).read_text(encoding="utf-8"))
        schema = Schema.from_dict(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if schema.format < SCHEMA_FORMAT:
        return None
    return schema if schema.fields and schema.transformers_version == transformers_version else None


def save_cached(schema: Schema) -> Path:
    path = cache_path(schema.transformers_version)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, schema.to_dict(), indent=None, fsync=False)
    return path


def latest_cached() -> Schema | None:
    """Any cached schema (newest file), for an instant form before the child answers."""
    try:
        files = sorted(paths.cache_dir().glob("training-args-*.json"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return None
    for path in reversed(files):
        try:
            schema = Schema.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if schema.fields and schema.format >= SCHEMA_FORMAT:
            return schema
    return None
