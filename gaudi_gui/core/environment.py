"""Facts about the Python environment a worker will run in: what to probe and how to judge it.

The probe itself runs in a child (``gaudi_gui.workers.probe``); this module only holds the rules, so
the GUI, the command line and the tests judge a probe result the same way.
"""

from __future__ import annotations

from typing import Any

#: Shown name -> importable module.
PACKAGES: dict[str, str] = {
    "torch": "torch",
    "habana_frameworks": "habana_frameworks.torch",
    "transformers": "transformers",
    "accelerate": "accelerate",
    "peft": "peft",
    "bitsandbytes": "bitsandbytes",
    "datasets": "datasets",
    "tokenizers": "tokenizers",
    "PySide6": "PySide6",
}

#: Environment variables that change what a Gaudi job does.
ENV_KEYS = ("PT_ENABLE_INT64_SUPPORT", "PT_HPU_LAZY_MODE", "HABANA_VISIBLE_MODULES",
            "HABANA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "HF_HOME")

MIN_ACCELERATE = (1, 5, 0)


def parse_version(text: str | None) -> tuple[int, ...]:
    """'1.16.0+abc' -> (1, 16, 0); unparsable parts stop the tuple."""
    out: list[int] = []
    for part in (text or "").split("+")[0].split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if len(digits) < len(part):
            break  # '0rc1': a pre-release tag ends the numeric part
    return tuple(out)


def pick_device(hpu_count: int, cuda_count: int) -> str:
    """hpu > cuda > cpu."""
    if hpu_count > 0:
        return "hpu"
    if cuda_count > 0:
        return "cuda"
    return "cpu"


def warnings(info: dict[str, Any]) -> list[str]:
    """Problems a user should see in the Environment view."""
    out: list[str] = []
    packages = info.get("packages", {})
    accelerate = packages.get("accelerate")
    if accelerate and parse_version(accelerate) < MIN_ACCELERATE:
        out.append(f"accelerate {accelerate} is older than 1.5.0: transformers' is_torch_hpu_available() "
                   "refuses it, so Gaudi cards are not used even when present. Upgrade accelerate.")
    for name in ("torch", "transformers", "accelerate"):
        if not packages.get(name):
            out.append(f"{name} is not importable: model runner and training cannot start "
                       f"({info.get('errors', {}).get(name, 'not installed')}).")
    env = info.get("env", {})
    if packages.get("habana_frameworks"):
        if env.get("PT_ENABLE_INT64_SUPPORT") != "1":
            out.append("PT_ENABLE_INT64_SUPPORT is not 1 here; gaudi-gui sets it for every job it starts.")
        if not info.get("is_torch_hpu_available"):
            out.append("habana_frameworks is installed but no HPU is usable (driver, card or "
                       "HABANA_VISIBLE_MODULES?).")
    return out


def as_text(info: dict[str, Any]) -> str:
    """A plain-text report for bug reports (the Environment view's Copy button, ``gaudi-gui env``)."""
    lines = [f"gaudi-gui environment ({info.get('platform', '?')})",
             f"python            {info.get('python')}  ({info.get('executable')})"]
    for name, version in info.get("packages", {}).items():
        lines.append(f"{name:<18}{version or 'not installed'}")
    lines += [
        f"{'hpu available':<18}{info.get('is_torch_hpu_available')}",
        f"{'hpu count':<18}{info.get('hpu_count')}",
        f"{'cuda count':<18}{info.get('cuda_count')}",
        f"{'device used':<18}{info.get('device')}",
    ]
    for key, value in info.get("env", {}).items():
        lines.append(f"{key:<26}{value if value is not None else '(unset)'}")
    for warning in info.get("warnings", []):
        lines.append(f"WARNING: {warning}")
    for name, error in info.get("errors", {}).items():
        lines.append(f"error[{name}]: {error}")
    return "\n".join(lines)
