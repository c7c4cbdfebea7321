"""The real validation child (``python -m gaudi_gui.workers.schema --validate FILE``): the whole dict is
built in the child, valid combinations pass, and a failure is blamed on the field that causes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Its module fixture (real children) runs once: under xdist every test here goes to one worker.
pytestmark = pytest.mark.xdist_group("validate_child")

#: name -> the validate file's content. All run at once (one transformers import each).
CASES: dict[str, dict[str, Any]] = {
    "bf16_use_cpu": {"training_args": {"output_dir": "o", "bf16": True, "use_cpu": True}},
    "bf16_alone": {"training_args": {"output_dir": "o", "bf16": True, "use_cpu": False}},
    "best_matching": {"training_args": {"output_dir": "o", "load_best_model_at_end": True,
                                        "eval_strategy": "steps", "save_strategy": "steps",
                                        "eval_steps": 5, "save_steps": 5}},
    "best_no_eval": {"training_args": {"output_dir": "o", "load_best_model_at_end": True,
                                       "eval_strategy": "no", "save_strategy": "steps"}},
    "bad_values": {"training_args": {"output_dir": "o", "eval_strategy": "bogus", "learning_rate": "abc",
                                     "max_steps": -5, "num_train_epochs": 0, "bf16": True,
                                     "use_cpu": True, "warmup_ratio": 0.1}},
    "both_precisions": {"training_args": {"output_dir": "o", "fp16": True, "bf16": True, "use_cpu": True}},
    "ddp_one_process": {"training_args": {"output_dir": "o", "use_cpu": True, "ddp_backend": "gloo"}},
    "ddp_two_processes": {"training_args": {"output_dir": "o", "use_cpu": True, "ddp_backend": "gloo"},
                          "num_processes": 2},
    # The device environment reaches transformers: this variable makes it want DeepSpeed (absent here).
    "env": {"training_args": {"output_dir": "o", "max_steps": 3},
            "env": {"ACCELERATE_USE_DEEPSPEED": "true"}},
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, dict[str, Any]]]:
    folder = tmp_path_factory.mktemp("validate")
    procs = {}
    for name, content in CASES.items():
        path = folder / f"{name}.json"
        path.write_text(json.dumps(content))
        procs[name] = subprocess.Popen([sys.executable, "-m", "gaudi_gui.workers.schema", "--validate",
                                        str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True)
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        assert lines, f"{name}: no JSON line; stderr: {stderr[-2000:]}"
        out[name] = (proc.returncode, json.loads(lines[-1]))
    return out


def blamed(result: tuple[int, dict[str, Any]]) -> dict[str, str]:
    code, data = result
    assert code == (0 if data["ok"] else 1)
    assert data["ok"] == (not data["errors"])
    return {e["field"]: e["message"] for e in data["errors"]}


def test_bf16_with_use_cpu_is_valid(results: dict) -> None:
    assert blamed(results["bf16_use_cpu"]) == {}
    problems = blamed(results["bf16_alone"])
    assert list(problems) == ["bf16"] and "use_cpu" in problems["bf16"]


def test_load_best_with_matching_strategies_is_valid(results: dict) -> None:
    assert blamed(results["best_matching"]) == {}


def test_load_best_without_eval_blames_load_best(results: dict) -> None:
    problems = blamed(results["best_no_eval"])
    assert list(problems) == ["load_best_model_at_end"]
    assert "strategy" in problems["load_best_model_at_end"]


def test_bad_values_are_blamed_on_their_fields(results: dict) -> None:
    problems = blamed(results["bad_values"])
    assert set(problems) == {"eval_strategy", "learning_rate", "max_steps", "num_train_epochs",
                             "warmup_ratio"}
    assert "bogus" in problems["eval_strategy"] and "abc" in problems["learning_rate"]
    assert "nothing to train" in problems["num_train_epochs"]


def test_an_invalid_pair_names_both_and_not_the_bystander(results: dict) -> None:
    assert set(blamed(results["both_precisions"])) == {"fp16", "bf16"}


def test_ddp_backend_needs_processes(results: dict) -> None:
    problems = blamed(results["ddp_one_process"])
    assert list(problems) == ["ddp_backend"] and "more than one process" in problems["ddp_backend"]
    assert blamed(results["ddp_two_processes"]) == {}


def test_device_env_is_applied_before_transformers(results: dict) -> None:
    problems = blamed(results["env"])
    assert list(problems) == [""] and "deepspeed" in problems[""].lower()


def test_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    res = subprocess.run([sys.executable, "-m", "gaudi_gui.workers.schema", "--validate", str(missing)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    data = json.loads(res.stdout)
    assert not data["ok"] and "cannot read" in data["errors"][0]["message"]
