"""Instruction/chat data in core (no Qt, no torch): column mappings and their messages, alpaca and
sharegpt rows, the eval split, and push to the Hub without a token ever reaching a job file, a
command preview or a run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gaudi_gui.core import sft
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.prepare import prepare_run, preview_command
from gaudi_gui.core.runstore import RunStore
from gaudi_gui.core.secrets import hub_token_available

TOKEN = "hf_" + "Q" * 34


def _alpaca(tmp_path: Path) -> Path:
    path = tmp_path / "alpaca.jsonl"
    path.write_text(json.dumps({"instruction": "Add.", "input": "2 and 3", "output": "5"}) + "\n"
                    + json.dumps({"instruction": "Hi.", "input": "", "output": "Hello."}) + "\n")
    return path


def test_mapping_problems_name_the_available_columns() -> None:
    problems = dict(sft.check_columns("prompt_completion", {"prompt": "question", "completion": "output"},
                                      ["instruction", "input", "output"]))
    assert problems == {"dataset.columns.prompt": "the dataset has no column 'question' for prompt; its "
                                                  "columns: instruction, input, output"}
    problems = dict(sft.check_columns("prompt_completion", {"prompt": "{instruction} {inp}",
                                                            "completion": ""}, ["instruction", "output"]))
    assert "'inp'" in problems["dataset.columns.prompt"]
    assert "instruction, output" in problems["dataset.columns.completion"]
    assert sft.check_columns("conversational", {"messages": "conversations"}, None) == []


def test_alpaca_template_and_sharegpt_rows() -> None:
    mapping = sft.default_columns("prompt_completion", ["instruction", "input", "output"])
    assert mapping == {"prompt": "{instruction}\n\n{input}", "completion": "output"}
    row = sft.to_sft_row("prompt_completion", mapping, {"instruction": "Hi.", "input": None, "output": "Yo"},
                         chat=False)
    assert row == {"prompt": "Hi.", "completion": "Yo"}  # no trailing blank section
    chat = sft.to_sft_row("prompt_completion", mapping, {"instruction": "Add.", "input": "2", "output": "2"},
                          chat=True)
    assert chat["prompt"] == [{"role": "user", "content": "Add.\n\n2"}]
    assert chat["completion"] == [{"role": "assistant", "content": "2"}]
    messages = sft.to_messages([{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}], "c")
    assert messages == [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(sft.MappingError, match="from/value"):
        sft.to_messages([{"speaker": "x"}], "c")


def _pc_job(tmp_path: Path, rows: list[dict[str, object]], prompt: str) -> JobConfig:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out")})
    job.dataset.source, job.dataset.kind = str(path), "prompt_completion"
    job.dataset.columns = {"prompt": prompt, "completion": "answer"}
    return job


def _mapping_problems(job: JobConfig) -> dict[str, str]:
    return {f: m for f, m in job.validate() if f.startswith("dataset.")}


def test_a_template_is_refused_unless_it_renders_every_preview_row(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [{"prompt": "Sky?", "answer": "Blue."},
                                     {"prompt": "Grass?", "answer": "Green."}]
    nested = "Q: {prompt!r:>{width}}"
    at_prompt = "dataset.columns.prompt"
    # A nested format field reads a column too: refused naming it (the worker failed with KeyError).
    assert sft.columns_used(nested) == ["prompt", "width"]
    problems = _mapping_problems(_pc_job(tmp_path, rows, nested))
    assert list(problems) == [at_prompt] and "no column 'width'" in problems[at_prompt]
    # With the column there, every row renders as the worker renders it (the same function).
    wide = [{**r, "width": 8} for r in rows]
    assert _mapping_problems(_pc_job(tmp_path, wide, nested)) == {}
    mapping = {"prompt": nested, "completion": "answer"}
    assert sft.to_sft_row("prompt_completion", mapping, wide[0], chat=False)["prompt"] == "Q:   'Sky?'"
    # A row whose value the template cannot take: refused at the field, naming the row.
    bad: list[dict[str, object]] = [*wide, {"prompt": "Snow?", "answer": "White.", "width": "wide"}]
    assert _mapping_problems(_pc_job(tmp_path, bad, nested))[at_prompt].startswith("row 3 of the file: ")
    assert "Unknown format code 'd'" in _mapping_problems(_pc_job(tmp_path, rows, "{prompt:d}"))[at_prompt]
    # A column holding a list where the template wants text.
    listed: list[dict[str, object]] = [*rows, {"prompt": ["a", "b"], "answer": "c"}]
    assert "row 3 of the file" in _mapping_problems(_pc_job(tmp_path, listed, "Q: {prompt}"))[at_prompt]
    # Attribute or item lookups are never columns.
    for spec in ("{prompt.upper}", "{prompt[0]}", "{}"):
        assert "is not a column name" in _mapping_problems(_pc_job(tmp_path, rows, spec))[at_prompt]
    # The worker's own render says which template and value, never a bare KeyError or ValueError.
    with pytest.raises(sft.MappingError, match="cannot be filled"):
        sft.render("{prompt:>{width}}", {"prompt": "x", "width": "wide"}, "prompt")
    assert sft.check_rows("prompt_completion", {"prompt": "prompt", "completion": "answer"}, rows) == []


def test_eval_split_checks(tmp_path: Path) -> None:
    assert sft.check_eval({"fraction": 0.2}) == []
    assert "between 0 and 1" in dict(sft.check_eval({"fraction": 1.5}))["dataset.eval.fraction"]
    assert "choose one" in dict(sft.check_eval({"fraction": 0.1, "split": "test"}))["dataset.eval"]
    job = JobConfig(training_args={"output_dir": str(tmp_path / "o")})
    job.dataset.source, job.dataset.format = "someone/data", "hub"
    job.dataset.eval = {"split": "validation"}
    assert job.validate() == []  # a Hub split for a Hub dataset
    job.dataset.source, job.dataset.format = str(_alpaca(tmp_path)), "auto"
    assert "dataset.eval.split" in dict(job.validate())


def test_hub_token_is_found_without_reading_it(tmp_path: Path) -> None:
    assert hub_token_available({"HF_TOKEN": TOKEN})
    assert not hub_token_available({"HF_HOME": str(tmp_path)})
    (tmp_path / "token").write_text(TOKEN)
    assert hub_token_available({"HF_HOME": str(tmp_path)})
    assert hub_token_available({"HF_TOKEN_PATH": str(tmp_path / "token")})
    assert not hub_token_available({"HF_TOKEN_PATH": str(tmp_path / "none")})


def test_push_to_hub_needs_a_token_and_never_stores_it(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_TOKEN_PATH", raising=False)
    job = JobConfig(training_args={"output_dir": str(tmp_path / "o"), "push_to_hub": True,
                                   "hub_model_id": "me/tiny-sft"})
    job.dataset.source, job.dataset.kind = str(_alpaca(tmp_path)), "prompt_completion"
    job.dataset.columns = {"prompt": "instruction", "completion": "output"}
    problems = dict(job.validate())
    assert list(problems) == ["training_args.push_to_hub"]
    assert "hf auth login" in problems["training_args.push_to_hub"]
    bad = JobConfig.from_dict({**job.to_dict(), "training_args": {**job.training_args,
                                                                  "hub_model_id": "a/b/c"}})
    assert "training_args.hub_model_id" in dict(bad.validate())
    # With a token in the environment the job is fine, and the token reaches neither the job file,
    # the command preview, nor anything in the run folder (the child inherits it from the env).
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert job.validate() == []
    job.training_args["hub_token"] = TOKEN
    assert "training_args.hub_token" in dict(job.validate())
    assert TOKEN not in job.to_json()
    del job.training_args["hub_token"]
    shown = preview_command(job, device="cpu", device_env=None, runs_root=tmp_path / "runs")
    assert "--config" in shown and TOKEN not in shown
    prepared = prepare_run(job, device="cpu", store=RunStore(tmp_path / "runs"))
    assert prepared.env["HF_TOKEN"] == TOKEN  # passed to the child through its environment only
    assert json.loads(prepared.run.config_path.read_text())["training_args"]["push_to_hub"] is True
    for path in prepared.run.folder.rglob("*"):
        if path.is_file():
            assert TOKEN not in path.read_text(errors="replace"), path
