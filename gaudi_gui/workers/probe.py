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
import sys
import time
from typing import Any

from gaudi_gui.core import environment, protocol


def _version(module: str) -> tuple[str | None, str | None]:
    """(version, error) of an importable module."""
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # any import failure (missing, broken build, missing driver) is data
        return None, f"{type(exc).__name__}: {exc}".strip()[:300]
    return str(getattr(mod, "__version__", "unknown")), None


def collect() -> dict[str, Any]:
    started = time.perf_counter()
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "packages": {},
        "errors": {},
    }
    for name, module in environment.PACKAGES.items():
        # Libraries print banners on import; keep this child's stdout for the protocol only.
        with contextlib.redirect_stdout(io.StringIO()):
            version, error = _version(module)
        info["packages"][name] = version
        if error and name != "habana_frameworks":
            info["errors"][name] = error
    habana_version, habana_error = info["packages"].get("habana_frameworks"), None
    info["habana_frameworks"] = habana_version is not None
    hpu_available = False
    hpu_count = 0
    if info["packages"].get("transformers") and info["packages"].get("torch"):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                from transformers.utils import is_torch_hpu_available

                hpu_available = bool(is_torch_hpu_available())
                if hpu_available:
                    import torch

                    hpu_count = int(torch.hpu.device_count())  # type: ignore[attr-defined]
        except Exception as exc:
            habana_error = f"{type(exc).__name__}: {exc}"[:300]
    if habana_error:
        info["errors"]["hpu"] = habana_error
    cuda_count = 0
    if info["packages"].get("torch"):
        try:
            import torch

            cuda_count = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
        except Exception as exc:
            info["errors"]["cuda"] = f"{type(exc).__name__}: {exc}"[:300]
    info["is_torch_hpu_available"] = hpu_available
    info["hpu_count"] = hpu_count
    info["cuda_count"] = cuda_count
    info["device"] = environment.pick_device(hpu_count, cuda_count)
    info["env"] = {key: os.environ.get(key) for key in environment.ENV_KEYS}
    info["warnings"] = environment.warnings(info)
    info["probe_seconds"] = round(time.perf_counter() - started, 3)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gaudi_gui.workers.probe")
    parser.add_argument("--json", action="store_true", help="print plain JSON instead of an event")
    args = parser.parse_args(argv)
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(protocol.event("probe", info=info), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
