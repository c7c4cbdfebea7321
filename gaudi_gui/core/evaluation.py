"""Evaluate: did a fine-tune help, and what did it forget. The spec, its checks, and the results kept
with the run. Qt-free and torch-free: the model work is ``gaudi_gui.workers.evaluate``.

An evaluation compares two models on the same inputs: the *tuned* one (a run's LoRA adapter over its
base, unmerged, or the run's full final/merged model; or ``--model M [--adapter A]``) and the *base*
it started from. Inputs: the user's prompts (typed, or a JSONL/text file), a references JSONL scored
with exact match, ROUGE-L (rouge-score) and BLEU (sacrebleu), the perplexity of the references text,
and lm-evaluation-harness tasks that exist offline.

Results of a run are written in the run folder, never anywhere else in it (a LoRA run's adapter and
output are only read): ``<run>/eval/<stamp>.json`` (the spec, per model the means and per task its
scores) and ``<run>/eval/<stamp>-answers.jsonl`` (every prompt, both answers, their timings and per-row
scores). A model evaluated without a run keeps its results under ``<data>/evals/``.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from gaudi_gui.core import atomic, jsonfile, paths
from gaudi_gui.core.jobconfig import JobConfigError
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.core.sft import has_eval, is_adapter_dir

METRICS = ("exact_match", "rouge", "bleu", "perplexity")
#: How prompts reach the model: "auto" formats them with the tokenizer's chat template when the run
#: trained on prompt/completion or chat rows (as training formatted them), "on" always, "off" never.
CHAT_MODES = ("auto", "on", "off")
#: The key each metric's mean has in a result ("rouge" is ROUGE-L's F-measure).
METRIC_KEYS = {"exact_match": "exact_match", "rouge": "rougeL", "bleu": "bleu", "perplexity": "perplexity"}
RESULT_VERSION = 1
EVAL_DIR = "eval"
#: Rows read from a file to learn its columns (the preview and the checks).
PREVIEW_ROWS = 20
MAX_NEW_TOKENS_LIMIT = 2048
#: How far FP8 may raise perplexity over bf16 before the comparison warns (``eval --fp8-max-rise``).
FP8_MAX_RISE_PCT = 3.0
#: Exit codes of ``gaudi-gui eval`` and its worker.
EXIT_OK, EXIT_MODEL_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class EvalInputError(ValueError):
    """Input that cannot be evaluated; ``field`` names the option or form field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class EvalSpec:
    """What to evaluate, as the form or the command line gives it."""

    #: A run folder, or a run's name under the runs folder.
    run: str = ""
    #: Without a run: the tuned model (a folder, a Hub id, or an adapter folder).
    model: str = ""
    #: An adapter applied over ``model`` (unmerged).
    adapter: str = ""
    #: The base model compared with; default: the run's (or the adapter's) base.
    base: str = ""
    #: Prompts typed in the view.
    prompts: list[str] = field(default_factory=list)
    #: A prompts file: JSONL (a string, or an object with ``prompt_column``) or text (one per line).
    prompts_file: str = ""
    #: A references JSONL with a prompt and a reference column.
    data: str = ""
    prompt_column: str = "prompt"
    reference_column: str = "reference"
    metrics: list[str] = field(default_factory=lambda: ["exact_match", "rouge", "bleu"])
    tasks: list[str] = field(default_factory=list)
    include_path: str = ""
    #: 0: every row.
    max_rows: int = 0
    max_new_tokens: int = 32
    seed: int = 0
    #: Where results go without a run (default: ``<data>/evals``).
    output: str = ""
    #: One of CHAT_MODES.
    chat: str = "auto"
    #: A calibrate run (core.fp8): the tuned model is ``model`` quantized to FP8 with its measurements,
    #: compared with ``model`` itself (the base by default).
    fp8: str = ""
    #: With ``fp8``: how far FP8 may raise perplexity over bf16, in %, before the comparison warns
    #: (``--fp8-max-rise``).
    fp8_max_rise: float = FP8_MAX_RISE_PCT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def cli_args(self) -> list[str]:
        """The ``gaudi-gui eval`` options that ask for this spec (the view starts the command with
        them, and a host gets them: one path for the GUI and the command line). Each as
        ``--option=value``, so a value that begins with '-' stays a value."""
        pairs: list[tuple[str, str]] = [("--run", self.run) if self.run else ("--model", self.model)]
        pairs += [(o, v) for o, v in (("--adapter", self.adapter), ("--base", self.base),
                                      ("--prompts", self.prompts_file), ("--data", self.data),
                                      ("--include-path", self.include_path), ("--output", self.output)) if v]
        pairs += [("--prompt", p) for p in self.prompts]
        if self.data or self.prompts_file:
            pairs.append(("--prompt-column", self.prompt_column))
        if self.data:
            pairs.append(("--reference-column", self.reference_column))
        pairs.append(("--metrics", ",".join(self.metrics)))
        if self.tasks:
            pairs.append(("--tasks", ",".join(self.tasks)))
        pairs += [("--max-rows", str(self.max_rows)), ("--max-new-tokens", str(self.max_new_tokens)),
                  ("--seed", str(self.seed))]
        if self.chat != "auto":
            pairs.append(("--chat", self.chat))
        if self.fp8:
            pairs += [("--fp8", self.fp8), ("--fp8-max-rise", f"{self.fp8_max_rise:g}")]
        return [f"{option}={value}" for option, value in pairs]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalSpec:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Target:
    """The two models and where results go, resolved from a spec (paths, nothing loaded)."""

    #: The tuned model's weights: a full model folder or id; with an adapter, the base it goes over.
    tuned_model: str
    #: The adapter applied over ``tuned_model`` for the tuned answers ("" for a full model).
    adapter: str
    #: The base model: with an adapter, the same weights with the adapter switched off.
    base_model: str
    results_dir: Path
    run_folder: str = ""
    #: What a person reads: "run 2026…-alpaca (adapter over tiny-model)".
    label: str = ""
    #: The run trained on prompt/completion or chat rows (chat "auto" formats prompts as it did).
    chat_kind: bool = False
    #: The run's config.json when its job has an eval split: perplexity without a references file is
    #: measured on that held-out split.
    heldout: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["results_dir"] = str(self.results_dir)
        return data


# -- reading files -----------------------------------------------------------------------------------

def read_jsonl(path: str | Path, limit: int = 0, *, field_name: str = "data") -> list[Any]:
    """The rows of a JSONL file (``limit`` 0: all); EvalInputError naming the line that is not JSON,
    a missing or empty file."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise EvalInputError(field_name, f"{path}: no such file")
    rows: list[Any] = []
    try:
        with open(file, "rb") as fh:
            for number, raw in enumerate(fh, 1):
                text = jsonfile.decode(raw, f"{file.name} line {number}")
                if not text.strip():
                    continue
                try:
                    rows.append(json.loads(text))
                except json.JSONDecodeError as exc:
                    raise EvalInputError(field_name, f"{file.name} line {number} is not JSON: "
                                                     f"{exc.msg}") from None
                if limit and len(rows) >= limit:
                    break
    except jsonfile.FileProblem as exc:
        raise EvalInputError(field_name, str(exc)) from None
    except OSError as exc:
        raise EvalInputError(field_name, f"{path}: {exc.strerror or exc}") from None
    if not rows:
        raise EvalInputError(field_name, f"{file.name} is empty: it holds no rows")
    return rows


def columns_of(rows: list[Any]) -> list[str]:
    """Every key of the object rows, in first-seen order (the preview's column pickers)."""
    seen: dict[str, None] = {}
    for row in rows:
        if isinstance(row, dict):
            seen.update(dict.fromkeys(str(k) for k in row))
    return list(seen)


#: Column names that say what they hold, most telling first.
_PROMPT_NAMES = ("prompt", "question", "instruction", "input", "query", "text", "context")
_REFERENCE_NAMES = ("reference", "answer", "output", "response", "completion", "target", "label")


def guess_columns(columns: list[str], rows: list[dict[str, Any]]) -> tuple[str, str]:
    """The prompt and reference columns a person would pick: by name first (prompt, question …;
    reference, answer …), else the text columns in order. A column that holds no text in the rows
    shown (an integer ``qid``, a float score) is never guessed. ("", "") when nothing fits."""
    def texty(column: str) -> bool:
        values = [row.get(column) for row in rows if column in row]
        return bool(values) and all(isinstance(v, str) for v in values)

    text = [c for c in columns if texty(c)]
    lowered = {c.lower(): c for c in text}
    prompt = next((lowered[n] for n in _PROMPT_NAMES if n in lowered), "")
    reference = next((lowered[n] for n in _REFERENCE_NAMES if n in lowered and lowered[n] != prompt), "")
    rest = [c for c in text if c not in (prompt, reference)]
    if not prompt and rest:
        prompt = rest.pop(0)
    if not reference and rest:
        reference = rest.pop(0)
    return prompt, reference


def preview(path: str | Path, rows: int = PREVIEW_ROWS) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns and first rows of a references file (EvalInputError when it cannot be read)."""
    data = read_jsonl(path, rows)
    objects = [r for r in data if isinstance(r, dict)]
    return columns_of(objects), objects


def read_prompts(path: str | Path, column: str = "prompt", limit: int = 0) -> list[str]:
    """Prompts from a file: JSONL of strings or of objects with ``column``; any other file, one prompt
    a line."""
    file = Path(path).expanduser()
    if file.suffix.lower() not in (".jsonl", ".json"):
        try:
            lines = [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        except FileNotFoundError:
            raise EvalInputError("prompts_file", f"{path}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise EvalInputError("prompts_file", f"{path}: {exc}") from None
        if not lines:
            raise EvalInputError("prompts_file", f"{file.name} is empty: it holds no prompts")
        return lines[:limit] if limit else lines
    rows = read_jsonl(file, limit, field_name="prompts_file")
    out: list[str] = []
    for number, row in enumerate(rows, 1):
        if isinstance(row, str):
            out.append(row)
        elif isinstance(row, dict) and isinstance(row.get(column), str):
            out.append(row[column])
        else:
            cols = ", ".join(columns_of(rows)) or "none"
            raise EvalInputError("prompts_file", f"{file.name} row {number}: no '{column}' text "
                                                 f"(a row is a string or an object; columns: {cols})")
    return out


def read_references(path: str | Path, prompt_column: str, reference_column: str,
                    limit: int = 0) -> list[dict[str, str]]:
    """``[{"prompt", "reference"}]`` from a references JSONL; a missing column names the file's
    columns."""
    file = Path(path).expanduser()
    rows = read_jsonl(file, limit, field_name="data")
    cols = columns_of(rows)
    shown = ", ".join(cols) or "none (its rows are not objects)"
    for name, column in (("prompt_column", prompt_column), ("reference_column", reference_column)):
        if column not in cols:
            raise EvalInputError(name, f"'{column}' is not a column of {file.name} (its columns: {shown})")
    out: list[dict[str, str]] = []
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise EvalInputError("data", f"{file.name} row {number} is not an object")
        prompt, ref = row.get(prompt_column), row.get(reference_column)
        if not isinstance(prompt, str) or not isinstance(ref, str):
            raise EvalInputError("data", f"{file.name} row {number}: '{prompt_column}' and "
                                         f"'{reference_column}' must be text")
        out.append({"prompt": prompt, "reference": ref})
    return out


# -- lm-eval tasks (names and local folders; the worker checks them against lm-eval) -----------------

_TASK_LINE = re.compile(r"^task:\s*['\"]?([A-Za-z0-9_.\-]+)['\"]?\s*$", re.MULTILINE)


def local_tasks(include_path: str | Path) -> list[str]:
    """The task names the YAML files of a local task folder declare (``task: NAME``)."""
    folder = Path(include_path).expanduser()
    names: list[str] = []
    for yaml in sorted([*folder.rglob("*.yaml"), *folder.rglob("*.yml")]):
        try:
            names += _TASK_LINE.findall(yaml.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return sorted(set(names))


_NAME_LINE = re.compile(r"^\s*(?:task|group|tag):\s*['\"]?([A-Za-z0-9_.\-]+)['\"]?\s*$|^\s*-\s*['\"]?"
                        r"([A-Za-z0-9_.\-]+)['\"]?\s*$", re.MULTILINE)


def catalogue_names() -> set[str]:
    """Every name lm-eval's bundled task YAMLs declare (task, group, tag, and list items, which
    over-counts harmlessly), read from disk without importing lm_eval (it imports torch). Empty when
    lm-eval is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        return set()
    folder = Path(next(iter(spec.submodule_search_locations))) / "tasks"
    names: set[str] = set()
    for yaml in folder.rglob("*.yaml"):
        try:
            text = yaml.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for scalar, item in _NAME_LINE.findall(text):
            names.add(scalar or item)
    return names


def unknown_tasks(tasks: list[str], include_path: str = "") -> list[str]:
    """The tasks neither the local folder nor lm-eval's catalogue declares."""
    local = set(local_tasks(include_path)) if include_path else set()
    missing = [t for t in tasks if t not in local]
    if not missing:
        return []
    catalogue = catalogue_names()
    return [t for t in missing if t not in catalogue] if catalogue else []


# -- resolving the models ----------------------------------------------------------------------------

def upstream_architecture(name: str) -> str:
    """A Gaudi-specific class name (optimum-habana's ``GaudiLlamaForCausalLM``) as the upstream
    transformers one (``LlamaForCausalLM``): a run trained on Gaudi is evaluated anywhere."""
    return name[len("Gaudi"):] if name.startswith("Gaudi") and len(name) > 5 and name[5].isupper() else name


def find_run(name: str) -> Run:
    """A run folder given as a path or as a run's folder name under the runs folder."""
    folder = Path(name).expanduser()
    if folder.is_dir():
        return Run(folder)
    store = RunStore()
    candidate = store.root / name
    if candidate.is_dir():
        return Run(candidate)
    raise EvalInputError("run", f"no run folder {name!r} (neither a folder nor a run under {store.root})")


def _adapter_base(adapter: Path) -> str:
    try:
        data = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EvalInputError("adapter", f"cannot read {adapter}/adapter_config.json: {exc}") from None
    base = data.get("base_model_name_or_path") if isinstance(data, dict) else None
    if not isinstance(base, str) or not base:
        raise EvalInputError("adapter", f"{adapter}: the adapter names no base model")
    return base


def _local_model(value: str, field_name: str) -> None:
    """A model or base that cannot be loaded as named (``core.jobcheck.model_problem``, the one rule of
    training, Serve and Evaluate): a folder must be a model or adapter folder, a Hub id well formed."""
    from gaudi_gui.core.jobcheck import model_problem
    bad = model_problem(value)
    if bad:
        raise EvalInputError(field_name, bad)


def resolve(spec: EvalSpec) -> Target:
    """The models and results folder a spec names; EvalInputError for the first thing wrong."""
    if bool(spec.run) == bool(spec.model):
        raise EvalInputError("run", "give a run (--run) or a model (--model), one of them")
    if spec.run and spec.fp8:
        raise EvalInputError("fp8", "--fp8 goes with --model (the model that was calibrated), not --run")
    if spec.run:
        if spec.adapter:
            raise EvalInputError("adapter", "a run's adapter is found in its output folder: --adapter goes "
                                            "with --model")
        if spec.output:
            raise EvalInputError("output", "a run's results go to its folder: --output goes with --model")
        run = find_run(spec.run)
        try:
            job = run.job()
        except JobConfigError as exc:
            raise EvalInputError("run", f"{run.name}: {exc}") from None
        out = run.output_dir()
        base = spec.base or job.model
        if out is not None and is_adapter_dir(out / "adapter"):
            tuned, adapter, kind = base, str(out / "adapter"), "adapter over its base"
        elif job.method in ("lora", "qlora"):
            raise EvalInputError("run", f"{run.name} is a {job.method.upper()} run with no adapter "
                                        f"({out / 'adapter' if out else 'no output folder'} holds no "
                                        "adapter_config.json): it did not save one")
        else:
            full = next((out / n for n in ("final", "merged") if out and (out / n / "config.json").is_file()),
                        None)
            if full is None:
                raise EvalInputError("run", f"{run.name} has no saved model (no adapter/, final/ or "
                                            f"merged/ in {out})")
            tuned, adapter, kind = str(full), "", f"{full.name} model"
        if (out is not None and (out / "merged" / "config.json").is_file() and adapter
                and not spec.base):
            kind += " (a merged copy exists; the adapter is evaluated)"
        return Target(tuned, adapter, base, run.folder / EVAL_DIR, str(run.folder),
                      f"run {run.name} ({kind})",
                      chat_kind=job.dataset.kind in ("prompt_completion", "conversational"),
                      heldout=str(run.config_path) if has_eval(job.dataset.eval) else "")
    _local_model(spec.model, "model")
    model = str(Path(spec.model).expanduser()) if Path(spec.model).expanduser().is_dir() else spec.model
    if spec.fp8:
        if spec.adapter or is_adapter_dir(model):
            raise EvalInputError("fp8", "FP8 quantizes a full model: merge the adapter first")
        base = spec.base or model
        if spec.base:
            _local_model(spec.base, "base")
        results = Path(spec.output).expanduser() if spec.output else paths.data_dir() / "evals"
        return Target(model, "", base, results, "", f"{model} in FP8 ({Path(spec.fp8).name}) against "
                                                    f"{'the same model' if base == model else base}")
    results = Path(spec.output).expanduser() if spec.output else paths.data_dir() / "evals"
    if spec.adapter:
        adapter_dir = Path(spec.adapter).expanduser()
        if not is_adapter_dir(adapter_dir):
            raise EvalInputError("adapter", f"{spec.adapter} holds no adapter (adapter_config.json)")
        base = spec.base or model
        if spec.base:
            _local_model(spec.base, "base")
        return Target(model, str(adapter_dir), base, results, "", f"{spec.adapter} over {model}")
    if is_adapter_dir(model):
        base = spec.base or _adapter_base(Path(model))
        return Target(base, model, base, results, "", f"{model} over {base}")
    if not spec.base:
        raise EvalInputError("base", f"{spec.model} is a full model: name the base model it is compared "
                                     "with (--base)")
    _local_model(spec.base, "base")
    return Target(model, "", spec.base, results, "", model)


def validate(spec: EvalSpec, *, catalogue: bool = True) -> list[tuple[str, str]]:
    """Problems at the field: (field, message). Empty: the worker may start. ``catalogue=False`` skips
    reading lm-eval's task catalogue (a second's disk reads: the window leaves it to the command)."""
    problems: list[tuple[str, str]] = []
    target: Target | None = None
    try:
        target = resolve(spec)
    except EvalInputError as exc:
        problems.append((exc.field, str(exc)))
    if spec.chat not in CHAT_MODES:
        problems.append(("chat", f"chat is one of {', '.join(CHAT_MODES)}"))
    unknown = [m for m in spec.metrics if m not in METRICS]
    if unknown:
        problems.append(("metrics", f"unknown metric(s) {', '.join(unknown)}: choose from "
                                    f"{', '.join(METRICS)}"))
    heldout = target is not None and bool(target.heldout) and "perplexity" in spec.metrics
    if not spec.prompts and not spec.prompts_file and not spec.data and not spec.tasks and not heldout:
        problems.append(("data", "nothing to evaluate: give prompts, a references file or lm-eval tasks"))
    if spec.prompts_file:
        try:
            read_prompts(spec.prompts_file, spec.prompt_column, 1)
        except EvalInputError as exc:
            problems.append((exc.field, str(exc)))
    if any(not p.strip() for p in spec.prompts):
        problems.append(("prompts", "a prompt is empty"))
    if spec.data:
        try:
            read_references(spec.data, spec.prompt_column, spec.reference_column, PREVIEW_ROWS)
        except EvalInputError as exc:
            problems.append((exc.field, str(exc)))
    elif "perplexity" in spec.metrics and target is not None and not target.heldout:
        problems.append(("data", "perplexity is measured on a references file's text or a run's eval "
                                 "split: this run has none, give a references file (--data)"))
    if spec.include_path and not Path(spec.include_path).expanduser().is_dir():
        problems.append(("include_path", f"{spec.include_path}: no such folder"))
    if catalogue and spec.tasks and (not spec.include_path or Path(spec.include_path).expanduser().is_dir()):
        unknown = unknown_tasks(spec.tasks, spec.include_path)
        if unknown:
            where = f" in {spec.include_path} or" if spec.include_path else ""
            problems.append(("tasks", f"unknown lm-eval task(s): {', '.join(unknown)} (not found{where} in "
                                      "lm-eval's tasks)"))
    if spec.include_path and not spec.tasks:
        problems.append(("tasks", "an include path needs the tasks to run from it (--tasks)"))
    if spec.max_rows < 0:
        problems.append(("max_rows", "max rows is 0 (all) or more"))
    if not 1 <= spec.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
        problems.append(("max_new_tokens", f"max new tokens is 1 to {MAX_NEW_TOKENS_LIMIT}"))
    return problems


# -- scores ------------------------------------------------------------------------------------------

def exact_match(answer: str, reference: str) -> float:
    """1.0 when the answer is the reference, ignoring surrounding whitespace."""
    return 1.0 if answer.strip() == reference.strip() else 0.0


def mean(values: list[float]) -> float | None:
    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


# -- results -----------------------------------------------------------------------------------------

def stamp(now: float | None = None) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))


def write_results(results_dir: Path, record: dict[str, Any], answers: list[dict[str, Any]]) -> Path:
    """``<stamp>.json`` and ``<stamp>-answers.jsonl`` in ``results_dir`` (0700/0600, like a run);
    returns the JSON's path. Each file goes through a temporary and a rename: a reader never sees half."""
    results_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = stamp(record.get("created"))
    path, counter = results_dir / f"{name}.json", 1
    while path.exists():
        counter += 1
        path = results_dir / f"{name}-{counter}.json"
    answers_path = path.with_name(path.stem + "-answers.jsonl")
    record = {**record, "answers": answers_path.name}
    _write(answers_path, "".join(json.dumps(a, ensure_ascii=False) + "\n" for a in answers))
    _write(path, json.dumps(record, indent=2, ensure_ascii=False))
    return path


def _write(path: Path, text: str) -> None:
    atomic.write_text(path, text, fsync=False)


def results_of(run: Run | str | Path) -> list[Path]:
    """A run's result files, oldest first."""
    folder = (run.folder if isinstance(run, Run) else Path(run)) / EVAL_DIR
    def order(path: Path) -> tuple[str, int]:
        # "<stamp>.json" before "<stamp>-2.json" (a second result in the same second)
        parts = path.stem.split("-")
        counter = parts[2] if len(parts) == 3 else ""
        return ("-".join(parts[:2]), int(counter)) if counter.isdigit() else (path.stem, 1)

    try:
        return sorted(folder.glob("*.json"), key=order)
    except OSError:
        return []


def latest_result(run: Run | str | Path) -> dict[str, Any] | None:
    """The newest readable result of a run (a damaged file is skipped), or None."""
    for path in reversed(results_of(run)):
        try:
            data = jsonfile.read(path)
        except jsonfile.FileProblem:
            continue
        if isinstance(data, dict) and isinstance(data.get("tuned"), dict):
            return {**data, "path": str(path)}
    return None


def score_items(result: dict[str, Any]) -> list[tuple[str, float | None, float | None]]:
    """(name, tuned, base) for every mean and task score of a result, in a stable order."""
    tuned, base = result.get("tuned") or {}, result.get("base") or {}
    out: list[tuple[str, float | None, float | None]] = []
    names = [METRIC_KEYS[m] for m in METRICS]
    t_metrics, b_metrics = tuned.get("metrics") or {}, base.get("metrics") or {}
    for key in names + sorted(set(t_metrics) - set(names)):
        if key in t_metrics or key in b_metrics:
            out.append((key, _num(t_metrics.get(key)), _num(b_metrics.get(key))))
    t_tasks, b_tasks = tuned.get("tasks") or {}, base.get("tasks") or {}
    for task in sorted(set(t_tasks) | set(b_tasks)):
        out.append((task, _num((t_tasks.get(task) or {}).get("score")),
                    _num((b_tasks.get(task) or {}).get("score"))))
    return out


def fp8_cost(result: dict[str, Any], max_rise_pct: float = FP8_MAX_RISE_PCT) -> str:
    """What FP8 cost in quality, in a sentence: the tuned side quantized with a calibration (``eval
    --fp8``) against the model in bf16, by perplexity; a warning ("⚠ …") past ``max_rise_pct``. "" for a
    result that compared no FP8 model."""
    tuned, base = result.get("tuned") or {}, result.get("base") or {}
    if not isinstance(tuned, dict) or not tuned.get("fp8"):
        return ""
    key = METRIC_KEYS["perplexity"]
    fp8_ppl = _num((tuned.get("metrics") or {}).get(key))
    bf16_ppl = _num((base.get("metrics") or {}).get(key))
    if fp8_ppl is None or bf16_ppl is None or bf16_ppl <= 0:
        return ("FP8 vs bf16: no perplexity to compare (tick perplexity, with a references file, to see what "
                "FP8 costs)")
    rise = (fp8_ppl / bf16_ppl - 1.0) * 100.0
    said = f"perplexity {bf16_ppl:.4g} → {fp8_ppl:.4g} ({rise:+.1f} %)"
    if rise > max_rise_pct:
        return (f"⚠ FP8 costs more than the {max_rise_pct:g} % allowed: {said}. Keep more layers in bf16 "
                "(the blocklist) or calibrate on more rows like the ones served")
    return f"FP8 vs bf16: {said}, within the {max_rise_pct:g} % allowed"


def no_scores_reason(result: dict[str, Any]) -> str:
    """Why a result has no scores, in a sentence ("" when it has some): an empty score table told a
    person evaluating prompts alone nothing (exact match, ROUGE-L and BLEU need reference answers)."""
    if score_items(result):
        return ""
    spec = result.get("spec") if isinstance(result.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    rows = result.get("rows") if isinstance(result.get("rows"), dict) else {}
    assert isinstance(rows, dict)
    if not spec.get("data") or not rows.get("references"):
        column = spec.get("reference_column") or "reference"
        return ("no scores: no reference answers. Exact match, ROUGE-L and BLEU compare the answers with "
                f"a references file (JSONL with a prompt and a '{column}' column); tick perplexity or name "
                "lm-eval tasks to score without one. Compare the base and tuned answers by eye.")
    return "no scores: no metric ticked and no lm-eval task named"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def scores_summary(result: dict[str, Any] | None, limit: int = 3) -> str:
    """The Runs list's cell: "rougeL 0.41 (base 0.12) · bleu 3.2 (base 0.8)"."""
    if not result:
        return "–"
    parts = [f"{name} {_fmt(t)} (base {_fmt(b)})" for name, t, b in score_items(result)[:limit]]
    return " · ".join(parts) or "–"


def latest_scores(run: Run | str | Path) -> str:
    return scores_summary(latest_result(run))


__all__ = ["EVAL_DIR", "EXIT_BAD_INPUT", "EXIT_MODEL_FAILED", "EXIT_OK", "METRICS", "METRIC_KEYS",
           "EvalInputError", "EvalSpec", "Target", "columns_of", "exact_match", "find_run", "guess_columns",
           "latest_result", "latest_scores", "local_tasks", "mean", "preview", "read_jsonl",
           "read_prompts", "read_references", "resolve", "results_of", "score_items", "scores_summary",
           "upstream_architecture", "validate", "write_results"]
