from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gaudi_gui.core import training_args as ta

SCHEMA = ta.Schema.from_dict({"transformers_version": "9.9", "format": 3, "fields": [
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


def test_common_search_and_removed() -> None:
    assert [s.name for s in SCHEMA.common()][:2] == ["output_dir", "max_steps"]
    assert [s.name for s in SCHEMA.search("learning rate")] == ["learning_rate"]
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
    # Each preference objective: TrainingArguments' fields and its config class's own, not SFT's.
    dpo = schema.for_objective("dpo")
    assert dpo.config_class == "DPOConfig" and dpo.fields["beta"].default == 0.1
    assert "packing" not in dpo.fields and "learning_rate" in dpo.fields and "packing" in schema.fields
    assert schema.for_objective("orpo").config_class == "ORPOConfig"
    kto = dpo.for_objective("kto")
    assert kto.config_class == "KTOConfig" and "desirable_weight" in kto.fields
    assert [f for f, _m in kto.check({"beta": "high", "packing": True})] == ["beta", "packing"]
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"training_args": {"eval_strategy": "bogus", "warmup_ratio": 0.1,
                                                 "max_steps": 5}}))
    res = subprocess.run([sys.executable, "-m", "gaudi_gui.workers.schema", "--validate", str(job)],
                         capture_output=True, text=True, timeout=120)
    data = json.loads(res.stdout)
    assert res.returncode == 1 and not data["ok"]
    assert {e["field"] for e in data["errors"]} == {"eval_strategy", "warmup_ratio"}


MIXED = ta.FieldSpec.from_dict({"name": "lr_scheduler_kwargs", "kind": "str", "default": None,
                                "optional": True, "accepts": ["dict", "str"]})
TOKENS = ta.FieldSpec.from_dict({"name": "include_num_input_tokens_seen", "kind": "str", "default": "no",
                                 "accepts": ["bool", "str"]})


@pytest.mark.parametrize("spec, value", [
    (MIXED, {"power": 2}), (MIXED, '{"power": 2}'), (MIXED, "plain"), (MIXED, " padded"), (MIXED, ""),
    (TOKENS, True), (TOKENS, False), (TOKENS, "true"), (TOKENS, "all"),
    (SCHEMA.fields["learning_rate"], 3), (SCHEMA.fields["learning_rate"], 1e-7),
    (SCHEMA.fields["report_to"], ""),
])
def test_format_parse_are_inverse(spec: ta.FieldSpec, value: object) -> None:
    again = spec.parse(spec.format(value))
    assert again == value and type(again) is type(value)


def test_accepts_types_and_old_cached_schemas() -> None:
    assert MIXED.check({"power": 2}) is None and MIXED.check("x") is None
    assert MIXED.check(3) is not None
    assert TOKENS.check(True) is None
    old = ta.FieldSpec.from_dict({"name": "x", "kind": "str"})  # cached before "accepts" existed
    assert old.accepts is None and old.check(3) is None and not old.mixed
    assert ta.FieldSpec.from_dict(MIXED.to_dict()) == MIXED


def test_ranges_and_nothing_to_train() -> None:
    schema = ta.Schema.from_dict({"transformers_version": "9.9", "fields": [
        {"name": "max_steps", "kind": "int", "default": -1},
        {"name": "num_train_epochs", "kind": "float", "default": 3.0},
        {"name": "save_steps", "kind": "float", "default": 500},
        {"name": "logging_steps", "kind": "float", "default": 500},
        {"name": "eval_steps", "kind": "float", "default": None, "optional": True},
    ], })
    assert schema.check({}) == []
    assert schema.check({"max_steps": -1, "save_steps": 0, "logging_steps": 0, "eval_steps": 0}) == []
    flagged = dict(schema.check({"max_steps": -5, "save_steps": -1, "logging_steps": -0.5,
                                 "eval_steps": -2}))
    assert set(flagged) == {"max_steps", "save_steps", "logging_steps", "eval_steps"}
    assert "-5" in flagged["max_steps"]
    refused = dict(schema.check({"max_steps": -5, "num_train_epochs": 0}))
    assert set(refused) == {"max_steps", "num_train_epochs"}
    assert "nothing to train" in refused["num_train_epochs"]
    assert [f for f, _ in schema.check({"num_train_epochs": 0})] == ["num_train_epochs"]
    assert schema.check({"num_train_epochs": 0, "max_steps": 10}) == []
    # Combinations that TrainingArguments accepts are left to the child: never refused here.
    assert SCHEMA.check({"bf16": True, "output_dir": "o"}) == []
