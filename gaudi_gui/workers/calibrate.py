"""``python -m gaudi_gui.workers.calibrate``: the MEASURE step of FP8 with Intel Neural Compressor.

Reads its job (JSON, one line on stdin, or the file ``--job FILE``: model folder, prompts, device,
max_length, the MEASURE QUANT_CONFIG as ``core.fp8.measure_config`` built it) and prints protocol events:
``phase``, ``progress`` (rows done of rows), ``calibrate_device`` (torch's version and the device INC
saw), ``done`` or ``error``. INC writes its measurement files itself, at the config's ``dump_stats_path``
(``<path>_hooks_maxabs.json`` / ``.npz`` / ``_mod_list.json``).

Several ranks: started by torch's launcher (``torch.distributed.run``: RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR/PORT in the environment), each rank joins the process group (gloo on the CPU, HCCL on Gaudi,
NCCL on CUDA) before INC prepares the model, so INC names its files with the rank and world size
(``<path>_hooks_maxabs_<rank>_<world>.json`` …, ``core.fp8.rank_suffix``). Each rank loads the whole
model and measures its share of the prompts (every world-th, from its rank): no tensor parallelism
here. Every event carries ``rank``.

``load_quantized`` is the QUANTIZE step, for a worker that runs the model (eval's): the model loaded
and converted with the measurements of a calibrate run. Imports torch and INC: a worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gaudi_gui.core import fp8, protocol

#: This process's rank and the world size (torch's launcher says them; 0 and 1 alone).
RANK = 0
WORLD = 1


def _emit(event_type: str, **fields: Any) -> None:
    if WORLD > 1:
        fields = {"rank": RANK, **fields}
    protocol.write_line(sys.stdout, protocol.encode({"type": event_type, **fields}))


def _ranks_from_env() -> tuple[int, int, int]:
    """(rank, local rank, world size) as torch's launcher set them; (0, 0, 1) outside it."""
    try:
        world = int(os.environ.get("WORLD_SIZE") or 1)
        rank = int(os.environ.get("RANK") or 0)
        local = int(os.environ.get("LOCAL_RANK") or rank)
    except ValueError:
        return 0, 0, 1
    return rank, local, max(1, world)


def _join(device: str) -> Any:
    """The process group of the ranks (env://: the launcher's MASTER_ADDR/PORT), None for one rank."""
    if WORLD <= 1:
        return None
    import datetime

    import torch.distributed as dist

    backend = {"cpu": "gloo", "cuda": "nccl", "hpu": "hccl"}[device.split(":", 1)[0]]
    if backend == "hccl":
        import habana_frameworks.torch.distributed.hccl  # noqa: F401  (registers the backend)
    dist.init_process_group(backend, rank=RANK, world_size=WORLD, timeout=datetime.timedelta(minutes=30))
    return dist


def _die_with_parent() -> None:
    """The command's death ends this worker (Linux): it never holds a card alone."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


def _inc() -> Any:
    try:
        from neural_compressor.torch import quantization
    except ImportError as exc:
        raise fp8.Fp8Error(f"Intel Neural Compressor is not installed ({exc}): {fp8.INC_INSTALL}") from None
    return quantization


def _device(wanted: str) -> str:
    from gaudi_gui.workers import device as device_mod
    found = device_mod.resolve(wanted)
    if found == "hpu":
        import habana_frameworks.torch.core  # noqa: F401  (registers the hpu device)
    return found


def _config(inc: Any, config: dict[str, Any]) -> Any:
    """INC's FP8Config from a QUANT_CONFIG dict (the JSON keys are its constructor's)."""
    return inc.FP8Config(**{k: v for k, v in config.items() if not k.startswith("_")})


def _load(model: str, device: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    # bf16: INC's high-precision type (hp_dtype); a float32 model's attention would meet bf16 values.
    loaded: Any = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16)
    loaded.eval()
    if device != "cpu":
        loaded.to(device)
    return loaded, tokenizer


def measure(job: dict[str, Any]) -> dict[str, Any]:
    """Run the job's prompts (this rank's share) through the prepared model and write INC's
    measurements."""
    import torch

    inc = _inc()
    device = _device(str(job.get("device") or "cpu"))
    if device == "cuda" and WORLD > 1:
        _rank, local, _world = _ranks_from_env()
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    dist = _join(device)  # before INC reads the rank and the world size
    _emit("calibrate_device", device=device, torch=torch.__version__)
    _emit("phase", phase="loading", message=f"loading {job['model']} on {device}")
    model, tokenizer = _load(str(job["model"]), device)
    config = dict(job["config"])
    Path(str(config["dump_stats_path"])).parent.mkdir(parents=True, exist_ok=True)
    model = inc.prepare(model, _config(inc, config))
    if dist is not None:
        # INC's MEASURE prepare moves every file of the dump folder under its prefix to a backup_ folder
        # (quant_config._validate_dump_path): a slow rank's prepare would move a fast rank's finished files.
        dist.barrier()
    prompts = [str(p) for p in job["prompts"]][RANK::WORLD]
    max_length = int(job.get("max_length") or 512)
    share = f" (rank {RANK} of {WORLD})" if WORLD > 1 else ""
    _emit("phase", phase="measuring",
          message=f"measuring {len(prompts)} rows{share} ({config.get('observer')})")
    tokens = 0
    with torch.no_grad():
        for i, prompt in enumerate(prompts, 1):
            ids = tokenizer(prompt, return_tensors="pt", truncation=True, max_length=max_length)
            ids = {k: v.to(device) for k, v in ids.items()}
            tokens += int(ids["input_ids"].numel())
            model(**ids)
            if device == "hpu":
                torch.hpu.synchronize()  # type: ignore[attr-defined]
            _emit("progress", done=i, total=len(prompts))
    _emit("phase", phase="writing", message="writing the measurements")
    inc.finalize_calibration(model)
    if dist is not None:
        dist.barrier()  # every rank's files are written before any rank says it is done
        dist.destroy_process_group()
    return {"device": device, "torch": torch.__version__, "tokens": tokens, "rows": len(prompts)}


def load_quantized(model: str, folder: str | Path, device: str = "cpu") -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, the QUANTIZE config used): ``model`` quantized to FP8 with the measurements
    of the calibrate run at ``folder`` (Q/DQ on a CPU). The measurements are copied to a private folder
    first (removed once the model is converted): INC writes its scale files beside them, and the run
    folder stays as it was calibrated."""
    inc = _inc()
    device = _device(device)
    manifest = fp8.read_manifest(folder)
    refused = fp8.eval_ranks_refusal(str(folder), manifest)
    if refused:  # one process reads the files without a rank suffix, which N ranks did not write
        raise fp8.Fp8Error(refused)
    scratch = Path(tempfile.mkdtemp(prefix="fp8-"))
    shutil.copytree(Path(folder) / fp8.MEASURE_DIR, scratch / fp8.MEASURE_DIR)
    method = str(manifest.get("scale_method") or fp8.default_scale_method(device))
    config = fp8.quantize_config(str(scratch / fp8.MEASURE_DIR / fp8.DUMP_PREFIX), device=device,
                                 scale_method=method,
                                 blocklist=[str(b) for b in manifest.get("blocklist") or []])
    try:
        loaded, tokenizer = _load(model, device)
        loaded = inc.convert(loaded, _config(inc, config))
    finally:
        # The scales are in the converted model now: the private copy goes.
        shutil.rmtree(scratch, ignore_errors=True)
    return loaded, tokenizer, config


def main(argv: list[str] | None = None) -> int:
    global RANK, WORLD
    _die_with_parent()
    argv = sys.argv[1:] if argv is None else argv
    RANK, _local, WORLD = _ranks_from_env()
    try:
        if argv[:1] == ["--job"] and len(argv) == 2:
            job = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
        else:
            job = json.loads(sys.stdin.readline())
        if not isinstance(job, dict) or not job.get("model") or not job.get("prompts") \
                or not isinstance(job.get("config"), dict):
            raise ValueError("model, prompts and config are needed")
    except (OSError, ValueError, TypeError) as exc:
        _emit("error", kind="bad_input", message=f"bad job: {exc}")
        return 2
    started = time.time()
    try:
        said = measure(job)
    except fp8.Fp8Error as exc:
        _emit("error", kind="bad_input", message=str(exc))
        return 2
    except Exception as exc:  # said as one event: the command prints it as one line
        _emit("error", kind="failed", message=f"{type(exc).__name__}: {exc}"[:800])
        return 1
    _emit("done", duration_s=round(time.time() - started, 3), **said)
    return 0


if __name__ == "__main__":
    sys.exit(main())
