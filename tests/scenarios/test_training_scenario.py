"""One training scenario for every placement (this machine, a host over SSH, two hosts, a Slurm
cluster), driven by clicks in the real Training tab: the placement picked in the tab's placement widget
as a person does, Start — the first metrics arrive (points in the chart, the step and ETA); Stop —
"stopped", "Stopped at step N — checkpoint-N saved", a complete checkpoint; Resume — a new run linked
to the first whose first step is N+1 and whose curve continues the first run's; Stop again; nothing
left running (here, on the host, in Slurm; and the autouse leftover checks).

What only one placement has stays in its own file: the slow checkpoint's seconds (tests/qt/
test_training_tab.py), the dropped connection and the re-attach (tests/remote/
test_remote_training_tab.py), the two hosts' preview, log filter and a host's failure (tests/remote/
test_multi_host_tab.py), the Slurm fields, script and re-attach (tests/slurm/test_slurm_tab.py)."""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from gaudi_gui.core import remote
from gaudi_gui.core.launch import free_port
from gaudi_gui.core.runstore import checkpoint_complete
from gaudi_gui.ui.placement_widget import SEVERAL, SLURM
from gaudi_gui.ui.training_tab import TrainingTab
from tests.helpers import choose, click, end_training_tab, set_arg, training_tab, type_over, wait_until
from tests.slurm_cluster import PARTITION

HOST_B = "gg-remote-b"  # the SSH fixture's second alias of the same server: the second host

# Under xdist (--dist loadgroup) the training scenarios take turns on one worker, and the Slurm one
# runs on the worker of every other Slurm test (one cluster per session).
PLACEMENTS = [*(pytest.param(kind, marks=pytest.mark.xdist_group("training_scenario"))
                for kind in ("local", "host", "hosts")),
              pytest.param("slurm", marks=pytest.mark.xdist_group("slurm"))]

# Under load (two workers on two cores) the two-host run alone takes ~250 s, and the first test of a
# worker also builds the session's tiny model: more than the suite's 300 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@dataclass
class Place:
    """What a placement needs in the scenario."""

    #: Its entry picked in the placement widget (and its fields filled), as a person does.
    pick: Callable[[QtBot, TrainingTab], None]
    #: The output folder (a path at the place).
    out: Path
    #: What still runs there after the scenario (one line each).
    left: Callable[[], list[str]]
    #: Its run folders are this machine's, listed in the Runs page.
    in_history: bool


def _place(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    """Starts only what ``kind`` needs: nothing for this machine, the SSH server for hosts, the Slurm
    test cluster for Slurm."""
    if kind == "local":
        return Place(lambda qtbot, tab: choose(qtbot, tab.placement.host_combo, remote.LOCAL),
                     tmp_path / "out", list, in_history=True)
    if kind == "slurm":
        cluster = request.getfixturevalue("slurm")

        def pick_slurm(qtbot: QtBot, tab: TrainingTab) -> None:
            choose(qtbot, tab.placement.host_combo, SLURM)
            type_over(qtbot, tab.placement.slurm_partition, PARTITION)
            type_over(qtbot, tab.placement.slurm_cards, "1")

        return Place(pick_slurm, tmp_path / "out",
                     lambda: [] if wait_until(lambda: not cluster.jobs(), 30) else cluster.jobs(),
                     in_history=True)
    ssh_host = request.getfixturevalue("ssh_host")
    names = [ssh_host.dest] if kind == "host" else [ssh_host.dest, HOST_B]
    remote.save_hosts([remote.Host.parse(name) for name in names])

    def pick_hosts(qtbot: QtBot, tab: TrainingTab) -> None:
        if kind == "host":
            choose(qtbot, tab.placement.host_combo, ssh_host.dest)
            return
        choose(qtbot, tab.placement.host_combo, SEVERAL)
        for name in names:
            click(qtbot, tab.placement.host_checks[name])
            assert tab.placement.host_checks[name].isChecked()

    # The start gate asked the hosts' agent for its doctor: that agent stays, as it is meant to.
    return Place(pick_hosts, ssh_host.home / "out", lambda: ssh_host.wait_no_processes(30, but_agent=True),
                 in_history=False)


def _steps_drawn(tab: TrainingTab) -> list[int]:
    """The steps of the loss curve "this run" as the chart draws it."""
    items = [i for i in tab.chart.loss_plot.getPlotItem().listDataItems() if i.name() == "this run"]
    assert len(items) == 1, [i.name() for i in tab.chart.loss_plot.getPlotItem().listDataItems()]
    xs, _ys = items[0].getData()
    return [int(x) for x in (xs if xs is not None else [])]


@pytest.mark.usefixtures("demo_model")
@pytest.mark.parametrize("kind", PLACEMENTS)
def test_start_stop_resume_by_clicks(kind: str, qtbot: QtBot, tmp_path: Path,
                                     request: pytest.FixtureRequest) -> None:
    place = _place(kind, request, tmp_path)
    services, tab = training_tab(qtbot, tmp_path)
    try:
        place.pick(qtbot, tab)
        assert tab.placement.placement().kind == kind
        tab.form.model.setCurrentText("builtin:demo")
        tab.form.main_port.setValue(free_port())
        for name, text in (("output_dir", str(place.out)), ("max_steps", "100000"), ("save_steps", "100000"),
                           ("logging_steps", "1"), ("per_device_train_batch_size", "2")):
            set_arg(tab, name, text)

        # Start (on a host: after the card check there): the first metrics arrive.
        idle = tab.job
        click(qtbot, tab.btn["Start"])
        qtbot.waitUntil(lambda: tab.job is not idle, timeout=90000)
        job = tab.job
        assert job.kind == kind, tab.status.text()
        assert not tab.btn["Start"].isEnabled() and tab.btn["Stop"].isEnabled()
        qtbot.waitUntil(lambda: len(job.records) >= 2, timeout=240000)
        assert tab.chart.point_count() == len(job.records)
        assert _steps_drawn(tab) == [int(r["step"]) for r in job.records]
        # The ETA comes from the steps after warm-up only (the first ten of a long run: compilation
        # on Gaudi), "–" until then.
        eta_shown = r"step \d+/100000  ETA \d+(h\d\dm|m\d\ds|s)  loss \d\.\d{4}"
        qtbot.waitUntil(lambda: re.fullmatch(eta_shown, tab.eta.text()) is not None, timeout=240000)

        # Stop: a checkpoint at the end of the current step, where the run is.
        with qtbot.waitSignal(job.finished, timeout=180000) as done:
            click(qtbot, tab.btn["Stop"])
            assert tab.btn["Stop"].text() == "Kill now"
        assert done.args[1] == "stopped" and job.state == "stopped", tab.status.text()
        stopped = re.match(r"Stopped at step (\d+) — checkpoint-(\d+) saved", tab.status.text())
        assert stopped and stopped[1] == stopped[2], tab.status.text()
        step = int(stopped[1])
        assert step >= 2 and Path(job.checkpoint()).name == f"checkpoint-{step}", job.checkpoint()
        assert checkpoint_complete(place.out / f"checkpoint-{step}")
        assert tab.btn["Start"].isEnabled() and tab.btn["Resume"].isEnabled()
        assert not tab.btn["Stop"].isEnabled()
        first = _steps_drawn(tab)

        # Resume: a new run at the same place, linked to the first, from that checkpoint; its curve
        # continues the first run's, and its ETA counts only its own pace.
        click(qtbot, tab.btn["Resume"])
        resumed = tab.job
        assert resumed is not job and resumed.kind == kind, tab.status.text()
        assert resumed.host_names() == job.host_names()
        assert _steps_drawn(tab) == [s for s in first if s <= step]  # shown before the first new step
        qtbot.waitUntil(lambda: len(resumed.records) >= 2, timeout=240000)
        assert resumed.records[0]["step"] == step + 1, resumed.records[:2]
        assert resumed.progress.start_step == step
        assert resumed.folder != job.folder and resumed.resumed_from == job.folder
        status = json.loads((Path(resumed.folder) / "status.json").read_text())  # the place is this machine
        assert status.get("resumed_from") == job.folder, status
        assert _steps_drawn(tab) == list(range(first[0], resumed.progress.step + 1))
        assert tab.eta.text().startswith(f"step {resumed.progress.step}/100000  ETA"), tab.eta.text()
        assert resumed.progress.eta is not None and resumed.progress.eta > 60  # ~100000 steps to go

        with qtbot.waitSignal(resumed.finished, timeout=180000) as done:
            click(qtbot, tab.btn["Stop"])
        assert done.args[1] == "stopped", tab.status.text()
        assert tab.status.text().startswith("Stopped at step"), tab.status.text()
        if place.in_history:
            # The Runs page lists the resumed run with its link to the first.
            tab.runs.refresh()
            names = [tab.runs.table.item(r, 0).text() for r in range(tab.runs.table.rowCount())]
            assert f"{resumed.name} ↳ {job.name}" in names, names
    finally:
        end_training_tab(qtbot, services, tab)
    assert place.left() == []
