"""A long run history with a few damaged folders, read by ``gaudi-gui runs`` as a user runs it (real
subprocesses): each damaged run shows its own problem in one sentence, every other run is listed, the
command exits 0 and never prints a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import DAMAGED_RUNS, run_history

HISTORY = 2000


def runs(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(root), *args],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("history") / "runs"
    return root, run_history(root, HISTORY)


def test_runs_list_shows_every_run_and_each_damaged_ones_problem(history: tuple[Path, list[str]]) -> None:
    root, sound = history
    proc = runs(root, "list")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert len(lines) == HISTORY + len(DAMAGED_RUNS)
    by_name = {line.split()[0]: line for line in lines}
    assert set(sound) <= set(by_name)
    assert all("finished" in by_name[name] and "⚠" not in by_name[name] for name in sound)
    for name, problem in DAMAGED_RUNS.items():
        assert problem in by_name[name], by_name[name]
    # A truncated status is a failed run saying why, not "failed —" with nothing after it.
    assert "failed" in by_name["20250101-000002-cut"]


def test_runs_list_json_carries_the_problems(history: tuple[Path, list[str]]) -> None:
    root, sound = history
    proc = runs(root, "list", "--json")
    assert proc.returncode == 0, proc.stderr
    items = {item["name"]: item for item in json.loads(proc.stdout)}
    assert len(items) == HISTORY + len(DAMAGED_RUNS)
    for name, problem in DAMAGED_RUNS.items():
        assert items[name]["problems"] == [problem]
    assert all(items[name]["problems"] == [] for name in sound)
    assert items["20250101-000002-cut"]["status"]["summary"] == "Damaged run: status.json is truncated"


@pytest.mark.parametrize("name", list(DAMAGED_RUNS))
def test_runs_show_names_what_is_wrong(history: tuple[Path, list[str]], name: str) -> None:
    root, _sound = history
    proc = runs(root, "show", name)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.count("\n") == 1 and DAMAGED_RUNS[name] in proc.stdout, proc.stdout
