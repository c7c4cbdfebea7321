"""``gaudi-gui train --cards``: the ids checked, turned into the device's visibility variable in the
prepared run (and its env.json), passed on to a detached supervisor and to every host of ``--hosts``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gaudi_gui import cli
from gaudi_gui.commands.train import detached_argv
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.multi_host import parse_host_cards
from gaudi_gui.core.prepare import prepare_run
from gaudi_gui.core.runstore import RunStore
from gaudi_gui.core.visibility import cards_argv, parse_cards


def _job(tmp_path: Path) -> JobConfig:
    job = JobConfig()
    job.training_args = {"output_dir": str(tmp_path / "out"), "max_steps": 1}
    return job


def test_parse_cards_takes_comma_separated_non_negative_ints_only() -> None:
    assert parse_cards("2,3") == [2, 3]
    assert parse_cards(" 3, 2 ,3") == [2, 3]
    assert parse_cards("0") == [0]
    for bad in ("", " ", "2,", ",2", "a", "2;3", "-1", "1.5", "2,,3", "٣"):
        with pytest.raises(ValueError, match="--cards takes card ids"):
            parse_cards(bad)
    assert cards_argv([3, 2]) == ["--cards", "2,3"] and cards_argv([]) == []


def test_cards_for_several_hosts_same_on_every_host_or_per_host() -> None:
    assert parse_host_cards("", ["A", "B"]) == {}
    assert parse_host_cards("0,1", ["A", "B"]) == {"A": [0, 1], "B": [0, 1]}
    assert parse_host_cards("A=0,1;B=2,3", ["A", "B"]) == {"A": [0, 1], "B": [2, 3]}
    assert parse_host_cards("B=4", ["A", "B"]) == {"B": [4]}
    for bad, why in (("C=0", "not one of --hosts"), ("A=0;A=1", "twice"), ("=0", "HOST=IDS"),
                     ("A=x", "card ids")):
        with pytest.raises(ValueError, match=why):
            parse_host_cards(bad, ["A", "B"])


@pytest.mark.parametrize("device, variable", [("hpu", "HABANA_VISIBLE_MODULES"),
                                              ("cuda", "CUDA_VISIBLE_DEVICES")])
def test_prepared_run_gets_the_cards_and_records_them(tmp_path: Path, device: str, variable: str) -> None:
    # prepare_run only writes the folder and builds the launch: no accelerator is needed for it.
    prepared = prepare_run(_job(tmp_path), device=device, store=RunStore(tmp_path / "runs"), cards=[3, 2])
    assert prepared.env[variable] == "2,3"
    recorded = json.loads((prepared.run.folder / "env.json").read_text())
    assert recorded["set_by_gaudi_gui"][variable] == "2,3"
    assert recorded["cards"] == {"requested": "2,3", "device": device, "applied": True}
    # --cards wins over a selection that came in the device environment.
    other = prepare_run(_job(tmp_path), device=device, store=RunStore(tmp_path / "runs"),
                        device_env={variable: "0,1"}, cards=[4])
    assert other.env[variable] == "4"


def test_cards_are_ignored_on_cpu_but_recorded(tmp_path: Path) -> None:
    prepared = prepare_run(_job(tmp_path), device="cpu", store=RunStore(tmp_path / "runs"), cards=[2, 3])
    recorded = json.loads((prepared.run.folder / "env.json").read_text())
    assert "HABANA_VISIBLE_MODULES" not in recorded["set_by_gaudi_gui"]
    assert "CUDA_VISIBLE_DEVICES" not in recorded["set_by_gaudi_gui"]
    assert recorded["cards"] == {"requested": "2,3", "device": "cpu", "applied": False}
    # Without --cards, env.json is as before.
    plain = prepare_run(_job(tmp_path), device="hpu", store=RunStore(tmp_path / "runs"))
    assert "cards" not in json.loads((plain.run.folder / "env.json").read_text())


def test_train_refuses_bad_cards_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "job.json"
    _job(tmp_path).save(str(config))
    for bad in ("2,x", "-1", "2,,3"):
        assert cli.main(["train", "--config", str(config), "--cards", bad, "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert err.strip().count("\n") == 0 and "--cards takes card ids" in err, err
    assert not list(RunStore().root.glob("*/env.json"))  # refused before any run folder


def test_detached_supervisor_gets_the_cards() -> None:
    args = argparse.Namespace(device="hpu", grace=5.0, cards="3,2", runs_dir="", resumed_from="")
    argv = detached_argv(args, "/tmp/job.json", "/tmp/job.run")
    assert argv[argv.index("--cards") + 1] == "2,3"
    args.cards = ""
    assert "--cards" not in detached_argv(args, "/tmp/job.json", "/tmp/job.run")
