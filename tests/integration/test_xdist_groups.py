"""tests/xdist_groups.py, the suite's ``--dist loadgroup`` scheduler, on a tiny suite run by a real
pytest with real xdist workers: a group's tests on one worker, the longest work first, a crashed
worker's tests reported or run elsewhere, and ``-n 0`` untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests import xdist_groups

ROOT = Path(__file__).resolve().parents[2]

SUITE = '''
import os, signal
import pytest

def record(name):
    # One file per worker, one line per test, in the order the worker ran them.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(os.environ["XG_LOG"], worker), "a") as fh:
        fh.write(name + "\\n")

@pytest.mark.parametrize("i", range(4))
def test_single(i):
    record(f"single{i}")

@pytest.mark.xdist_group("g")
@pytest.mark.parametrize("i", range(4))
def test_g(i):
    record(f"g{i}")
    if i == 1 and os.environ.get("XG_CRASH") and os.environ.get("PYTEST_XDIST_WORKER"):
        os.kill(os.getpid(), signal.SIGKILL)  # the worker dies in the middle of its group

@pytest.mark.xdist_group(name="h")
@pytest.mark.parametrize("i", range(3))
def test_h(i):
    record(f"h{i}")

@pytest.mark.parametrize("i", range(4, 8))
def test_single_more(i):
    record(f"single{i}")

def test_slow():
    record("slow")

if os.environ.get("XG_DIFFER") and os.environ.get("PYTEST_XDIST_WORKER") == "gw1":
    def test_only_on_gw1():
        record("only-gw1")
'''


Ran = dict[str, list[str]]  # worker -> the tests it ran, in order


def _run(tmp_path: Path, *args: str, crash: bool = False,
         differ: bool = False) -> tuple[subprocess.CompletedProcess[str], Ran]:
    suite = tmp_path / "suite"
    log = tmp_path / "log"
    suite.mkdir(exist_ok=True)
    log.mkdir()
    (suite / "test_tiny.py").write_text(SUITE)
    durations = tmp_path / "durations.json"
    # test_slow is collected last; its recorded duration must send it out first.
    durations.write_text(json.dumps({"test_tiny.py::test_slow": 100.0}))
    env = {**os.environ, "XG_LOG": str(log), "PYTHONPATH": str(ROOT),
           xdist_groups.DURATIONS_ENV: str(durations)}
    env.pop(xdist_groups.GROUPS_DIR_ENV, None)  # the outer session's, if it runs under xdist
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    if crash:
        env["XG_CRASH"] = "1"
    if differ:
        env["XG_DIFFER"] = "1"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-p", "tests.xdist_groups", "-o", "addopts=", "-rA", *args, "test_tiny.py"],
                          cwd=suite, env=env, capture_output=True, text=True, timeout=240)
    ran = {p.name: p.read_text().split() for p in log.iterdir()}
    return proc, ran


def _all(ran: dict[str, list[str]]) -> list[str]:
    return sorted(name for names in ran.values() for name in names)


EVERY = sorted([f"single{i}" for i in range(8)] + [f"g{i}" for i in range(4)] + [f"h{i}" for i in range(3)]
               + ["slow"])


def _worker_of(ran: dict[str, list[str]], name: str) -> str:
    return next(worker for worker, names in ran.items() if name in names)


def test_two_workers_keep_each_group_on_one_and_start_with_the_longest(tmp_path: Path) -> None:
    proc, ran = _run(tmp_path, "-n", "2", "--dist", "loadgroup")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _all(ran) == EVERY  # each test once
    assert set(ran) == {"gw0", "gw1"}  # both workers had work
    for group, size in (("g", 4), ("h", 3)):
        assert len({_worker_of(ran, f"{group}{i}") for i in range(size)}) == 1, ran
        worker = ran[_worker_of(ran, f"{group}0")]
        assert [n for n in worker if n.startswith(group)] == [f"{group}{i}" for i in range(size)]
    # The longest unit (100 s recorded) first, though collected last.
    assert "slow" in [names[0] for names in ran.values()], ran


def test_a_crashed_worker_s_test_is_reported_and_the_rest_of_its_group_runs_together_elsewhere(
        tmp_path: Path) -> None:
    proc, ran = _run(tmp_path, "-n", "2", "--dist", "loadgroup", crash=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "crashed while running 'test_tiny.py::test_g[1]'" in out, out
    assert "1 failed, 15 passed" in out, out
    assert _all(ran) == EVERY  # nothing run twice, nothing lost: g1 started once, crashed, not re-run
    crashed = _worker_of(ran, "g1")
    assert ran[crashed][-1] == "g1"  # that worker ended there
    assert _worker_of(ran, "g0") == crashed
    rest = {_worker_of(ran, "g2"), _worker_of(ran, "g3")}
    assert len(rest) == 1 and rest != {crashed}, ran  # the group's rest, together, on another worker
    assert len({_worker_of(ran, f"h{i}") for i in range(3)}) == 1


def test_workers_that_collect_different_tests_fail_the_run_and_run_nothing(tmp_path: Path) -> None:
    proc, ran = _run(tmp_path, "-n", "2", "--dist", "loadgroup", differ=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Different tests were collected between gw" in out, out
    assert ran == {}, ran


def test_without_workers_the_plugin_stays_out(tmp_path: Path) -> None:
    proc, ran = _run(tmp_path, "-n", "0", "--dist", "loadgroup")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(ran) == ["main"]
    assert _all(ran) == EVERY


def test_durations_are_merged_from_pytest_logs_and_kept_for_slow_tests_only(tmp_path: Path) -> None:
    out = tmp_path / "durations.json"
    out.write_text(json.dumps({"t.py::old": 9.0, "t.py::now_fast": 8.0}))
    log = tmp_path / "pytest.log"
    log.write_text("=== slowest 25 durations ===\n"
                   "61.80s setup    t.py::a\n12.00s call     t.py::a\n0.50s teardown t.py::a\n"
                   "4.00s call     t.py::b[x-1]\n1.00s call     t.py::now_fast\n"
                   "5 passed in 80.00s\n")
    assert xdist_groups.main([str(log), "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == {"t.py::a": 74.3, "t.py::old": 9.0, "t.py::b[x-1]": 4.0}
    assert list(json.loads(out.read_text())) == ["t.py::a", "t.py::old", "t.py::b[x-1]"]  # longest first


def test_the_committed_durations_name_tests_that_exist() -> None:
    """A renamed test would silently lose its place at the front."""
    known = xdist_groups.read_durations(xdist_groups.DURATIONS_FILE)
    assert known, "tests/durations.json is missing or empty"
    for nodeid in known:
        path = ROOT / nodeid.split("::")[0]
        assert path.is_file(), nodeid
        name = nodeid.split("::")[-1].split("[")[0]
        assert f"def {name}(" in path.read_text(), nodeid
