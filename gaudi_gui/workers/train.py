"""The training worker: ``accelerate launch ... -m gaudi_gui.workers.train --config <run>/config.json``.

It loads the model and dataset the job names, applies LoRA/QLoRA when asked, builds TrainingArguments
with ``HfArgumentParser.parse_dict`` and runs the Trainer.

What the app relies on:
- Each rank records its pid and create time in ``<run>/ranks/rank-N.json`` before anything slow, so
  Stop signals exactly these processes (never the launcher, whose SIGTERM handling would kill the
  worker 5 s later, mid-save).
- Events (phases, metrics, checkpoints, errors, the end) go to ``<run>/events.jsonl``, one atomic
  append each (``gaudi_gui.core.events``); stdout stays a console log with ``[rank i/n]`` lines.
- SIGTERM, SIGINT or SIGHUP is a stop request. While loading, the rank ends at once ("stopped before
  training began"). While training, the ranks agree on the stop at the end of the current step (an
  all-reduce over a gloo group, so every rank stops at the same step), set ``should_save`` and
  ``should_training_stop``, and the Trainer writes a complete checkpoint through its own save path,
  on every rank, as DeepSpeed ZeRO-3 and FSDP need. transformers' own JIT checkpoint is not used: it
  waits 3 s before asking for a save and lets each rank save at its own step.
- The final save calls ``trainer.save_model`` on every rank (ZeRO-3 / FSDP gather the weights
  collectively; the Trainer writes on the main process only).
Failures end with an ``error`` event naming a kind (oom, missing_column, output_dir, config, model,
dataset, resume, other) and exit code 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from gaudi_gui.core import paths
from gaudi_gui.core.events import EventWriter
from gaudi_gui.core.jobconfig import JobConfig, JobConfigError

RANK = int(os.environ.get("RANK", "0"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
MAIN = RANK == 0


class WorkerError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class StopBeforeTraining(BaseException):
    """A BaseException, like KeyboardInterrupt, so no library's "except Exception" eats it.

    A stop request that arrived before there was any training state worth saving."""


class _Stop:
    """What the signal handler and the stop callback share."""

    requested = False
    signal_name = ""
    #: loading -> training -> finishing
    phase = "loading"


STOP = _Stop()
EVENTS: EventWriter | None = None


def emit(event_type: str, **fields: Any) -> None:
    """An event from rank 0 (or ``everywhere=True``: from each rank, tagged with its rank)."""
    everywhere = bool(fields.pop("everywhere", False))
    if EVENTS is not None and (MAIN or everywhere):
        try:
            EVENTS.write(event_type, **fields)
        except OSError as exc:
            print(f"[rank {RANK}/{WORLD}] could not write event {event_type}: {exc}", file=sys.stderr)


def say(text: str) -> None:
    print(f"[rank {RANK}/{WORLD}] {text}", flush=True)


def _on_stop_signal(signum: int, _frame: Any) -> None:
    first = not STOP.requested
    STOP.requested = True
    STOP.signal_name = signal.Signals(signum).name
    if first:
        emit("stop_requested", signal=STOP.signal_name, phase=STOP.phase, everywhere=True)
        os.write(2, f"[rank {RANK}/{WORLD}] {STOP.signal_name}: stopping ({STOP.phase})\n".encode())
    if STOP.phase == "loading":
        raise StopBeforeTraining


def install_stop_handlers() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_stop_signal)


def record_rank(run_dir: Path) -> None:
    """``ranks/rank-N.json``: this process, named by pid and create time, for an exact Stop."""
    import json

    import psutil
    folder = run_dir / "ranks"
    folder.mkdir(mode=0o700, exist_ok=True)
    me = psutil.Process()
    data = {"rank": RANK, "local_rank": LOCAL_RANK, "world_size": WORLD, "pid": me.pid,
            "create_time": me.create_time(), "host": socket.gethostname(), "started": time.time()}
    path = folder / f"rank-{RANK}.json"
    tmp = folder / f".rank-{RANK}.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


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


def _text_of(value: Any, row: int, column: str) -> str:
    if isinstance(value, str):
        return value
    raise WorkerError("dataset", f"row {row} of column {column!r} is not text "
                                 f"({type(value).__name__}: {str(value)[:60]!r})")


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


def make_callbacks(started: float) -> list[Any]:
    from transformers import TrainerCallback

    class MetricsCallback(TrainerCallback):
        """Structured metrics events from rank 0 (the Trainer's printed dicts hold strings)."""

        def __init__(self) -> None:
            self.train_t0 = 0.0
            self.first_step = 0
            self.last_loss: float | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.train_t0 = time.time()
            self.first_step = state.global_step
            emit("training_started", max_steps=state.max_steps, world_size=args.world_size,
                 start_step=state.global_step, load_seconds=round(self.train_t0 - started, 3))

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
            record: dict[str, Any] = {
                "step": state.global_step, "max_steps": state.max_steps, "start_step": self.first_step,
                "loss": num("loss"), "learning_rate": num("learning_rate"), "epoch": num("epoch"),
                "grad_norm": num("grad_norm"), "elapsed": round(elapsed, 3),
                "throughput": round(steps / elapsed, 4) if elapsed > 0 else None}
            if num("eval_loss") is not None:
                record["eval_loss"] = num("eval_loss")
            if record["loss"] is None and num("train_loss") is not None:
                record["train_loss"] = num("train_loss")
                record["summary"] = True
            if record["loss"] is not None:
                self.last_loss = record["loss"]
            emit("metrics", **record)

    class StopCallback(TrainerCallback):
        """Turns a stop request into a checkpoint at the end of the current step, on every rank."""

        def __init__(self) -> None:
            self.group: Any = None
            self.save_t0 = 0.0
            self.stop_step = -1

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            STOP.phase = "training"
            if WORLD > 1:
                import torch.distributed as dist
                if dist.is_available() and dist.is_initialized():
                    # A CPU group for the stop flag: no device sync per step on CUDA/HPU.
                    try:
                        self.group = dist.new_group(backend="gloo")
                    except Exception:  # a build without gloo: use the default group
                        self.group = dist.group.WORLD
            if STOP.requested:
                control.should_training_stop = True

        def _agree(self, args: Any) -> bool:
            if self.group is None:
                return STOP.requested
            import torch
            import torch.distributed as dist
            device = "cpu" if self.group is not dist.group.WORLD else args.device
            flag = torch.tensor([1 if STOP.requested else 0], dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
            return bool(flag.item())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self._agree(args):
                STOP.requested = True
                control.should_save = True
                control.should_training_stop = True
                self.stop_step = state.global_step
            if control.should_save:
                self.save_t0 = time.time()
                emit("checkpoint_saving", step=state.global_step,
                     reason="stop" if self.stop_step == state.global_step else "schedule")

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            emit("checkpoint_saved", step=state.global_step, path=str(path),
                 seconds=round(time.time() - self.save_t0, 3) if self.save_t0 else None,
                 reason="stop" if self.stop_step == state.global_step else "schedule")

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            STOP.phase = "finishing"

    return [MetricsCallback(), StopCallback()]


def train(job: JobConfig, run_dir: Path) -> dict[str, Any]:
    started = time.time()
    emit("phase", phase="loading", message="loading model and dataset")
    say("loading model and dataset")
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
        # Our StopCallback saves on a stop; the JIT handler would take SIGTERM from it (see above).
        args_dict["enable_jit_checkpoint"] = False
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

    def tokenize(batch: dict[str, list[Any]], indices: list[int]) -> Any:
        texts = [_text_of(v, row, column) for v, row in zip(batch[column], indices, strict=True)]
        return tokenizer(texts, truncation=True, max_length=max_length)

    with targs.main_process_first(desc="tokenize"):
        tokenized = ds.map(tokenize, batched=True, with_indices=True, remove_columns=ds.column_names)
    tokenized = tokenized.filter(lambda row: len(row["input_ids"]) > 1)
    if len(tokenized) == 0:
        raise WorkerError("dataset", f"column {column!r} holds no text to train on")
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    callbacks = make_callbacks(started)
    resume: str | bool | None = job.resume_from_checkpoint or None
    if resume == "latest":
        from gaudi_gui.core.runstore import latest_checkpoint
        found = latest_checkpoint(targs.output_dir)
        if found is None:
            raise WorkerError("resume", f"nothing to resume: {targs.output_dir} holds no complete "
                                        f"checkpoint-N folder")
        resume = str(found)
    elif resume:
        from gaudi_gui.core.runstore import checkpoint_complete
        if not checkpoint_complete(str(resume)):
            raise WorkerError("resume", f"{resume} is not a complete checkpoint (no readable "
                                        f"trainer_state.json, or a save was cut short)")
    trainer = Trainer(model=model, args=targs, train_dataset=tokenized, data_collator=collator,
                      callbacks=callbacks)
    distributed = str(getattr(trainer.accelerator, "distributed_type", "")).rsplit(".", 1)[-1]
    say(f"pid {os.getpid()} training on {targs.device} ({len(tokenized)} rows, {distributed})")
    if resume:
        emit("phase", phase="resuming", checkpoint=str(resume), message=f"resuming from {resume}")
    result = trainer.train(resume_from_checkpoint=resume)
    STOP.phase = "finishing"
    state = trainer.state
    stopped = STOP.requested and state.max_steps > 0 and state.global_step < state.max_steps
    final_dir = ""
    checkpoint = ""
    if stopped:
        from gaudi_gui.core.runstore import checkpoint_complete
        candidate = Path(targs.output_dir) / f"checkpoint-{state.global_step}"
        checkpoint = str(candidate) if checkpoint_complete(candidate) else ""
    else:
        emit("phase", phase="finishing", message="saving the final model")
        final_dir = save_final(trainer, job, tokenizer, Path(targs.output_dir))
    trainer.accelerator.wait_for_everyone()
    loss = float(result.training_loss) if result.training_loss == result.training_loss else None
    return {"stopped": stopped, "global_step": state.global_step, "max_steps": state.max_steps,
            "train_loss": loss, "final_loss": callbacks[0].last_loss, "output_dir": targs.output_dir,
            "final_dir": final_dir, "checkpoint": checkpoint, "world_size": targs.world_size}


def save_final(trainer: Any, job: JobConfig, tokenizer: Any, output_dir: Path) -> str:
    """Every rank calls ``trainer.save_model`` (ZeRO-3 and FSDP gather collectively; only the main
    process writes). A LoRA run keeps its adapter in ``adapter/`` and, when the weights are whole on
    each rank (not sharded), rank 0 writes the merged model to ``final/`` for the runner."""
    final = output_dir / "final"
    sharded = bool(getattr(trainer, "is_fsdp_enabled", False))
    if getattr(trainer, "is_deepspeed_enabled", False):
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
        sharded = sharded or is_deepspeed_zero3_enabled()
    if job.method == "lora":
        adapter = output_dir / "adapter" if not sharded else final
        trainer.save_model(str(adapter))
        trainer.accelerator.wait_for_everyone()
        if not sharded and MAIN:
            merged = trainer.accelerator.unwrap_model(trainer.model).merge_and_unload()
            merged.save_pretrained(str(final))
    else:
        trainer.save_model(str(final))
    if MAIN:
        tokenizer.save_pretrained(str(final))
    return str(final)


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
    global EVENTS
    install_stop_handlers()
    parser = argparse.ArgumentParser(prog="python -m gaudi_gui.workers.train")
    parser.add_argument("--config", required=True, help="job config JSON (in the run folder)")
    ns = parser.parse_args(argv)
    config = Path(ns.config)
    run_dir = config.parent
    try:
        record_rank(run_dir)
        EVENTS = EventWriter(run_dir / "events.jsonl", rank=RANK)
    except (OSError, StopBeforeTraining) as exc:
        say(f"cannot write to the run folder {run_dir}: {exc}")
        return 1
    say(f"started, pid {os.getpid()}")
    try:
        job = JobConfig.load(config)
        problems = [p for p in job.validate() if not p[0].startswith("launch.")]
        if problems:
            raise WorkerError("config", "; ".join(f"{f}: {m}" for f, m in problems))
        summary = train(job, run_dir)
    except StopBeforeTraining:
        emit("stopped", before_training=True, global_step=0, signal=STOP.signal_name)
        say("stopped before training began")
        return 0
    except JobConfigError as exc:
        emit("error", kind="config", message=str(exc), everywhere=True)
        say(f"error: {exc}")
        return 1
    except Exception as exc:
        kind, message = classify(exc)
        if kind == "other":
            traceback.print_exc()
        emit("error", kind=kind, message=message, everywhere=True)
        print(f"[rank {RANK}/{WORLD}] error ({kind}): {message}", file=sys.stderr, flush=True)
        return 1
    emit("stopped" if summary["stopped"] else "finished", **summary)
    say("stopped after checkpoint" if summary["stopped"] else "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
