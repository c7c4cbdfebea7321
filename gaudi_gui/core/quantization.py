"""One quantization vocabulary for every job that loads a model: the runner, Evaluate, training (QLoRA
is "4bit") and Serve's choices. ``workers.loader`` turns a name into bitsandbytes' arguments: a new
quantization is one entry of ``BNB_ARGS``. Qt-free and torch-free.
"""

from __future__ import annotations

from typing import Any

#: The names, in the order the forms offer them.
QUANTIZATIONS = ("none", "8bit", "4bit")
#: Each name's ``BitsAndBytesConfig`` arguments (4-bit also gets its compute dtype); None: no config.
BNB_ARGS: dict[str, dict[str, Any] | None] = {
    "none": None, "8bit": {"load_in_8bit": True},
    "4bit": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}}
#: What a device cannot run, and why (DESIGN.md: on Gaudi bitsandbytes runs nf4 only).
UNSUPPORTED = {("hpu", "8bit"): "8-bit quantization is not supported on Gaudi; use 4bit (nf4)"}
#: Other spellings a saved setting or an older release may hold (Serve's "bnb-4bit", bitsandbytes'
#: "nf4" and "load_in_4bit", "int8"...), read as the names above.
ALIASES = {
    "": "none", "no": "none", "off": "none", "false": "none", "null": "none",
    "8-bit": "8bit", "int8": "8bit", "bnb-8bit": "8bit", "bnb_8bit": "8bit", "load_in_8bit": "8bit",
    "llm.int8": "8bit", "4-bit": "4bit", "int4": "4bit", "nf4": "4bit", "bnb-4bit": "4bit",
    "bnb_4bit": "4bit", "load_in_4bit": "4bit", "qlora": "4bit",
}


def normalize(value: Any) -> str:
    """``value`` as one of ``QUANTIZATIONS`` when it is one or an old spelling of one (None and False:
    "none"); anything else as it was written, for the form to refuse by name."""
    if value is None or value is False:
        return "none"
    text = str(value).strip()
    return text.lower() if text.lower() in BNB_ARGS else ALIASES.get(text.lower(), text)


def problem(quantization: str, device: str = "") -> str:
    """Why ``quantization`` cannot be used (on ``device``, when given); "" when it can."""
    if quantization not in BNB_ARGS:
        return f"quantization must be one of {', '.join(QUANTIZATIONS)} (got {quantization!r})"
    return UNSUPPORTED.get((device, quantization), "")


__all__ = ["ALIASES", "BNB_ARGS", "QUANTIZATIONS", "UNSUPPORTED", "normalize", "problem"]
