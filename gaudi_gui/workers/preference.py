"""The preference side of the training worker (DPO, ORPO, KTO): the model, the rows, TRL's trainer.

The loss is TRL's own: ``DPOTrainer``/``KTOTrainer`` (``trl``) and ``ORPOTrainer``
(``trl.experimental.orpo`` in TRL 1.x) with their config classes, built from the job as the SFT path
builds SFTTrainer (``workers/train.py``), the same callbacks, Stop, Resume and final save.

From a finished SFT run (``Align with preferences…``): a job whose model is a LoRA adapter folder
loads the adapter's base model and the adapter over it, trainable (method lora/qlora); TRL then adds a
frozen copy of that adapter as the reference ("ref"), so the reference model is the SFT model and
the base weights are in memory once. With method full the adapter is merged first, and the trainer
keeps a reference copy of the merged model (a full fine-tune needs one). A full SFT model is loaded
as any model, and the reference is a copy of it (DPO/KTO) or none (ORPO has no reference).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gaudi_gui.core import preference

if TYPE_CHECKING:
    from gaudi_gui.core.jobconfig import JobConfig


def adapter_base(path: str) -> str | None:
    """The base model a LoRA adapter folder was trained on (None: ``path`` is no adapter folder)."""
    config = Path(path).expanduser() / "adapter_config.json"
    if not config.is_file():
        return None
    try:
        base = json.loads(config.read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError):
        return None
    return str(base) if base else None


def load_model(job: JobConfig, path: str, how: Any, say: Any) -> tuple[Any, Any, bool]:
    """(model, tokenizer, the model already holds the trainable adapter) for ``path``."""
    from gaudi_gui.workers import loader

    base = adapter_base(path)
    if base is None:
        model, tokenizer = loader.load(path, how)
        return model, tokenizer, False
    from peft import PeftModel

    # An SFT run saves its tokenizer beside the adapter (workers/train.save_final); else the base's.
    own = (Path(path).expanduser() / "tokenizer_config.json").is_file()
    model, tokenizer = loader.load(base, how, tokenizer_path=path if own else "")
    if job.method in ("lora", "qlora"):
        say(f"starting from the adapter {path} over {base}: the reference is that SFT model (a frozen "
            f"copy of the adapter; the base weights once in memory)")
        return PeftModel.from_pretrained(model, path, is_trainable=True), tokenizer, True
    say(f"starting from the adapter {path} merged into {base} (method full: the trainer keeps a "
        f"reference copy)")
    return PeftModel.from_pretrained(model, path).merge_and_unload(), tokenizer, False


def rows(job: JobConfig, ds: Any, what: str = "dataset") -> tuple[Any, preference.Layout]:
    """The columns the objective takes (every other dropped), checked on the first rows; DataError
    (missing_column / dataset) naming the objective and the column otherwise."""
    from gaudi_gui.workers.sft_data import DataError

    columns = list(ds.column_names)
    head = [ds[i] for i in range(min(len(ds), preference.PREVIEW_ROWS * 7))]
    problems = preference.check(job.objective, columns, head)
    if problems:
        kind = "missing_column" if preference.layout(job.objective, columns) is None else "dataset"
        raise DataError(kind, f"{what}: {problems[0][1]}", "dataset.source")
    found = preference.detect(job.objective, columns, head)
    assert found is not None
    if len(ds) == 0:
        raise DataError("dataset", f"{what} has no rows", "dataset.source")
    return ds.select_columns(list(found.columns)), found


def trainer_class(objective: str) -> Any:
    if objective == "dpo":
        from trl import DPOTrainer
        return DPOTrainer
    if objective == "kto":
        from trl import KTOTrainer
        return KTOTrainer
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's notice that trl.experimental may change; said in the log
        from trl.experimental.orpo import ORPOTrainer
    return ORPOTrainer


def make_trainer(job: JobConfig, model: Any, tokenizer: Any, targs: Any, *, train_rows: Any, eval_rows: Any,
                 peft_config: Any, callbacks: list[Any]) -> Any:
    cls = trainer_class(job.objective)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return cls(model=model, args=targs, train_dataset=train_rows, eval_dataset=eval_rows,
               processing_class=tokenizer, peft_config=peft_config, callbacks=callbacks)


def metrics(logs: dict[str, Any]) -> dict[str, float]:
    """TRL's reward metrics in a log dict, under TRL's names (and ``eval_`` ones), as floats."""
    out: dict[str, float] = {}
    for key in preference.REWARD_KEYS:
        for name in (key, f"eval_{key}"):
            value = logs.get(name)
            try:
                if value is not None:
                    out[name] = float(value)
            except (TypeError, ValueError):
                continue
    return out


__all__ = ["adapter_base", "load_model", "make_trainer", "metrics", "rows", "trainer_class"]
