"""One check of a job where it enters, never late (issue 37, item 8).

A training job enters through the Training form (Start, Queue), ``gaudi-gui train`` (which the window's
local Start runs too), ``queue add`` and ``prepare_run``; each calls ``check`` and refuses what it
finds at the field (exit 2 on the command line). Before this, each entry checked a different part and
the rest failed minutes later in the launched ranks, after the model load: ``"max_steps": "ten"`` as
three tracebacks, a missing model folder as "Repo id must be in the form …", an output folder that
cannot be written as an accelerate traceback.

``check`` covers the job's keys and types (``JobConfig.validate``, which ``JobConfig.load`` precedes),
the training arguments by type against the installed TrainingArguments/SFTConfig schema (the cached
introspection of ``workers.schema``; asked of its child once when not cached), the model (``model_problem``:
the one rule Serve and Evaluate use too), the dataset files read whole (``core.datafile``), the output
folder's writability and another run's files in it. What needs the model, the device or the whole set of
arguments together is the child validation's and the worker's. Qt-free, torch-free.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Final

from gaudi_gui.core import datafile, outputs, paths
from gaudi_gui.core.jobconfig import JobConfig, dataset_columns

if TYPE_CHECKING:
    from gaudi_gui.core.training_args import Schema

#: ``schema=ASK``: the installed schema (cached, else its child once).
ASK: Final = "ask"
#: A Hub model id: "name" or "owner/name" (huggingface_hub's rule: word characters, "-" and ".", no
#: "--" or "..", at most 96 characters each).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]{0,95}(/[A-Za-z0-9_][\w.\-]{0,95})?")


def model_problem(model: str) -> str | None:
    """Why ``model`` cannot be loaded as named (None: it can be tried): a folder must exist and hold
    ``config.json`` (or ``adapter_config.json``); what looks like a path (``/``, ``.``, ``~``, or more
    than one ``/``) must be such a folder; anything else must read as a Hub id. Used by training,
    Serve and Evaluate alike."""
    text = model.strip()
    if not text:
        return "choose a model (Hub id, folder, or builtin:demo)"
    if paths.is_demo(text):
        return None
    expanded = os.path.expanduser(text)
    if os.path.isdir(expanded):
        if os.path.isfile(os.path.join(expanded, "config.json")) or \
                os.path.isfile(os.path.join(expanded, "adapter_config.json")):
            return None
        return f"{text} has no config.json: not a model folder"
    if os.path.exists(expanded):
        return f"{text} is a file, not a model folder"
    if text.startswith((".", "/", "~")) or text.count("/") > 1 or (os.sep != "/" and os.sep in text):
        return f"model folder not found: {text}"
    if not _HUB_ID.fullmatch(text) or "--" in text or ".." in text or text.endswith((".", "-")):
        return f"{text!r} is neither a model folder nor a Hub id (org/name)"
    return None


def writable_problem(folder: str | Path) -> str | None:
    """Why files cannot be written into ``folder`` (None: they can). It need not exist yet: a probe
    file is made and removed in it, or in its nearest existing parent (where it would be created)."""
    target = Path(folder).expanduser().absolute()
    nearest = target
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if not nearest.is_dir():
        return f"{folder} cannot be made: {nearest} is a file, not a folder"
    probe = nearest / f".gaudi-gui-write-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except OSError as exc:
        where = "" if nearest == target else f" ({nearest}, where it would be made)"
        return f"{folder} is not writable{where}: {exc.strerror or exc}"
    with contextlib.suppress(OSError):
        probe.unlink()
    return None


def cached_schema() -> Schema | None:
    """The installed TrainingArguments/SFTConfig schema where it is cached for this transformers
    version, else None: never a child (the window's thread must not wait seconds for one)."""
    from importlib import metadata

    from gaudi_gui.core.training_args import load_cached
    try:
        return load_cached(metadata.version("transformers"))
    except metadata.PackageNotFoundError:
        return None


def training_schema(timeout_s: float = 180.0) -> Schema | None:
    """The installed TrainingArguments/SFTConfig schema: the cached one for this transformers version,
    else its child's (seconds: it imports transformers), cached for the next time. None where
    transformers is missing or the child fails (the launched worker checks the arguments then)."""
    from importlib import metadata

    from gaudi_gui.core.training_args import Schema, save_cached
    try:
        metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None
    cached = cached_schema()
    if cached is not None:
        return cached
    try:
        done = subprocess.run([sys.executable, "-m", "gaudi_gui.workers.schema"], capture_output=True,
                              text=True, errors="replace", timeout=timeout_s, check=False)
        schema = Schema.from_dict(json.loads(done.stdout[done.stdout.find("{"):]))
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return None
    if not schema.fields:
        return None
    with contextlib.suppress(OSError):
        save_cached(schema)
    return schema


def output_problems(job: JobConfig, resumed_from: str = "") -> list[tuple[str, str]]:
    """The output folder holds another run's checkpoints or model and the job does not say
    overwrite: one problem at ``training_args.output_dir`` naming the folder and its run."""
    if job.overwrite_output:
        return []
    found = outputs.conflict(job.output_dir, resumed_from=resumed_from)
    return [("training_args.output_dir", found.message)] if found else []


def output_folder(job: JobConfig) -> str:
    """The folder the run will write: the job's output_dir, else where each run gets its own."""
    return job.output_dir.strip() or str(paths.data_dir() / "outputs")


def dataset_scans(job: JobConfig, scan_limit: int | None = None) -> list[tuple[str, datafile.Scan]]:
    """(field, scan) of each local dataset file the job trains or evaluates on."""
    out: list[tuple[str, datafile.Scan]] = []
    source = job.dataset_file()
    fmt = job.dataset_format()
    files = [("dataset.source", source, fmt)]
    eval_source = job.dataset.eval.get("source")
    if isinstance(eval_source, str) and eval_source:
        from gaudi_gui.core.jobconfig import resolve_format
        files.append(("dataset.eval.source", eval_source,
                      resolve_format(eval_source, str(job.dataset.eval.get("format") or "auto"))))
    for field, path, path_fmt in files:
        if not datafile.is_local(path, path_fmt):
            continue
        kind = job.dataset.kind
        if job.objective != "sft":
            # A preference file's rows are checked by core.preference (JobConfig.validate); the scan
            # maps SFT columns. Its lines are still read whole: not valid JSON is said here.
            found = datafile.scan(path, path_fmt, text_column="chosen", limit=scan_limit)
            if found.problem:
                out.append((field, datafile.Scan(path, problem=found.problem)))
            continue
        if kind == "text" and path_fmt != "text":
            columns = dataset_columns(path, path_fmt)
            if columns is not None and (job.dataset.text_column or "text") not in columns:
                continue  # the missing column itself is said at dataset.text_column
        out.append((field, datafile.scan(path, path_fmt, kind=kind, columns=job.dataset.columns,
                                         text_column=job.dataset.text_column or "text", limit=scan_limit)))
    return out


def check(job: JobConfig, *, schema: Schema | str | None = ASK, resumed_from: str = "", local: bool = True,
          scan_limit: int | None = None) -> list[tuple[str, str]]:
    """Every problem of ``job`` found before a launch, as (field, message), fields as
    ``JobConfig.validate`` names them (``training_args.NAME`` for an argument). Empty: it may launch.

    ``schema``: the training-arguments schema to check the arguments by (``ASK``: the installed one;
    None: not checked here). ``local`` False: the job runs on another machine, whose own ``train``
    checks the files it names (model, dataset, output folder): they are not looked for here.
    ``scan_limit``: read at most that many bytes of a dataset file (the window's checks at each change)."""
    problems = job.validate()
    if schema == ASK:
        schema = training_schema()
    if schema is not None and not isinstance(schema, str):
        schema = schema.for_objective(job.objective)
        problems += [(f"training_args.{f}", m) for f, m in schema.check(job.training_args)]
    if local:
        bad = model_problem(job.model)
        if bad and not any(f == "model" for f, _m in problems):
            problems.append(("model", bad))
        said = {f for f, _m in problems}
        # A column mapping already refused is the cause: every row then lacks that column, and
        # counting them would say the same thing twice.
        mapping_said = any(f.startswith("dataset.columns") for f in said)
        for field, found in dataset_scans(job, scan_limit):
            refusal = found.refusal()
            if refusal and field not in said and not (mapping_said and not found.problem):
                problems.append((field, refusal))
        if isinstance(job.training_args.get("output_dir", ""), str):
            bad = writable_problem(output_folder(job))
            if bad:
                problems.append(("training_args.output_dir", bad))
            else:
                problems += output_problems(job, resumed_from)
    return problems


def notes(job: JobConfig, scan_limit: int | None = None) -> list[str]:
    """What to say about a job that may launch: the rows of its dataset that will be skipped."""
    return [n for _f, scan in dataset_scans(job, scan_limit) if (n := scan.note())]


__all__ = ["ASK", "check", "dataset_scans", "model_problem", "notes", "output_folder", "output_problems",
           "training_schema", "writable_problem"]
