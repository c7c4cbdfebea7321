"""Each Slurm node's part of a job is metered (issue 27): the step on each node runs under a meter of its
own cards (``core.slurm meter-node``: nodes/<node>/meter.jsonl), and the batch shell sums the nodes'
parts into the job's meter-summary.json (``core.meter.combine``). A real one-node Slurm cluster, a real
training launch on the node, the fake hl-smi replaying recorded output (on the submitter's PATH, which
sbatch passes to the job)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gaudi_gui.core import meter, slurm
from tests.helpers import job_file
from tests.slurm_cluster import PARTITION, SlurmCluster

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]


@pytest.mark.usefixtures("demo_model")
def test_each_node_meters_its_own_cards_and_the_job_sums_them(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                              fake_hl_smi: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    # The node's cards as the cluster gives them to the job's step (sbatch passes this environment on).
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "2,3")
    job = job_file(tmp_path, tmp_path / "out", max_steps=3)
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(job), "--slurm",
                           "--device", "hpu", "--no-preflight", "--partition", PARTITION,
                           "--time", "10", "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = list((tmp_path / "runs").iterdir())
    node = slurm_cluster.node
    part = run / slurm.NODES_DIR / node
    samples = [json.loads(line) for line in (part / meter.METER_NAME).read_text().splitlines()]
    samples = [s for s in samples if "cards" in s]
    assert samples and {c["module_id"] for s in samples for c in s["cards"]} == {2, 3}
    own = json.loads((part / meter.SUMMARY_NAME).read_text())
    assert own["energy_source"] == "hl-smi power integrated" and own["energy_j"] > 0
    assert own["cards"] == [2, 3] and own["node"] == node
    whole = json.loads((run / meter.SUMMARY_NAME).read_text())
    assert whole["kind"] == "parts" and [p["name"] for p in whole["parts"]] == [node]
    assert whole["energy_j"] == own["energy_j"] and whole["card_hours"] == own["card_hours"]
    assert whole["energy_complete"] is True
    # The follower says the job's meter; runs show too.
    assert f"meter: the whole job (1 part: {node})" in done.stdout + done.stderr
    shown = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(tmp_path / "runs"),
                            "show", run.name], capture_output=True, text=True, timeout=60).stdout
    assert f"the whole job (1 part: {node})" in shown and "hl-smi power integrated" in shown


def test_a_node_that_measured_nothing_is_named_never_counted_as_0(tmp_path: Path) -> None:
    # Two nodes measured, one whose part has no power readings, one that wrote nothing at all.
    for name, joules in (("n1", 100.0), ("n2", 250.0), ("n3", None)):
        (tmp_path / slurm.NODES_DIR / name).mkdir(parents=True)
        (tmp_path / slurm.NODES_DIR / name / meter.SUMMARY_NAME).write_text(json.dumps(
            {"energy_j": joules, "energy_kwh": None if joules is None else joules / 3.6e6,
             "energy_source": "hl-smi power integrated" if joules else "not measured",
             "card_hours": 0.01, "wall_s": 36.0}))
    said = subprocess.run([sys.executable, "-m", "gaudi_gui.core.slurm", "combine-meter", str(tmp_path),
                           "n1", "n2", "n3", "n4"], capture_output=True, text=True, timeout=60)
    assert said.returncode == 0, said.stderr
    whole = json.loads((tmp_path / meter.SUMMARY_NAME).read_text())
    assert whole["energy_j"] == 350.0 and whole["energy_complete"] is False
    assert "no meter summary from n4" in whole["note"] and "energy not measured on n3" in whole["note"]
    assert whole["card_hours"] == pytest.approx(0.03)
    assert "the whole job (4 parts: n1, n2, n3, n4)" in said.stdout and "n4" in said.stdout
