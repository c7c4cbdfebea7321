"""Each Slurm node's part of a job is metered (issue 27): the step on each node runs under a meter of its
own cards (``core.slurm meter-node``: nodes/<node>/meter.jsonl), and the batch shell sums the nodes'
parts into the job's meter-summary.json
(``core.meter_account.combine``). A real one-node Slurm cluster, a real
training launch on the node, the fake hl-smi replaying recorded output (on the submitter's PATH, which
sbatch passes to the job)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gaudi_gui.core import meter_account, meter_files, slurm
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
    samples = [json.loads(line) for line in (part / meter_files.METER_NAME).read_text().splitlines()]
    samples = [s for s in samples if "cards" in s]
    assert samples and {c["module_id"] for s in samples for c in s["cards"]} == {2, 3}
    own = json.loads((part / meter_files.SUMMARY_NAME).read_text())
    assert own["energy_source"] == "hl-smi power integrated" and own["energy_j"] > 0
    assert own["cards"] == [2, 3] and own["node"] == node
    whole = json.loads((run / meter_files.SUMMARY_NAME).read_text())
    assert whole["kind"] == "parts" and [p["name"] for p in whole["parts"]] == [node]
    assert whole["energy_j"] == own["energy_j"] and whole["card_hours"] == own["card_hours"]
    assert whole["energy_complete"] is True
    # The follower says the job's meter; runs show too.
    assert f"meter: the whole job (1 part: {node})" in done.stdout + done.stderr
    shown = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(tmp_path / "runs"),
                            "show", run.name], capture_output=True, text=True, timeout=60).stdout
    assert f"the whole job (1 part: {node})" in shown and "hl-smi power integrated" in shown
    # env.json records what the nodes use: the batch script's exports (no compile-meter path in the
    # shared run folder: no node writes there), and each node what it added, in its own part.
    recorded = json.loads((run / "env.json").read_text())
    script = (run / slurm.SCRIPT_NAME).read_text().splitlines()
    exported = dict(shlex.split(line)[1].split("=", 1) for line in script
                    if line.startswith("export ") and "=" in line)
    assert recorded["set_by_gaudi_gui"] == exported, (recorded, exported)
    assert "PT_HPU_METRICS_FILE" not in recorded["set_by_gaudi_gui"]
    assert recorded["per_node"]["recorded_in"] == f"{slurm.NODES_DIR}/<node>/{slurm.NODE_ENV_NAME}"
    node_env = json.loads((part / slurm.NODE_ENV_NAME).read_text())
    assert node_env["node"] == node
    assert node_env["set_by_gaudi_gui"]["PT_HPU_METRICS_FILE"] == str(part / "hpu-metrics" / "metrics.json")
    # command.txt / command.json say what ran (the sbatch line, the script's one step, each node's task,
    # never a launch in one place), and the run folder has no compile-meter folder nobody writes.
    assert not (run / "hpu-metrics").exists() and (part / "hpu-metrics").is_dir()
    command = json.loads((run / "command.json").read_text())
    assert command["argv"] == ["sbatch", "--parsable", str(run / slurm.SCRIPT_NAME)]
    assert command["env"] == exported and command["slurm"]["login"] == "local"
    assert command["slurm"]["node_task"] in script and f"{command['slurm']['step']} &" in script
    text = (run / "command.txt").read_text()
    assert text.splitlines()[-1] == f"sbatch --parsable {shlex.quote(str(run / slurm.SCRIPT_NAME))}"
    assert f"#   {command['slurm']['node_task']}" in text.splitlines()
    assert "PT_HPU_METRICS_FILE" not in text + json.dumps(command)


def test_a_node_that_measured_nothing_is_named_never_counted_as_0(tmp_path: Path) -> None:
    # Two nodes measured, one whose part has no power readings, one that wrote nothing at all.
    for name, joules in (("n1", 100.0), ("n2", 250.0), ("n3", None)):
        (tmp_path / slurm.NODES_DIR / name).mkdir(parents=True)
        (tmp_path / slurm.NODES_DIR / name / meter_files.SUMMARY_NAME).write_text(json.dumps(
            {"energy_j": joules, "energy_kwh": None if joules is None else joules / 3.6e6,
             "energy_source": "hl-smi power integrated" if joules else "not measured",
             "card_hours": 0.01, "wall_s": 36.0}))
    said = subprocess.run([sys.executable, "-m", "gaudi_gui.core.slurm", "combine-meter", str(tmp_path),
                           "n1", "n2", "n3", "n4"], capture_output=True, text=True, timeout=60)
    assert said.returncode == 0, said.stderr
    whole = json.loads((tmp_path / meter_files.SUMMARY_NAME).read_text())
    # n1's and n2's 350 J are half the job's card-hours (n4 weighs as the others): partial, never
    # the job's energy (issue 37 item 4).
    assert whole["energy_j"] is None and whole["energy_complete"] is False
    assert whole["energy_status"] == meter_account.PARTIAL and whole["energy_read_j"] == 350.0
    assert whole["energy_coverage"] == pytest.approx(0.5)
    assert "no meter summary from n4" in whole["note"] and "energy not measured on n3" in whole["note"]
    assert whole["card_hours"] == pytest.approx(0.03)
    assert "the whole job (4 parts: n1, n2, n3, n4)" in said.stdout and "n4" in said.stdout


def test_each_node_has_its_own_compile_meter_and_the_job_keeps_it(slurm_cluster: SlurmCluster,
                                                                   tmp_path: Path) -> None:
    """A Gaudi step on the real cluster's node: ``meter-node --device hpu`` gives the node's ranks
    PT_HPU_METRICS_FILE in the node's own part (nodes/<node>/hpu-metrics/), as the batch script's task
    does; the ranks are the fake bridge writer (tests/fake_hpu_bridge.py: two ranks, the bridge's exact
    format, rank 0's name already taken so its file is ``.1``) logging rank 0's steps into the shared
    run folder. The node's summary has its compile meter split at the first step and the warning,
    named; ``combine-meter`` keeps both in the job's summary; ``runs show`` says them."""
    runs = tmp_path / "runs"
    folder = runs / "run-slurm-compile"
    node = slurm_cluster.node
    part = folder / slurm.NODES_DIR / node
    (part / "hpu-metrics").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "status.json").write_text(json.dumps({"state": "finished"}))
    # An earlier process of rank 0 on this node (3 graphs, closed): the bridge writes the next one's
    # file as metrics-rank0.json.1.
    (part / "hpu-metrics" / "metrics-rank0.json").write_text(json.dumps(
        [{"metric_name": "graph_compilation", "triggered_by": "process_exit",
          "generated_on": "2020-01-01T00:00:00", "statistics": {"TotalNumber": 3, "TotalTime": 2700}}]))
    env = slurm_cluster.env()
    env.pop("PT_HPU_METRICS_FILE", None)
    env.update(GAUDI_GUI_METER_RISE_WARMUP="10", GAUDI_GUI_METER_COMPILE_S="0.2")
    writer = Path(__file__).resolve().parents[1] / "fake_hpu_bridge.py"
    done = subprocess.run(["srun", "--partition", PARTITION, "--nodes", "1", "--ntasks", "1", "--time", "5",
                           sys.executable, "-m", "gaudi_gui.core.slurm", "meter-node", str(folder),
                           "--device", "hpu", "--", sys.executable, str(writer), str(folder / "events.jsonl"),
                           "60", "--ranks", "0,1"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in (part / "hpu-metrics").iterdir()) == [
        "metrics-rank0.json", "metrics-rank0.json.1", "metrics-rank1.json"]
    own = json.loads((part / meter_files.SUMMARY_NAME).read_text())
    compiled = own["compile"]
    # Rank 0 sets the pace: 3 + 6 before the first step, one every 2nd step from 12 to 60.
    assert compiled["rank"] == 0 and compiled["compilations"] == 34
    assert compiled["warmup_compilations"] == 9 and compiled["steady_compilations"] == 25
    assert compiled["files"] == ["metrics-rank0.json", "metrics-rank0.json.1"] and compiled["truncated"]
    assert [r["compilations"] for r in compiled["ranks"]] == [34, 19]
    assert compiled["cpu_fallback_ops"] == {"aten::digamma": 2}
    assert compiled["recipe_cache_hit_rate"] == 0.9
    finding = own["compile_warning"]
    assert finding["part"] == node
    assert finding["message"].startswith(f"{node}: graph compilations keep rising")
    assert finding["steady_compilations"] == 25 and finding["from_step"] == 11
    assert f"gaudi-gui: ⚠ {node}: graph compilations keep rising" in done.stdout
    # The warning event went into the run's events (the folder every node shares), naming the node.
    warned = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()
              if '"warning"' in line]
    assert [w["part"] for w in warned] == [node]

    # Before the batch shell combines (a job still running, or ended before its shell did), the Runs
    # list and the Training tab read the nodes' bridge files themselves.
    from gaudi_gui.core.events import read_events
    early = meter_files.run_compile(folder, None, read_events(folder / "events.jsonl"))
    assert slurm.NODES_DIR == meter_files.NODES_DIR
    assert early is not None and early["part"] == node and early["compilations"] == 34
    assert early["steady_compilations"] == 25

    said = subprocess.run([sys.executable, "-m", "gaudi_gui.core.slurm", "combine-meter", str(folder), node],
                          capture_output=True, text=True, timeout=60)
    assert said.returncode == 0, said.stderr
    assert f"34 graph compilations (25 after warm-up) on {node}" in said.stdout
    whole = json.loads((folder / meter_files.SUMMARY_NAME).read_text())
    assert whole["compile"]["compilations"] == 34 and whole["compile"]["part"] == node
    assert whole["compile_warning"] == finding and whole["compile_warnings"] == [finding]
    assert whole["parts"][0]["compilations"] == 34
    shown = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(runs), "show",
                            folder.name], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"compile meter ({node}, the part that compiled most): 34 graph compilations" in shown.stdout
    assert f"⚠ {node}: graph compilations keep rising after warm-up: 25 in the 49 steps" in shown.stdout

