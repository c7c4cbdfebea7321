"""Evaluate worker: ``python -m gaudi_gui.workers.evaluate`` reads one job (JSON) on stdin and writes
protocol events on stdout. The only place the evaluation imports torch, transformers, peft, lm_eval,
rouge-score and sacrebleu.

The job (made by ``gaudi-gui eval`` from ``core.evaluation``): ``target`` (tuned model, adapter, base
model), ``prompts`` (texts), ``references`` ([{prompt, reference}]), ``metrics``, ``tasks``,
``include_path``, ``max_rows``, ``max_new_tokens``, ``seed``.

Order: lm-eval tasks are checked first (an unknown task, or one whose data would need the network, is
refused before a model loads: exit 2). Then the base model loads and answers everything; then the tuned
one: with an adapter, the same loaded weights get the adapter applied in memory (transformers' peft
integration, never merged, nothing written), else the tuned full model loads in its place. Every
answer is greedy with the seed set before it; its time to first token and tokens/s are measured with a
streamer. A config naming a Gaudi-specific class (``GaudiLlamaForCausalLM``) loads as the upstream one.

Events: ``phase`` {message}, ``progress`` {done, total}, ``answer`` {model, source, i, prompt,
reference?, text, ttft_s, tokens_per_s, new_tokens, scores?}, ``model_result`` {model, metrics,
tasks, ttft_s, tokens_per_s, device}, ``done``, ``error`` {kind: bad_input | model_failed, message}.
Exit 0, 1 (a model failed to load or run), 2 (bad input).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import math
import os
import signal
import sys
import time
from typing import Any

from gaudi_gui.core import paths, protocol
from gaudi_gui.core.evaluation import (
    EXIT_BAD_INPUT,
    EXIT_MODEL_FAILED,
    EXIT_OK,
    METRIC_KEYS,
    local_tasks,
    mean,
    upstream_architecture,
)
from gaudi_gui.core.evaluation import exact_match as exact_match_score
from gaudi_gui.core.events import EventType


class Failure(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def emit(event_type: EventType, /, **fields: Any) -> None:
    protocol.write_line(sys.stdout, protocol.encode({"type": event_type, **fields}))


def _die_with_parent() -> None:
    """Linux: the kernel ends this worker when the command that started it dies, even by SIGKILL."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


def _first_line(exc: BaseException, limit: int = 400) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:limit] if text else ''}"


class Scorer:
    """ROUGE-L (rouge-score) and BLEU (sacrebleu), per row and over the corpus."""

    def __init__(self, metrics: list[str]) -> None:
        self.metrics = metrics
        self._rouge: Any = None
        if "rouge" in metrics:
            from rouge_score import rouge_scorer
            self._rouge = rouge_scorer.RougeScorer(["rougeL"])

    def row(self, answer: str, reference: str) -> dict[str, float]:
        out: dict[str, float] = {}
        if "exact_match" in self.metrics:
            out["exact_match"] = exact_match_score(answer, reference)
        if self._rouge is not None:
            out["rougeL"] = float(self._rouge.score(reference, answer)["rougeL"].fmeasure)
        if "bleu" in self.metrics:
            import sacrebleu
            out["bleu"] = float(sacrebleu.sentence_bleu(answer, [reference]).score)
        return out

    def corpus(self, answers: list[str], references: list[str],
               rows: list[dict[str, float]]) -> dict[str, Any]:
        """Means of the per-row scores; BLEU is sacrebleu's corpus BLEU (its mean is not a BLEU)."""
        out: dict[str, Any] = {}
        for key in ("exact_match", "rougeL"):
            if rows and key in rows[0]:
                out[key] = mean([r[key] for r in rows])
        if "bleu" in self.metrics and answers:
            import sacrebleu
            out["bleu"] = float(sacrebleu.corpus_bleu(answers, [references]).score)
        return out


class Evaluator:
    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        #: What the FP8 load did (the tuned model's result says it); {} without --fp8.
        self.fp8_said: dict[str, Any] = {}
        self.target: dict[str, Any] = job["target"]
        self.prompts: list[str] = list(job.get("prompts") or [])
        self.references: list[dict[str, str]] = list(job.get("references") or [])
        self.metrics: list[str] = list(job.get("metrics") or [])
        self.tasks: list[str] = list(job.get("tasks") or [])
        self.include_path: str = job.get("include_path") or ""
        self.max_rows = int(job.get("max_rows") or 0)
        self.max_new_tokens = int(job.get("max_new_tokens") or 32)
        self.seed = int(job.get("seed") or 0)
        self.chat_mode = str(job.get("chat") or "auto")
        self.device = "cpu"
        #: The texts perplexity is measured on, and what they are ("references", "eval split").
        self.heldout: list[Any] = []
        self.perplexity_on = ""
        self.total = 0
        self.done = 0
        self._task_manager: Any = None

    def count(self) -> None:
        per_model = len(self.prompts) + len(self.references) + len(self.heldout) + len(self.tasks)
        self.total = 2 * per_model

    def step(self, count: int = 1) -> None:
        self.done += count
        emit(EventType.PROGRESS, done=self.done, total=self.total)

    # -- lm-eval -------------------------------------------------------------------------------------

    def check_tasks(self) -> None:
        """Unknown tasks and tasks whose data is not available offline are refused before any model."""
        if not self.tasks:
            return
        emit(EventType.PHASE, message="checking lm-eval tasks")
        os.environ["HF_DATASETS_OFFLINE"] = "1"
        os.environ["HF_HUB_OFFLINE"] = "1"
        logging.getLogger("lm_eval").setLevel(logging.ERROR)
        from lm_eval.tasks import TaskManager, get_task_dict
        local = set(local_tasks(self.include_path)) if self.include_path else set()
        # lm-eval's own catalogue takes many seconds to index: only read when a task is not local.
        defaults = not set(self.tasks) <= local
        self._task_manager = TaskManager(include_path=self.include_path or None, include_defaults=defaults)
        known = set(self._task_manager.all_tasks)
        unknown = [t for t in self.tasks if t not in known]
        if unknown:
            where = f" in {self.include_path} or" if self.include_path else ""
            raise Failure("bad_input", f"unknown lm-eval task(s): {', '.join(unknown)} (not found{where} "
                                       "in lm-eval's tasks)")
        for task in self.tasks:
            try:
                get_task_dict([task], self._task_manager)
            except Exception as exc:
                raise Failure("bad_input", f"lm-eval task {task} needs the network: its data is not on "
                                           f"this machine or in the datasets cache ({_first_line(exc, 200)})"
                              ) from None

    def run_tasks(self, model: Any, tokenizer: Any) -> dict[str, dict[str, Any]]:
        if not self.tasks:
            return {}
        import lm_eval
        lm = self.lm_eval_model(model, tokenizer)
        out: dict[str, dict[str, Any]] = {}
        for task in self.tasks:
            res = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=self._task_manager,
                                          limit=self.max_rows or None, log_samples=False,
                                          bootstrap_iters=100, verbosity="ERROR",
                                          random_seed=self.seed, numpy_random_seed=self.seed,
                                          torch_random_seed=self.seed, fewshot_random_seed=self.seed)
            for name, values in (res or {}).get("results", {}).items():
                out[name] = _task_scores(values)
            self.step()
        return out

    def lm_eval_model(self, model: Any, tokenizer: Any) -> Any:
        """lm-eval's ``hf`` model over the loaded model; on Gaudi with optimum-habana, its Gaudi class
        (``habana``, a subclass of ``hf``), falling back to ``hf`` if that refuses the loaded model."""
        from lm_eval.models.huggingface import HFLM
        if self.device == "hpu":
            import importlib.util
            if importlib.util.find_spec("optimum.habana") is not None:
                try:
                    from lm_eval.models.optimum_habana import HabanaLM
                    return HabanaLM(pretrained=model, tokenizer=tokenizer, batch_size=1)
                except Exception as exc:
                    emit(EventType.PHASE, message="lm-eval's Gaudi model refused the loaded model "
                                          f"({_first_line(exc)}): using its hf model")
        return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1)

    # -- models --------------------------------------------------------------------------------------

    def load(self, path: str, tokenizer_path: str = "") -> tuple[Any, Any]:
        from transformers import AutoConfig

        from gaudi_gui.workers import loader
        if paths.is_demo(path):
            from gaudi_gui.workers.demo import resolve_model
            path = resolve_model(path)
        local_only = os.environ.get("HF_HUB_OFFLINE") == "1"
        try:
            config = AutoConfig.from_pretrained(path, local_files_only=local_only)
            # A run trained on Gaudi may name optimum-habana's class: load the upstream one.
            if config.architectures:
                config.architectures = [upstream_architecture(a) for a in config.architectures]
            return loader.load(path, loader.plan(self.device), tokenizer_path=tokenizer_path, config=config,
                               local_files_only=local_only)
        except Exception as exc:
            raise Failure("model_failed", f"cannot load {path}: {_first_line(exc)}") from None

    def load_fp8(self, path: str, folder: str) -> tuple[Any, Any]:
        """``path`` quantized to FP8 by INC with the calibrate run's measurements (QUANTIZE)."""
        from gaudi_gui.workers.calibrate import load_quantized
        if paths.is_demo(path):
            from gaudi_gui.workers.demo import resolve_model
            path = resolve_model(path)
        note = " (FP8 Q/DQ on the CPU checks the flow and the answers, not speed: it is slower than " \
               "bf16)" if self.device == "cpu" else ""
        emit(EventType.PHASE, message=f"loading {path} in FP8 with the measurements of {folder}{note}")
        try:
            model, tokenizer, config = load_quantized(path, folder, self.device)
        except Exception as exc:
            raise Failure("model_failed", f"cannot quantize {path} to FP8: {_first_line(exc)}") from None
        names = [type(m).__name__ for m in model.modules() if type(m).__name__.startswith("Patched")]
        patched, count = sorted(set(names)), len(names)
        self.fp8_said = {"calibration": folder, "scale_method": config["scale_method"],
                         "qdq": bool(config.get("use_qdq")), "quantized_modules": count, "classes": patched,
                         "note": note.strip(" ()")}
        emit(EventType.PHASE, message=f"FP8: {count} modules quantized ({', '.join(patched)})")
        return model, tokenizer

    def answer(self, model: Any, tokenizer: Any, prompt: str) -> dict[str, Any]:
        """One greedy answer with the seed set, its time to first token and tokens/s."""
        import torch
        from transformers import set_seed
        from transformers.generation.streamers import BaseStreamer

        class Clock(BaseStreamer):
            def __init__(self) -> None:
                self.calls = 0
                self.first = 0.0

            def put(self, value: Any) -> None:
                self.calls += 1  # the first call carries the prompt, the second the first new token
                if self.calls == 2:
                    self.first = time.perf_counter()

            def end(self) -> None:
                pass

        ids = self.encode(tokenizer, prompt)
        set_seed(self.seed)
        clock = Clock()
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**ids, max_new_tokens=self.max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, streamer=clock)
        ended = time.perf_counter()
        new = out[0, ids["input_ids"].shape[1]:]
        text = tokenizer.decode(new, skip_special_tokens=True)
        count = int(new.shape[0])
        ttft = (clock.first or ended) - started
        return {"text": text, "new_tokens": count, "ttft_s": round(ttft, 6),
                "tokens_per_s": round(count / (ended - started), 3) if ended > started and count else 0.0}

    def use_chat(self, tokenizer: Any) -> bool:
        if self.chat_mode == "off" or not getattr(tokenizer, "chat_template", None):
            return False
        return self.chat_mode == "on" or bool(self.target.get("chat_kind"))

    def encode(self, tokenizer: Any, prompt: str) -> Any:
        """The prompt as the model saw prompts in training: through the chat template (a user turn and
        the assistant's start) when the run trained on prompt/completion or chat rows."""
        if self.use_chat(tokenizer):
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                 add_generation_prompt=True)
            return tokenizer(text, return_tensors="pt", add_special_tokens=False).to(self.device)
        return tokenizer(prompt, return_tensors="pt").to(self.device)

    def prepare_heldout(self, tokenizer: Any) -> None:
        """The texts perplexity is measured on: the references (prompt then reference, as a chat turn
        pair when prompts go through the template), else the run's eval split as training built it."""
        if "perplexity" not in self.metrics:
            return
        if self.references:
            chat = self.use_chat(tokenizer)
            self.heldout = [tokenizer.apply_chat_template(
                [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["reference"]}],
                tokenize=False) if chat else r["prompt"] + r["reference"] for r in self.references]
            self.perplexity_on = "references"
            return
        config = self.target.get("heldout") or ""
        if not config:
            return
        from gaudi_gui.core.jobconfig import JobConfig
        from gaudi_gui.workers import sft_data
        job = JobConfig.load(config)
        try:
            _train, raw_eval = sft_data.load_raw(job)
            if raw_eval is None:
                return
            if self.max_rows:
                raw_eval = raw_eval.select(range(min(self.max_rows, len(raw_eval))))
            chat = bool(getattr(tokenizer, "chat_template", None))
            rows, _skipped = sft_data.to_sft(job, raw_eval, chat, "eval split")
        except sft_data.DataError as exc:
            raise Failure("bad_input", f"the run's eval split: {exc}") from None
        texts: list[str] = []
        for row in rows:
            if "text" in row and row["text"] is not None:
                texts.append(row["text"])
            elif row.get("messages"):
                texts.append(tokenizer.apply_chat_template(row["messages"], tokenize=False))
            elif isinstance(row.get("prompt"), list):
                texts.append(tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False))
            else:
                texts.append(str(row.get("prompt") or "") + str(row.get("completion") or ""))
        self.heldout = texts
        self.perplexity_on = f"the run's eval split ({len(texts)} rows)"

    def perplexity(self, model: Any, tokenizer: Any) -> float | None:
        """exp of the mean token loss over the held-out texts (every token after the first)."""
        import torch
        total_loss, total_tokens = 0.0, 0
        for text in self.heldout:
            ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(self.device)
            n = int(ids["input_ids"].shape[1]) - 1
            if n > 0:
                with torch.inference_mode():
                    loss = model(**ids, labels=ids["input_ids"]).loss
                total_loss += float(loss) * n
                total_tokens += n
            self.step()
        return math.exp(total_loss / total_tokens) if total_tokens else None

    def evaluate(self, name: str, model: Any, tokenizer: Any, scorer: Scorer) -> None:
        emit(EventType.PHASE, message=f"{name}: answering")
        timings: list[dict[str, Any]] = []
        for i, prompt in enumerate(self.prompts):
            got = self.answer(model, tokenizer, prompt)
            timings.append(got)
            emit(EventType.ANSWER, model=name, source="prompts", i=i, prompt=prompt, **got)
            self.step()
        answers: list[str] = []
        rows: list[dict[str, float]] = []
        for i, ref in enumerate(self.references):
            got = self.answer(model, tokenizer, ref["prompt"])
            timings.append(got)
            scores = scorer.row(got["text"], ref["reference"])
            answers.append(got["text"])
            rows.append(scores)
            emit(EventType.ANSWER, model=name, source="references", i=i, prompt=ref["prompt"],
                 reference=ref["reference"], scores=scores, **got)
            self.step()
        metrics = scorer.corpus(answers, [r["reference"] for r in self.references], rows) \
            if self.references else {}
        if self.heldout:
            emit(EventType.PHASE, message=f"{name}: perplexity on {self.perplexity_on}")
            metrics[METRIC_KEYS["perplexity"]] = self.perplexity(model, tokenizer)
        if self.tasks:
            emit(EventType.PHASE, message=f"{name}: lm-eval {', '.join(self.tasks)}")
        tasks = self.run_tasks(model, tokenizer)
        extra = {"fp8": self.fp8_said} if name == "tuned" and self.fp8_said else {}
        emit(EventType.MODEL_RESULT, model=name, metrics=metrics, tasks=tasks, device=self.device,
             chat_template=self.use_chat(tokenizer), perplexity_on=self.perplexity_on,
             ttft_s=mean([t["ttft_s"] for t in timings]),
             tokens_per_s=mean([t["tokens_per_s"] for t in timings]), **extra)

    def run(self) -> None:
        self.check_tasks()
        scorer = Scorer(self.metrics)
        from gaudi_gui.workers import loader
        self.device = loader.resolve_device("auto")  # the probe's rule, as every worker decides it
        base_path = self.target["base_model"]
        tuned_path, adapter = self.target["tuned_model"], self.target.get("adapter") or ""
        # A run's adapter folder holds the tokenizer training used (its chat template): both models
        # read their prompts through it, so base and tuned see the same text.
        has_tokenizer = bool(adapter) and os.path.isfile(os.path.join(adapter, "tokenizer_config.json"))
        tokenizer_path = adapter if has_tokenizer else ""
        emit(EventType.PHASE, message=f"loading the base model {base_path}")
        model, tokenizer = self.load(base_path, tokenizer_path)
        if self.chat_mode == "on" and not getattr(tokenizer, "chat_template", None):
            raise Failure("bad_input", f"--chat on: {base_path} has no chat template")
        self.prepare_heldout(tokenizer)
        self.count()
        emit(EventType.PROGRESS, done=0, total=self.total)
        try:
            self.evaluate("base", model, tokenizer, scorer)
        except Failure:
            raise
        except Exception as exc:
            raise Failure("model_failed", f"the base model failed: {_first_line(exc)}") from None
        if adapter:
            emit(EventType.PHASE, message=f"applying the adapter {adapter} (in memory, unmerged)")
            if tuned_path != base_path:
                del model
                model, tokenizer = self.load(tuned_path, tokenizer_path)
            try:
                model.load_adapter(adapter)
            except Exception as exc:
                raise Failure("model_failed", f"cannot apply the adapter {adapter}: {_first_line(exc)}") \
                    from None
            model.eval()
        elif self.job.get("fp8"):
            del model
            model, tokenizer = self.load_fp8(tuned_path, str(self.job["fp8"]))
        else:
            emit(EventType.PHASE, message=f"loading the tuned model {tuned_path}")
            del model
            model, tokenizer = self.load(tuned_path)
        try:
            self.evaluate("tuned", model, tokenizer, scorer)
        except Failure:
            raise
        except Exception as exc:
            raise Failure("model_failed", f"the tuned model failed: {_first_line(exc)}") from None
        emit(EventType.DONE)


def _task_scores(values: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's ``{"acc,none": .5, "acc_stderr,none": .1, "alias": ...}`` as ``{"score", "stderr",
    "metric", "acc", "acc_stderr", ...}``; the score is acc (else the first metric)."""
    flat: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[key.split(",")[0]] = float(value)
    names = [k for k in flat if not k.endswith("_stderr")]
    primary = "acc" if "acc" in flat else (names[0] if names else "")
    stderr = flat.get(f"{primary}_stderr")
    return {"metric": primary, "score": flat.get(primary),
            "stderr": stderr if stderr is not None and math.isfinite(stderr) else None, **flat}


def main() -> int:
    _die_with_parent()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from gaudi_gui.workers import loader
    loader.hide_bitsandbytes()  # models are evaluated unquantized (workers/loader.py: why it matters)
    try:
        job = json.loads(sys.stdin.read())
        evaluator = Evaluator(job)
    except (ValueError, KeyError, TypeError) as exc:
        emit(EventType.ERROR, kind="bad_input", message=f"the evaluation job is not readable: {exc}")
        return EXIT_BAD_INPUT
    try:
        evaluator.run()
    except Failure as exc:
        emit(EventType.ERROR, kind=exc.kind, message=str(exc))
        return EXIT_BAD_INPUT if exc.kind == "bad_input" else EXIT_MODEL_FAILED
    except Exception as exc:  # one readable line, never only a traceback
        emit(EventType.ERROR, kind="model_failed", message=_first_line(exc))
        return EXIT_MODEL_FAILED
    return EXIT_OK


if __name__ == "__main__":
    code = main()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
