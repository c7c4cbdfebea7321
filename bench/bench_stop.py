"""Stop on a ~200M-parameter model: Stop → checkpoint complete on disk, Stop → every rank gone.

Drives the real ``gaudi-gui train`` from outside (SIGINT, as Ctrl-C), on a random Llama of ~201M
parameters (hidden 1024, 12 layers; ~2.4 GB checkpoint with its Adam state), with 1 and 2 processes.
The baseline is the Trainer's own time to write that checkpoint, measured in the same run by the
worker (``checkpoint_saved.seconds``): the ratio is what a Stop costs beyond the save itself (the
wait for the current step to end, the ranks agreeing, the processes exiting). Repeats alternate 1
and 2 processes. A killed run, or a run without a complete checkpoint, fails the bench.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gaudi_gui.core.jobconfig import JobConfig  # noqa: E402
from gaudi_gui.core.runstore import Run, checkpoint_complete  # noqa: E402

_MODEL = """
import sys
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
from gaudi_gui.workers.demo import resolve_model
from transformers import AutoTokenizer
out, hidden, layers = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tok = AutoTokenizer.from_pretrained(resolve_model("builtin:demo"))
config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 4,
                     num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=16,
                     max_position_embeddings=256, tie_word_embeddings=False,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id)
model = LlamaForCausalLM(config)
model.save_pretrained(out)
tok.save_pretrained(out)
print(sum(p.numel() for p in model.parameters()))
"""


def _build_model(folder: Path, hidden: int, layers: int) -> int:
    done = subprocess.run([sys.executable, "-c", _MODEL, str(folder), str(hidden), str(layers)],
                          capture_output=True, text=True, check=True, timeout=900, cwd=ROOT)
    return int(done.stdout.strip().splitlines()[-1])


def _one(work: Path, model: Path, nproc: int, index: int) -> dict[str, float]:
    out = work / f"out-{nproc}-{index}"
    job = JobConfig(model=str(model), training_args={
        "output_dir": str(out), "max_steps": 100000, "per_device_train_batch_size": 1,
        "logging_steps": 1, "save_steps": 100000})
    job.dataset.max_length = 32
    job.launch.num_processes = nproc
    config = work / f"job-{nproc}-{index}.json"
    job.save(config)
    runs = work / f"runs-{nproc}-{index}"
    cli = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "train", "--config", str(config),
                            "--runs-dir", str(runs), "--device", "cpu", "--grace", "600"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 1200
        run = None
        while time.monotonic() < deadline:
            folders = list(runs.iterdir()) if runs.is_dir() else []
            if folders:
                run = Run(folders[0])
                if sum(1 for e in run.events() if e["type"] == "metrics") >= 2:
                    break
            time.sleep(0.2)
        else:
            raise RuntimeError("the run never reached two steps")
        assert run is not None
        pids = [r["pid"] for r in run.ranks()]
        t0 = time.monotonic()
        cli.send_signal(signal.SIGINT)
        ckpt_at = gone_at = 0.0
        while time.monotonic() - t0 < 900:
            now = time.monotonic()
            if not ckpt_at:
                saved = [e for e in run.events() if e["type"] == "checkpoint_saved"]
                if saved and checkpoint_complete(saved[-1]["path"]):
                    ckpt_at = now
            alive = [p for p in pids if _alive(p)]
            if not alive and not gone_at:
                gone_at = now
            if ckpt_at and gone_at:
                break
            time.sleep(0.05)
        _out, err = cli.communicate(timeout=600)
        status = run.status()
        if status.state != "stopped" or not ckpt_at:
            raise RuntimeError(f"{nproc} process(es): the run ended {status.state!r} "
                               f"({status.summary}); {err[-800:]}")
        save_s = next(e["seconds"] for e in reversed(run.events()) if e["type"] == "checkpoint_saved")
        return {"to_checkpoint": ckpt_at - t0, "to_gone": gone_at - t0, "save": float(save_s)}
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def run(quick: bool = False) -> list[dict[str, Any]]:
    hidden, layers = (512, 8) if quick else (1024, 12)
    repeats = 1 if quick else 2
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gaudi-gui-bench-stop-") as tmp:
        work = Path(tmp)
        os.environ["GAUDI_GUI_HOME"] = str(work / "home")
        params = _build_model(work / "model", hidden, layers)
        samples: dict[int, list[dict[str, float]]] = {1: [], 2: []}
        for index in range(repeats):
            for nproc in (1, 2):  # interleaved: 1, 2, 1, 2 ...
                samples[nproc].append(_one(work, work / "model", nproc, index))
        for nproc, got in samples.items():
            for key, label in (("to_checkpoint", "checkpoint on disk"), ("to_gone", "all processes gone")):
                values = [g[key] for g in got]
                ratios = [g[key] / g["save"] for g in got]
                rows.append({
                    "name": f"stop → {label}, {params / 1e6:.0f}M params, {nproc} proc",
                    "value": statistics.median(values), "unit": "s",
                    "baseline": statistics.median(g["save"] for g in got),
                    "ratio": statistics.median(ratios), "spread": (min(ratios), max(ratios)),
                    "repeats": len(got), "goal": "stopped with a complete checkpoint, never killed"})
    return rows


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(row)
