"""One model loader for the runner, Evaluate and training: (model, device, dtype, quantization) ->
model and tokenizer, by one rule.

- device: ``resolve_device`` is ``workers.device.resolve`` (the probe's rule: hpu > cuda > cpu);
- dtype: "auto" is fp32 on the CPU and bf16 on an accelerator; None leaves the library's default
  (training: its TrainingArguments' bf16/fp16 decide the compute);
- quantization: ``core.quantization``'s names -> ``BitsAndBytesConfig``; refused with a sentence
  where the device cannot run it or bitsandbytes is not installed;
- placement: ``device_map`` on Gaudi, and on CUDA with bitsandbytes (it places the quantized weights
  itself), else ``.to(device)`` after loading; training leaves placement to the Trainer (``place=False``).

``plan`` builds the arguments without importing torch (tests/unit/test_loader.py); ``load`` loads.
Imports torch and transformers in ``load`` only: workers only.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gaudi_gui.core import quantization as quant

#: Our dtype names -> torch's attribute names.
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


def _bitsandbytes_missing(quantization: str) -> LoadError:
    return LoadError("unsupported", f"{quantization} quantization needs bitsandbytes, which is not "
                                    "installed in this environment (pip install bitsandbytes), or choose "
                                    "quantization none")


@dataclass(frozen=True)
class Plan:
    """How one model is loaded: ``kwargs`` are ``from_pretrained``'s arguments."""

    device: str
    #: "bf16", "fp32", "fp16", or None: the library's default.
    dtype: str | None
    quantization: str
    #: bitsandbytes' compute dtype for 4-bit (the model's dtype unless training says otherwise).
    compute_dtype: str
    device_map: str | None
    #: Move the loaded model to ``device`` (not when ``device_map`` placed it, nor for the Trainer).
    move: bool
    #: Put the model in eval mode (inference); the Trainer sets its own mode.
    inference: bool

    def kwargs(self, torch: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.dtype:
            out["dtype"] = getattr(torch, DTYPES[self.dtype])
        bnb = quant.BNB_ARGS[self.quantization]
        if bnb is not None:
            try:
                import bitsandbytes  # noqa: F401
                from transformers import BitsAndBytesConfig
            except ImportError:
                raise _bitsandbytes_missing(self.quantization) from None
            args = dict(bnb)
            if args.get("load_in_4bit"):
                args["bnb_4bit_compute_dtype"] = getattr(torch, DTYPES[self.compute_dtype])
            out["quantization_config"] = BitsAndBytesConfig(**args)
        if self.device_map:
            out["device_map"] = self.device_map
        return out


def plan(device: str, *, dtype: str | None = "auto", quantization: str = "none", place: bool = True,
         compute_dtype: str = "") -> Plan:
    """The plan for a model on ``device`` (resolved: "cpu", "cuda", "hpu"). ``place=False``: training
    (the Trainer places the model and sets its mode). LoadError with a sentence for what cannot be."""
    name = quant.normalize(quantization)
    why = quant.problem(name, device)
    if why:
        raise LoadError("unsupported" if name in quant.BNB_ARGS else "bad_parameters", why)
    bnb = quant.BNB_ARGS[name] is not None
    if bnb and importlib.util.find_spec("bitsandbytes") is None:
        raise _bitsandbytes_missing(name)
    if dtype == "auto":
        dtype = "fp32" if device == "cpu" else "bf16"
    for value in (dtype, compute_dtype):
        if value and value not in DTYPES:
            raise LoadError("bad_parameters",
                            f"dtype must be one of auto, {', '.join(DTYPES)} (got {value!r})")
    device_map = device if place and (device == "hpu" or (device == "cuda" and bnb)) else None
    return Plan(device=device, dtype=dtype, quantization=name, compute_dtype=compute_dtype or dtype or "fp32",
                device_map=device_map, move=place and device != "cpu" and device_map is None, inference=place)


def load(path: str, how: Plan, *, tokenizer_path: str = "", trust_remote_code: bool = False,
         local_files_only: bool = False, config: Any = None, adapter: str = "",
         stage: Callable[[str], None] | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) of ``path`` (a folder or a Hub id; ``builtin:demo`` resolved by the caller)
    as ``how`` says. ``tokenizer_path``: where the tokenizer is (default ``path``); ``config``: a
    prepared model config; ``adapter``: a LoRA adapter folder applied over the model, unmerged;
    ``stage``: told each step ("loading weights"...). The library's exceptions go to the caller."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say = stage or (lambda _text: None)
    common: dict[str, Any] = {}
    if trust_remote_code:
        common["trust_remote_code"] = True
    if local_files_only:
        common["local_files_only"] = True
    say("loading tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or path, **common)
    say("loading weights")
    kwargs = {**how.kwargs(torch), **common, **({"config": config} if config is not None else {})}
    model: Any = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if adapter:
        say("applying the adapter")
        model.load_adapter(adapter)  # transformers' peft integration: a separate module, not merged
    if how.move:
        say(f"moving to {how.device}")
        model = model.to(how.device)
    if how.inference:
        model.eval()
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


__all__ = ["DTYPES", "LoadError", "Plan", "load", "plan", "resolve_device"]
