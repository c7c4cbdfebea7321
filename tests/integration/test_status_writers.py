"""One writer of status.json, one atomic write (issue 26): a supervisor writing steps as fast as it can
while `runs list`, `runs show` and a reader loop read the same run; readers never write."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from gaudi_gui.core import atomic
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore

WRITES = 3000

_WRITER = """
import sys
from gaudi_gui.core.runstore import Run
run = Run(sys.argv[1])
run.write_supervisor()
for step in range(1, int(sys.argv[2]) + 1):
    run.update_status(state="running", step=step, max_steps=int(sys.argv[2]))
run.update_status(state="finished", exit_code=0, summary="Finished")
"""


def test_readers_never_see_a_damaged_run_while_its_supervisor_writes(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    run = store.create(JobConfig(name="hammer", training_args={"output_dir": str(tmp_path / "out")}))
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(run.folder), str(WRITES)],
                              stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    damaged: list[str] = []
    cli_damaged: list[str] = []
    calls: list[int] = []

    def cli_reader() -> None:
        while writer.poll() is None:
            for argv in (["runs", "--runs-dir", str(store.root), "list", "--json"],
                         ["runs", "--runs-dir", str(store.root), "show", run.name, "--json"]):
                done = subprocess.run([sys.executable, "-m", "gaudi_gui", *argv], capture_output=True,
                                      text=True, timeout=60)
                calls.append(done.returncode)
                if done.returncode != 0:
                    cli_damaged.append(done.stderr[-300:])
                if "amaged" in done.stdout or "not JSON" in done.stdout or "truncated" in done.stdout \
                        or "is empty" in done.stdout:
                    cli_damaged.append(done.stdout[:300])

    thread = threading.Thread(target=cli_reader)
    thread.start()
    try:
        while writer.poll() is None:
            status = Run(run.folder).reconcile()
            seen.append(status.state)
            if status.error_kind == "damaged" or status.state not in ("queued", "running", "finished"):
                damaged.append(status.summary or status.state)
    finally:
        thread.join(timeout=120)
        _out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err[-2000:]
    assert len(seen) > 50  # the readers really raced the writes
    assert damaged == [] and cli_damaged == []
    assert calls  # the command line read it while it was written
    final = json.loads(run.status_path.read_text())
    assert final["state"] == "finished" and final["step"] == WRITES
    assert not list(run.folder.glob("*.tmp"))  # no temporary left behind


def test_two_writers_of_one_file_never_fail_or_leave_it_damaged(tmp_path: Path) -> None:
    """The atomic write with a unique temporary: the fixed `status.json.tmp` lost ~530 of 20,000
    renames (FileNotFoundError) with two writers."""
    target = tmp_path / "status.json"
    script = ("import sys\nfrom gaudi_gui.core import atomic\n"
              "for i in range(2000):\n    atomic.write_json(sys.argv[1], {'writer': sys.argv[2], 'i': i}, "
              "fsync=False)\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(target), name], stderr=subprocess.PIPE,
                              text=True) for name in ("a", "b")]
    bad = 0
    while any(p.poll() is None for p in procs):
        try:
            data = json.loads(target.read_text())
        except FileNotFoundError:
            continue
        except ValueError:
            bad += 1
            continue
        assert data["writer"] in ("a", "b")
    for proc in procs:
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
    assert bad == 0
    assert json.loads(target.read_text())["i"] == 1999
    assert not list(tmp_path.glob(".*.tmp"))
    atomic.write_text(target, "x")
    assert target.stat().st_mode & 0o777 == 0o600


def test_a_reader_does_not_write_the_status_of_a_run_whose_supervisor_is_gone(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    run = store.create(JobConfig(name="dead", training_args={"output_dir": str(tmp_path / "out")}))
    run.update_status(state="running", pid=2 ** 22 + 7, pid_create_time=1.0, started_at=1.7e9, step=3)
    with open(run.events_path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"type": "metrics", "step": 3, "max_steps": 10, "loss": 1.0}) + "\n")
    before = run.status_path.read_bytes()
    status = run.reconcile()
    assert status.state != "running"  # told as its events prove
    assert run.status_path.read_bytes() == before  # and never written by a reader
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(store.root), "list",
                           "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["status"]["state"] != "running"
    assert run.status_path.read_bytes() == before
