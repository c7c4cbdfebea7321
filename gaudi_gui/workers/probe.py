"""``python -m gaudi_gui.workers.probe``: what this Python can do, as JSON.

Runs in a child process because it imports torch (seconds) and, on Gaudi, lets transformers patch
torch, which must never happen in the Qt process. Every import is guarded: a missing or broken package
is reported, never a crash. Prints one protocol event ``probe`` (or, with ``--json``, plain JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata
from typing import Any

from gaudi_gui import __version__
from gaudi_gui.core import environment, protocol
from gaudi_gui.workers.loader import hide_bitsandbytes

#: hl-smi answers in well under a second; a wedged driver must not hang the probe.
HLSMI_TIMEOUT_S = 10.0


def _version(module: str) -> tuple[str | None, str | None]:
    """(version, error) of an importable module."""
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # any import failure (missing, broken build, missing driver) is data
        return None, f"{type(exc).__name__}: {exc}".strip()[:300]
    return str(getattr(mod, "__version__", "unknown")), None


def optional_version(dist: str) -> str | None:
    """An installed distribution's version from its metadata (no import), or None."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def optional_packages() -> dict[str, str | None]:
    return {name: optional_version(dist) for name, dist in environment.OPTIONAL_PACKAGES.items()}


def gaudi_versions() -> dict[str, Any]:
    """Driver, firmware and hl-smi versions from ``hl-smi``'s table (GAUDI_GUI_HL_SMI, then PATH)."""
    from gaudi_gui.core.hlsmi import hl_smi_program
    program, _chosen = hl_smi_program()
    resolved = shutil.which(program)
    empty: dict[str, Any] = {"driver_version": None, "firmware_version": None, "hl_smi_version": None,
                             "nic_driver_version": None}
    if resolved is None:
        return {**empty, "error": f"{program} not found"}
    try:
        proc = subprocess.run([resolved], capture_output=True, text=True, errors="replace",
                              timeout=HLSMI_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return {**empty, "error": f"{program} did not answer in {HLSMI_TIMEOUT_S:.0f} s"}
    except OSError as exc:
        return {**empty, "error": f"{program}: {exc}"}
    versions = environment.parse_hlsmi_versions(proc.stdout)
    if proc.returncode != 0 and not any(versions.values()):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return {**empty, "error": f"{program} exited {proc.returncode}: {tail[0][:200]}"}
    return {**versions, "error": None}


def collect() -> dict[str, Any]:
    started = time.perf_counter()
    info: dict[str, Any] = {
        "gaudi_gui_version": __version__,
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "packages": {},
        "errors": {},
    }
    # bitsandbytes is read from its metadata, never imported: 0.50 runs torch.compile at import (seconds)
    # and, on a CPU with AVX512-BF16 (a Gaudi server's Xeon), asks the Hub for a kernel. Hidden, peft
    # and transformers do not import it either (workers.loader.hide_bitsandbytes).
    hide_bitsandbytes()
    for name, module in environment.PACKAGES.items():
        if name == "bitsandbytes":
            info["packages"][name] = optional_version("bitsandbytes")
            continue
        # Libraries print banners on import; keep this child's stdout for the protocol only.
        with contextlib.redirect_stdout(io.StringIO()):
            version, error = _version(module)
        info["packages"][name] = version
        if error and name != "habana_frameworks":
            info["errors"][name] = error
    info["optional_packages"] = optional_packages()
    info["gaudi"] = gaudi_versions()
    habana_version, habana_error = info["packages"].get("habana_frameworks"), None
    info["habana_frameworks"] = habana_version is not None
    hpu_available, hpu_count, cuda_count, habana_error = False, 0, 0, ""
    if info["packages"].get("transformers") and info["packages"].get("torch"):
        from gaudi_gui.workers import device as device_mod
        hpu_available, hpu_count, cuda_count, habana_error = device_mod.counts()
    if habana_error:
        info["errors"]["hpu"] = habana_error
    info["is_torch_hpu_available"] = hpu_available
    info["hpu_count"] = hpu_count
    info["cuda_count"] = cuda_count
    info["device"] = environment.pick_device(hpu_count if hpu_available else 0, cuda_count)
    info["env"] = {key: os.environ.get(key) for key in environment.ENV_KEYS}
    info["warnings"] = environment.warnings(info)
    info["probe_seconds"] = round(time.perf_counter() - started, 3)
    return info


def device_only() -> dict[str, Any]:
    """What "auto" means here, and only that (``--device``): the full probe's rule, importing what it
    needs (torch, transformers' Gaudi check) and nothing more."""
    hide_bitsandbytes()
    from gaudi_gui.workers import device as device_mod
    with contextlib.redirect_stdout(io.StringIO()):
        hpu_available, hpu_count, cuda_count, error = device_mod.counts()
    return {"device": environment.pick_device(hpu_count if hpu_available else 0, cuda_count),
            "hpu_count": hpu_count, "cuda_count": cuda_count, "error": error or None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gaudi_gui.workers.probe")
    parser.add_argument("--json", action="store_true", help="print plain JSON instead of an event")
    parser.add_argument("--device", action="store_true",
                        help="print only the device 'auto' means here, as JSON")
    args = parser.parse_args(argv)
    if args.device:
        print(json.dumps(device_only()))
        return 0
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(protocol.event("probe", info=info), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
