"""``--dist loadgroup`` for this suite, written against pytest-xdist's public scheduler protocol.

pytest-xdist 3.8 tells its own loadgroup scheduler a test's ``xdist_group`` by writing "@group" into
the private ``item._nodeid``, which pytest 9.2's structured node ids no longer read: every test was
scheduled alone, and two Slurm tests could start two clusters at once (pytest-dev/pytest-xdist#1386).
Here, with public API only:

- each worker writes the groups it collected (``item.iter_markers("xdist_group")``, ``item.nodeid``)
  to a folder the controller made (``xdist.is_xdist_worker``, ``xdist.get_xdist_worker_id``);
- the controller's scheduler (:class:`GroupScheduling`, returned by the documented
  ``pytest_xdist_make_scheduler`` hook) implements ``xdist.scheduler.protocol.Scheduling`` and talks
  to workers only through ``WorkerController.send_runtest_some`` / ``shutdown`` / ``shutting_down``.

What it schedules: every test of one ``xdist_group`` is one work unit, run on one worker (groups share
expensive module and session fixtures: the Slurm cluster, the wheel install); every other test is a
unit of its own. Units are handed out longest first (a group costs the sum of its tests), from the
durations of the slow tests in ``tests/durations.json``, so the two workers of ``make test`` finish
together instead of one starting a 60 s test at the end; tests with no recorded duration keep their
collection order after the slow ones. A worker that crashes: the test it was running is reported by
xdist as crashed (not run again: it might crash the next worker too), the rest of what it had been
given goes back to the front of the queue (a group's rest still as one unit) for the other worker or
xdist's replacement worker.

Refreshing the durations: ``GAUDI_GUI_DURATIONS_OUT=tests/durations.json make test`` records every
test's time as the workers report it (setup, call and teardown: a group's session fixture counts in
its first test) and writes the tests above ``SLOW_S`` there at the end of the run. ``python -m
tests.xdist_groups LOG...`` merges the "slowest durations" tables of pytest logs (``--durations=N``)
into the same file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: The environment variable naming the folder where workers write their groups (workers inherit it).
GROUPS_DIR_ENV = "GAUDI_GUI_XDIST_GROUPS"
#: Where the known durations of slow tests are read from (an override for the scheduler's own tests).
DURATIONS_ENV = "GAUDI_GUI_XDIST_DURATIONS"
#: Set to a path: the controller writes the durations of this run's slow tests there at the end.
DURATIONS_OUT_ENV = "GAUDI_GUI_DURATIONS_OUT"
DURATIONS_FILE = Path(__file__).resolve().parent / "durations.json"
#: Tests at least this long (seconds, setup to teardown) are recorded in durations.json.
SLOW_S = 3.0
#: What a test missing from durations.json is assumed to cost: under SLOW_S, since it is not there.
DEFAULT_S = 1.0


def _loadgroup(config: pytest.Config) -> bool:
    return bool(config.getoption("dist", None) == "loadgroup") and bool(config.getoption("numprocesses", 0))


def _is_worker(config: pytest.Config) -> bool:
    # xdist's documented marker of a worker's config (``xdist.is_xdist_worker`` reads the same).
    return hasattr(config, "workerinput")


def read_durations(path: Path | None = None) -> dict[str, float]:
    """The known durations (seconds by node id); an absent or damaged file is no knowledge, not an error:
    the schedule is then collection order, as before."""
    path = path or Path(os.environ.get(DURATIONS_ENV) or DURATIONS_FILE)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}


def write_durations(path: Path, durations: dict[str, float]) -> None:
    """Merge ``durations`` (tests at least ``SLOW_S``) into ``path``; a test measured this time and now
    under SLOW_S leaves the file. Sorted longest first so that a diff reads as a ranking."""
    known = read_durations(path)
    for nodeid, seconds in durations.items():
        if seconds >= SLOW_S:
            known[nodeid] = round(seconds, 1)
        else:
            known.pop(nodeid, None)
    ranked = dict(sorted(known.items(), key=lambda kv: (-kv[1], kv[0])))
    from gaudi_gui.core.atomic import write_text

    write_text(path, json.dumps(ranked, indent=1) + "\n", mode=0o644, fsync=False)


# --- the plugin's hooks (registered by tests/conftest.py; ``-p tests.xdist_groups`` for a test suite) ---

_state: dict[str, Any] = {}


def pytest_configure(config: pytest.Config) -> None:
    if _loadgroup(config) and not _is_worker(config):  # the controller, before workers start
        import shutil

        folder = tempfile.mkdtemp(prefix="gaudi-gui-xdist-groups-")
        os.environ[GROUPS_DIR_ENV] = folder  # the workers inherit it
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


@pytest.hookimpl(trylast=True)  # after every other plugin has selected or deselected items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    folder = os.environ.get(GROUPS_DIR_ENV)
    if not folder or not _is_worker(config):
        return
    from gaudi_gui.core.atomic import write_text

    groups = {}
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names:
            groups[item.nodeid] = "_".join(names)
    worker = str(config.workerinput.get("workerid", "worker"))  # type: ignore[attr-defined]
    write_text(Path(folder) / f"{worker}.json", json.dumps(groups), fsync=False)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    folder = os.environ.get(GROUPS_DIR_ENV)
    if not folder or not _loadgroup(config):
        return None
    scheduler = GroupScheduling(config, groups_dir=Path(folder), durations=read_durations())
    _state["scheduler"] = scheduler
    return scheduler


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get(DURATIONS_OUT_ENV)
    scheduler = _state.get("scheduler")
    if out and isinstance(scheduler, GroupScheduling) and scheduler.measured:
        write_durations(Path(out), scheduler.measured)


# --- the scheduler ---


@dataclass
class Unit:
    """Tests that go to one worker together: one group, or one test."""

    key: str
    tests: list[str]
    cost: float = 0.0


@dataclass
class _Node:
    """What one worker was given and has not finished, in the order it was sent (a worker runs its
    tests in that order, so the first is the one running)."""

    pending: list[tuple[str, str]] = field(default_factory=list)  # (node id, unit key)


class GroupScheduling:
    """``xdist.scheduler.protocol.Scheduling``: one unit per xdist_group, longest units first."""

    def __init__(self, config: pytest.Config, *, groups_dir: Path, durations: dict[str, float]) -> None:
        from xdist.workermanage import parse_tx_spec_config

        self.config = config
        self.numnodes = len(parse_tx_spec_config(config))
        self.groups_dir = groups_dir
        self.durations = durations
        #: Every test's time as the workers report it (for ``GAUDI_GUI_DURATIONS_OUT``).
        self.measured: dict[str, float] = {}
        self.collection: list[str] | None = None
        self.queue: list[Unit] = []
        self.work: dict[Any, _Node] = {}  # WorkerController -> what it holds
        self.collections: dict[Any, list[str]] = {}
        self.index: dict[Any, dict[str, int]] = {}  # node -> node id -> its index in that collection
        self.group_of: dict[str, str] = {}

    # -- the protocol's properties --

    @property
    def nodes(self) -> list[Any]:
        return list(self.work)

    @property
    def collection_is_completed(self) -> bool:
        return len(self.collections) >= self.numnodes

    @property
    def tests_finished(self) -> bool:
        # A worker runs a test only once it knows the next one (or is told to shut down): one pending
        # test left per worker is the end, and the session's shutdown lets each run its last.
        if not self.collection_is_completed or self.queue:
            return False
        return all(len(n.pending) < 2 for n in self.work.values())

    @property
    def has_pending(self) -> bool:
        return bool(self.queue) or any(n.pending for n in self.work.values())

    # -- the protocol's methods --

    def add_node(self, node: Any) -> None:
        assert node not in self.work
        self.work[node] = _Node()

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        assert node in self.work
        if self.collection is not None and list(collection) != self.collection:
            # A replacement worker that collected something else gets no work (xdist's own schedulers
            # do the same).
            self._report_diff(next(iter(self.collections)), collection, node, fail=False)
            node.shutdown()
            return
        self.collections[node] = list(collection)
        self.index[node] = {nodeid: i for i, nodeid in enumerate(collection)}

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        nodeid = self.collections[node][item_index]
        self.measured[nodeid] = duration
        pending = self.work[node].pending
        for i, (pid, _) in enumerate(pending):
            if pid == nodeid:
                del pending[i]
                break
        self._reschedule(node)

    def mark_test_pending(self, item: str) -> None:
        """A plugin (``pytest_handlecrashitem``) asks for a crashed test to be run again."""
        self.queue.insert(0, Unit(self._key(item), [item], self._cost([item])))
        for node in self.nodes:
            self._reschedule(node)

    def remove_pending_tests_from_node(self, node: Any, indices: Sequence[int]) -> None:
        """The worker gave back tests it had not started (only after a "steal", which this scheduler
        never sends; handled all the same): they go back to the front of the queue."""
        collection = self.collections[node]
        given_back = {collection[i] for i in indices}
        kept: list[tuple[str, str]] = []
        returned: list[tuple[str, str]] = []
        for entry in self.work[node].pending:
            (returned if entry[0] in given_back else kept).append(entry)
        self.work[node].pending = kept
        self.queue[:0] = self._units(returned)

    def remove_node(self, node: Any) -> str | None:
        """A worker finished or crashed. Crashed: the test it was running is returned for xdist to
        report, everything after it goes back to the front of the queue."""
        held = self.work.pop(node).pending  # its collection stays: the first ones decide completeness
        if not held:
            return None
        crashed, rest = held[0][0], held[1:]
        self.queue[:0] = self._units(rest)
        for other in self.nodes:
            self._reschedule(other)
        return crashed

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is None:
            first, collection = next(iter(self.collections.items()))
            for node, other in self.collections.items():
                if other != collection:
                    # xdist's schedulers abort the same way: the diff is a failed collection, no test
                    # is sent, and with nothing queued the session shuts the workers down.
                    self._report_diff(first, other, node, fail=True)
                    return
            self.collection = list(collection)
            self.group_of = self._read_groups()
            self.queue = self._plan(self.collection)
        for node in self.nodes:
            self._reschedule(node)

    # -- inside --

    def _read_groups(self) -> dict[str, str]:
        groups: dict[str, str] = {}
        for path in sorted(self.groups_dir.glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                groups.update(json.loads(path.read_text()))
        return groups

    def _key(self, nodeid: str) -> str:
        group = self.group_of.get(nodeid)
        return f"@group {group}" if group else nodeid

    def _cost(self, tests: list[str]) -> float:
        return sum(self.durations.get(t, DEFAULT_S) for t in tests)

    def _units(self, entries: list[tuple[str, str]]) -> list[Unit]:
        """Tests back into units, a group's tests together, in the order given."""
        units: dict[str, Unit] = {}
        for nodeid, key in entries:
            units.setdefault(key, Unit(key, [])).tests.append(nodeid)
        for unit in units.values():
            unit.cost = self._cost(unit.tests)
        return list(units.values())

    def _plan(self, collection: list[str]) -> list[Unit]:
        """Longest first; equal costs (the tests nobody recorded) in collection order."""
        units = self._units([(nodeid, self._key(nodeid)) for nodeid in collection])
        order = {id(u): i for i, u in enumerate(units)}
        return sorted(units, key=lambda u: (-u.cost, order[id(u)]))

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down or node not in self.collections:
            return
        held = self.work[node]
        # Two pending tests keep a worker busy: it runs one while it knows the next.
        while len(held.pending) < 2 and self.queue:
            unit = self.queue.pop(0)
            index = self.index[node]
            held.pending.extend((t, unit.key) for t in unit.tests)
            node.send_runtest_some([index[t] for t in unit.tests])
        if not self.queue:
            node.shutdown()  # it runs what it holds, then ends

    def _report_diff(self, first: Any, other: Sequence[str], node: Any, *, fail: bool) -> None:
        from xdist.report import report_collection_diff

        base = self.collection or self.collections[first]
        msg = report_collection_diff(base, list(other), first.gateway.id, node.gateway.id)
        if not msg:
            return
        print(msg, file=sys.stderr)
        if fail:
            self.config.hook.pytest_collectreport(report=pytest.CollectReport(
                nodeid=node.gateway.id, outcome="failed", longrepr=msg, result=[]))


# --- ``python -m tests.xdist_groups LOG...``: merge pytest's "slowest durations" tables ---

_DURATION_LINE = re.compile(r"^\s*([0-9.]+)s\s+(setup|call|teardown)\s+(\S+)\s*$")


def durations_from_logs(texts: list[str]) -> dict[str, float]:
    """Setup + call + teardown per test, from pytest's ``--durations`` tables (a later log wins)."""
    found: dict[str, float] = {}
    for text in texts:
        this: dict[str, float] = {}
        for line in text.splitlines():
            match = _DURATION_LINE.match(line)
            if match:
                this[match[3]] = this.get(match[3], 0.0) + float(match[1])
        found.update(this)
    return found


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="merge pytest --durations tables into durations.json")
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=DURATIONS_FILE)
    args = parser.parse_args(argv)
    found = durations_from_logs([p.read_text(errors="replace") for p in args.logs])
    write_durations(args.out, found)
    print(f"{len(found)} test durations read, {len(read_durations(args.out))} slow tests in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
