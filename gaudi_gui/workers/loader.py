"""One model loader for the runner, Evaluate and training, by one rule:

- device: ``resolve_device`` is ``workers.device.resolve`` (the probe's rule: hpu > cuda > cpu);
- dtype: "auto" is fp32 on the CPU, bf16 on an accelerator; None keeps the library's default (training:
  its TrainingArguments decide the compute);
- quantization: ``core.quantization``'s names -> ``BitsAndBytesConfig``; what the device cannot run or
  a missing bitsandbytes is a LoadError with a sentence;
- placement: ``device_map`` on Gaudi, and on CUDA with bitsandbytes (it places quantized weights
  itself), else ``.to(device)`` after loading; ``place=False`` leaves it to the Trainer.

``plan`` builds the arguments without torch (tests/unit/test_loader.py); ``load`` imports torch.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gaudi_gui.core import quantization as quant

#: Our dtype names -> torch's.
DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


class LoadError(Exception):
    """A model cannot be loaded as asked: ``kind`` ("unsupported", "bad_parameters") and a sentence."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def resolve_device(wanted: str) -> str:
    """``wanted`` ("auto", "hpu", "cuda", "cpu") as this process will use it."""
    from gaudi_gui.workers import device as device_mod
    try:
        return device_mod.resolve(wanted)
    except device_mod.Unsupported as exc:
        raise LoadError("unsupported", str(exc)) from None


#: TrainingArguments' optimizers that bitsandbytes provides (transformers' ``_BITSANDBYTES_OPTIMIZERS``
#: and the 8-bit GaLore ones): each name holds one of these.
_BNB_OPTIMIZER_MARKS = ("bnb", "8bit", "paged", "lion", "ademamix")


def hide_bitsandbytes(quantization: str = "none", optim: object = None) -> bool:
    """Makes bitsandbytes look not installed to this process when it cannot need it (no quantization, no
    bitsandbytes optimizer); called before transformers is imported. Returns whether it was hidden.

    Why: transformers' Trainer and peft import it whenever it is installed, and its import is costly and
    not quiet. bitsandbytes 0.50 wraps its kernels in ``torch.compile`` at import (which imports
    inductor: measured 2.4-4.7 s more per process on this 2-core machine, ``from trl import
    SFTTrainer`` 8.9 -> 6.5 s, 15.2 -> 10.5 s), and on a CPU with AVX512-BF16 (the Xeons of Gaudi
    servers) with ``kernels`` installed (transformers requires it) it asks the Hub for a kernel at
    import: on an air-gapped server, every rank's start waits on the network for nothing.
    ``sys.modules[name] = None`` is Python's own "not importable": ``import`` raises ImportError and
    ``importlib.util.find_spec`` answers None, which is what the libraries ask."""
    if quant.normalize(quantization) != "none":
        return False
    if any(mark in str(optim or "").lower() for mark in _BNB_OPTIMIZER_MARKS):
        return False
    if sys.modules.get("bitsandbytes") is not None:
        return False  # already imported: too late to matter
    sys.modules["bitsandbytes"] = None  # type: ignore[assignment]
    return True


def _no_bitsandbytes(quantization: str) -> LoadError:
    return LoadError("unsupported", f"{quantization} quantization needs bitsandbytes, which is not "
                                    "installed in this environment (pip install bitsandbytes), or choose "
                                    "quantization none")


@dataclass(frozen=True)
class Plan:
    """How one model is loaded (``kwargs``: ``from_pretrained``'s arguments)."""

    device: str
    dtype: str | None
    quantization: str
    compute_dtype: str  # bitsandbytes' 4-bit compute dtype
    device_map: str | None
    move: bool  # .to(device) once loaded
    inference: bool  # eval mode (the Trainer sets its own)

    def kwargs(self, torch: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": getattr(torch, DTYPES[self.dtype])} if self.dtype else {}
        args = quant.BNB_ARGS[self.quantization]
        if args is not None:
            try:
                import bitsandbytes  # noqa: F401
                from transformers import BitsAndBytesConfig
            except ImportError:
                raise _no_bitsandbytes(self.quantization) from None
            if args.get("load_in_4bit"):
                args = {**args, "bnb_4bit_compute_dtype": getattr(torch, DTYPES[self.compute_dtype])}
            out["quantization_config"] = BitsAndBytesConfig(**args)
        if self.device_map:
            out["device_map"] = self.device_map
        return out


def plan(device: str, *, dtype: str | None = "auto", quantization: str = "none", place: bool = True,
         compute_dtype: str = "") -> Plan:
    """The plan for a model on ``device`` ("cpu", "cuda", "hpu"; "" for the Trainer's). LoadError with
    a sentence for what cannot be."""
    name = quant.normalize(quantization)
    why = quant.problem(name, device)
    if why:
        raise LoadError("unsupported" if name in quant.BNB_ARGS else "bad_parameters", why)
    bnb = quant.BNB_ARGS[name] is not None
    if bnb and importlib.util.find_spec("bitsandbytes") is None:
        raise _no_bitsandbytes(name)
    if dtype == "auto":
        dtype = "fp32" if device == "cpu" else "bf16"
    for value in (dtype, compute_dtype):
        if value and value not in DTYPES:
            raise LoadError("bad_parameters", f"dtype must be auto or {', '.join(DTYPES)} (got {value!r})")
    device_map = device if place and (device == "hpu" or (device == "cuda" and bnb)) else None
    return Plan(device, dtype, name, compute_dtype or dtype or "fp32", device_map,
                move=place and device not in ("cpu", "") and device_map is None, inference=place)


def load(path: str, how: Plan, *, tokenizer_path: str = "", trust_remote_code: bool = False,
         local_files_only: bool = False, config: Any = None, adapter: str = "",
         stage: Callable[[str], None] = lambda _text: None) -> tuple[Any, Any]:
    """(model, tokenizer) of ``path`` (a folder or a Hub id) as ``how`` says; the tokenizer from
    ``tokenizer_path`` when given; ``adapter``: a LoRA folder applied unmerged; ``stage`` is told each
    step. The library's own exceptions go to the caller."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    common = {k: True for k, on in (("trust_remote_code", trust_remote_code),
                                    ("local_files_only", local_files_only)) if on}
    stage("loading tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or path, **common)
    stage("loading weights")
    extra = {"config": config} if config is not None else {}
    model: Any = AutoModelForCausalLM.from_pretrained(path, **how.kwargs(torch), **common, **extra)
    if adapter:
        stage("applying the adapter")
        model.load_adapter(adapter)  # transformers' peft integration: a separate module, not merged
    if how.move:
        stage(f"moving to {how.device}")
        model = model.to(how.device)
    if how.inference:
        model.eval()
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


__all__ = ["DTYPES", "LoadError", "Plan", "load", "plan", "resolve_device"]
