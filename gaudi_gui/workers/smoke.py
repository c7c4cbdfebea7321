"""The doctor's per-card smoke test: acquire the one visible card and run a tensor operation.

``python -m gaudi_gui.workers.smoke {hpu|cuda|cpu}``; the parent sets the visibility
(HABANA_VISIBLE_MODULES / CUDA_VISIBLE_DEVICES) so this child sees exactly one card. Prints one line
``SMOKE OK <what>`` and exits 0, or prints the error and exits 1. The only doctor module that imports
torch (the doctor process itself never does).
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    kind = argv[0] if argv else "cpu"
    try:
        import torch
        if kind == "hpu":
            import habana_frameworks.torch.core  # noqa: F401  (registers the hpu device)
            device = torch.device("hpu")
        elif kind == "cuda":
            device = torch.device("cuda:0")
        else:
            device = torch.device("cpu")
        a = torch.ones((64, 64), device=device)
        value = float((a @ a).sum().cpu())
        if value != 64.0 * 64 * 64:
            print(f"SMOKE FAIL wrong result {value}", flush=True)
            return 1
    except Exception as exc:  # any failure is the answer: print it for the parent
        print(f"SMOKE FAIL {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(f"SMOKE OK {device}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
