"""core/preference.py and the job's objective, without a child: the layouts people bring, the one-line
refusals, and the key in the job file (absent means SFT)."""

# mypy: disable-error-code="union-attr"
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.core import paths, preference
from gaudi_gui.core.jobconfig import JobConfig, JobConfigError, align_job, dataset_rows

CHAT = [{"role": "user", "content": "Sky?"}]


def test_layouts_and_what_is_missing() -> None:
    assert preference.layout("dpo", ["prompt", "chosen", "rejected", "id"]).columns == ("prompt", "chosen",
                                                                                         "rejected")
    implicit = preference.layout("orpo", ["chosen", "rejected"])
    assert implicit.shape == "implicit" and "what chosen and rejected share" in implicit.describe()
    assert preference.layout("kto", ["prompt", "completion", "label"]).shape == "unpaired"
    assert preference.layout("kto", ["prompt", "chosen", "rejected"]).shape == "paired"  # TRL unpairs
    assert preference.missing_message("dpo", ["prompt", "chosen"]) == \
        "DPO needs a 'rejected' column; this file has prompt, chosen"
    assert preference.missing_message("orpo", ["text"]) == \
        "ORPO needs 'chosen' and 'rejected' columns; this file has text"
    assert preference.missing_message("kto", ["prompt", "completion"]) == \
        "KTO needs a 'label' column (or prompt, chosen, rejected pairs); this file has prompt, completion"
    assert preference.check("sft", ["text"]) == [] and preference.check("dpo", None) == []


def test_rows_are_checked_and_their_style_said() -> None:
    rows: list[dict[str, Any]] = [{"prompt": CHAT, "chosen": [{"role": "assistant", "content": "Blue."}],
             "rejected": [{"role": "assistant", "content": "Green."}]}]
    assert preference.check("dpo", ["prompt", "chosen", "rejected"], rows) == []
    assert preference.detect("dpo", ["prompt", "chosen", "rejected"], rows).style == "conversational"
    # HuggingFaceH4/ultrafeedback_binarized: a text prompt beside conversations that begin with it.
    h4 = [{"prompt": "Sky?", "chosen": [*CHAT, {"role": "assistant", "content": "Blue."}],
           "rejected": [*CHAT, {"role": "assistant", "content": "Green."}], "messages": []}]
    assert preference.check("dpo", list(h4[0]), h4) == []
    assert preference.detect("dpo", list(h4[0]), h4) == preference.Layout("implicit", ("chosen", "rejected"),
                                                                          "conversational")
    mixed = [*rows, {"prompt": "Sky?", "chosen": "Blue.", "rejected": "Green."}]
    assert "mixes plain text and chat messages" in preference.check("dpo", list(rows[0]), mixed)[0][1]
    assert preference.check("dpo", list(rows[0]), [{**rows[0], "rejected": ""}]) == \
        [("dataset.source", "row 1: 'rejected' is empty")]
    unpaired = [{"prompt": "Q?", "completion": "A.", "label": "yes"}]
    assert "'label' must be true or false" in preference.check("kto", list(unpaired[0]), unpaired)[0][1]


def test_the_objective_in_the_job_file(tmp_path: Path) -> None:
    assert "objective" not in JobConfig().to_dict()  # absent means SFT: SFT files read as they did
    job = JobConfig(objective="kto")
    assert JobConfig.from_json(job.to_json()).objective == "kto"
    with pytest.raises(JobConfigError, match="unknown objective 'ppo': choose one of sft, dpo, orpo, kto"):
        JobConfig.from_dict({"objective": "ppo"})
    # builtin:demo is the objective's demo file: the preference pairs, which a DPO job validates.
    assert JobConfig(objective="dpo").dataset_file() == str(paths.demo_dataset_path("dpo"))
    rows = dataset_rows(str(paths.demo_dataset_path("dpo")), "json")
    assert rows and all(set(r) == {"prompt", "chosen", "rejected"} for r in rows)
    assert JobConfig(objective="dpo", training_args={"output_dir": str(tmp_path)}).validate() == []
    sft_file = tmp_path / "qa.jsonl"
    sft_file.write_text(json.dumps({"text": "Q: A:"}) + "\n")
    job = JobConfig(objective="orpo")
    job.dataset.source = str(sft_file)
    refusal = ("dataset.source", "ORPO needs 'chosen' and 'rejected' columns; this file has text")
    assert refusal in job.validate()


def test_align_job_starts_dpo_from_the_sft_runs_model() -> None:
    sft = JobConfig(model="org/base", method="full", name="chat",
                    training_args={"output_dir": "o", "packing": True, "max_steps": 9})
    sft.dataset.source, sft.dataset.kind = "alpaca.jsonl", "prompt_completion"
    job = align_job(sft, "/runs/o/final", adapter=False, sft_only=("packing",))
    assert (job.objective, job.model, job.method, job.name) == ("dpo", "/runs/o/final", "full", "chat-dpo")
    assert job.training_args == {"max_steps": 9} and job.dataset.source == "" and job.dataset.kind == "text"
    sft.method = "qlora"
    assert align_job(sft, "/runs/o/adapter", adapter=True).method == "qlora"
