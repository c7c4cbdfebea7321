"""The training worker: ``accelerate launch ... -m gaudi_gui.workers.train --config <run>/config.json``.

It loads the model and dataset the job names, applies LoRA/QLoRA when asked, builds TrainingArguments
with ``HfArgumentParser.parse_dict`` and runs the Trainer: TRL's SFTTrainer, or for a preference
objective (``objective``: dpo, orpo, kto) TRL's DPOTrainer, ORPOTrainer, KTOTrainer with its config
class (``workers/preference.py``); TRL's reward metrics (``rewards/margins``, ...) go into the metrics
events under TRL's names, beside the loss.

What the app relies on:
- Each rank records its pid and create time in ``<run>/ranks/rank-N.json`` before anything slow, so
  Stop signals exactly these processes (never the launcher, whose SIGTERM handling would kill the
  worker 5 s later, mid-save).
- Events (phases, metrics, checkpoints, errors, the end) go to ``<run>/events.jsonl``, one atomic
  append each (``gaudi_gui.core.events``); stdout stays a console log with ``[rank i/n]`` lines.
- SIGTERM, SIGINT or SIGHUP is a stop request, from the first line of ``main`` on. While loading, the
  rank ends at once ("stopped before training began", exit 0), wherever the signal lands; one that
  comes before the rank can write events is kept and honoured as soon as it can (a Stop waits for
  the rank file, so it lands right there). While training, the ranks agree on the stop at the end
  of the current step (an all-reduce over a gloo group, so every rank stops at the same step), set
  ``should_save`` and ``should_training_stop``, and the Trainer writes a complete checkpoint through
  its own save path, on every rank, as DeepSpeed ZeRO-3 and FSDP need. transformers' own JIT
  checkpoint is not used: it waits 3 s before asking for a save and lets each rank save at its own
  step.
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
from typing import TYPE_CHECKING, Any

from gaudi_gui.core import preference
from gaudi_gui.core.events import EventType, EventWriter

if TYPE_CHECKING:
    from gaudi_gui.core.jobconfig import JobConfig

RANK = int(os.environ.get("RANK", "0"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
MAIN = RANK == 0
#: Each machine's run folder gets its events from that machine's first rank (on one machine: rank 0).
#: In a multi-host run, machine i's folder must still prove how its ranks ended.
EVENTS_HERE = LOCAL_RANK == 0


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
    #: A stop while loading ends the rank through StopBeforeTraining only once the rank can say so in
    #: its events (armed); before that the request is kept, and raised when arming.
    armed = False
    #: StopBeforeTraining is raised once: a second signal must not interrupt the first one's ending.
    raised = False


STOP = _Stop()
EVENTS: EventWriter | None = None


def emit(event_type: EventType, **fields: Any) -> None:
    """An event from this machine's first rank (or ``everywhere=True``: from each rank, tagged)."""
    everywhere = bool(fields.pop("everywhere", False))
    if EVENTS is not None and (EVENTS_HERE or everywhere):
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
        emit(EventType.STOP_REQUESTED, signal=STOP.signal_name, phase=STOP.phase, everywhere=True)
        os.write(2, f"[rank {RANK}/{WORLD}] {STOP.signal_name}: stopping ({STOP.phase})\n".encode())
    if STOP.phase == "loading":
        _stop_before_training()


def _stop_before_training() -> None:
    if STOP.armed and not STOP.raised:
        STOP.raised = True
        raise StopBeforeTraining


def _arm() -> None:
    """From here on a stop while loading ends the rank at once; one that came earlier does now."""
    STOP.armed = True
    if STOP.requested and STOP.phase == "loading":
        _stop_before_training()


def install_stop_handlers() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_stop_signal)


def record_rank(run_dir: Path) -> None:
    """``ranks/rank-N.json``: this process, named by pid and create time, for an exact Stop."""

    import psutil
    folder = run_dir / "ranks"
    folder.mkdir(mode=0o700, exist_ok=True)
    me = psutil.Process()
    data = {"rank": RANK, "local_rank": LOCAL_RANK, "world_size": WORLD, "pid": me.pid,
            "create_time": me.create_time(), "host": socket.gethostname(), "started": time.time()}
    from gaudi_gui.core import atomic
    atomic.write_json(folder / f"rank-{RANK}.json", data, indent=None, fsync=False)


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
            self.memory_said = False

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.train_t0 = time.time()
            self.first_step = state.global_step
            emit(EventType.TRAINING_STARTED, max_steps=state.max_steps, world_size=args.world_size,
                 start_step=state.global_step, load_seconds=round(self.train_t0 - started, 3))

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if not logs:
                return
            if not state.is_world_process_zero:
                # Another machine's first rank (a multi-host run, a Slurm node): its own run folder
                # gets the step alone, so that machine's meter splits its compile meter at warm-up
                # and sees compilations rising (core/meter.py), by that machine's own clock.
                if "loss" in logs:
                    emit(EventType.STEP, step=state.global_step, max_steps=state.max_steps)
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
            record.update(self.speeds(args, state, steps, elapsed, num("num_tokens")))
            from gaudi_gui.workers.preference import metrics as reward_metrics
            record.update(reward_metrics(logs))
            record.update(self.memory(args))
            eval_loss = num("eval_loss")
            if eval_loss is not None:
                import math
                record["eval_loss"] = eval_loss
                # Perplexity of the eval split: exp(mean token loss); inf past float range is None.
                record["eval_perplexity"] = round(math.exp(eval_loss), 4) if eval_loss < 700 else None
            if record["loss"] is None and num("train_loss") is not None:
                record["train_loss"] = num("train_loss")
                record["summary"] = True
            if record["loss"] is not None:
                self.last_loss = record["loss"]
            emit(EventType.METRICS, **record)

        @staticmethod
        def speeds(args: Any, state: Any, steps: int, elapsed: float, tokens: float | None) -> dict[str, Any]:
            """samples/s and tokens/s since training began (this session), beside steps/s.

            Tokens: TRL's own count of trained tokens ("num_tokens" in its logs, all ranks, padding
            excluded), else the Trainer's ``num_input_tokens_seen`` when the job asked for it: no
            extra per-step gather is added for it."""
            if elapsed <= 0:
                return {"samples_per_second": None, "tokens_per_second": None}
            batch = (int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
                     * max(1, int(args.world_size)))
            seen = getattr(state, "num_input_tokens_seen", None)
            if tokens is None and seen:
                tokens = float(seen)
            return {"samples_per_second": round(steps * batch / elapsed, 4),
                    "tokens_per_second": round(tokens / elapsed, 2) if tokens else None,
                    "tokens_seen": int(tokens) if tokens else None}

        def memory(self, args: Any) -> dict[str, Any]:
            """The device memory the rank's allocator really holds (hl-smi reads the whole pool, "full"
            whatever the batch): torch.hpu.memory_stats() / torch.cuda; nothing on the CPU."""
            kind = getattr(args.device, "type", str(args.device))
            mib = 1 << 20
            try:
                import torch
                if kind == "hpu":
                    stats = torch.hpu.memory_stats()  # type: ignore[attr-defined]
                    return {"memory_source": "torch.hpu.memory_stats",
                            "memory_in_use_mib": round(stats.get("InUse", 0) / mib, 1),
                            "memory_peak_mib": round(stats.get("MaxInUse", 0) / mib, 1),
                            "memory_limit_mib": round(stats.get("Limit", 0) / mib, 1) or None}
                if kind == "cuda":
                    total = torch.cuda.get_device_properties(args.device).total_memory
                    return {"memory_source": "torch.cuda",
                            "memory_in_use_mib": round(torch.cuda.memory_allocated(args.device) / mib, 1),
                            "memory_peak_mib": round(torch.cuda.max_memory_allocated(args.device) / mib, 1),
                            "memory_limit_mib": round(total / mib, 1)}
            except Exception as exc:  # a reading must never stop training
                if not self.memory_said:
                    self.memory_said = True
                    say(f"device memory: cannot read it on {kind}: {exc}")
                return {}
            if not self.memory_said:
                self.memory_said = True
                say(f"device memory: not measured on {kind} (torch has no device memory to report there)")
            return {}

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
                emit(EventType.CHECKPOINT_SAVING, step=state.global_step,
                     reason="stop" if self.stop_step == state.global_step else "schedule")

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            emit(EventType.CHECKPOINT_SAVED, step=state.global_step, path=str(path),
                 seconds=round(time.time() - self.save_t0, 3) if self.save_t0 else None,
                 reason="stop" if self.stop_step == state.global_step else "schedule")

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            STOP.phase = "finishing"

    return [MetricsCallback(), StopCallback()]


def reporting(args: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The user's ``report_to`` goes to the Trainer as written (``sft_data.build_args`` only fills in
    "none" where it is unset). Here, before anything loads: a tracker whose package is missing is a
    config error with its pip line (the Trainer would raise it later, as a crash); a trackio Space
    while HF_HUB_OFFLINE is set is refused (it cannot be reached); the run's name is the trackers'
    run name unless ``run_name`` says otherwise; and where each tracker writes is said in the log and
    kept in ``<run>/trackers.json`` (what "Open in TensorBoard / trackio" reads). Returns that record.

    transformers 5.x's trackio callback (integrations/integration_utils.TrackioCallback) logs locally
    (trackio's SQLite under TRACKIO_DIR, else $HF_HOME/trackio) unless ``trackio_space_id`` or the
    TRACKIO_SPACE_ID / TRACKIO_SERVER_URL variables name a Space or a server; it then needs the
    network (and a Hugging Face login for a Space). Locally its one call out is huggingface_hub's
    ``whoami`` for the run's user name, made only where a Hugging Face token is stored; its failure is
    ignored, HF_HUB_OFFLINE=1 makes it fail at once (without it, an unreachable Hub costs the
    connection's own time-out: huggingface_hub sets none). A push to the Hub (``push_to_hub``) also
    syncs a static trackio Space unless ``trackio_static_space_id`` is false."""
    import importlib.util

    from gaudi_gui.core import export

    report = args.get("report_to")
    names = [report] if isinstance(report, str) else [str(n) for n in report or []]
    names = [n for n in names if n and n != "none"]
    if "all" in names:  # the Trainer's meaning: every integration installed here
        from transformers.integrations import get_available_reporting_integrations
        names = [n for n in names if n != "all"] + list(get_available_reporting_integrations())
    record: dict[str, Any] = {}
    if not names:
        return record
    args.setdefault("run_name", run_dir.name)
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    if "trackio" in names:
        if importlib.util.find_spec("trackio") is None:
            raise WorkerError("config", "report_to trackio: trackio is not installed in this Python: "
                                        "pip install trackio (or take trackio out of report_to)")
        space = args.get("trackio_space_id") or os.environ.get("TRACKIO_SPACE_ID")
        server = os.environ.get("TRACKIO_SERVER_URL")
        project = str(args.get("project") or "huggingface")
        if (space or server) and offline:
            target = f"the Space {space}" if space else f"the server {server}"
            raise WorkerError("config", f"report_to trackio: {target} needs the network, and "
                                        "HF_HUB_OFFLINE is set: clear trackio_space_id (and "
                                        "TRACKIO_SPACE_ID / TRACKIO_SERVER_URL) to log locally")
        if space or server:
            record["trackio"] = {"space": space or "", "server": server or "", "project": project,
                                 "run": args["run_name"]}
            if MAIN:
                say(f"trackio: logging to {space or server} (needs the network"
                    f"{' and a Hugging Face login' if space else ''}), project {project}")
        else:
            where = export.default_trackio_dir()
            record["trackio"] = {"dir": str(where), "project": project, "run": args["run_name"]}
            if MAIN:
                say(f"trackio: logging locally to {where}, project {project}, run {args['run_name']} "
                    f"(see it: TRACKIO_DIR={where} trackio show --project {project})")
    if "tensorboard" in names:
        if not any(importlib.util.find_spec(name) for name in ("tensorboard", "tensorboardX")):
            raise WorkerError("config", "report_to tensorboard: tensorboard is not installed in this Python: "
                                        "pip install tensorboard (or take tensorboard out of report_to)")
        logdir = os.environ.get("TENSORBOARD_LOGGING_DIR") or str(Path(str(args.get("output_dir"))) / "runs")
        record["tensorboard"] = {"dir": str(Path(logdir).expanduser())}
        if MAIN:
            say(f"tensorboard: event files under {logdir} (tensorboard --logdir {logdir})")
    if MAIN and record:
        from gaudi_gui.core import atomic
        try:
            atomic.write_json(run_dir / "trackers.json", record, indent=None, fsync=False)
        except OSError as exc:
            say(f"could not record the trackers in the run folder: {exc}")
    return record


def train(job: JobConfig, run_dir: Path) -> dict[str, Any]:
    started = time.time()
    emit(EventType.PHASE, phase="loading", message="loading model and dataset")
    say("loading model and dataset")
    from gaudi_gui.workers import loader, sft_data
    from gaudi_gui.workers.demo import resolve_model
    from gaudi_gui.workers.schema import config_class

    args_dict = sft_data.build_args(job)
    if not args_dict.get("output_dir"):
        raise WorkerError("config", "training_args.output_dir is not set")
    check_output_dir(str(args_dict["output_dir"]))
    reporting(args_dict, run_dir)
    targs = sft_data.parse_args(args_dict, job.objective)
    if config_class(job.objective).__name__ != preference.CONFIG_CLASSES[job.objective]:
        raise WorkerError("config", "trl is not installed in this environment (pip install 'trl>=1.16')")
    aligning = preference.is_preference(job.objective)
    if job.objective == "orpo":
        say("ORPO: TRL's trl.experimental.orpo (TRL marks its experimental API as subject to change)")

    try:
        # The Trainer places the model; QLoRA computes in bf16 when the run trains in bf16.
        how = loader.plan("", dtype=None, quantization=job.quantization, place=False,
                          compute_dtype="bf16" if targs.bf16 else "fp32")
        if aligning:
            from gaudi_gui.workers import preference as pref
            model, tokenizer, adapted = pref.load_model(job, resolve_model(job.model), how, say)
        else:
            model, tokenizer = loader.load(resolve_model(job.model), how)
            adapted = False
    except loader.LoadError as exc:
        raise WorkerError("config", str(exc)) from None
    except Exception as exc:
        raise WorkerError("model", f"cannot load model {job.model!r}: {exc}") from exc
    peft_config = None
    if job.method in ("lora", "qlora") and not adapted:
        from peft import LoraConfig
        # SFTTrainer wraps the model (and prepares a 4-bit one) from this config.
        peft_config = LoraConfig(r=job.lora.r, lora_alpha=job.lora.alpha, lora_dropout=job.lora.dropout,
                                 target_modules=job.lora.target_modules or None, task_type="CAUSAL_LM")

    raw, raw_eval = sft_data.load_raw(job)
    callbacks = make_callbacks(started)
    if job.profile_steps > 0 and MAIN:
        # Rank 0 only: every data-parallel rank runs the same operators (core/profile.py).
        from gaudi_gui.workers.profile import make_callback
        callbacks.append(make_callback(job.profile_steps, run_dir, say))
    resume = _resume_point(job, targs)
    if aligning:
        return _align(job, model, tokenizer, targs, raw=raw, raw_eval=raw_eval, peft_config=peft_config,
                      callbacks=callbacks, resume=resume)
    chat = bool(getattr(tokenizer, "chat_template", None)) or bool(args_dict.get("chat_template_path"))
    train_rows, skipped = sft_data.to_sft(job, raw, chat)
    if skipped.count:
        say(f"warning: {skipped.said(len(train_rows) + skipped.count)}")
    eval_rows = None
    if raw_eval is not None:
        eval_rows, eval_skipped = sft_data.to_sft(job, raw_eval, chat, "eval split")
        if eval_skipped.count:
            say(f"warning: {eval_skipped.said(len(eval_rows) + eval_skipped.count, 'eval split')}")
    if targs.assistant_only_loss and not targs.chat_template_path:
        from trl.chat_template_utils import get_training_chat_template, has_generation_markers
        if not has_generation_markers(tokenizer.chat_template or ""):
            # SFTTrainer raises a bare ValueError here; say what to choose instead.
            sft_data.training_chat_template(tokenizer, get_training_chat_template)
    from trl import SFTTrainer
    trainer: Any = SFTTrainer(model=model, args=targs, train_dataset=train_rows, eval_dataset=eval_rows,
                         processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks)
    if peft_config is not None:
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        say(f"{job.method}: {trainable} trainable parameters")
    # TRL drops rows that truncation left without a labelled token (a prompt longer than max_length).
    dropped = len(train_rows) - len(trainer.train_dataset)
    if len(trainer.train_dataset) == 0:
        raise sft_data.DataError("dataset", sft_data.truncated_message(dropped, len(train_rows),
                                                                       targs.max_length),
                                 "dataset.max_length")
    if dropped:
        say(f"warning: {sft_data.truncated_message(dropped, len(train_rows), targs.max_length)}")
    first = trainer.train_dataset[0] if len(trainer.train_dataset) else {}
    labels = list(first.get("labels") or first.get("input_ids") or [])
    emit(EventType.DATASET_READY, kind=job.dataset.kind, rows=len(trainer.train_dataset),
         dropped=dropped + skipped.count, skipped=skipped.count, skipped_first=skipped.first,
         eval_rows=len(trainer.eval_dataset) if trainer.eval_dataset is not None else 0,
         first_tokens=len(first.get("input_ids") or []),
         first_labelled=sum(1 for x in labels if x != -100))
    distributed = str(getattr(trainer.accelerator, "distributed_type", "")).rsplit(".", 1)[-1]
    say(f"pid {os.getpid()} training on {targs.device} ({len(trainer.train_dataset)} rows, {distributed})")
    return _finish(job, trainer, tokenizer, targs, eval_rows=eval_rows, callbacks=callbacks, resume=resume)


def _resume_point(job: JobConfig, targs: Any) -> str | None:
    """The checkpoint the run resumes from (None: a new run); WorkerError for one that cannot be."""
    resume: str | None = job.resume_from_checkpoint or None
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
    return resume


def _align(job: JobConfig, model: Any, tokenizer: Any, targs: Any, *, raw: Any, raw_eval: Any,
           peft_config: Any, callbacks: list[Any], resume: str | None) -> dict[str, Any]:
    """A preference run (DPO, ORPO, KTO): TRL's trainer of the objective on the columns it takes."""
    from gaudi_gui.workers import preference as pref

    train_rows, found = pref.rows(job, raw)
    eval_rows = pref.rows(job, raw_eval, "eval split")[0] if raw_eval is not None else None
    say(f"{preference.LABELS[job.objective]}: {found.describe()}")
    trainer = pref.make_trainer(job, model, tokenizer, targs, train_rows=train_rows, eval_rows=eval_rows,
                                peft_config=peft_config, callbacks=callbacks)
    if job.method in ("lora", "qlora"):
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        say(f"{job.method}: {trainable} trainable parameters")
    emit(EventType.DATASET_READY, kind=job.objective, rows=len(trainer.train_dataset), dropped=0, skipped=0,
         skipped_first="", columns=list(found.columns), shape=found.shape,
         eval_rows=len(trainer.eval_dataset) if trainer.eval_dataset is not None else 0)
    say(f"pid {os.getpid()} training on {targs.device} ({len(trainer.train_dataset)} rows, "
        f"{preference.LABELS[job.objective]})")
    return _finish(job, trainer, tokenizer, targs, eval_rows=eval_rows, callbacks=callbacks, resume=resume)


def _finish(job: JobConfig, trainer: Any, tokenizer: Any, targs: Any, *, eval_rows: Any,
            callbacks: list[Any], resume: str | None) -> dict[str, Any]:
    """Train (from ``resume``), evaluate once where an eval split has no schedule, save the result."""
    if resume:
        emit(EventType.PHASE, phase="resuming", checkpoint=str(resume), message=f"resuming from {resume}")
    result = trainer.train(resume_from_checkpoint=resume)
    STOP.phase = "finishing"
    state = trainer.state
    stopped = STOP.requested and state.max_steps > 0 and state.global_step < state.max_steps
    strategy = str(getattr(targs.eval_strategy, "value", targs.eval_strategy))
    if eval_rows is not None and not stopped and strategy == "no":
        # An eval split without a schedule: one evaluation of the trained model (logged as metrics).
        emit(EventType.PHASE, phase="evaluating", message="evaluating on the eval split")
        trainer.evaluate()
    final_dir = ""
    checkpoint = ""
    if stopped:
        from gaudi_gui.core.runstore import checkpoint_complete
        candidate = Path(targs.output_dir) / f"checkpoint-{state.global_step}"
        checkpoint = str(candidate) if checkpoint_complete(candidate) else ""
    else:
        emit(EventType.PHASE, phase="finishing", message="saving the final model")
        final_dir = save_final(trainer, job, tokenizer, Path(targs.output_dir))
    trainer.accelerator.wait_for_everyone()
    loss = float(result.training_loss) if result.training_loss == result.training_loss else None
    return {"stopped": stopped, "global_step": state.global_step, "max_steps": state.max_steps,
            "train_loss": loss, "final_loss": callbacks[0].last_loss, "output_dir": targs.output_dir,
            "final_dir": final_dir, "checkpoint": checkpoint, "world_size": targs.world_size,
            **({"objective": job.objective} if job.objective != "sft" else {})}


def save_final(trainer: Any, job: JobConfig, tokenizer: Any, output_dir: Path) -> str:
    """Every rank calls ``trainer.save_model`` (ZeRO-3 and FSDP gather collectively; only the main
    process writes). A full run writes the model to ``final/``; a LoRA/QLoRA run writes its adapter,
    as an adapter, to ``adapter/`` (with the tokenizer, so the runner can load base + adapter from
    it); "Merge and save" (``gaudi_gui.workers.merge``) makes a full model of it when asked."""
    target = output_dir / ("adapter" if job.method in ("lora", "qlora") else "final")
    trainer.save_model(str(target))
    if MAIN:
        tokenizer.save_pretrained(str(target))
    return str(target)


def classify(exc: BaseException) -> tuple[str, str]:
    text = str(exc)
    if isinstance(exc, WorkerError):
        return exc.kind, text
    from gaudi_gui.workers.sft_data import DataError
    if isinstance(exc, DataError):
        return exc.kind, text
    if isinstance(exc, MemoryError) or "out of memory" in text.lower() or "OutOfMemory" in type(exc).__name__:
        first = text.splitlines()[0] if text else ""
        return "oom", ("out of memory: lower per_device_train_batch_size or max length, use gradient "
                       f"accumulation, LoRA/QLoRA, or fewer processes ({first})")
    if isinstance(exc, PermissionError):
        return "output_dir", f"permission denied: {exc}"
    return "other", f"{type(exc).__name__}: {text}"


def main(argv: list[str] | None = None) -> int:
    # First thing, before any import that takes time: a SIGTERM from here on is a stop request, never
    # the default death (which the outcome can only call "killed").
    install_stop_handlers()
    try:
        return _run(argv)
    except StopBeforeTraining:
        # Caught here, outside every other handler: raised wherever the signal landed (an import, a
        # print, an error being reported), it ends the rank the same way.
        emit(EventType.STOPPED, before_training=True, global_step=0, signal=STOP.signal_name)
        say("stopped before training began")
        return 0


def _run(argv: list[str] | None) -> int:
    global EVENTS
    from gaudi_gui.core.jobconfig import JobConfig, JobConfigError

    parser = argparse.ArgumentParser(prog="python -m gaudi_gui.workers.train")
    parser.add_argument("--config", required=True, help="job config JSON (in the run folder)")
    ns = parser.parse_args(argv)
    config = Path(ns.config)
    run_dir = config.parent
    try:
        # The events first: the rank file is what Stop waits for, so a stop that comes the moment
        # it appears can be told as a stop.
        EVENTS = EventWriter(run_dir / "events.jsonl", rank=RANK)
        record_rank(run_dir)
    except OSError as exc:
        say(f"cannot write to the run folder {run_dir}: {exc}")
        return 1
    _arm()
    say(f"started, pid {os.getpid()}")
    try:
        job = JobConfig.load(config)
        from gaudi_gui.workers import loader
        loader.hide_bitsandbytes(job.quantization, job.training_args.get("optim"))  # before transformers
        problems = [p for p in job.validate() if not p[0].startswith("launch.")]
        if problems:
            raise WorkerError("config", "; ".join(f"{f}: {m}" for f, m in problems))
        summary = train(job, run_dir)
    except JobConfigError as exc:
        emit(EventType.ERROR, kind="config", message=str(exc), everywhere=True)
        say(f"error: {exc}")
        return 1
    except Exception as exc:
        kind, message = classify(exc)
        if kind == "other":
            traceback.print_exc()
        emit(EventType.ERROR, kind=kind, message=message, everywhere=True)
        print(f"[rank {RANK}/{WORLD}] error ({kind}): {message}", file=sys.stderr, flush=True)
        return 1
    emit(EventType.STOPPED if summary["stopped"] else EventType.FINISHED, **summary)
    say("stopped after checkpoint" if summary["stopped"] else "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
