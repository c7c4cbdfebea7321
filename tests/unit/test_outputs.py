"""Whose files an output folder holds, and which checkpoint is a run's own (issue 25, items 1 and 2)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gaudi_gui.core import jobcheck, outputs, prepare
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStatus, RunStore


def _checkpoint(folder: Path, step: int, mtime: float | None = None) -> Path:
    ck = folder / f"checkpoint-{step}"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if mtime is not None:
        os.utime(ck / "trainer_state.json", (mtime, mtime))
    return ck


def _run(store: RunStore, out: Path, name: str, **status: object) -> Run:
    run = store.create(JobConfig(name=name, training_args={"output_dir": str(out)}))
    run.update_status(**status)
    return run


def _saved(run: Run, *steps_paths: tuple[int, Path]) -> None:
    with open(run.events_path, "a", encoding="utf-8") as fh:
        for step, path in steps_paths:
            fh.write(json.dumps({"type": "checkpoint_saved", "step": step, "path": str(path)}) + "\n")


def test_a_new_folder_and_an_empty_one_are_free(tmp_path: Path) -> None:
    assert outputs.conflict(str(tmp_path / "new")) is None
    (tmp_path / "empty").mkdir()
    assert outputs.conflict(str(tmp_path / "empty")) is None
    assert outputs.conflict("") is None


def test_another_runs_checkpoints_are_refused_naming_the_run(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    out = tmp_path / "out"
    first = _run(store, out, "full")
    outputs.claim(out, first)
    for step in (10, 20, 30):
        _checkpoint(out, step)
    (out / "final").mkdir()
    found = outputs.conflict(str(out))
    assert found is not None
    assert found.owner == str(first.folder)
    assert first.name in found.message and str(out) in found.message
    assert "checkpoint-10 … checkpoint-30 (3)" in found.message and "final" in found.message
    # The job says overwrite: no problem.
    job = JobConfig(training_args={"output_dir": str(out)})
    assert jobcheck.output_problems(job)[0][0] == "training_args.output_dir"
    job.overwrite_output = True
    assert jobcheck.output_problems(job) == []


def test_unowned_checkpoints_are_refused_too(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _checkpoint(out, 5)
    found = outputs.conflict(str(out))
    assert found is not None and "an earlier run" in found.message


def test_resuming_the_owner_or_its_lineage_is_allowed(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    out = tmp_path / "out"
    first = _run(store, out, "a", state="stopped")
    second = _run(store, out, "b", state="stopped", resumed_from=str(first.folder))
    outputs.claim(out, second)
    _checkpoint(out, 10)
    assert outputs.conflict(str(out), resumed_from=str(second.folder)) is None
    # Resuming the first link of the chain again is the same lineage.
    assert outputs.conflict(str(out), resumed_from=str(first.folder)) is None
    stranger = _run(store, tmp_path / "elsewhere", "c", state="stopped")
    assert outputs.conflict(str(out), resumed_from=str(stranger.folder)) is not None


def test_a_job_without_output_dir_gets_a_folder_of_its_own(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    job = JobConfig(name="demo")
    assert job.validate() == [] or all(f != "training_args.output_dir" for f, _m in job.validate())
    one = store.create(JobConfig.from_dict(job.to_dict()), default_output=outputs.default_output_dir)
    two = store.create(JobConfig.from_dict(job.to_dict()), default_output=outputs.default_output_dir)
    assert one.output_dir() != two.output_dir()
    assert one.output_dir() == outputs.default_output_dir(one.name)
    # job.json keeps it empty: a clone gets its own folder again.
    assert store.clone(one).output_dir == ""


def test_own_checkpoint_is_the_one_the_run_stopped_with_not_a_later_runs(tmp_path: Path) -> None:
    """The field defect: a run stopped at 110/400 resumed from checkpoint-400 of a later run that
    wrote into the same folder."""
    store = RunStore(tmp_path / "runs")
    out = tmp_path / "out"
    stopped = _run(store, out, "stopped")
    ck110 = _checkpoint(out, 110)
    _saved(stopped, (100, out / "checkpoint-100"), (110, ck110))
    stopped.update_status(state="stopped", step=110, max_steps=400, checkpoint=str(ck110))
    later = _run(store, out, "later", state="finished", step=400, max_steps=400)
    ck400 = _checkpoint(out, 400)
    _saved(later, (400, ck400))
    outputs.claim(out, later)
    assert outputs.own_checkpoint(stopped) == ck110
    assert outputs.own_checkpoint(later) == ck400
    # Without the status's checkpoint: the newest complete one of its own recorded saves.
    stopped.update_status(checkpoint="")
    assert outputs.own_checkpoint(stopped) == ck110
    # Its recorded checkpoints gone: nothing of its own (never the other run's).
    import shutil
    shutil.rmtree(ck110)
    assert outputs.own_checkpoint(stopped) is None


def test_own_checkpoint_of_an_earlier_versions_run_goes_by_time_and_step(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    out = tmp_path / "out"
    now = time.time()
    old = _run(store, out, "old", state="stopped", step=110, max_steps=400,
               started_at=now - 3600, ended_at=now - 3000)
    mine = _checkpoint(out, 110, mtime=now - 3100)
    _checkpoint(out, 400, mtime=now - 100)  # a later run's, written long after
    assert outputs.own_checkpoint(old) == mine


def test_resolve_resume_makes_latest_the_runs_own_checkpoint(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    out = tmp_path / "out"
    stopped = _run(store, out, "stopped")
    ck = _checkpoint(out, 110)
    stopped.update_status(state="stopped", step=110, checkpoint=str(ck))
    _checkpoint(out, 400)
    job = stopped.user_job()
    job.resume_from_checkpoint = "latest"
    resolved, resumed = prepare.resolve_resume(job, str(stopped.folder))
    assert resolved.resume_from_checkpoint == str(ck) and resumed == str(stopped.folder)
    assert resolved.output_dir == str(out)
    # "latest" with no run named: the folder's owner is the run resumed.
    outputs.claim(out, stopped)
    resolved, resumed = prepare.resolve_resume(job, "")
    assert resumed == str(stopped.folder) and resolved.resume_from_checkpoint == str(ck)
    empty = _run(store, tmp_path / "none", "empty", state="stopped")
    with pytest.raises(prepare.PrepareError, match="no complete checkpoint of its own"):
        prepare.resolve_resume(job, str(empty.folder))


def test_overwrite_output_travels_in_the_job_file() -> None:
    job = JobConfig(overwrite_output=True)
    assert JobConfig.from_dict(job.to_dict()).overwrite_output is True
    from gaudi_gui.core.jobconfig import JobConfigError
    with pytest.raises(JobConfigError, match="overwrite_output"):
        JobConfig.from_dict({"overwrite_output": "yes"})


def test_status_default_is_unchanged() -> None:
    assert RunStatus().checkpoint == ""


def test_a_checkpoint_named_by_path_resumes_the_run_that_wrote_it(tmp_path: Path) -> None:
    """`train` with resume_from_checkpoint=<path> (the multi-host resume) continues that folder's owner."""
    store = RunStore(tmp_path / "runs")
    out = tmp_path / "out"
    owner = _run(store, out, "first", state="stopped")
    outputs.claim(out, owner)
    ck = _checkpoint(out, 7)
    job = JobConfig(resume_from_checkpoint=str(ck), training_args={"output_dir": str(out)})
    resolved, resumed = prepare.resolve_resume(job, "")
    assert resumed == str(owner.folder) and resolved.resume_from_checkpoint == str(ck)
    assert jobcheck.output_problems(resolved, resumed) == []
    # A fresh run into that folder is still refused.
    assert jobcheck.output_problems(JobConfig(training_args={"output_dir": str(out)}))


def test_the_parts_of_one_multi_node_run_share_their_output_folder(tmp_path: Path) -> None:
    """Two machines' runs of one job on a shared file system write one output folder; each part
    resumes its own run there (found by the [hosts] training scenario, whose hosts share a home)."""
    store = RunStore(tmp_path / "runs")
    out = tmp_path / "out"
    part_a = _run(store, out, "a", state="stopped")
    outputs.claim(out, part_a)
    assert outputs.conflict(str(out)) is None  # claimed, nothing written yet: the second part starts
    part_b = _run(store, out, "b", state="stopped")
    outputs.claim(out, part_b)
    _checkpoint(out, 14)
    assert outputs.owners_of(out) == [str(part_a.folder), str(part_b.folder)]
    for part in (part_a, part_b):
        assert outputs.conflict(str(out), resumed_from=str(part.folder)) is None
    stranger = _run(store, tmp_path / "x", "x", state="stopped")
    assert outputs.conflict(str(out), resumed_from=str(stranger.folder)) is not None
    # Overwrite: the new run alone.
    outputs.claim(out, stranger, replace=True)
    assert outputs.owners_of(out) == [str(stranger.folder)]



_CLAIM_AT = """
import sys, time
from pathlib import Path
from gaudi_gui.core import outputs
from gaudi_gui.core.runstore import Run
out, run_folder, start_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
while time.time() < start_at:  # every part claims at the same instant
    time.sleep(0.0005)
outputs.claim(out, Run(Path(run_folder)))
"""


def test_parts_that_claim_at_the_same_instant_are_all_recorded(tmp_path: Path) -> None:
    """The parts of one multi-node job start together and claim one folder of a shared file system
    together. Fresh clone #27: the two parts' read-modify-writes of the owner record crossed, the
    first part was lost, and its Resume was refused (the folder "holds run …-2's checkpoint-15"):
    the [hosts] training scenario waited 240 s for a resumed run that had been refused. Before the
    lock: 3 of 6 parts lost in the first round."""
    import subprocess
    import sys

    store = RunStore(tmp_path / "runs")
    for round_ in range(6):
        out = tmp_path / f"out-{round_}"
        parts = [_run(store, out, f"part-{round_}-{i}") for i in range(6)]
        start_at = time.time() + 2.0
        procs = [subprocess.Popen([sys.executable, "-c", _CLAIM_AT, str(out), str(p.folder), str(start_at)])
                 for p in parts]
        assert [proc.wait(60) for proc in procs] == [0] * len(parts)
        assert sorted(outputs.owners_of(out)) == sorted(str(p.folder) for p in parts), round_
