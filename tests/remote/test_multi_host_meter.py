"""The Gaudi compile meter of a job on two hosts (issue 27): each host's part is a run of its own, with its
own folder, supervisor and meter (``gaudi-gui train --hosts A,B``); at the end the command asks each host
for its part's summary over ssh (``runs show FOLDER --json``) and sums them
(``core.meter_account.combine``): the
host whose slowest rank compiled most is the job's figure, and each host's compile warning is said,
naming the host. Two SSH destinations to the test server (tests/remote/conftest.py). Host B has no rank
0: its folder's steps are its first rank's "step" events, and its meter times its bridge files by them
(the bridge files and steps written by tests/fake_hpu_bridge.py, in the bridge's exact format: a CPU
rank writes none)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gaudi_gui.commands import remote_run
from gaudi_gui.core import hpu_metrics, meter, meter_files, multi_host, remote, supervisor
from gaudi_gui.core.events import read_events
from tests.remote.conftest import SshHost

HOST_B = "gg-remote-b"  # the fixture's second alias of the same server
WRITER = Path(__file__).resolve().parents[1] / "fake_hpu_bridge.py"


def _part(folder: Path, step_event: str, steps: int) -> dict:
    """One host's part: a run folder, its meter started as the supervisor starts it (device hpu, the
    launch's PT_HPU_METRICS_FILE in the folder), the 'ranks' (the fake bridge), the supervisor's end."""
    (folder / hpu_metrics.FOLDER_NAME).mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "status.json").write_text('{"state": "finished"}')
    env = {"PATH": "", **hpu_metrics.launch_env(folder), "GAUDI_GUI_METER_RISE_WARMUP": "10"}
    m = meter.Meter(folder, device="hpu", env=env)
    m.start()
    subprocess.run([sys.executable, str(WRITER), str(folder / "events.jsonl"), str(steps), "--ranks", "0,1",
                    "--step-event", step_event], check=True, env={**env, "PATH": "/usr/bin:/bin"}, timeout=60)
    summary = supervisor.stop_meter(m, read_events(folder / "events.jsonl"), lambda _line: None)
    assert summary is not None
    return summary


def test_two_hosts_compile_meters_combined_and_each_warning_named(ssh_host: SshHost) -> None:
    runs = ssh_host.runs_dir
    # Host A (machine rank 0: its steps are rank 0's "metrics"): 11 steps, no rise yet to judge.
    a = _part(runs / "run-a", "metrics", 11)
    assert a["compile"]["compilations"] == 6 and "compile_warning" not in a
    # Host B (machine rank 1): 60 steps of its own "step" events; its slowest rank keeps compiling.
    b = _part(runs / "run-b", "step", 60)
    assert b["compile"]["compilations"] == 31 and b["compile"]["steady_compilations"] == 25
    assert b["compile_warning"]["from_step"] == 11

    parts = [remote_run.HostRun(remote.find_host(name), rank, folder=str(runs / run))
             for rank, (name, run) in enumerate((("gg-remote", "run-a"), (HOST_B, "run-b")))]
    whole = remote_run.job_meter(parts)  # each host asked over ssh: `runs show FOLDER --json`
    assert [p["name"] for p in whole["parts"]] == ["gg-remote", HOST_B]
    assert [p["compilations"] for p in whole["parts"]] == [6, 31]
    assert whole["compile"]["part"] == HOST_B and whole["compile"]["compilations"] == 31
    assert whole["compile_warning"]["part"] == HOST_B
    lines = remote_run.job_meter_lines(parts)
    assert lines[0].startswith(f"meter: the whole job (2 parts: gg-remote, {HOST_B}) · ")
    assert f" · 31 graph compilations (25 after warm-up) on {HOST_B} (" in lines[0], lines[0]
    assert "energy not measured on any part" in lines[0]  # no hl-smi here: never 0 J
    assert lines[1:] and lines[1].startswith(f"⚠ {HOST_B}: graph compilations keep rising after warm-up: "
                                             "25 in the 49 steps after step 11")
    assert "dataloader_drop_last" in lines[1]

    # The whole job's meter is kept in host 0's run (as `train --hosts` does at the end): `runs show`
    # and `runs list` there say the whole job, and host 0's own part stays beside it.
    said = multi_host.keep_job_meter(parts[0].host, parts[0].folder, whole)
    assert said.startswith("meter: the whole job's kept in gg-remote's run "), said
    code, out, err = remote.call(parts[0].host, parts[0].host.gaudi_gui_argv("runs", "show", parts[0].folder,
                                                                             "--json"))
    shown = json.loads(out)
    assert code == 0, err
    kept = shown["meter"]
    assert kept["kind"] == "parts" and [p["name"] for p in kept["parts"]] == ["gg-remote", HOST_B]
    assert (kept["card_hours"], kept["energy_j"], kept["energy_source"]) == (whole["card_hours"], None,
                                                                            "not measured")
    assert kept["compile"]["part"] == HOST_B and kept["compile"]["compilations"] == 31
    assert shown["meter_part"]["compile"]["compilations"] == 6  # host 0's own part, as it was
    listed = json.loads(remote.call(parts[0].host, parts[0].host.gaudi_gui_argv("runs", "list", "--json"))[1])
    assert [r["meter"]["kind"] for r in listed if r["folder"] == parts[0].folder] == ["parts"]
    # Asked again (a re-attached Training tab, a second follow), host 0's part is its own, not the job's.
    assert [p["compilations"] for p in remote_run.job_meter(parts)["parts"]] == [6, 31]
    # Anything but a job's meter is refused there, with why (exit 2), and nothing is written.
    code, _out, err = remote.call(parts[0].host, parts[0].host.gaudi_gui_argv("runs", "job-meter",
                                                                              parts[1].folder),
                                  input_text=json.dumps({"kind": "cpu"}))
    assert code == 2 and "not a job's meter" in err
    assert not (runs / "run-b" / meter_files.JOB_SUMMARY_NAME).exists()
