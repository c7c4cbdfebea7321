from __future__ import annotations

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
    assert '"version": 1' in path.read_text()


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


def test_validate(tmp_path: Path) -> None:
    job = JobConfig(training_args={"output_dir": str(tmp_path)})
    assert job.validate() == []
    job.dataset.source = str(tmp_path / "nope.csv")
    job.method = "xx"
    job.launch.num_machines = 2
    fields = {f for f, _ in job.validate()}
    assert {"dataset.source", "method", "launch.main_process_ip"} <= fields
    assert {f for f, _ in JobConfig().validate()} == {"training_args.output_dir"}


def test_format_by_extension(tmp_path: Path) -> None:
    assert resolve_format("a.jsonl") == "json"
    assert resolve_format("a.csv") == "csv"
    assert resolve_format("a.txt") == "text"
    assert resolve_format("builtin:demo") == "json"
    assert resolve_format("user/some-dataset") == "hub"
    assert resolve_format("x.jsonl", "text") == "text"
