"""Facts about the Python environment a worker will run in: what to probe and how to judge it.

The probe itself runs in a child (``gaudi_gui.workers.probe``); this module only holds the rules, so
the GUI, the command line and the tests judge a probe result the same way.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
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

#: Shown name -> distribution name, reported only when installed. Read from the package metadata,
#: never imported: importing deepspeed probes compilers and CUDA for seconds.
OPTIONAL_PACKAGES: dict[str, str] = {
    "deepspeed": "deepspeed",
    "optimum-habana": "optimum-habana",
}

#: Environment variables that change what a Gaudi job does.
ENV_KEYS = ("PT_ENABLE_INT64_SUPPORT", "PT_HPU_LAZY_MODE", "HABANA_VISIBLE_MODULES",
            "HABANA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "HF_HOME")

MIN_ACCELERATE = (1, 5, 0)


def parse_version(text: str | None) -> tuple[int, ...]:
    """The release numbers of a version as ``packaging`` reads it: '1.16.0+abc' -> (1, 16, 0),
    '1.5.0rc1' -> (1, 5, 0); () for no version or one that is not PEP 440."""
    from packaging.version import InvalidVersion, Version
    try:
        return tuple(Version((text or "").strip()).release)
    except InvalidVersion:
        return ()


_HLSMI_VERSION = re.compile(r"HL-SMI Version:\s*(\S+)")
_DRIVER_VERSION = re.compile(r"^\W*Driver Version:\s*(\S+)", re.MULTILINE)
_NIC_DRIVER_VERSION = re.compile(r"Nic Driver Version:\s*(\S+)")
_FW_IN_HLSMI = re.compile(r"-fw-([0-9][\w.\-]*)")
_FW_LINE = re.compile(r"^\s*Firmware[^:\n]*Version\s*:\s*(.+?)\s*\|?\s*$", re.MULTILINE | re.IGNORECASE)


def parse_hlsmi_versions(text: str) -> dict[str, str | None]:
    """Versions from ``hl-smi``'s table header (and ``hl-smi -q`` firmware lines).

    The header reads ``HL-SMI Version: hl-1.18.0-fw-53.1.1.1`` (the firmware version is the part after
    ``-fw-``) and ``Driver Version: 1.18.0-ee698fb``; newer releases add ``Nic Driver Version:``.
    """
    def first(pattern: re.Pattern[str], where: str) -> str | None:
        m = pattern.search(where)
        return m.group(1).strip(" |") if m else None

    hl_smi = first(_HLSMI_VERSION, text)
    firmware = first(_FW_IN_HLSMI, hl_smi or "") or first(_FW_LINE, text)
    return {"hl_smi_version": hl_smi, "driver_version": first(_DRIVER_VERSION, text),
            "nic_driver_version": first(_NIC_DRIVER_VERSION, text), "firmware_version": firmware}


_BUILT_FOR = re.compile(r"^(cuda|hip|rocm|xpu)\b[^=\n]*=\s*(?P<value>.+?)\s*$", re.M)


def cpu_only_install() -> bool:
    """Whether this Python can only ever run on the cpu, read from what is installed without importing
    torch: no ``habana_frameworks`` to be found, and a torch built for no accelerator (its
    ``torch/version.py`` names no CUDA, HIP/ROCm or XPU). Then "auto" is the cpu by the same rule as
    the probe (:func:`pick_device` of 0 Gaudi and 0 CUDA cards) and no probe child is needed: it
    imports torch and transformers, seconds at every start. Any doubt (torch missing, its version file
    unreadable, an accelerator build) is False: the probe child decides."""
    try:
        if importlib.util.find_spec("habana_frameworks") is not None:
            return False
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except (OSError, StopIteration, UnicodeDecodeError):
        return False
    values = {m.group(1): m.group("value") for m in _BUILT_FOR.finditer(text)}
    return set(values) >= {"cuda", "hip"} and all(v == "None" for v in values.values())


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
    lines = [f"gaudi-gui {info.get('gaudi_gui_version', '?')} environment ({info.get('platform', '?')})",
             f"python            {info.get('python')}  ({info.get('executable')})"]
    for name, version in info.get("packages", {}).items():
        lines.append(f"{name:<18}{version or 'not installed'}")
    for name, version in info.get("optional_packages", {}).items():
        if version:
            lines.append(f"{name:<18}{version}")
    gaudi = info.get("gaudi", {})
    lines += [
        f"{'gaudi driver':<18}{gaudi.get('driver_version') or 'unknown'}",
        f"{'gaudi firmware':<18}{gaudi.get('firmware_version') or 'unknown'}",
        f"{'hl-smi':<18}{gaudi.get('hl_smi_version') or gaudi.get('error') or 'unknown'}",
    ]
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
