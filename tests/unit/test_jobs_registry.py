"""The close dialog's words for every kind of job (services/jobs.close_question)."""

from __future__ import annotations

from gaudi_gui.services.jobs import ActiveJob, close_question


def test_the_question_names_every_job_and_what_each_choice_does() -> None:
    jobs = [ActiveJob("training run a (running, step 5/40)", True),
            ActiveJob("Serve: demo at http://127.0.0.1:8000/v1", True),
            ActiveJob("Evaluate: run-b, 3/8 rows", True), ActiveJob("Model runner: demo", False)]
    text = close_question(jobs)
    for job in jobs:
        assert f"• {job.text}" in text
    assert "the 3 jobs go on and are followed again at the next start" in text
    assert "the other job ends now" in text
    assert "training saves a checkpoint first" in text and "keeps the results it has so far" in text


def test_only_jobs_that_end_with_the_window() -> None:
    text = close_question([ActiveJob("Model runner: demo", False)])
    assert "Leave running and quit is not offered" in text
    assert "checkpoint" not in text


def test_two_training_runs() -> None:
    text = close_question([ActiveJob("training run a", True), ActiveJob("training run b", True)])
    assert "the 2 training runs go on and are followed again" in text and "other" not in text


def test_a_server_left_running() -> None:
    text = close_question([ActiveJob("Serve: demo at http://127.0.0.1:8000/v1", True)])
    assert "the job goes on and is followed again at the next start" in text and "checkpoint" not in text
