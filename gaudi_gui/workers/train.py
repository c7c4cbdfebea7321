"""The training worker: ``accelerate launch ... -m gaudi_gui.workers.train --config <run>/config.json``.

It loads the model and dataset the job names, applies LoRA/QLoRA when asked, builds TrainingArguments
with ``HfArgumentParser.parse_dict`` and runs the Trainer. A TrainerCallback writes structured metric
lines to ``<run>/metrics.jsonl`` and as protocol events on stdout, from rank 0 only; every rank prints
one ``[rank i/n]`` line so a supervisor can see that all of them ran. Failures end with an ``error``
event naming a kind (oom, missing_column, output_dir, config, model, dataset, other) and exit code 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from gaudi_gui.core import paths, protocol
from gaudi_gui.core.jobconfig import JobConfig, JobConfigError

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
MAIN = RANK == 0


class WorkerError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def emit(event_type: str, **fields: Any) -> None:
    if MAIN:
        # encode(), not event(): event()'s own parameter is called "kind", like our error field.
        print(protocol.encode({"type": event_type, **fields}), flush=True)


def say(text: str) -> None:
    print(f"[rank {RANK}/{WORLD}] {text}", flush=True)


def load_dataset_rows(job: JobConfig) -> Any:
    import datasets

    source = job.dataset.source
    fmt = job.dataset_format()
    if paths.is_demo(source):
        source = str(paths.demo_dataset_path())
    try:
        if fmt == "hub":
            ds = datasets.load_dataset(source, split=job.dataset.split or "train")
        else:
            if not Path(source).expanduser().is_file():
                raise WorkerError("dataset", f"dataset file not found: {source}")
            ds = datasets.load_dataset(fmt, data_files=str(Path(source).expanduser()), split="train")
    except WorkerError:
        raise
    except Exception as exc:  # datasets raises many types (FileNotFoundError, DatasetNotFoundError, ...)
        raise WorkerError("dataset", f"cannot load dataset {job.dataset.source!r}: {exc}") from exc
    column = job.dataset.text_column or "text"
    if column not in ds.column_names:
        raise WorkerError("missing_column", f"dataset has no column {column!r}; available columns: "
                                            f"{', '.join(ds.column_names)}")
    return ds, column


def check_output_dir(output_dir: str) -> None:
    folder = Path(output_dir).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".gaudi-gui-write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise WorkerError("output_dir", f"output folder {output_dir} is not writable: "
                                        f"{exc.strerror or exc}") from exc


def make_callback(run_dir: Path, started: float) -> Any:
    from transformers import TrainerCallback

    class MetricsCallback(TrainerCallback):
        def __init__(self) -> None:
            self.t0 = started
            self.train_t0 = 0.0
            self.first_step = 0
            self.last_loss: float | None = None
            self.fh = open(run_dir / "metrics.jsonl", "a", encoding="utf-8") if MAIN else None  # noqa: SIM115

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.train_t0 = time.time()
            self.first_step = state.global_step
            emit("training_started", max_steps=state.max_steps, world_size=args.world_size,
                 start_step=state.global_step)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if not state.is_world_process_zero or not logs:
                return

            def num(key: str) -> float | None:
                try:
                    return float(logs[key]) if key in logs and logs[key] is not None else None
                except (TypeError, ValueError):
                    return None
            elapsed = time.time() - self.train_t0
            steps = state.global_step - self.first_step
            record = {"step": state.global_step, "max_steps": state.max_steps, "loss": num("loss"),
                      "learning_rate": num("learning_rate"), "epoch": num("epoch"),
                      "grad_norm": num("grad_norm"), "elapsed": round(elapsed, 3),
                      "throughput": round(steps / elapsed, 4) if elapsed > 0 else None,
                      "time": time.time()}
            if record["loss"] is None and num("train_loss") is not None:
                record["train_loss"] = num("train_loss")
                record["summary"] = True
            if record["loss"] is not None:
                self.last_loss = record["loss"]
            if self.fh:
                self.fh.write(json.dumps(record) + "\n")
                self.fh.flush()
            emit("metrics", **record)

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            emit("checkpoint_saved", step=state.global_step,
                 path=str(Path(args.output_dir) / f"checkpoint-{state.global_step}"))

    return MetricsCallback()


def train(job: JobConfig, run_dir: Path) -> dict[str, Any]:
    started = time.time()
    emit("phase", phase="loading", message="loading model and dataset")
    import dataclasses

    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        HfArgumentParser,
        Trainer,
        TrainingArguments,
    )

    from gaudi_gui.workers.demo import resolve_model

    args_dict = dict(job.training_args)
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    if "enable_jit_checkpoint" in names:
        # SIGTERM (the Stop button) then saves a checkpoint at the next step instead of losing work.
        args_dict.setdefault("enable_jit_checkpoint", True)
    args_dict.setdefault("report_to", "none")
    unknown = sorted(set(args_dict) - names)
    if unknown:
        raise WorkerError("config", f"unknown training argument(s) for this transformers version: "
                                    f"{', '.join(unknown)}")
    if not args_dict.get("output_dir"):
        raise WorkerError("config", "training_args.output_dir is not set")
    check_output_dir(str(args_dict["output_dir"]))
    try:
        (targs,) = HfArgumentParser(TrainingArguments).parse_dict(args_dict)  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        raise WorkerError("config", f"invalid training arguments: {exc}") from exc

    model_path = resolve_model(job.model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        kwargs: dict[str, Any] = {}
        if job.method == "qlora":
            import torch
            from transformers import BitsAndBytesConfig
            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=torch.bfloat16 if targs.bf16 else torch.float32)
        model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
    except Exception as exc:
        raise WorkerError("model", f"cannot load model {job.model!r}: {exc}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if job.method in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
        if job.method == "qlora":
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        lora = LoraConfig(r=job.lora.r, lora_alpha=job.lora.alpha, lora_dropout=job.lora.dropout,
                          target_modules=job.lora.target_modules or None, task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)  # type: ignore[assignment]
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        say(f"{job.method}: {trainable} trainable parameters")

    ds, column = load_dataset_rows(job)
    max_length = job.dataset.max_length

    def tokenize(batch: dict[str, list[Any]]) -> Any:
        return tokenizer([str(t) for t in batch[column]], truncation=True, max_length=max_length)

    with targs.main_process_first(desc="tokenize"):
        tokenized = ds.map(tokenize, batched=True, remove_columns=ds.column_names)
    tokenized = tokenized.filter(lambda row: len(row["input_ids"]) > 1)
    if len(tokenized) == 0:
        raise WorkerError("dataset", f"column {column!r} holds no text to train on")
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    callback = make_callback(run_dir, started)
    trainer = Trainer(model=model, args=targs, train_dataset=tokenized, data_collator=collator,
                      callbacks=[callback])
    say(f"pid {os.getpid()} training on {targs.device} ({len(tokenized)} rows)")
    resume: str | bool | None = job.resume_from_checkpoint or None
    if resume == "latest":
        from gaudi_gui.core.runstore import latest_checkpoint
        found = latest_checkpoint(targs.output_dir)
        resume = str(found) if found else None
    if resume:
        emit("phase", phase="resuming", checkpoint=str(resume))
    result = trainer.train(resume_from_checkpoint=resume)
    state = trainer.state
    stopped = state.max_steps > 0 and state.global_step < state.max_steps
    final_dir = ""
    if not stopped and MAIN:
        final = Path(targs.output_dir) / "final"
        if job.method == "lora":
            model.merge_and_unload().save_pretrained(str(final))  # type: ignore[operator]
        else:
            trainer.save_model(str(final))
        tokenizer.save_pretrained(str(final))
        final_dir = str(final)
    return {"stopped": stopped, "global_step": state.global_step, "max_steps": state.max_steps,
            "train_loss": float(result.training_loss) if result.training_loss == result.training_loss
            else None, "final_loss": callback.last_loss, "output_dir": targs.output_dir,
            "final_dir": final_dir, "world_size": targs.world_size}


def classify(exc: BaseException) -> tuple[str, str]:
    text = str(exc)
    if isinstance(exc, WorkerError):
        return exc.kind, text
    if isinstance(exc, MemoryError) or "out of memory" in text.lower() or "OutOfMemory" in type(exc).__name__:
        first = text.splitlines()[0] if text else ""
        return "oom", ("out of memory: lower per_device_train_batch_size or max length, use gradient "
                       f"accumulation, LoRA/QLoRA, or fewer processes ({first})")
    if isinstance(exc, PermissionError):
        return "output_dir", f"permission denied: {exc}"
    return "other", f"{type(exc).__name__}: {text}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gaudi_gui.workers.train")
    parser.add_argument("--config", required=True, help="job config JSON (in the run folder)")
    ns = parser.parse_args(argv)
    config = Path(ns.config)
    run_dir = config.parent
    say(f"started, pid {os.getpid()}")
    try:
        job = JobConfig.load(config)
        problems = [p for p in job.validate() if not p[0].startswith("launch.")]
        if problems:
            raise WorkerError("config", "; ".join(f"{f}: {m}" for f, m in problems))
        summary = train(job, run_dir)
    except JobConfigError as exc:
        emit("error", kind="config", message=str(exc))
        say(f"error: {exc}")
        return 1
    except Exception as exc:
        kind, message = classify(exc)
        if kind == "other":
            traceback.print_exc()
        emit("error", kind=kind, message=message)
        print(f"[rank {RANK}/{WORLD}] error ({kind}): {message}", file=sys.stderr, flush=True)
        return 1
    emit("stopped" if summary["stopped"] else "finished", **summary)
    say("stopped after checkpoint" if summary["stopped"] else "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
