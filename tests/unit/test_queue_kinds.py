"""Serve, eval and download jobs in the queue (issue 29): the add values, and the start each kind gets
through the agent's job start (its command's words, its cards). No child process is started."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gaudi_gui.agent.queue import Book, QueueService
from gaudi_gui.agent.server import Agent
from gaudi_gui.core import kinds, queue
from gaudi_gui.core.queue import CardRequest, CardsView, Entry, QueueError


def test_kind_names_and_refusals() -> None:
    assert [queue.kind_name(k) for k in ("train", "training", "Evaluate", "eval", "serve", "download")] == \
        ["train", "train", "eval", "eval", "serve", "download"]
    with pytest.raises(QueueError, match="--kind export: one of train, serve, eval, download"):
        queue.kind_name("export")
    with pytest.raises(QueueError, match="a download uses no cards"):
        queue.kind_add_values("download", ["org/x"], name="d", cards=CardRequest(count=1))
    with pytest.raises(QueueError, match="--config"):
        queue.kind_add_values("train", [], name="t")
    values = queue.kind_add_values("evaluate", ["--model=m"], name="eval-m", cards=CardRequest(ids=(2, 3)))
    assert values["kind"] == "eval" and values["job"] == {"words": ["--model=m"], "name": "eval-m"}
    assert values["card_ids"] == [2, 3] and values["output_dir"] == ""


def _entry(kind: str, words: list[str]) -> Entry:
    return Entry(id="q1", job={"words": words, "name": f"{kind}-x"}, kind=kind, name=f"{kind}-x")


def _service(tmp_path: Path) -> QueueService:
    return QueueService(Agent(sock_path=tmp_path / "agent.sock"), tmp_path / "q")


@pytest.mark.parametrize("kind", ["serve", "eval", "download", "calibrate", "benchmark"])
def test_each_kind_starts_through_the_agents_job_start(tmp_path: Path, kind: str) -> None:
    message = _service(tmp_path).job_of(_entry(kind, ["--model=m"]), [])
    assert message == {"kind": kind, "job": {"args": ["--model=m"]}}
    # What the jobs service runs for it: the kind's own --detach, as `gaudi-gui KIND … --detach` does.
    words = kinds.job_words(kind, message["job"])
    assert kinds.start_argv(kind, words, runs_dir="") == [
        sys.executable, "-m", "gaudi_gui", kind, "--model=m", "--detach", "--json"]


def test_a_training_entry_starts_with_its_config_device_and_cards(tmp_path: Path) -> None:
    entry = Entry(id="q1", job={"model": "m"}, kind="train", device="cpu")
    message = _service(tmp_path).job_of(entry, [2, 3])
    args = ["--device", "cpu", "--no-preflight", "--cards", "2,3"]
    assert message == {"kind": "train", "job": {"config": {"model": "m"}, "args": args}}
    assert kinds.job_words("train", message["job"]) == message["job"]["args"]


def test_cards_reach_a_serve_as_its_cards_and_an_eval_as_its_visible_modules(tmp_path: Path) -> None:
    service = _service(tmp_path)
    served = service.job_of(_entry("serve", ["--model=m"]), [4, 5])
    assert served["job"]["args"][-2:] == ["--cards", "4,5"] and "env" not in served
    service.view = CardsView(SimpleNamespace(cards=[{"module_id": 4}], free_modules=[4, 5]), 1.0)
    evaluated = service.job_of(_entry("eval", ["--model=m"]), [4, 5])
    assert evaluated["env"]["HABANA_VISIBLE_MODULES"] == "4,5"
    assert evaluated["env"]["PT_ENABLE_INT64_SUPPORT"] == "1"
    assert "--cards" not in evaluated["job"]["args"]
    # A calibration measures on one rank a card, a benchmark runs on its cards: both take --cards.
    for kind in ("calibrate", "benchmark"):
        assert service.job_of(_entry(kind, ["--model=m"]), [4, 5])["job"]["args"][-2:] == ["--cards", "4,5"]


def test_an_add_of_a_kind_without_words_is_refused() -> None:
    book = Book()
    request = {"kind": "serve", "job": {"name": "s"}}
    with pytest.raises(QueueError, match="needs its command's words"):
        book.apply("add", request)
    done = book.apply("add", {**request, "job": {"words": ["--model=m"], "name": "s"}, "name": "s"})
    assert done["entry"] == "q1" and book.state.entries[0].kind == "serve"
    assert book.state.entries[0].words() == ["--model=m"]
