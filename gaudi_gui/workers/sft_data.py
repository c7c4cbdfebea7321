"""The data side of a training run, shared by the training worker and the render preview.

``python -m gaudi_gui.workers.sft_data --config JOB.json [--rows N]`` prints one JSON line: the first
rows exactly as SFTTrainer will train on them (TRL's own dataset preparation: chat template, EOS,
tokenizing, completion/assistant masks, truncation), as segments of text marked with whether their
tokens carry the loss::

    {"ok": true, "rows": [{"segments": [["<|im_start|>user\\n...", false], ["answer", true]],
      "tokens": 31, "labelled": 9}], "loss": "assistant tokens only", "template": "..."}

or ``{"ok": false, "field": "dataset.columns.prompt", "message": "..."}``. Only the tokenizer is
loaded (no model), so the preview costs seconds even for a large model.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import types
from pathlib import Path
from typing import Any

from gaudi_gui.core import datafile, paths, sft
from gaudi_gui.core.jobconfig import JobConfig, JobConfigError, resolve_format
from gaudi_gui.workers.loader import hide_bitsandbytes


class DataError(Exception):
    """A dataset or mapping problem: ``kind`` as the worker's error kinds, ``field`` the job key."""

    def __init__(self, kind: str, message: str, field: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.field = field


# -- arguments ---------------------------------------------------------------------------------------

def build_args(job: JobConfig) -> dict[str, Any]:
    """The SFTConfig values of a job: what it sets over the kept TrainingArguments defaults, plus what
    its dataset part decides (max length, the text field, the loss default of its kind)."""
    from gaudi_gui.workers.schema import config_class, pinned_defaults

    try:
        cls = config_class(job.objective)
    except ImportError:
        raise DataError("config", f"{job.objective.upper()} needs trl, which is not installed in this "
                                  f"environment (pip install 'trl>=1.16')") from None
    names = {f.name for f in dataclasses.fields(cls)}
    args = {**pinned_defaults(cls), **job.training_args}
    if "enable_jit_checkpoint" in names:
        # Our StopCallback saves on a stop; the JIT handler would take SIGTERM from it (train.py).
        args["enable_jit_checkpoint"] = False
    args.setdefault("report_to", "none")
    if job.objective != "sft":
        args.setdefault("max_length", job.dataset.max_length)
    elif cls.__name__ == "SFTConfig":
        args.setdefault("max_length", job.dataset.max_length)
        args["dataset_text_field"] = "text"
        if job.dataset.kind == "conversational":
            # Loss on the answers is the default for chat data (TRL's own default is every token).
            args.setdefault("assistant_only_loss", True)
    unknown = sorted(set(args) - names)
    if unknown:
        raise DataError("config", f"unknown training argument(s) for this transformers/trl version: "
                                  f"{', '.join(unknown)}")
    return args


def parse_args(args: dict[str, Any], objective: str = "sft") -> Any:
    from transformers import HfArgumentParser

    from gaudi_gui.workers.schema import config_class
    try:
        (parsed,) = HfArgumentParser(config_class(objective)).parse_dict(args)
    except (ValueError, TypeError) as exc:
        raise DataError("config", f"invalid training arguments: {exc}") from exc
    return parsed


# -- rows --------------------------------------------------------------------------------------------

def _load(source: str, fmt: str, split: str) -> Any:
    import datasets

    if paths.is_demo(source):
        source = str(paths.demo_dataset_path())
    try:
        if fmt == "hub":
            return datasets.load_dataset(source, split=split or "train")
        if not Path(source).expanduser().is_file():
            raise DataError("dataset", f"dataset file not found: {source}")
        # The file read as the loader will (core.datafile): an empty file, a line that is not UTF-8 or
        # not JSON is named with its line here; datasets' own error often had no text at all.
        found = datafile.scan(source, fmt)
        if found.problem:
            raise DataError("dataset", found.problem, "dataset.source")
        return datasets.load_dataset(fmt, data_files=str(Path(source).expanduser()), split="train")
    except DataError:
        raise
    except Exception as exc:  # datasets raises many types (FileNotFoundError, DatasetNotFoundError, ...)
        raise DataError("dataset", f"cannot load dataset {source!r}: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    """An exception's text, or its cause's, or its type: never the empty reason datasets gave."""
    seen: BaseException | None = exc
    while seen is not None:
        if str(seen).strip():
            text = str(seen).strip()
            return text if seen is exc else f"{type(exc).__name__}: {text}"
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


def load_raw(job: JobConfig) -> tuple[Any, Any]:
    """(train rows, eval rows or None) as the file holds them; a fraction is split off, seeded."""
    ds = _load(job.dataset_file(), job.dataset_format(), job.dataset.split)
    spec = job.dataset.eval
    eval_ds = None
    if spec.get("source"):
        fmt = resolve_format(spec["source"], str(spec.get("format") or "auto"))
        eval_ds = _load(spec["source"], fmt, "train")
    elif spec.get("split"):
        eval_ds = _load(job.dataset.source, "hub", str(spec["split"]))
    elif spec.get("fraction"):
        fraction = float(spec["fraction"])
        if round(len(ds) * fraction) < 1 or round(len(ds) * (1 - fraction)) < 1:
            raise DataError("dataset", f"an eval fraction of {fraction} of {len(ds)} rows leaves no row "
                                       f"for one side", "dataset.eval.fraction")
        seed = job.training_args.get("seed", 42)
        parts = ds.train_test_split(test_size=fraction, seed=seed if isinstance(seed, int) else 42)
        ds, eval_ds = parts["train"], parts["test"]
    return ds, eval_ds


def check_columns(job: JobConfig, ds: Any, what: str = "dataset") -> None:
    kind = job.dataset.kind
    if kind == "text":
        column = job.dataset.text_column or "text"
        if column not in ds.column_names:
            raise DataError("missing_column", f"{what} has no column {column!r}; available columns: "
                                              f"{', '.join(ds.column_names)}", "dataset.text_column")
        return
    problems = sft.check_columns(kind, job.dataset.columns, list(ds.column_names))
    if problems:
        field, message = problems[0]
        raise DataError("missing_column", f"{what}: {message}", field)


@dataclasses.dataclass
class Skipped:
    """Rows that could not train and were dropped: how many, and the first one's row number and why."""

    count: int = 0
    first: str = ""

    def said(self, rows: int, what: str = "dataset") -> str:
        return f"{what}: {self.count} of {rows} rows cannot train and were skipped (first: {self.first})"


def to_sft(job: JobConfig, ds: Any, chat: bool, what: str = "dataset", *,
           sample: bool = False) -> tuple[Any, Skipped]:
    """File rows -> SFTTrainer rows (text / prompt+completion / messages), every other column dropped,
    and the rows dropped because they cannot train (``sft.row_problem``: no answer, an empty field).
    A loader fills a missing column with null: trained as it was, such a row taught the model an empty
    answer, unsaid. More than ``datafile.BAD_ROWS_LIMIT`` of the rows refuses the run (DataError);
    not of a ``sample`` (the preview's first rows: one bad row of three says nothing of the file)."""
    from gaudi_gui.core.datafile import BAD_ROWS_LIMIT

    check_columns(job, ds, what)
    kind, columns = job.dataset.kind, job.dataset.columns
    column = job.dataset.text_column or "text"
    fmt = job.dataset_format()

    def convert(row: dict[str, Any], index: int) -> dict[str, Any]:
        why = sft.row_problem(kind, columns, row, column)
        if why and not (kind == "text" and fmt == "text"):
            # Kept in the shape of a good row (one column type for the whole set), dropped below.
            empty: dict[str, Any] = {"messages": []} if kind == "conversational" else \
                {"text": ""} if kind == "text" else \
                {"prompt": [{"role": "user", "content": ""}],
                 "completion": [{"role": "assistant", "content": ""}]} if chat else \
                {"prompt": "", "completion": ""}
            return {**empty, "_bad": f"row {index + 1}: {why}"}
        try:
            if kind == "conversational":
                from trl import maybe_convert_to_chatml

                # TRL renames sharegpt's from/value keys; its human/gpt speakers are mapped in core.sft.
                value = copy.deepcopy(row.get(columns["messages"]))
                if isinstance(value, list):
                    value = maybe_convert_to_chatml({"conversations": value})["messages"]
                return {"messages": sft.to_messages(value, columns["messages"]), "_bad": ""}
            return {**sft.to_sft_row(kind, columns, row, chat=chat, text_column=column), "_bad": ""}
        except sft.MappingError as exc:
            raise DataError("dataset", f"{what} row {index + 1}: {exc}", exc.field) from None

    out = ds.map(convert, with_indices=True, remove_columns=ds.column_names)
    bad = [b for b in out["_bad"] if b]
    skipped = Skipped(len(bad), bad[0] if bad else "")
    rows = len(out)
    if bad:
        out = out.filter(lambda row: not row["_bad"])
    out = out.remove_columns("_bad")
    if skipped.count and skipped.count > rows * BAD_ROWS_LIMIT and not sample:
        raise DataError("dataset", f"{what}: {skipped.count} of {rows} rows cannot train (first: "
                                   f"{skipped.first}); more than {BAD_ROWS_LIMIT:.0%} of the rows: check "
                                   f"the column mapping or the file", "dataset.source")
    if kind == "text":
        # A text file's blank lines separate paragraphs: dropped, as they always were, not counted.
        out = out.filter(lambda row: bool(row["text"].strip()))
        if len(out) == 0:
            raise DataError("dataset", f"column {column!r} holds no text to train on", "dataset.text_column")
    elif len(out) == 0:
        raise DataError("dataset", f"{what} has no rows")
    return out, skipped


def apply_chat_template_path(tokenizer: Any, path: str | None) -> str:
    """For the preview: the chat template a chosen ``chat_template_path`` gives (SFTTrainer itself sets
    it in training; a tokenizer folder's template is cloned there with its special tokens)."""
    if not path:
        return "the model's" if getattr(tokenizer, "chat_template", None) else "none"
    if path.endswith((".jinja", ".j2")) and Path(path).is_file():
        tokenizer.chat_template = Path(path).read_text(encoding="utf-8")
    else:
        from transformers import AutoTokenizer
        tokenizer.chat_template = AutoTokenizer.from_pretrained(path).chat_template
    return Path(path).name


# -- preview -----------------------------------------------------------------------------------------

def preview(job: JobConfig, rows: int = 3) -> dict[str, Any]:
    from transformers import AutoTokenizer
    from trl import SFTTrainer
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    from gaudi_gui.workers.demo import resolve_model

    args = parse_args(build_args(job) | {"output_dir": job.output_dir or str(paths.cache_dir())})
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(job.model))
    except Exception as exc:
        raise DataError("model", f"cannot load the tokenizer of {job.model!r}: {exc}", "model") from exc
    template = apply_chat_template_path(tokenizer, args.chat_template_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    chat = bool(getattr(tokenizer, "chat_template", None))
    ds, eval_ds = load_raw(job)
    # Both sides of the split as training will see them (a Hub split or a second file is loaded too,
    # so a wrong split name or eval file shows here, not after the model load).
    train_rows, eval_rows = len(ds), len(eval_ds) if eval_ds is not None else 0
    if eval_ds is not None:
        to_sft(job, eval_ds.select(range(min(rows, len(eval_ds)))), chat, "eval split", sample=True)
    ds = ds.select(range(min(rows, len(ds))))
    data, _skipped = to_sft(job, ds, chat, sample=True)
    sample = data[0]
    # What SFTTrainer.__init__ decides before it prepares the dataset, the same way.
    training_template = None
    if args.assistant_only_loss and not has_generation_markers(tokenizer.chat_template or ""):
        training_template = training_chat_template(tokenizer, get_training_chat_template)
    completion_only = args.completion_only_loss
    if completion_only is None:
        completion_only = "prompt" in sample and "completion" in sample
    stub = types.SimpleNamespace(_tokenizer=tokenizer, chat_template=training_template,
                                 completion_only_loss=completion_only)
    prepared = SFTTrainer._prepare_dataset(stub, data, tokenizer, args, False, None,  # type: ignore[arg-type]
                                           "preview")
    dropped = len(data) - len(prepared)
    if len(prepared) == 0:
        raise DataError("dataset", truncated_message(len(data), len(data), args.max_length),
                        "dataset.max_length")
    out_rows = []
    for row in prepared:
        ids, labels = list(row["input_ids"]), list(row["labels"])
        segments: list[list[Any]] = []
        start = 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or (labels[i] != -100) != (labels[start] != -100):
                segments.append([tokenizer.decode(ids[start:i]), labels[start] != -100])
                start = i
        out_rows.append({"segments": segments, "tokens": len(ids),
                         "labelled": sum(1 for x in labels if x != -100)})
    loss = "assistant tokens only" if args.assistant_only_loss else \
        "completion tokens only" if completion_only else "every token"
    return {"ok": True, "rows": out_rows, "loss": loss, "template": template,
            "training_template": bool(training_template), "kind": job.dataset.kind,
            "train_rows": train_rows, "eval_rows": eval_rows, "dropped": dropped,
            "max_length": args.max_length}


def truncated_message(dropped: int, rows: int, max_length: int | None) -> str:
    """What to say when TRL dropped rows that truncation left without a labelled token."""
    return (f"{dropped} of {rows} rows have no answer token left after truncation to max length "
            f"{max_length} (the prompt alone fills it), so training drops them: raise the max length")


def training_chat_template(tokenizer: Any, get_training_chat_template: Any) -> str | None:
    """TRL's training version of the tokenizer's template (with {% generation %} markers), or a
    DataError that says what to choose instead."""
    try:
        return get_training_chat_template(tokenizer)
    except ValueError:
        raise DataError("config", "assistant-only loss needs a chat template with {% generation %} markers; "
                                  "this model's template has none and TRL has no training version of it: "
                                  "choose a chat template (a TRL training template fits most models) or "
                                  "train on every token (assistant_only_loss=false)",
                        "training_args.chat_template_path") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gaudi_gui.workers.sft_data")
    parser.add_argument("--config", required=True, help="job file")
    parser.add_argument("--rows", type=int, default=3)
    ns = parser.parse_args(argv)
    # A preview renders text and never loads weights: bitsandbytes (imported by TRL through peft when
    # installed: seconds, see workers/loader.py) is made to look absent.
    hide_bitsandbytes()
    try:
        job = JobConfig.load(ns.config)
        result = preview(job, max(1, min(ns.rows, 50)))
    except JobConfigError as exc:
        result = {"ok": False, "field": "", "message": str(exc)}
    except DataError as exc:
        result = {"ok": False, "field": exc.field, "message": str(exc)}
    except Exception as exc:  # a preview never shows a traceback; the message says what failed
        result = {"ok": False, "field": "", "message": f"{type(exc).__name__}: {str(exc)[:500]}"}
    print(json.dumps(result, ensure_ascii=False), flush=True)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
