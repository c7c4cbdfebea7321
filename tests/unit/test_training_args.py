from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gaudi_gui.core import training_args as ta

SCHEMA = ta.Schema.from_dict({"transformers_version": "9.9", "fields": [
    {"name": "output_dir", "kind": "str", "default": None, "help": "where", "optional": True},
    {"name": "learning_rate", "kind": "float", "default": 5e-5, "help": "The initial learning rate"},
    {"name": "max_steps", "kind": "int", "default": -1, "help": "steps"},
    {"name": "bf16", "kind": "bool", "default": False, "help": "bf16"},
    {"name": "lr_scheduler_type", "kind": "enum", "default": "linear", "choices": ["linear", "cosine"]},
    {"name": "report_to", "kind": "str", "default": "none"},
]})


def test_parse_and_check_by_kind() -> None:
    f = SCHEMA.fields
    assert f["learning_rate"].parse("1e-3") == 1e-3
    assert f["max_steps"].parse("20") == 20
    assert f["bf16"].parse("true") is True
    with pytest.raises(ValueError, match="whole number"):
        f["max_steps"].parse("2.5")
    with pytest.raises(ValueError, match="one of"):
        f["lr_scheduler_type"].parse("bogus")
    assert f["learning_rate"].check("abc") is not None
    assert f["max_steps"].check(True) is not None
    assert f["learning_rate"].check(1) is None
    assert f["bf16"].format(True) == "true"


def test_common_search_non_default_and_removed() -> None:
    assert [s.name for s in SCHEMA.common()][:2] == ["output_dir", "max_steps"]
    assert [s.name for s in SCHEMA.search("learning rate")] == ["learning_rate"]
    assert SCHEMA.non_default({"output_dir": "o", "learning_rate": 5e-5, "max_steps": 3}) == \
        {"output_dir": "o", "max_steps": 3}
    problems = dict(SCHEMA.check({"warmup_ratio": 0.1, "max_steps": "x"}))
    assert "warmup_steps" in problems["warmup_ratio"] and "max_steps" in problems


def test_device_hints() -> None:
    assert [f for f, _ in ta.hints("cpu", {"bf16": True})] == ["bf16"]
    assert ta.hints("cpu", {"bf16": True, "use_cpu": True}) == []
    assert [f for f, _ in ta.hints("cpu", {"fp16": True})] == ["fp16"]
    assert [f for f, _ in ta.hints("hpu", {"ddp_backend": "nccl"}, num_processes=8)] == ["ddp_backend"]
    assert "ratio" in ta.hints("cpu", {"warmup_steps": 0.1})[0][1]


def test_cache_round_trip() -> None:
    assert ta.load_cached("9.9") is None
    ta.save_cached(SCHEMA)
    loaded = ta.load_cached("9.9")
    assert loaded is not None and loaded.fields == SCHEMA.fields
    assert ta.latest_cached() is not None


def test_real_schema_child_and_validation(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "gaudi_gui.workers.schema"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    schema = ta.Schema.from_dict(json.loads(out))
    assert len(schema.fields) > 100
    assert schema.fields["lr_scheduler_type"].kind == "enum"
    assert "cosine" in schema.fields["lr_scheduler_type"].choices
    assert schema.fields["bf16"].kind == "bool" and schema.fields["max_steps"].default == -1
    for removed in ta.REMOVED:
        assert removed not in schema.fields
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"training_args": {"eval_strategy": "bogus", "warmup_ratio": 0.1,
                                                 "max_steps": 5}}))
    res = subprocess.run([sys.executable, "-m", "gaudi_gui.workers.schema", "--validate", str(job)],
                         capture_output=True, text=True, timeout=120)
    data = json.loads(res.stdout)
    assert res.returncode == 1 and not data["ok"]
    assert {e["field"] for e in data["errors"]} == {"eval_strategy", "warmup_ratio"}
