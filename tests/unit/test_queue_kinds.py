"""Serve, eval and download jobs in the queue (issue 29): the add values, and the start child each kind
gets (its own detached supervisor, its command's words, its cards). No child process is started."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gaudi_gui.core import queue
from gaudi_gui.core.queue import CardRequest, CardsView, Entry, QueueError
from gaudi_gui.core.queue_runner import Runner


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


@pytest.mark.parametrize(("kind", "run_kind"), [("serve", "serve"), ("eval", "eval"),
                                                 ("download", "download")])
def test_each_kind_starts_under_its_own_detached_supervisor(tmp_path: Path, kind: str, run_kind: str) -> None:
    runner = Runner(tmp_path / "q")
    config, announce = tmp_path / "q1-1.json", tmp_path / "q1-1.run"
    argv, env = runner.start_argv(_entry(kind, ["--model=m"]), [], config, announce)
    assert argv == [sys.executable, "-m", "gaudi_gui.commands.detach", run_kind, str(config), str(announce),
                    "30", ""]
    assert env is None
    payload = json.loads(config.read_text())
    assert payload == {"argv": [sys.executable, "-m", "gaudi_gui", kind, "--model=m", "--events"],
                       "name": f"{kind}-x"}


def test_cards_reach_a_serve_as_its_cards_and_an_eval_as_its_visible_modules(tmp_path: Path) -> None:
    runner = Runner(tmp_path / "q")
    config, announce = tmp_path / "q1-1.json", tmp_path / "q1-1.run"
    runner.start_argv(_entry("serve", ["--model=m"]), [4, 5], config, announce)
    assert json.loads(config.read_text())["argv"][-3:] == ["--cards", "4,5", "--events"]
    runner.view = CardsView(SimpleNamespace(cards=[{"module_id": 4}], free_modules=[4, 5]), 1.0)
    _argv, env = runner.start_argv(_entry("eval", ["--model=m"]), [4, 5], config, announce)
    assert env is not None and env["HABANA_VISIBLE_MODULES"] == "4,5"
    assert env["PT_ENABLE_INT64_SUPPORT"] == "1"
    assert "--cards" not in json.loads(config.read_text())["argv"]


def test_an_add_of_a_kind_without_words_is_refused(tmp_path: Path) -> None:
    runner = Runner(tmp_path / "q")
    request = {"action": "add", "kind": "serve", "job": {"name": "s"}}
    with pytest.raises(QueueError, match="needs its command's words"):
        runner._apply(request)
    done = runner._apply({**request, "job": {"words": ["--model=m"], "name": "s"}, "name": "s"})
    assert done["ok"] and runner.state.entries[0].kind == "serve"
    assert runner.state.entries[0].words() == ["--model=m"]
