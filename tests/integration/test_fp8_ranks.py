"""FP8 calibration on several ranks, on the CPU: ``gaudi-gui calibrate --cards 0,1`` runs INC's MEASURE in
two real processes under torch's launcher (a gloo process group), each writing its own file set
(``inc_hooks_maxabs_<rank>_2.*``) from its share of the prompts; the manifest says ``ranks: 2`` and lists
each rank's files. ``serve --fp8`` on another number of cards and ``eval --fp8`` (one process) are refused
before anything starts, naming both counts; check() names a missing rank's files; a malformed
``--cards`` is one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gaudi_gui import cli
from gaudi_gui.core import fp8
from gaudi_gui.core.runstore import Run, RunStore

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> tuple[Run, str]:
    home = tmp_path_factory.mktemp("ranks-home")
    env = {**os.environ, "GAUDI_GUI_HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "calibrate", "--model", str(tiny_model_dir),
                           "--prompt", "the cat sat on the mat", "--prompt", "hello world",
                           "--prompt", "what is fp8?", "--cards", "0,1", "--device", "cpu", "--no-agent"],
                          capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = RunStore(home / "data" / "runs").runs()
    assert len(runs) == 1
    return runs[0], done.stdout + done.stderr


def test_two_ranks_write_a_file_set_each(two_ranks: tuple[Run, str]) -> None:
    run, said = two_ranks
    status = run.status()
    assert (status.kind, status.state, status.exit_code) == ("calibrate", "finished", 0)
    assert status.summary.startswith("Finished: 3 rows measured") and "(2 ranks)" in status.summary
    folder = run.folder
    manifest = fp8.read_manifest(folder)
    assert (manifest["ranks"], manifest["cards"]) == (2, [0, 1])
    assert manifest["rank_files"] == [list(fp8.rank_files(rank=r, ranks=2)) for r in (0, 1)]
    assert manifest["measurements"] == sorted(fp8.required_files(ranks=2))
    assert fp8.measurement_files(folder) == manifest["measurements"]  # no file set without a rank
    assert manifest["rank_rows"] == [2, 1] and manifest["rows"] == 3  # prompts 0 and 2, prompt 1
    for rank in (0, 1):
        measured = json.loads((folder / f"measure/inc_hooks_maxabs_{rank}_2.json").read_text())
        assert measured["LocalRank"] == rank  # INC's own record: the rank of the process group
        assert any("layers.0.mlp" in key for key in measured["Nodes"])  # the whole model, on each rank
    assert not (folder / "calibrate-job.json").exists()  # the ranks' job file is gone
    _manifest, found = fp8.check(folder)
    assert found == []
    assert "2 ranks" in said


def command(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main([*argv, "--no-agent"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_serve_and_eval_refuse_another_number_of_ranks(two_ranks: tuple[Run, str], tiny_model_dir: Path,
                                                       tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    folder = two_ranks[0].folder
    model = str(tiny_model_dir)
    code, _out, err = command(["serve", "--model", model, "--fp8", str(folder)], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err == (f"gaudi-gui serve: --fp8 {folder}: calibrated on 2 cards (2 ranks), this serve would run "
                   "on 1 card (tensor parallel 1): serve on 2 cards (--cards with 2 ids) or calibrate again "
                   "with --cards of 1 card\n")
    code, _out, err = command(["serve", "--model", model, "--fp8", str(folder), "--cards", "0,1,2,3"], capsys)
    assert code == 2 and "this serve would run on 4 cards (tensor parallel 4)" in err
    # As many cards as ranks: the calibration fits; no vLLM here, so that is what is said.
    code, _out, err = command(["serve", "--model", model, "--fp8", str(folder), "--cards", "0,1"], capsys)
    assert code == 2 and "FP8 serving runs through vLLM" in err
    code, out, err = command(["eval", "--model", model, "--fp8", str(folder), "--prompt", "hi"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("gaudi-gui eval: --fp8: calibrated on 2 cards (2 ranks, a file set each), eval "
                          "runs on 1 (one process)")
    assert cli.main(["doctor", "--fp8", str(folder)]) == 0
    assert "ranks: 2 (cards 0,1), a file set each" in capsys.readouterr().out
    # A rank's files missing: named, with the rank.
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    (copy / "measure" / "inc_hooks_maxabs_1_2_mod_list.json").unlink()
    _manifest, found = fp8.check(copy)
    assert [m.line() for m in found] == [
        "measurement files: calibrated present, here missing measure/inc_hooks_maxabs_1_2_mod_list.json "
        "(rank 1 of 2) → the run folder is incomplete: calibrate again on this machine (gaudi-gui calibrate "
        f"--model {tiny_model_dir.resolve()})"]
    assert RunStore().runs() == []  # nothing started


def test_bad_ranks_are_one_line_and_exit_2(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(tiny_model_dir)
    cases = [
        (["--cards", "0,x"], "--cards takes card ids separated by commas (e.g. 2,3), not '0,x'"),
        (["--cards", "1,,2"], "--cards takes card ids"),
        (["--cards", "0,1", "--ranks", "3"], "--ranks 3 and --cards 0,1 (2 cards) disagree"),
        (["--ranks", "-1"], "--ranks: -1 is not between 1 and 64"),
        (["--ranks", "3"], "1 calibration prompt(s) cannot be shared by 3 ranks"),
        (["--ranks", "two"], "invalid int value"),
    ]
    for argv, words in cases:
        code, out, err = command(["calibrate", "--model", model, "--prompt", "hi", "--device", "cpu", *argv],
                                 capsys)
        assert code == 2, argv
        assert words in err and err.count("\n") == 1 and "Traceback" not in err, err
        assert out == ""
    assert not RunStore().runs()  # nothing started
