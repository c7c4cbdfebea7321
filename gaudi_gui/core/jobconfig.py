"""A training job as one JSON file: the form saves it, ``gaudi-gui train --config`` and the worker read it.

Only the training arguments that differ from the defaults are stored, so a job file stays readable
and keeps working when a transformers release changes a default.

Version 2 adds the dataset's kind (``dataset.kind``: text, prompt_completion, conversational), the
column mapping (``dataset.columns``) and an eval split (``dataset.eval``); a version-1 file reads as a
text job with no eval split. ``training_args`` are SFTConfig values (TRL's subclass of
TrainingArguments); the worker keeps TrainingArguments' defaults where SFTConfig changes them, so a
version-1 file trains as it did.

``objective`` (issue 41) is what the run learns: ``"sft"`` (the default, and what a file without the key
means), or a preference objective, ``"dpo"``, ``"orpo"``, ``"kto"`` (``core.preference``): the worker then
takes TRL's DPOTrainer/ORPOTrainer/KTOTrainer and its config class, ``training_args`` are that class's
values, and the dataset is a preference file (its columns read by ``core.preference``; ``dataset.kind``
and ``dataset.columns`` are SFT's and unused).
"""

from __future__ import annotations

import csv
import io
import json
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from gaudi_gui.core import atomic, jsonfile, paths, preference, sft
from gaudi_gui.core.secrets import SECRET_TRAINING_ARGS, hub_token_available

JOB_VERSION = 2
METHODS = ("full", "lora", "qlora")
FORMATS = ("auto", "text", "json", "csv", "hub")
MIXED_PRECISION = ("no", "bf16", "fp16")


class JobConfigError(ValueError):
    """A job file that cannot be read; the message says what and where."""


@dataclass
class DatasetConfig:
    #: A file path, a Hub dataset id, or "builtin:demo".
    source: str = paths.DEMO_DATASET_ID
    #: "auto" picks text/json/csv by extension (a non-existent path is read as a Hub id).
    format: str = "auto"
    text_column: str = "text"
    max_length: int = 32
    split: str = "train"
    #: "text" | "prompt_completion" | "conversational" (gaudi_gui.core.sft.KINDS).
    kind: str = "text"
    #: SFTTrainer field -> column (or a "{col}" template): {"prompt": "question", "completion": "answer"},
    #: {"messages": "conversations"}. Unused by "text", which reads ``text_column``.
    columns: dict[str, str] = field(default_factory=dict)
    #: {} (none), {"fraction": 0.1} (seeded split of the train rows), {"source": FILE}, {"split": NAME}.
    eval: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoraConfig:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    #: Empty: peft picks the modules for known architectures.
    target_modules: list[str] = field(default_factory=list)


@dataclass
class LaunchConfig:
    num_processes: int = 1
    mixed_precision: str = "no"
    #: An accelerate config file chosen by the user; empty: a generated one in the run folder.
    accelerate_config: str = ""
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str = ""
    main_process_port: int = 29500


@dataclass
class JobConfig:
    model: str = paths.DEMO_MODEL_ID
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    method: str = "full"
    lora: LoraConfig = field(default_factory=LoraConfig)
    training_args: dict[str, Any] = field(default_factory=dict)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    #: A checkpoint folder, "latest" (newest in output_dir), or empty.
    resume_from_checkpoint: str = ""
    name: str = ""
    #: Write into an output folder that holds another run's checkpoints, final model or adapter
    #: (core/outputs.py refuses that otherwise).
    overwrite_output: bool = False
    #: "sft" (default; not written to the file), "dpo", "orpo" or "kto" (core.preference.OBJECTIVES).
    objective: str = "sft"
    #: Record this many training steps with torch.profiler after a short warm-up (issue 40; 0: off,
    #: not written to the file): the trace and its summary go to ``<run>/profile/`` (core/profile.py).
    profile_steps: int = 0

    @property
    def quantization(self) -> str:
        """How the model is loaded, in the one vocabulary (``core.quantization``): QLoRA is "4bit"."""
        return "4bit" if self.method == "qlora" else "none"

    # -- JSON -------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["version"] = JOB_VERSION
        if data.get("objective") == "sft":
            del data["objective"]  # absent means SFT: an SFT job file reads as it always did
        if not data.get("profile_steps"):
            data.pop("profile_steps", None)  # absent means no profile: older readers read it as before
        # A token comes from the environment or the Hub's token store, never from a job file.
        data["training_args"] = {k: v for k, v in data["training_args"].items()
                                 if k not in SECRET_TRAINING_ARGS}
        return data

    @classmethod
    def from_dict(cls, data: Any) -> JobConfig:
        if not isinstance(data, dict):
            raise JobConfigError("a job file must hold a JSON object")
        version = data.get("version", JOB_VERSION)
        if not isinstance(version, int) or version > JOB_VERSION:
            raise JobConfigError(f"job file version {version!r} is newer than this gaudi-gui "
                                 f"understands ({JOB_VERSION})")
        known = {f.name for f in fields(cls)} | {"version"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise JobConfigError(f"unknown key(s) in job file: {', '.join(unknown)}")
        job = cls()
        for key in ("model", "method", "resume_from_checkpoint", "name"):
            if key in data:
                if not isinstance(data[key], str):
                    raise JobConfigError(f"'{key}' must be a string, got {data[key]!r}")
                setattr(job, key, data[key])
        if "overwrite_output" in data:
            if not isinstance(data["overwrite_output"], bool):
                raise JobConfigError(f"'overwrite_output' must be true or false, got "
                                     f"{data['overwrite_output']!r}")
            job.overwrite_output = data["overwrite_output"]
        if "profile_steps" in data:
            value = data["profile_steps"]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise JobConfigError(f"'profile_steps' must be a whole number of steps (0: no profile), "
                                     f"got {value!r}")
            job.profile_steps = value
        if "objective" in data:
            problem = preference.objective_problem(data["objective"])
            if problem:
                raise JobConfigError(problem)
            job.objective = data["objective"]
        if "training_args" in data:
            if not isinstance(data["training_args"], dict):
                raise JobConfigError("'training_args' must be an object of TrainingArguments values")
            job.training_args = dict(data["training_args"])
        job.dataset = _section(DatasetConfig, data.get("dataset", {}), "dataset")
        if version < 2 and (job.dataset.kind != "text" or job.dataset.columns or job.dataset.eval):
            raise JobConfigError("dataset.kind, dataset.columns and dataset.eval need a version 2 job file")
        job.lora = _section(LoraConfig, data.get("lora", {}), "lora")
        job.launch = _section(LaunchConfig, data.get("launch", {}), "launch")
        return job

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> JobConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise JobConfigError(f"not valid JSON (line {exc.lineno}, column {exc.colno}): "
                                 f"{exc.msg}") from None
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(path, self.to_json(), fsync=False)

    @classmethod
    def load(cls, path: str | Path) -> JobConfig:
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise JobConfigError(f"cannot read job file {path}: {exc.strerror or exc}") from None
        try:
            # A file in another encoding is a bad job file (one line), never a UnicodeDecodeError.
            text = jsonfile.decode(raw, str(path))
        except jsonfile.FileProblem as exc:
            raise JobConfigError(str(exc)) from None
        try:
            return cls.from_json(text)
        except JobConfigError as exc:
            raise JobConfigError(f"{path}: {exc}") from None

    # -- derived ----------------------------------------------------------------------------------

    @property
    def output_dir(self) -> str:
        return str(self.training_args.get("output_dir") or "")

    def dataset_format(self) -> str:
        return resolve_format(self.dataset.source, self.dataset.format)

    def dataset_file(self) -> str:
        """The dataset source as a path: ``builtin:demo`` is the objective's demo file."""
        return str(paths.demo_dataset_path(self.objective)) if paths.is_demo(self.dataset.source) \
            else self.dataset.source

    def validate(self) -> list[tuple[str, str]]:
        """Problems the form shows at the field: (field path, message). Empty: launchable."""
        problems: list[tuple[str, str]] = []
        if not self.model.strip():
            problems.append(("model", "choose a model (Hub id, folder, or builtin:demo)"))
        if not self.dataset.source.strip():
            problems.append(("dataset.source", "choose a dataset (file, Hub id, or builtin:demo)"))
        if self.dataset.format not in FORMATS:
            problems.append(("dataset.format", f"format must be one of {', '.join(FORMATS)}"))
        fmt = self.dataset_format()
        if fmt != "hub" and not paths.is_demo(self.dataset.source) \
                and not Path(self.dataset.source).expanduser().is_file():
            problems.append(("dataset.source", f"file not found: {self.dataset.source}"))
        kind = self.dataset.kind
        source = self.dataset_file()
        if preference.is_preference(self.objective):
            # A preference file: its columns say what it holds (core.preference); no SFT mapping.
            if kind != "text" or self.dataset.columns:
                problems.append(("dataset.columns", f"dataset.kind and dataset.columns are for SFT; "
                                                    f"{preference.LABELS[self.objective]} reads the prompt, "
                                                    f"chosen, rejected (or completion, label) columns"))
            columns = dataset_columns(source, fmt) if fmt != "hub" else None
            rows = dataset_rows(source, fmt, preference.PREVIEW_ROWS * 7) if columns is not None else None
            problems += preference.check(self.objective, columns, rows)
        elif kind != "text":
            # The worker maps these columns: a name the file lacks would fail only after the model load.
            columns = dataset_columns(source, fmt) if fmt != "hub" else None
            mapping = sft.check_columns(kind, self.dataset.columns, columns)
            problems += mapping
            rows = dataset_rows(source, fmt) if not mapping and columns is not None else None
            if rows:
                # Each preview row rendered as the worker renders it: a template that names only
                # columns the file has can still fail on a row (a format code the text does not take).
                problems += sft.check_rows(kind, self.dataset.columns, rows)
        elif not self.dataset.text_column.strip() and fmt != "text":
            problems.append(("dataset.text_column", "name the column to train on"))
        elif fmt != "hub":
            # The worker trains on this column: a name the file does not have fails only after the
            # launch and the model load, so check it against the file's first rows here.
            columns = dataset_columns(source, fmt)
            column = self.dataset.text_column.strip() or "text"
            if columns is not None and column not in columns:
                problems.append(("dataset.text_column", f"the dataset has no column {column!r}; its "
                                                        f"columns: {', '.join(columns) or '(none)'}"))
        if not _positive_int(self.dataset.max_length):
            problems.append(("dataset.max_length", "max length must be a whole number above 0"))
        problems += self._sft_problems(fmt)
        if self.method not in METHODS:
            problems.append(("method", f"method must be one of {', '.join(METHODS)}"))
        if self.method in ("lora", "qlora"):
            if not _positive_int(self.lora.r):
                problems.append(("lora.r", "LoRA rank must be a whole number above 0"))
            if not isinstance(self.lora.alpha, (int, float)) or self.lora.alpha <= 0:
                problems.append(("lora.alpha", "LoRA alpha must be above 0"))
            if not isinstance(self.lora.dropout, (int, float)) or not 0 <= self.lora.dropout < 1:
                problems.append(("lora.dropout", "LoRA dropout must be in [0, 1)"))
        # An empty output folder is the default: each run gets its own (core/outputs.py).
        if not isinstance(self.training_args.get("output_dir", ""), str):
            problems.append(("training_args.output_dir", "the output folder must be a path"))
        launch = self.launch
        if not _positive_int(launch.num_processes):
            problems.append(("launch.num_processes", "number of processes must be at least 1"))
        if launch.mixed_precision not in MIXED_PRECISION:
            problems.append(("launch.mixed_precision",
                             f"mixed precision must be one of {', '.join(MIXED_PRECISION)}"))
        if launch.accelerate_config and not Path(launch.accelerate_config).expanduser().is_file():
            problems.append(("launch.accelerate_config", f"file not found: {launch.accelerate_config}"))
        if not _positive_int(launch.num_machines):
            problems.append(("launch.num_machines", "number of machines must be at least 1"))
        elif launch.num_machines > 1:
            if not launch.main_process_ip.strip():
                problems.append(("launch.main_process_ip", "multi-node needs the main machine's address"))
            if not isinstance(launch.machine_rank, int) or not 0 <= launch.machine_rank < launch.num_machines:
                problems.append(("launch.machine_rank",
                                 f"machine rank must be 0 .. {launch.num_machines - 1}"))
        if not isinstance(launch.main_process_port, int) or not 0 < launch.main_process_port < 65536:
            problems.append(("launch.main_process_port", "port must be 1 .. 65535"))
        problems += self._profile_problems()
        return problems

    def _profile_problems(self) -> list[tuple[str, str]]:
        """``profile_steps``: a count of steps, and room for them after the warm-up in ``max_steps``."""
        from gaudi_gui.core.profile import PROFILE_SKIP_STEPS
        steps = self.profile_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            return [("profile_steps", "profile steps must be a whole number (0: no profile)")]
        max_steps = self.training_args.get("max_steps")
        if steps and isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps > 0 \
                and steps + PROFILE_SKIP_STEPS > max_steps:
            room = max(0, max_steps - PROFILE_SKIP_STEPS)
            return [("profile_steps", f"{steps} profiled steps need {steps + PROFILE_SKIP_STEPS} training "
                                      f"steps ({PROFILE_SKIP_STEPS} of warm-up first), but max_steps is "
                                      f"{max_steps}: profile at most {room} steps or raise max_steps")]
        return []


    def _sft_problems(self, fmt: str) -> list[tuple[str, str]]:
        """The eval split, and the training arguments that the dataset part of the job decides."""
        problems = sft.check_eval(self.dataset.eval)
        spec = self.dataset.eval
        if spec.get("split") and fmt != "hub":
            problems.append(("dataset.eval.split", "a named split is for a Hub dataset; for a file use "
                                                   "a fraction or a second file"))
        if spec.get("source") and not problems and preference.is_preference(self.objective):
            eval_fmt = resolve_format(spec["source"], str(spec.get("format") or "auto"))
            columns = dataset_columns(spec["source"], eval_fmt) if eval_fmt != "hub" else None
            problems += [("dataset.eval.source", f"eval file: {m}")
                         for _f, m in preference.check(self.objective, columns)]
        elif spec.get("source") and not problems and self.dataset.kind != "text":
            eval_fmt = resolve_format(spec["source"], str(spec.get("format") or "auto"))
            columns = dataset_columns(spec["source"], eval_fmt) if eval_fmt != "hub" else None
            problems += [(f.replace("dataset.columns", "dataset.eval.source"), f"eval file: {m}")
                         for f, m in sft.check_columns(self.dataset.kind, self.dataset.columns, columns)]
        args = self.training_args
        if not sft.has_eval(spec):
            strategy = args.get("eval_strategy")
            if strategy not in (None, "no"):
                problems.append(("training_args.eval_strategy",
                                 f"eval_strategy {strategy!r} needs an eval split: set one under Dataset "
                                 f"(a fraction of the train rows or a second file)"))
            if args.get("load_best_model_at_end"):
                problems.append(("training_args.load_best_model_at_end",
                                 "load_best_model_at_end needs an eval split (and eval_strategy)"))
        if "max_length" in args and args["max_length"] != self.dataset.max_length:
            problems.append(("training_args.max_length",
                             f"set the max length once: dataset.max_length ({self.dataset.max_length}) is "
                             f"what the run uses; remove training_args.max_length ({args['max_length']})"))
        if "dataset_text_field" in args:
            problems.append(("training_args.dataset_text_field",
                             "the column to train on is dataset.text_column (or dataset.columns)"))
        if self.dataset.kind != "prompt_completion" and args.get("completion_only_loss"):
            problems.append(("training_args.completion_only_loss",
                             "completion_only_loss is for prompt_completion datasets"))
        if self.dataset.kind != "conversational" and args.get("assistant_only_loss"):
            problems.append(("training_args.assistant_only_loss",
                             "assistant_only_loss is for conversational datasets"))
        if args.get("push_to_hub") and not hub_token_available():
            # The Trainer would create the repository only after the model load, then fail there.
            problems.append(("training_args.push_to_hub",
                             "push_to_hub needs a Hugging Face token: log in with `hf auth login` or set "
                             "HF_TOKEN (a job file never holds the token)"))
        hub_id = args.get("hub_model_id")
        if isinstance(hub_id, str) and hub_id.strip() and (hub_id.count("/") > 1 or hub_id.strip() != hub_id
                                                            or " " in hub_id):
            problems.append(("training_args.hub_model_id",
                             f"hub_model_id is a repository name, optionally with its owner: 'name' or "
                             f"'owner/name' (got {hub_id!r})"))
        for name in SECRET_TRAINING_ARGS:
            if args.get(name):
                problems.append((f"training_args.{name}", f"{name} is never kept in a job: log in with "
                                                          "`hf auth login` or set HF_TOKEN"))
        return problems


def demo_job(num_processes: int = 1, objective: str = "sft") -> JobConfig:
    """The demo job the Training tab starts from: ``builtin:demo`` model and dataset, full fine-tune.

    The demo model was pre-trained on ``demo/corpus.txt`` until it recites it (loss ~0.15), so the
    demo dataset is other text: one "Q: … A: …" row per fact, which the base model never saw. Trained
    on the corpus itself (as before), a 200-step LoRA run answered 2 of 3 prompts as the base did.
    learning_rate 1e-3: measured, 20 steps (full or LoRA) change every answer to the demo prompts
    (``demo/prompts.txt``); the 5e-5 default changed nothing. max_length 48: the longest row is 43
    tokens (the default 32 cut the answers off).

    A preference objective's demo (``builtin:demo`` is then ``demo/preference.jsonl``: 8 plain pairs, a
    right answer chosen over an unrelated one): 40 steps at 1e-3 (measured on the demo model on a CPU:
    DPO's rewards/margins rise from ~0 to ~5 in under a minute; TRL's 1e-6 default moves nothing in
    40 steps), no gradient checkpointing (a 2-layer model needs none; it costs a third of a step)."""
    if preference.is_preference(objective):
        job = JobConfig(objective=objective, training_args={
            "max_steps": 40, "learning_rate": 1e-3, "per_device_train_batch_size": 2, "logging_steps": 1,
            "save_steps": 20, "gradient_checkpointing": False})
        job.dataset.max_length = 48
        job.launch.num_processes = max(1, num_processes)
        return job
    job = JobConfig(training_args={"max_steps": 20, "learning_rate": 1e-3, "per_device_train_batch_size": 2,
                                   "logging_steps": 1, "save_steps": 10})
    job.dataset.max_length = 48
    job.launch.num_processes = max(1, num_processes)
    return job


def align_job(sft_job: JobConfig, model: str, *, adapter: bool, sft_only: tuple[str, ...] = (),
              objective: str = "dpo") -> JobConfig:
    """"Align with preferences…" on a finished SFT run: a DPO job (``objective``) that starts from that
    run's model (``model``: its final/ or merged/ model, or its LoRA ``adapter``, trained on as LoRA:
    the worker loads base + adapter and TRL keeps a frozen copy of the adapter as the reference).
    The SFT run's launch stays; a demo run's job becomes the preference demo; another run keeps its
    training arguments but SFTConfig's own (``sft_only``), its output folder and resume point, and
    its dataset is left for the person to choose (an SFT file is no preference file)."""
    job = JobConfig.from_dict(sft_job.to_dict())
    demo = paths.is_demo(sft_job.model) and paths.is_demo(sft_job.dataset.source)
    if demo:
        job.training_args = dict(demo_job(objective=objective).training_args)
        job.dataset = DatasetConfig(max_length=demo_job(objective=objective).dataset.max_length)
    else:
        job.training_args = {k: v for k, v in sft_job.training_args.items()
                             if k not in sft_only and k not in ("output_dir", "dataset_text_field")}
        job.dataset = DatasetConfig(source="", max_length=sft_job.dataset.max_length,
                                    eval=dict(sft_job.dataset.eval))
    job.objective = objective
    job.model = model
    if adapter:
        job.method = "qlora" if sft_job.method == "qlora" else "lora"
    elif job.method != "full":
        job.method = "full"  # a merged or full model: train it whole (the reference is a copy)
    job.resume_from_checkpoint = ""
    job.name = f"{sft_job.name}-{objective}" if sft_job.name else ""
    return job


def load_job(config: str, stdin: IO[str] | None = None) -> JobConfig:
    """The job a command's ``--config`` names: a job file, or ``-`` for the job as JSON on stdin;
    JobConfigError (one line) for anything else."""
    if config != "-":
        return JobConfig.load(config)
    try:
        data = json.loads((stdin or sys.stdin).read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise JobConfigError(f"the config on stdin is not JSON: {exc}") from None
    return JobConfig.from_dict(data)


def resolve_format(source: str, fmt: str = "auto") -> str:
    """'text' / 'json' / 'csv' / 'hub' for a dataset source."""
    if fmt != "auto":
        return fmt
    if paths.is_demo(source):
        return "json"
    suffix = Path(source).suffix.lower()
    if suffix in (".jsonl", ".json"):
        return "json"
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix in (".txt", ".md", ".text"):
        return "text"
    return "hub" if not Path(source).expanduser().exists() else "text"


#: How much of a dataset file the column check reads (the first rows, never the whole file).
COLUMN_PROBE_BYTES = 256 * 1024


def dataset_columns(source: str, fmt: str, rows: int = 20) -> list[str] | None:
    """The column names ``datasets`` will see in a local file, from its first rows, read as plain text
    (no ``datasets`` import in the GUI). None when they cannot be known this way (Hub dataset, missing
    or unreadable file, a JSON layout other than rows of objects)."""
    fmt = resolve_format(source, fmt)
    if fmt == "text":
        return ["text"]  # datasets' text loader: one "text" column
    head = _head(source, fmt)
    if head is None:
        return None
    if fmt == "csv":
        header = next(csv.reader(io.StringIO(head)), None)
        return list(header) if header else None
    found = _json_rows(head, rows)
    if not found:
        return None
    columns: dict[str, None] = {}
    for row in found:
        columns.update(dict.fromkeys(row))
    return list(columns)


def dataset_rows(source: str, fmt: str, rows: int = 20) -> list[dict[str, Any]] | None:
    """The first rows of a local JSON or CSV file as the worker's loader gives them (objects of column
    values), read as plain text; None when they cannot be known this way (see ``dataset_columns``)."""
    fmt = resolve_format(source, fmt)
    head = _head(source, fmt) if fmt in ("csv", "json") else None
    if head is None:
        return None
    if fmt == "csv":
        lines = head.splitlines(keepends=True)
        complete = lines if len(head) < COLUMN_PROBE_BYTES else lines[:-1]  # the last may be cut off
        return [dict(r) for _, r in zip(range(rows), csv.DictReader(complete), strict=False)]
    return _json_rows(head, rows)


def _head(source: str, fmt: str) -> str | None:
    """The first COLUMN_PROBE_BYTES of a local file, or None (a Hub dataset, an unreadable file)."""
    if fmt == "hub":
        return None
    try:
        # utf-8-sig: a spreadsheet's byte-order mark is not part of the first column's name.
        with open(Path(source).expanduser(), encoding="utf-8-sig", errors="replace") as fh:
            return fh.read(COLUMN_PROBE_BYTES)
    except OSError:
        return None


def _json_rows(head: str, rows: int) -> list[dict[str, Any]] | None:
    """The first row objects of a JSON array or of JSON lines; None for any other layout."""
    text = head.lstrip()
    out: list[dict[str, Any]] = []
    if text.startswith("["):
        # A JSON array of row objects: decode the first rows one after another.
        decoder = json.JSONDecoder()
        pos = 1
        while len(out) < rows:
            while pos < len(text) and text[pos] in " \t\r\n,":
                pos += 1
            try:
                row, pos = decoder.raw_decode(text, pos)
            except ValueError:
                break
            if not isinstance(row, dict):
                return None
            out.append(row)
        return out or None
    lines = text.splitlines()
    complete = lines if len(head) < COLUMN_PROBE_BYTES else lines[:-1]  # the last may be cut off
    for line in complete:
        if len(out) >= rows:
            break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            return None  # not JSON lines (one JSON document, e.g. {"data": [...]}): unknown here
        if not isinstance(row, dict):
            return None
        out.append(row)
    return out or None


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _section(cls: type, data: Any, name: str) -> Any:
    if not isinstance(data, dict):
        raise JobConfigError(f"'{name}' must be an object")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise JobConfigError(f"unknown key(s) in '{name}': {', '.join(unknown)}")
    obj = cls()
    for key, value in data.items():
        default = getattr(obj, key)
        is_bool = isinstance(value, bool)
        ok = (isinstance(value, type(default)) and not (is_bool and not isinstance(default, bool))) \
            or (isinstance(default, float) and isinstance(value, int) and not is_bool)
        if not ok:
            raise JobConfigError(f"'{name}.{key}' must be {type(default).__name__}, got {value!r}")
        setattr(obj, key, list(value) if isinstance(value, list) else value)
    return obj
