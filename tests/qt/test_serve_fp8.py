"""The Serve panel's FP8 field (issue 39), clicked: the calibrations of the model typed are offered from
the runs store; one of another card generation, one with files missing, one of another model (Browse…)
and one that vLLM is not here to serve are each refused at the field in core.fp8's one line, and Start
then starts nothing; a calibration that fits reaches the serve command line as --fp8. No INC runs: the
calibrate run folders are written as a calibration leaves them."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QFileDialog
from pytestqt.qtbot import QtBot

from gaudi_gui.core import serve as sv
from gaudi_gui.core.runstore import RunStore
from gaudi_gui.services.serve import ServeService
from gaudi_gui.ui.fp8_field import NONE_LABEL
from gaudi_gui.ui.serve_panel import ServePanel
from tests.helpers import choose, click, model_folder, write_calibration

CPU = {"device": "cpu", "generation": "cpu"}


def test_a_calibration_is_refused_at_the_field_or_reaches_serve(qtbot: QtBot, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    model = model_folder(tmp_path / "model")
    other = model_folder(tmp_path / "other-model", hidden=32)
    runs = RunStore().root
    runs.mkdir(parents=True, exist_ok=True)
    fits = write_calibration(runs / "20261207-0300-calibrate-model", model).resolve()
    gaudi3 = write_calibration(runs / "20261207-0301-calibrate-g3", model, device="hpu",
                               generation="gaudi3").resolve()
    broken = write_calibration(runs / "20261207-0302-calibrate-broken", model).resolve()
    (broken / "measure" / "inc_hooks_maxabs.npz").unlink()
    elsewhere = write_calibration(tmp_path / "calibrate-other", other).resolve()

    service = ServeService()
    started: list[list[str]] = []
    # What the service hands the agent (``gaudi-gui serve WORDS --detach``): recorded, not started.
    monkeypatch.setattr(service, "start_words", lambda words, host=None: started.append(words))
    monkeypatch.setattr(sv, "vllm_here", lambda: False)
    panel = ServePanel(service, machine=lambda: dict(CPU))
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    field = panel.fp8
    assert field.combo.currentText() == NONE_LABEL and field.value() == ""
    assert "--fp8" not in " ".join(panel.spec().cli_args())  # none: bf16

    panel.model.selectAll()
    qtbot.keyClicks(panel.model, str(model))
    offered = [field.combo.itemData(i) for i in range(field.combo.count())]
    assert offered == ["", str(broken), str(gaudi3), str(fits)]  # this model's, newest first

    # Another card generation: refused where it was chosen, in the one line serve --fp8 prints.
    choose(qtbot, field.combo, str(gaudi3))
    qtbot.waitUntil(field.error.isVisible, timeout=5000)
    assert field.error.text().startswith(f"--fp8 {gaudi3}: device type: calibrated hpu (gaudi3), here "
                                         "cpu (cpu) → scales are device-dependent: calibrate again on this")
    click(qtbot, panel.start_button)
    assert started == [] and panel.status.text() == "stopped" and panel.start_button.isEnabled()
    assert field.error.isVisible()

    choose(qtbot, field.combo, str(broken))
    qtbot.waitUntil(lambda: "measurement files" in field.error.text(), timeout=5000)
    assert "missing measure/inc_hooks_maxabs.npz → the run folder is incomplete" in field.error.text()
    click(qtbot, panel.start_button)
    assert started == []

    # Browse… to another model's calibration: offered, and refused for this model.
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *_a, **_k: str(elsewhere))
    click(qtbot, field.browse_button)
    qtbot.waitUntil(lambda: field.value() == str(elsewhere), timeout=5000)
    assert field.error.text().startswith(f"--fp8 {elsewhere}: model revision: calibrated {other} @ sha256:")
    assert "measurements belong to their model" in field.error.text()

    # The right calibration, but no vLLM here: FP8 serving is vLLM's, said before anything starts.
    choose(qtbot, field.combo, str(fits))
    qtbot.waitUntil(lambda: "FP8 serving runs through vLLM" in field.error.text(), timeout=5000)
    click(qtbot, panel.start_button)
    assert started == []

    # With vLLM: no line at the field, and Start gives the serve command --fp8 with the run folder.
    monkeypatch.setattr(sv, "vllm_here", lambda: True)
    click(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: len(started) == 1, timeout=5000)
    assert not field.error.isVisible() and panel.field_error.text() == ""
    assert started[0][0] == f"--model={model}" and started[0][-1] == f"--fp8={fits}"


def test_fp8_with_a_quantization_is_refused_at_the_fp8_field(qtbot: QtBot, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    model = model_folder(tmp_path / "model")
    runs = RunStore().root
    runs.mkdir(parents=True, exist_ok=True)
    fits = write_calibration(runs / "20261207-0300-calibrate-model", model).resolve()
    service = ServeService()
    started: list[list[str]] = []
    monkeypatch.setattr(service, "start_words", lambda words, host=None: started.append(words))
    monkeypatch.setattr(sv, "vllm_here", lambda: True)
    panel = ServePanel(service, machine=lambda: dict(CPU))
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    panel.model.selectAll()
    qtbot.keyClicks(panel.model, str(model))
    choose(qtbot, panel.fp8.combo, str(fits))
    assert not panel.fp8.error.isVisible()
    panel.quantization.setItemData(panel.quantization.findText("4bit"), "4bit")  # choose() walks to data
    choose(qtbot, panel.quantization, "4bit")
    click(qtbot, panel.start_button)
    assert started == []
    assert panel.fp8.error.text() == "FP8 serves the calibrated full model: no --quantization, no --adapter"


def test_the_window_knows_this_machine_from_the_agent_s_cards(qtbot: QtBot) -> None:
    """``AppServices.machine`` (what the FP8 fields check a calibration against): a CPU machine before
    any card; the card generation once the agent's samples name the cards (no tool run by the window)."""
    from gaudi_gui.app import window_services
    from gaudi_gui.core.devices import DeviceSample

    services = window_services()
    assert services.machine() == CPU
    services.ensure_poller().feed_samples([DeviceSample(kind="hpu", index=i, name="HL-325L", module_id=i)
                                           for i in range(2)])
    assert services.machine() == {"device": "hpu", "generation": "gaudi3"}


def test_a_calibration_on_two_cards_is_refused_for_a_serve_on_one(qtbot: QtBot, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's tensor-parallel ranks each read their own rank's files: a calibration measured on 2 ranks
    is refused at the field for a serve on one card (this CPU), in serve --fp8's line."""
    model = model_folder(tmp_path / "model")
    runs = RunStore().root
    runs.mkdir(parents=True, exist_ok=True)
    two = write_calibration(runs / "20261207-0300-calibrate-2", model, ranks=2).resolve()
    service = ServeService()
    started: list[list[str]] = []
    monkeypatch.setattr(service, "start_words", lambda words, host=None: started.append(words))
    monkeypatch.setattr(sv, "vllm_here", lambda: True)
    panel = ServePanel(service, machine=lambda: dict(CPU))
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    panel.model.selectAll()
    qtbot.keyClicks(panel.model, str(model))
    choose(qtbot, panel.fp8.combo, str(two))
    qtbot.waitUntil(panel.fp8.error.isVisible, timeout=5000)
    assert panel.fp8.error.text() == (
        f"--fp8 {two}: calibrated on 2 cards (2 ranks), this serve would run on 1 card (tensor parallel 1): "
        "serve on 2 cards (--cards with 2 ids) or calibrate again with --cards of 1 card")
    click(qtbot, panel.start_button)
    assert started == []
