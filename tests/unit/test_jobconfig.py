from __future__ import annotations

import json
from pathlib import Path

import pytest

from gaudi_gui.core.jobconfig import JobConfig, JobConfigError, resolve_format


def test_round_trip(tmp_path: Path) -> None:
    job = JobConfig(method="lora", training_args={"output_dir": "o", "max_steps": 3})
    job.lora.target_modules = ["q_proj"]
    job.launch.num_processes = 2
    path = tmp_path / "job.json"
    job.save(path)
    again = JobConfig.load(path)
    assert again == job
    assert '"version": 2' in path.read_text()


@pytest.mark.parametrize("text, needle", [
    ("{", "not valid JSON"),
    ("[]", "JSON object"),
    ('{"bogus": 1}', "unknown key"),
    ('{"launch": {"num_processes": "two"}}', "launch.num_processes"),
    ('{"version": 99}', "newer"),
    ('{"training_args": 3}', "training_args"),
])
def test_bad_files_give_clear_errors(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(JobConfigError, match=needle):
        JobConfig.load(path)
    with pytest.raises(JobConfigError, match="cannot read"):
        JobConfig.load(tmp_path / "missing.json")


def test_a_file_in_another_encoding_is_a_bad_job_file_naming_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_bytes('{"name": "café"}'.encode("latin-1"))
    with pytest.raises(JobConfigError, match=r"job.json is not UTF-8 \(byte 0xe9 at 13\)"):
        JobConfig.load(path)


def test_validate(tmp_path: Path) -> None:
    job = JobConfig(training_args={"output_dir": str(tmp_path)})
    assert job.validate() == []
    job.dataset.source = str(tmp_path / "nope.csv")
    job.method = "xx"
    job.launch.num_machines = 2
    fields = {f for f, _ in job.validate()}
    assert {"dataset.source", "method", "launch.main_process_ip"} <= fields
    # No output folder is the default now: each run gets its own (core/outputs.py).
    assert JobConfig().validate() == []
    bad = JobConfig(training_args={"output_dir": 3})
    assert {f for f, _ in bad.validate()} == {"training_args.output_dir"}


def test_format_by_extension(tmp_path: Path) -> None:
    assert resolve_format("a.jsonl") == "json"
    assert resolve_format("a.csv") == "csv"
    assert resolve_format("a.txt") == "text"
    assert resolve_format("builtin:demo") == "json"
    assert resolve_format("user/some-dataset") == "hub"
    assert resolve_format("x.jsonl", "text") == "text"


def test_dataset_columns(tmp_path: Path) -> None:
    from gaudi_gui.core.jobconfig import dataset_columns

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "a", "completion": "b"}\n\n{"messages": []}\n')
    assert dataset_columns(str(rows), "auto") == ["prompt", "completion", "messages"]
    array = tmp_path / "rows.json"
    array.write_text('[ {"body": "x"},\n {"body": "y", "id": 1} ]')
    assert dataset_columns(str(array), "auto") == ["body", "id"]
    nested = tmp_path / "nested.json"
    nested.write_text('{\n  "data": [{"text": "x"}]\n}')
    assert dataset_columns(str(nested), "auto") is None  # not rows: not guessed
    table = tmp_path / "t.csv"
    table.write_text("\ufefftext,label\nhi,1\n")
    assert dataset_columns(str(table), "auto") == ["text", "label"]
    assert dataset_columns(str(tmp_path / "t.txt"), "auto") == ["text"]
    assert dataset_columns("user/hub-dataset", "auto") is None
    assert dataset_columns(str(tmp_path / "missing.jsonl"), "auto") is None
    big = tmp_path / "big.jsonl"
    big.write_text('{"text": "' + "x" * 300_000 + '"}\n')  # first row longer than the probe
    assert dataset_columns(str(big), "auto") is None


def test_validate_text_column_against_the_file(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "a", "completion": "b"}\n')
    job = JobConfig(training_args={"output_dir": str(tmp_path)})
    job.dataset.source = str(rows)
    problems = dict(job.validate())
    assert "no column 'text'" in problems["dataset.text_column"]
    assert "prompt, completion" in problems["dataset.text_column"]
    job.dataset.text_column = "prompt"
    assert job.validate() == []
    job.dataset.source = "builtin:demo"
    job.dataset.text_column = "text"
    assert job.validate() == []
    job.dataset.text_column = "body"
    assert "dataset.text_column" in dict(job.validate())


def test_version_1_file_reads_as_text_job_and_version_2_keys(tmp_path: Path) -> None:
    v1 = {"version": 1, "model": "m", "dataset": {"source": "builtin:demo", "text_column": "text"},
          "training_args": {"output_dir": str(tmp_path / "o"), "max_steps": 3}}
    job = JobConfig.from_dict(v1)
    assert job.dataset.kind == "text" and job.dataset.columns == {} and job.dataset.eval == {}
    assert job.to_dict()["version"] == 2
    with pytest.raises(JobConfigError, match="version 2"):
        JobConfig.from_dict({**v1, "dataset": {"kind": "conversational"}})
    data = tmp_path / "qa.jsonl"
    data.write_text('{"question": "q", "answer": "a"}\n')
    v2 = JobConfig.from_dict({"version": 2, "dataset": {
        "source": str(data), "kind": "prompt_completion",
        "columns": {"prompt": "question", "completion": "answr"}, "eval": {"fraction": 0.1}},
        "training_args": {"output_dir": str(tmp_path / "o"), "hub_token": "hf_" + "x" * 30}})
    problems = dict(v2.validate())
    assert "question, answer" in problems["dataset.columns.completion"]
    assert "HF_TOKEN" in problems["training_args.hub_token"]
    assert "hub_token" not in json.dumps(v2.to_dict())
    v2.dataset.eval = {}
    v2.training_args = {"output_dir": str(tmp_path / "o"), "eval_strategy": "steps"}
    assert "needs an eval split" in dict(v2.validate())["training_args.eval_strategy"]
