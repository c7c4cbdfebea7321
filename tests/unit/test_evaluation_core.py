"""core.evaluation without models: what a spec resolves to for each kind of run, the checks a user
meets at the field, the results layout in the run folder and the Runs list's latest scores."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gaudi_gui.commands import eval as eval_cmd
from gaudi_gui.core import evaluation as ev
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore
from tests import helpers

TASKS = Path(__file__).resolve().parents[1] / "data" / "lmeval_task"


def _model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["GaudiLlamaForCausalLM"]}))
    return folder


def _run(root: Path, method: str, saved: str = "") -> Run:
    base = _model(root / f"base-{method}-{saved}")
    out = root / f"out-{method}-{saved}"
    job = JobConfig(model=str(base), method=method, training_args={"output_dir": str(out)})
    run = RunStore(root / "runs").create(job)
    if saved == "adapter":
        (out / "adapter").mkdir(parents=True)
        config = {"base_model_name_or_path": str(base)}
        (out / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    elif saved:
        _model(out / saved)
    return run


def _refs(path: Path, rows: list[dict[str, str]]) -> str:
    return str(helpers.write_jsonl(path, list(rows)))


def test_a_lora_run_is_its_adapter_over_its_base_and_results_go_to_its_folder(tmp_path: Path) -> None:
    run = _run(tmp_path, "lora", "adapter")
    target = ev.resolve(ev.EvalSpec(run=str(run.folder)))
    assert target.adapter.endswith("adapter") and target.tuned_model == target.base_model == run.job().model
    assert target.results_dir == run.folder / "eval"
    # A run is also found by its name under the runs folder.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GAUDI_GUI_RUNS_DIR", str(tmp_path / "runs"))
        assert ev.resolve(ev.EvalSpec(run=run.name)).adapter == target.adapter


def test_a_full_run_is_its_final_model_against_its_base(tmp_path: Path) -> None:
    run = _run(tmp_path, "full", "final")
    target = ev.resolve(ev.EvalSpec(run=str(run.folder)))
    assert target.adapter == "" and target.tuned_model.endswith("final")
    assert target.base_model == run.job().model


def test_a_lora_run_without_adapter_is_refused_at_the_run_field(tmp_path: Path) -> None:
    run = _run(tmp_path, "lora")
    problems = dict(ev.validate(ev.EvalSpec(run=str(run.folder), prompts=["hi"])))
    assert "no adapter" in problems["run"] and run.name in problems["run"]
    run2 = _run(tmp_path, "full")
    assert "no saved model" in dict(ev.validate(ev.EvalSpec(run=str(run2.folder), prompts=["hi"])))["run"]


def test_perplexity_without_references_needs_a_runs_eval_split(tmp_path: Path) -> None:
    run = _run(tmp_path, "lora", "adapter")
    spec = ev.EvalSpec(run=str(run.folder), metrics=["perplexity"])
    assert "this run has none" in dict(ev.validate(spec))["data"]
    job = run.job()
    job.dataset.eval = {"fraction": 0.25}
    job.save(run.config_path)
    assert ev.validate(spec) == [] and ev.resolve(spec).heldout == str(run.config_path)
    assert ev.resolve(spec).chat_kind is False  # a text run: prompts go in as they are
    assert "chat is one of" in dict(ev.validate(ev.EvalSpec(run=str(run.folder), prompts=["a"],
                                                            chat="maybe")))["chat"]


def test_a_missing_column_names_the_files_columns(tmp_path: Path) -> None:
    run = _run(tmp_path, "lora", "adapter")
    data = _refs(tmp_path / "refs.jsonl", [{"question": "q", "answer": "a"}])
    problems = dict(ev.validate(ev.EvalSpec(run=str(run.folder), data=data)))
    assert problems["prompt_column"] == \
        "'prompt' is not a column of refs.jsonl (its columns: question, answer)"
    spec = ev.EvalSpec(run=str(run.folder), data=data, prompt_column="question", reference_column="gold")
    assert "'gold' is not a column" in dict(ev.validate(spec))["reference_column"]
    spec.reference_column = "answer"
    assert ev.validate(spec) == []


def test_empty_and_broken_files_say_so(tmp_path: Path) -> None:
    run = _run(tmp_path, "lora", "adapter")
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "reference": "b"}\n{oops\n')
    empty = ev.EvalSpec(run=str(run.folder), data=str(tmp_path / "empty.jsonl"))
    assert "empty.jsonl is empty" in dict(ev.validate(empty))["data"]
    assert "bad.jsonl line 2 is not JSON" in dict(ev.validate(ev.EvalSpec(
        run=str(run.folder), data=str(tmp_path / "bad.jsonl"))))["data"]
    missing = ev.EvalSpec(run=str(run.folder), prompts_file=str(tmp_path / "nope.jsonl"))
    assert "no such file" in dict(ev.validate(missing))["prompts_file"]
    assert "nothing to evaluate" in dict(ev.validate(ev.EvalSpec(run=str(run.folder))))["data"]
    assert "perplexity" in dict(ev.validate(ev.EvalSpec(run=str(run.folder), prompts=["a"],
                                                        metrics=["perplexity"])))["data"]


def test_tasks_are_checked_against_the_local_folder_and_lm_evals_catalogue(tmp_path: Path) -> None:
    run = _run(tmp_path, "lora", "adapter")
    assert ev.local_tasks(TASKS) == ["gaudi_gui_needs_hub", "gaudi_gui_tiny_mc"]
    spec = ev.EvalSpec(run=str(run.folder), tasks=["gaudi_gui_tiny_mc", "hellaswag"], include_path=str(TASKS))
    assert ev.validate(spec) == []
    spec.tasks = ["gaudi_gui_tiny_mc", "no_such_task"]
    assert "unknown lm-eval task(s): no_such_task" in dict(ev.validate(spec))["tasks"]


def test_prompt_files_jsonl_or_text(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('"one"\n{"prompt": "two"}\n')
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    assert ev.read_prompts(tmp_path / "p.jsonl") == ["one", "two"]
    assert ev.read_prompts(tmp_path / "p.txt") == ["one", "two"]
    (tmp_path / "q.jsonl").write_text('{"question": "x"}\n')
    with pytest.raises(ev.EvalInputError, match="columns: question"):
        ev.read_prompts(tmp_path / "q.jsonl")


def test_gaudi_architectures_are_evaluated_as_upstream_ones() -> None:
    assert ev.upstream_architecture("GaudiLlamaForCausalLM") == "LlamaForCausalLM"
    assert ev.upstream_architecture("LlamaForCausalLM") == "LlamaForCausalLM"
    assert ev.upstream_architecture("Gaudi") == "Gaudi"


def test_results_layout_and_latest_scores(tmp_path: Path) -> None:
    run = _run(tmp_path, "lora", "adapter")
    assert ev.latest_scores(run) == "–"
    record = {"created": 1_800_000_000.0, "base": {"metrics": {"rougeL": 0.1, "bleu": 1.0}, "tasks": {}},
              "tuned": {"metrics": {"rougeL": 0.5, "bleu": 3.0},
                        "tasks": {"mc": {"score": 0.75, "stderr": 0.1}}}}
    path = ev.write_results(run.folder / "eval", record, [{"prompt": "p", "base": "a", "tuned": "b"}])
    again = ev.write_results(run.folder / "eval", record, [])
    assert path.parent == run.folder / "eval" and again != path and path.stem in again.stem
    assert (path.stat().st_mode & 0o777) == 0o600
    assert json.loads(path.with_name(path.stem + "-answers.jsonl").read_text())["tuned"] == "b"
    assert ev.results_of(run) == [path, again]
    (run.folder / "eval" / "zz-damaged.json").write_text("{")
    latest = ev.latest_result(run)
    assert latest is not None and latest["path"] == str(again)
    assert ev.score_items(latest) == [("rougeL", 0.5, 0.1), ("bleu", 3.0, 1.0), ("mc", 0.75, None)]
    assert ev.latest_scores(run) == "rougeL 0.5 (base 0.1) · bleu 3 (base 1) · mc 0.75 (base –)"


def test_the_forms_spec_is_what_the_command_line_reads_back(tmp_path: Path) -> None:
    spec = ev.EvalSpec(run="r", prompts=["a b", "--c"], prompts_file="p.jsonl", data="d.jsonl",
                       prompt_column="q", reference_column="ans", metrics=["bleu", "perplexity"],
                       tasks=["t1", "t2"], include_path="/tasks", max_rows=3, max_new_tokens=7, seed=5,
                       chat="off")
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    eval_cmd.add_parser(sub)
    args = parser.parse_args(["eval", *spec.cli_args()])
    assert eval_cmd.spec_of(args) == spec
    # The Evaluate window's FP8 field and threshold: --fp8 RUN --fp8-max-rise PCT, read back alike.
    fp8_spec = ev.EvalSpec(model="m", prompts=["a"], fp8="/runs/calibrate-m", fp8_max_rise=1.5)
    assert fp8_spec.cli_args()[-2:] == ["--fp8=/runs/calibrate-m", "--fp8-max-rise=1.5"]
    assert eval_cmd.spec_of(parser.parse_args(["eval", *fp8_spec.cli_args()])) == fp8_spec
    assert not any(a.startswith("--fp8") for a in spec.cli_args())  # no calibration, no threshold


def test_column_guess_never_takes_an_integer_id() -> None:
    """Issue 25, item 17: an integer `qid` first in the file was taken as the prompt column."""
    from gaudi_gui.core.evaluation import guess_columns
    rows = [{"qid": 1, "question": "2+2?", "answer": "4"}, {"qid": 2, "question": "1+1?", "answer": "2"}]
    assert guess_columns(["qid", "question", "answer"], rows) == ("question", "answer")
    rows = [{"qid": 1, "body": "hello there", "gold": "hi"}]
    assert guess_columns(["qid", "body", "gold"], rows) == ("body", "gold")
    assert guess_columns(["qid", "score"], [{"qid": 1, "score": 0.5}]) == ("", "")
    rows = [{"Instruction": "do", "Output": "done"}]
    assert guess_columns(["Output", "Instruction"], rows) == ("Instruction", "Output")
