"""The one decision of the "auto" device inside a child process: hpu > cuda > cpu, by the same rule
the environment probe reports (``core.environment.pick_device``), so the runner, Evaluate, Serve (which
asks the probe) and training (whose launcher the probe picks) agree.

"hpu" needs ``transformers.is_torch_hpu_available()`` (habana_frameworks importable, accelerate
>= 1.5, a card the bridge sees): a Gaudi software stack that is installed but unusable is the CPU here,
for every kind of job alike. Imports torch: workers only.
"""

from __future__ import annotations

import contextlib
import io

from gaudi_gui.core.environment import pick_device


def counts() -> tuple[bool, int, int, str]:
    """(is_torch_hpu_available, hpu cards, cuda cards, why hpu is unusable or "")."""
    hpu_available, hpu_count, cuda_count, error = False, 0, 0, ""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            from transformers.utils import is_torch_hpu_available

            hpu_available = bool(is_torch_hpu_available())
            if hpu_available:
                import torch

                hpu_count = int(torch.hpu.device_count())  # type: ignore[attr-defined]
    except Exception as exc:  # a broken habana install must not stop a CPU job
        error = f"{type(exc).__name__}: {exc}"[:300]
    with contextlib.suppress(Exception):
        import torch

        cuda_count = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    return hpu_available, hpu_count, cuda_count, error


def auto() -> str:
    """What "auto" means in this process."""
    hpu_available, hpu_count, cuda_count, _error = counts()
    return pick_device(hpu_count if hpu_available else 0, cuda_count)


class Unsupported(ValueError):
    """A device was asked for that this process cannot use (the message says why)."""


def resolve(wanted: str) -> str:
    """``wanted`` ("auto", "hpu", "cuda", "cpu") as this process will use it; Unsupported when a
    named device is not there."""
    if wanted == "auto":
        return auto()
    if wanted == "hpu":
        hpu_available, _n, _c, error = counts()
        if not hpu_available:
            raise Unsupported("device hpu was asked for but no Gaudi (habana_frameworks) is available in "
                              "this environment" + (f" ({error})" if error else ""))
    if wanted == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise Unsupported("device cuda was asked for but torch sees no CUDA GPU")
    return wanted


__all__ = ["Unsupported", "auto", "counts", "resolve"]
