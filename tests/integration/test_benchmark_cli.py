"""``gaudi-gui benchmark`` end to end on the CPU at the tiny size: one real run for the module (two
worker processes, a gloo all-reduce, the bench model's decode and training step), its run folder, and
the verdicts of references made from it (the run itself; edited copies: twice as fast, within the
spread, a forced wide spread); bad references refused with one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui import cli
from gaudi_gui.core import benchmark as bm
from gaudi_gui.core.runstore import Run, RunStore

# One unit for the scheduler: the module's tests share one real benchmark run (bench_run).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("benchmark_run")]

FIGURES = ("matmul.fp32", "allreduce", "decode", "train_step")


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, subprocess.CompletedProcess[str]]:
    home = tmp_path_factory.mktemp("bench-home")
    env = {**os.environ, "GAUDI_GUI_HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "benchmark", "--size", "tiny", "--repeats", "3",
                           "--cards", "0,1", "--device", "cpu", "--no-agent"], capture_output=True, text=True,
                          env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = RunStore(home / "data" / "runs").runs()
    assert len(runs) == 1
    return runs[0], done


def test_the_benchmark_writes_its_run_folder(bench_run: tuple[Run, subprocess.CompletedProcess[str]]) -> None:
    run, done = bench_run
    status = run.status()
    assert (status.kind, status.state, status.exit_code) == ("benchmark", "finished", 0)
    assert status.summary == "Finished: 4 figures on 2 × cpu"  # what runs list says
    record = json.loads((run.folder / bm.RESULT_NAME).read_text())
    assert record["kind"] == "benchmark" and record["size"] == "tiny" and record["repeats"] == 3
    assert record["identity"]["card_type"] == "cpu" and record["identity"]["card_count"] == 2
    assert record["identity"]["versions"]["torch"]
    assert list(record["figures"]) == list(FIGURES)
    for key in FIGURES:
        figure = record["figures"][key]
        assert len(figure["samples"]) == 3 and all(v > 0 for v in figure["samples"]), key
    # The roofline per card: each worker measured its own.
    assert sorted(record["figures"]["matmul.fp32"]["cards"]) == ["0", "1"]
    # Repeats interleaved: rank 0's samples came in core.benchmark.interleaved's order.
    events = [e for e in run.events() if e.get("type") == "bench_sample" and e.get("card") == "0"]
    assert [(e["repeat"], e["workload"]) for e in events] == bm.interleaved(list(FIGURES), 3)
    # The table, as a person reads it: every figure, no reference yet.
    assert "matmul roofline, fp32 (CPU)" in done.stdout and "training step, bench model" in done.stdout
    assert "no reference figure" in done.stdout and "fp32" in done.stdout
    assert "benchmark folder:" in done.stderr


def show(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(["benchmark", *argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def edited(record: dict[str, Any], path: Path, spread: tuple[float, float, float],
           scale: float = 1.0) -> Path:
    """``record`` with every figure's samples set around its median (``spread`` factors) times ``scale``."""
    out = json.loads(json.dumps(record))
    for figure in out["figures"].values():
        median = figure["median"]
        figure["samples"] = [median * f * scale for f in spread]
        figure.pop("cards", None)
    path.write_text(json.dumps(out))
    return path


def verdict_lines(out: str) -> list[str]:
    texts = [bm.WORKLOAD_OF[k].text for k in FIGURES]
    return [line for line in out.splitlines() if any(line.startswith(t) for t in texts)]


def test_references_made_from_the_run(bench_run: tuple[Run, subprocess.CompletedProcess[str]], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    run, _done = bench_run
    # The run itself as the reference: every figure as expected, whatever its spread.
    code, out, err = show(["--show", str(run.folder), "--reference", str(run.folder)], capsys)
    assert code == 0, err
    assert f"reference: run {run.name}" in out
    lines = verdict_lines(out)
    assert len(lines) == len(FIGURES) and all("as expected (+0 %" in line for line in lines), out
    record = json.loads((run.folder / bm.RESULT_NAME).read_text())
    tight = edited(record, tmp_path / "tight.json", (0.98, 1.0, 1.02))
    # Twice as fast a reference, beyond the spread: slower by 50 %.
    twice = edited(record, tmp_path / "twice.json", (0.98, 1.0, 1.02), scale=2.0)
    code, out, err = show(["--show", str(tight), "--reference", str(twice)], capsys)
    assert code == 0, err
    assert all("slower than the reference by 50 % (beyond the spread of 3 repeats)" in line
               for line in verdict_lines(out)), out
    # 13 % slower, but the repeats reach into the reference's range: not "slower".
    near = edited(record, tmp_path / "near.json", (0.98, 1.0, 1.02), scale=1.15)
    spread = edited(record, tmp_path / "spread.json", (0.9, 1.0, 1.15))
    code, out, _err = show(["--show", str(spread), "--reference", str(near)], capsys)
    assert all("cannot say (spread too wide: -13 % is within the spread of 3 repeats)" in line
               for line in verdict_lines(out)), out
    # A forced wide spread: cannot say, even against the twice-as-fast reference.
    wide = edited(record, tmp_path / "wide.json", (0.5, 1.0, 1.5))
    code, out, _err = show(["--show", str(wide), "--reference", str(twice)], capsys)
    assert all("cannot say (spread too wide: these 3 repeats spread 100 %" in line
               for line in verdict_lines(out)), out
    # The JSON says the same per figure.
    code, out, _err = show(["--show", str(wide), "--reference", str(twice), "--json"], capsys)
    assert {v["verdict"] for v in json.loads(out)["verdicts"]} == {"cannot say"}


def test_bad_references_are_refused_with_one_line(bench_run: tuple[Run, subprocess.CompletedProcess[str]],
                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, _done = bench_run
    record = json.loads((run.folder / bm.RESULT_NAME).read_text())
    record["identity"]["card_type"] = "HL-225"
    gaudi = tmp_path / "gaudi2.json"
    gaudi.write_text(json.dumps(record))
    code, out, err = show(["--size", "tiny", "--device", "cpu", "--reference", str(gaudi)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "measured on HL-225, this machine has cpu" in err, err
    missing = str(tmp_path / "nope.json")
    code, out, err = show(["--size", "tiny", "--device", "cpu", "--reference", missing], capsys)
    assert (code, out) == (2, "")
    assert err == f"gaudi-gui benchmark: --reference: {tmp_path / 'nope.json'}: no such file or run\n"
    # Another size is another benchmark.
    code, _out, err = show(["--device", "cpu", "--reference", str(run.folder)], capsys)
    assert code == 2 and "measured at size tiny, this benchmark runs standard (--size tiny)" in err
    assert not RunStore().runs()  # nothing started


def test_a_slow_card_among_eight_is_named_with_the_doctors_findings(fake_hl_smi: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """On a Gaudi server (the recorded 8-card one, replayed by the fake hl-smi, module 5 in power
    slowdown): the machine's identity and the doctor's findings per card as the benchmark records them,
    and the card whose roofline is low named with them."""
    from gaudi_gui.commands import benchmark as command

    monkeypatch.setenv("FAKE_HLSMI_MODE", "sick")
    assert command.machine_device("auto") == "hpu"
    kind = command.card_type("hpu", list(range(8)))
    assert kind == "HL-205"
    identity, findings = command.identity("hpu", list(range(8)), kind)
    assert identity["card_type"] == "HL-205" and identity["card_count"] == 8 and identity["driver"]
    assert any("card.throttle" in f and "active" in f for f in findings["5"]), findings.get("5")
    assert any("ports" in f and "DOWN" in f for f in findings["1"]), findings.get("1")
    # Eight cards' rooflines, card 5's a quarter below the others' beyond every spread.
    cards = {str(c): [400.0 + c, 404.0 + c, 402.0 + c] for c in range(8)}
    cards["5"] = [300.0, 306.0, 303.0]
    figure = bm.Figure("matmul.bf16", [401.0, 405.0, 403.0], cards)
    record = bm.judged({"kind": "benchmark", "size": "standard", "repeats": 3, "identity": identity,
                        "figures": {"matmul.bf16": figure.to_json()}, "card_findings": findings}, None)
    assert [s["card"] for s in record["slow_cards"]] == ["5"]
    text = bm.table_lines(record)
    at = text.index(next(line for line in text if line.startswith("SLOW CARD: module 5 is slower than the "
                                                                  "other modules by 25 %")))
    assert any("card.throttle" in line for line in text[at + 1:]), text[at:]
    assert "8 × HL-205" in text[0] and f"driver {identity['driver']}" in text[0]


def test_compare_two_benchmark_runs_by_clicks(bench_run: tuple[Run, subprocess.CompletedProcess[str]],
                                              qtbot: Any, tmp_path: Path) -> None:
    """Training → Runs, two benchmark runs selected, Compare clicked: one table, a row per figure (the
    roofline also per card), a column per run (median ± spread) and the later run's ratio to the first
    with the benchmark's verdict; the machine in the heading. The runs are copies of this module's real
    run (one benchmark costs ~10 s of the suite): the later one as measured again would read "as
    expected", so its decode is edited to half (tight repeats in both) and its training step to a wide
    spread, for the verdicts that say more. A benchmark run and a training run selected together: Compare
    says they cannot be compared."""
    from PySide6.QtCore import Qt

    from gaudi_gui.core.jobconfig import JobConfig
    from gaudi_gui.ui.benchmark_compare import BenchmarkCompare
    from gaudi_gui.ui.training_runs import RunsTable
    from tests import helpers

    run, _done = bench_run
    store = RunStore(tmp_path / "runs")
    first, later = store.root / "20261207-010000-benchmark", store.root / "20261207-020000-benchmark"
    import shutil
    for at, folder in enumerate((first, later)):
        shutil.copytree(run.folder, folder)
        Run(folder).update_status(started_at=1_000_000.0 + at)
    record = json.loads((run.folder / bm.RESULT_NAME).read_text())
    decode, train = record["figures"]["decode"]["median"], record["figures"]["train_step"]["median"]
    for folder, samples in ((first, {"decode": [decode * f for f in (0.98, 1.0, 1.02)]}),
                            (later, {"decode": [decode / 2 * f for f in (0.98, 1.0, 1.02)],
                                     "train_step": [train * 0.8 * f for f in (0.5, 1.0, 1.5)]})):
        edit = json.loads((folder / bm.RESULT_NAME).read_text())
        for key, values in samples.items():
            edit["figures"][key]["samples"] = values
        (folder / bm.RESULT_NAME).write_text(json.dumps(edit))
    made = store.create(JobConfig(training_args={"output_dir": str(tmp_path / "out")}))
    made.update_status(state="stopped", started_at=1_000_002.0)

    table = RunsTable(store)
    qtbot.addWidget(table)
    table.resize(1024, 600)
    with qtbot.waitExposed(table):
        table.show()
    try:
        rows = {found.name: r for r in range(table.table.rowCount())
                if (found := table._run_at(r)) is not None}
        assert set(rows) == {first.name, later.name, made.name}

        def select(*names: str) -> None:
            view = table.table
            for k, name in enumerate(names):
                at = view.visualRect(view.model().index(rows[name], 0)).center()
                modifier = Qt.KeyboardModifier.ControlModifier if k else Qt.KeyboardModifier.NoModifier
                qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, modifier, at)
            assert sorted(r.name for r in table.selected_runs()) == sorted(names)

        # Newest first in the list; the later run is judged against the earlier whatever the order clicked.
        select(later.name, first.name)
        helpers.click(qtbot, table.buttons["Compare"])
        view = table.benchmark_compare
        assert isinstance(view, BenchmarkCompare)
        qtbot.waitUntil(view.isVisible, timeout=5000)
        headers = [item.text() if (item := view.table.horizontalHeaderItem(c)) else ""
                   for c in range(view.table.columnCount())]
        assert headers == ["Figure", "Unit", first.name, later.name, f"{later.name} ÷ first"]
        assert view.heading.text().startswith("Machine: 2 × cpu"), view.heading.text()
        shown = view.rows()
        assert list(shown) == ["matmul roofline, fp32 (CPU)", "   card 0", "   card 1",
                               "all-reduce (bus bandwidth)", "decode, bench model",
                               "training step, bench model"]
        roofline = shown["matmul roofline, fp32 (CPU)"]
        assert roofline[0] == "TFLOPS" and " ± " in roofline[1] and roofline[1] == roofline[2]
        # Unedited figures: the same samples, as expected, ratio 1.
        for name in ("matmul roofline, fp32 (CPU)", "   card 0", "   card 1", "all-reduce (bus bandwidth)"):
            assert shown[name][3].startswith("1.00×: as expected (+0 %"), (name, shown[name])
        assert shown["decode, bench model"][3] == ("0.50×: slower than the first run by 50 % (beyond the "
                                                   "spread of 3 repeats)")
        assert shown["decode, bench model"][2].endswith("± 4 %")
        step = shown["training step, bench model"][3]
        assert step.startswith("0.80×: cannot say (spread too wide: these 3 repeats spread 100 %"), step
        assert not view.notes.isVisible()

        # A benchmark run and a training run: said in the list's status, nothing compared.
        select(first.name, made.name)
        assert table.buttons["Compare"].isEnabled()
        helpers.click(qtbot, table.buttons["Compare"])
        assert table.status.text().startswith("⚠ a benchmark run and a training run cannot be compared"), \
            table.status.text()
    finally:
        table.shutdown()
        table.close()
