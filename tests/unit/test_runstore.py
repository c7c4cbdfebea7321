from __future__ import annotations

import json
from pathlib import Path

from gaudi_gui.core import metrics
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.progress import RunProgress
from gaudi_gui.core.runstore import RunStore, is_pid_alive, latest_checkpoint


def test_create_list_clone_and_status(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out")}, resume_from_checkpoint="latest")
    a, b = store.create(job), store.create(job)
    assert a.folder != b.folder
    assert [r.folder for r in store.runs()] == sorted([a.folder, b.folder], reverse=True)
    assert a.status().state == "queued"
    a.update_status(state="running", pid=123, started_at=1.0)
    a.log_path.write_text("one\ntwo\nthree\n")  # the launcher's tee appends the console here
    assert a.log_tail(2) == ["two", "three"]
    assert a.status().pid == 123
    clone = store.clone(a)
    assert clone.resume_from_checkpoint == "" and clone.output_dir == str(tmp_path / "out")
    (a.folder / "status.json").write_text("{broken")
    assert a.status().state == "failed"


def test_latest_checkpoint(tmp_path: Path) -> None:
    for step in (5, 20, 30, 40, 100):
        (tmp_path / f"checkpoint-{step}").mkdir()
    for step in (5, 20, 30, 40):
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp_path / "checkpoint-30" / "checkpoint-is-incomplete.txt").write_text("saving")  # JIT sentinel
    (tmp_path / "checkpoint-40" / "trainer_state.json").write_text('{"global_st')  # cut mid-write
    # 100 has no state, 40's is cut, 30 is still being written: none of them is offered.
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-20"
    assert latest_checkpoint(tmp_path / "missing") is None


def test_metrics_and_progress(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    rows = [{"step": i, "max_steps": 10, "loss": 5.0 - i, "elapsed": i * 2.0} for i in range(1, 5)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{\"step\": 5, \"lo")  # cut last line
    records = metrics.read_metrics(path)
    assert len(records) == 4
    assert metrics.series(records, "loss") == ([1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0])
    p = RunProgress().apply_all({"type": "metrics", **r} for r in records)
    assert p.fraction == 0.4 and p.eta == 12.0 and p.loss == 1.0
    assert metrics.format_duration(75) == "1m15s"


def test_progress_takes_the_events_of_a_resumed_run() -> None:
    """The supervisor and the app's job read a run's events through the same reducer."""
    p = RunProgress()
    assert p.apply({"type": "training_started", "start_step": 6, "max_steps": 10}) is None
    assert (p.step, p.start_step, p.max_steps) == (6, 6, 10)
    assert p.apply({"type": "metrics", "loss": 1.0}) is None  # no step: not a record
    record = p.apply({"type": "metrics", "step": 8, "max_steps": 10, "loss": 0.5, "elapsed": 4.0})
    assert record is not None and record["loss"] == 0.5
    assert (p.step, p.fraction, p.eta) == (8, 0.8, 4.0)  # 2 steps in 4 s since step 6: 2 left, 4 s
    assert p.apply({"type": "checkpoint_saved", "step": 8}) is None and p.step == 8


def test_pid_alive() -> None:
    import os
    assert is_pid_alive(os.getpid()) and not is_pid_alive(0)


def test_status_survives_corrupt_files(tmp_path: Path) -> None:
    import time
    store = RunStore(tmp_path / "runs")
    run = store.create(JobConfig())
    for text, state in (("[]", "failed"), ('"running"', "failed"), ("{oops", "failed"),
                        ('{"state": "bogus"}', "failed"), ('{"state": "finished", "started_at": 1e300, '
                                                          '"pid": "12", "final_loss": "NaN"}', "failed")):
        run.status_path.write_text(text)
        st = run.status()
        assert st.state == state, text
        assert st.started_at == 0.0 and st.pid == 0 and st.final_loss is None
        assert st.duration < time.time()


def test_run_folder_is_private_and_clone_gives_the_users_job(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    user = JobConfig(training_args={"max_steps": 4})
    effective = JobConfig(training_args={"max_steps": 4, "use_cpu": True})
    run = store.create(effective, user_job=user)
    assert run.folder.stat().st_mode & 0o777 == 0o700
    for path in run.folder.iterdir():
        if path.is_file():
            assert path.stat().st_mode & 0o777 == 0o600, path
    assert store.clone(run).training_args == {"max_steps": 4}
    assert run.job().training_args["use_cpu"] is True



def test_damaged_files_are_the_runs_own_problem(tmp_path: Path) -> None:
    """Each kind of damage reads as one sentence on that run; the sound run next to it has none."""
    store = RunStore(tmp_path / "runs")
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out")})
    sound, latin1, cut, lost = (store.create(job) for _ in range(4))
    for run in (sound, latin1, cut, lost):
        run.update_status(state="finished", step=10, max_steps=10, summary="Finished")
        run.events_path.write_text('{"type": "end"}\n')
    latin1.config_path.write_bytes(b'{"name": "caf\xe9", "x": 1}')
    cut.status_path.write_text('{"state": "finished", "st')
    lost.events_path.unlink()
    assert sound.problems() == []
    assert latin1.problems() == ["config.json is not UTF-8 (byte 0xe9 at 13)"]
    assert cut.problems() == ["status.json is truncated"]
    assert lost.problems() == ["events.jsonl is missing"]
    status = cut.status()
    assert (status.state, status.summary) == ("failed", "Damaged run: status.json is truncated")
    # What reads the job of a damaged run gets the job file's error, never a UnicodeDecodeError.
    assert latin1.output_dir() == Path(str(tmp_path / "out"))  # status.json still names it
    assert latin1.latest_checkpoint() is None
    names = sorted((r.name for r in (sound, latin1, cut, lost)), reverse=True)
    assert [r.name for r in store.runs()] == names


def test_a_status_of_the_wrong_shape_or_types_is_damaged_and_says_why(tmp_path: Path) -> None:
    """A list instead of an object, or every field of the wrong type, is a damaged run with the reason
    (as a truncated file is), never "failed" with no reason or a finished run shown as "queued"."""
    store = RunStore(tmp_path / "runs")
    run = store.create(JobConfig(training_args={"output_dir": str(tmp_path / "out")}))
    wrong = {"state": ["finished"], "pid": "12", "pid_create_time": "x", "started_at": "yesterday",
             "ended_at": [], "exit_code": "0", "final_loss": "1.5", "step": "10", "max_steps": 10.5,
             "error": 3, "summary": {"a": 1}, "kind": 7}
    cases = {"[1, 2]": "status.json holds a list, not an object",
             json.dumps(wrong): "status.json: state is a list, not a string (and 11 more)",
             '{"state": "finished", "step": "10"}': "status.json: step is a string, not an integer",
             '{"state": "bogus"}': "status.json: state 'bogus' is not one of queued, running, finished, "
                                   "failed, stopped, killed",
             '{"step": 3}': "status.json has no state"}
    for text, problem in cases.items():
        run.status_path.write_text(text)
        st = run.status()
        assert (st.state, st.error_kind, st.error, st.summary) == (
            "failed", "damaged", problem, f"Damaged run: {problem}"), text
        assert run.problems() == [problem], text
        assert run.reconcile().summary == f"Damaged run: {problem}"
    # A diverged loss (NaN) and a clock far off are values, not damage: read as unknown.
    run.events_path.write_text('{"type": "finished"}\n')
    run.status_path.write_text('{"state": "finished", "final_loss": NaN, "started_at": 1e300}')
    st = run.status()
    assert (st.state, st.error_kind, st.final_loss, st.started_at) == ("finished", "", None, 0.0)
    assert run.problems() == []
