"""FP8 calibration (issue 39): ``gaudi-gui calibrate`` against the same INC measurement written by hand.

The app's side is the command as a user runs it (``gaudi-gui calibrate --model M --dataset D --rows N
--device cpu --no-agent``): its run folder, its supervisor and meter, the worker that loads the model in
bf16, prepares it with INC's MEASURE config, runs the rows and writes the measurements, the manifest. The
baseline is the script a user would write with INC alone (the same model, rows, ``max_length`` and
``FP8Config``), run with the same interpreter. Both are timed from process start to exit, interleaved
(bench/harness.py); the ratio is the median of the pair ratios. The model is the 86M Llama of the runner
bench (12 layers, hidden 768, on the demo tokenizer), so a row costs what a small real model's does.

A last row is what FP8 costs in quality: the demo model's perplexity on the demo rows in bf16 and
quantized with a calibration of it (Q/DQ on this CPU: it checks the flow, not speed), as ``gaudi-gui eval
--fp8 RUN --metrics perplexity`` reports it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_training import _big_model, _ensure_model
from bench.harness import interleaved, row
from gaudi_gui.core import fp8, paths
from gaudi_gui.core.evaluation import METRIC_KEYS

MAX_LENGTH = 512

#: INC's measurement, written by hand (what Intel's examples do): load in bf16, prepare with a MEASURE
#: FP8Config, run the rows, finalize.
BY_HAND = r'''
import json, sys
import torch
from neural_compressor.torch.quantization import FP8Config, finalize_calibration, prepare
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir, data, rows, dump = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
prompts = [json.loads(line)["text"] for line in open(data) if line.strip()][:rows]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
# On a CPU INC 3.10 takes FP8 only as Q/DQ and measures on the HPU unless told (as Intel documents).
model = prepare(model, FP8Config(mode="MEASURE", observer="maxabs", dump_stats_path=dump,
                                 allowlist={"types": [], "names": []},
                                 blocklist={"types": [], "names": ["lm_head"]}, use_qdq=True,
                                 measure_on_hpu=False))
with torch.no_grad():
    for prompt in prompts:
        model(**tokenizer(prompt, return_tensors="pt", truncation=True, max_length=MAX_LENGTH))
finalize_calibration(model)
'''.replace("MAX_LENGTH", str(MAX_LENGTH))


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "GAUDI_GUI_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return env


def _calibrate(model: str, data: Path, rows: int, home: Path) -> tuple[float, Path]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "calibrate", "--model", model, "--dataset",
                           str(data), "--rows", str(rows), "--max-length", str(MAX_LENGTH), "--device", "cpu",
                           "--no-agent"], capture_output=True, text=True, env=_env(home), timeout=1800)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"calibrate failed: {done.stderr[-2000:]}")
    (folder,) = [p for p in (home / "data" / "runs").iterdir() if (p / fp8.MANIFEST_NAME).is_file()]
    return took, folder


def _measure_config_matches(folder: Path) -> None:
    """The app measured with the config the script uses (observer, blocklist), so the pair is fair."""
    config = json.loads((folder / fp8.QUANT_CONFIG_NAME).read_text())
    assert config["mode"] == "MEASURE" and config["observer"] == "maxabs", config
    assert config.get("blocklist") == {"types": [], "names": ["lm_head"]}, config


def run(quick: bool = False) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="gaudi-gui-bench-fp8-"))
    _ensure_model(tmp)
    demo = str(os.environ.get("GAUDI_GUI_DEMO_MODEL_DIR") or paths.demo_model_dir())
    big, params = _big_model(tmp)
    data = paths.demo_dataset_path("sft")
    rows = 48  # the demo rows, each once
    script = tmp / "measure_by_hand.py"
    script.write_text(BY_HAND)
    counter = [0]
    kept: list[Path] = []

    def app_once() -> float:
        counter[0] += 1
        took, folder = _calibrate(big, data, rows, tmp / f"home-{counter[0]}")
        _measure_config_matches(folder)
        kept.append(folder)
        return took

    def by_hand_once() -> float:
        counter[0] += 1
        dump = tmp / f"hand-{counter[0]}" / "inc"
        dump.parent.mkdir(parents=True)
        started = time.perf_counter()
        subprocess.run([sys.executable, str(script), big, str(data), str(rows), str(dump)], check=True,
                       capture_output=True, timeout=1800, env=_env(tmp / "hand-home"))
        took = time.perf_counter() - started
        assert sorted(p.name for p in dump.parent.glob("inc_hooks_*")), "the script wrote no measurements"
        return took

    result = interleaved(app_once, by_hand_once, 2 if quick else 5, warmup=0 if quick else 1)
    print("[fp8] measure s per pair (app, by hand): " + ", ".join(
        f"({s['app']:.1f}, {s['base']:.1f})" for s in result["samples"]), flush=True)
    out = [row(f"fp8: calibrate {params / 1e6:.0f}M model, {rows} rows (s, process start to exit)", result,
               unit="s", goal="ratio <= 1.05")]
    manifest = fp8.read_manifest(kept[-1])
    print(f"[fp8] the 86M calibration's folder: {kept[-1]}", flush=True)
    for name in sorted(p.relative_to(kept[-1]).as_posix() for p in kept[-1].rglob("*") if p.is_file()):
        print(f"[fp8]   {name}  {(kept[-1] / name).stat().st_size} B", flush=True)
    print("[fp8] manifest: " + json.dumps({k: manifest.get(k) for k in (
        "model", "device", "generation", "inc_version", "torch_version", "rows", "tokens", "observer",
        "scale_method", "blocklist", "ranks", "measurements", "duration_s", "energy")}), flush=True)

    # What FP8 costs in quality: the demo model, calibrated on the demo rows, bf16 vs FP8 (Q/DQ).
    # The demo rows as references ("Q: … A:" the prompt, the answer the reference).
    home = tmp / "ppl-home"
    refs = tmp / "demo-references.jsonl"
    lines = [json.loads(line)["text"] for line in data.read_text().splitlines() if line.strip()]
    refs.write_text("".join(json.dumps({"prompt": t.split(" A: ", 1)[0] + " A:",
                                        "reference": t.split(" A: ", 1)[1]}) + "\n"
                            for t in lines if " A: " in t))
    _took, folder = _calibrate(demo, data, rows, home)
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "eval", "--model", demo, "--fp8", str(folder),
                           "--data", str(refs), "--metrics", "perplexity", "--max-new-tokens", "8", "--json",
                           "--no-agent"], capture_output=True, text=True, env=_env(home), timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"eval --fp8 failed: {done.stderr[-2000:]}")
    record = json.loads(done.stdout)
    key = METRIC_KEYS["perplexity"]
    quantized = ((record.get("tuned") or {}).get("metrics") or {}).get(key)
    bf16 = ((record.get("base") or {}).get("metrics") or {}).get(key)
    print(f"[fp8] demo perplexity: bf16 {bf16}, FP8 {quantized}: {record.get('fp8_cost')}", flush=True)
    out.append({"name": "fp8: demo perplexity, FP8 (Q/DQ) vs bf16", "value": quantized, "unit": "ppl",
                "baseline": bf16, "ratio": round(quantized / bf16, 4) if bf16 and quantized else None,
                "spread": None, "repeats": 1, "goal": "rise <= 3 %"})
    return out
