"""Issue 38, "a thin window": the window's views and services start no process and no thread. The
import-linter contract ``thin-window`` (pyproject.toml) keeps ``subprocess``, ``threading``,
``multiprocessing`` and ``concurrent`` out of them; what it cannot see is Qt's and ``os``'s ways to do
the same, found here in the source: a ``QProcess``, a ``QThread`` made or subclassed, a thread pool, a
fork or exec. What is still window-side is listed, as in the contract, until it moves to the agent."""

from __future__ import annotations

import ast
from pathlib import Path

import gaudi_gui

ROOT = Path(gaudi_gui.__file__).parent
#: Qt's ways to start a process or a thread.
QT_NAMES = frozenset({"QProcess", "QThreadPool", "QRunnable", "QtConcurrent"})
#: ``os``'s ways to start a process.
OS_CALLS = frozenset({"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "spawnl",
                      "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "execv",
                      "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe"})
#: asyncio's.
ASYNCIO_CALLS = frozenset({"create_subprocess_exec", "create_subprocess_shell", "to_thread"})
#: Still window-side (docs/architecture.md): nothing any more (a file listed here is allowed its finds).
LEFT: dict[str, str] = {}


def _found(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in QT_NAMES:
            found.append(node.id)
        elif isinstance(node, ast.alias) and node.name.split(".")[-1] in QT_NAMES:
            found.append(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id == "os" and node.attr in OS_CALLS) or \
                    (node.value.id == "asyncio" and node.attr in ASYNCIO_CALLS):
                found.append(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "QThread":
            found.append("QThread()")
        elif isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id == "QThread"
                                                    for b in node.bases):
            found.append(f"class {node.name}(QThread)")
    return [f"{path.relative_to(root)}: {what}" for what in sorted(set(found))]


def test_views_and_services_start_no_process_and_no_thread() -> None:
    found = [f for package in ("ui", "services") for path in sorted((ROOT / package).glob("*.py"))
             for f in _found(path)]
    allowed = {f"{where}: {what}" for where, what in LEFT.items()}
    assert [f for f in found if f not in allowed] == []
    # What moved to the agent comes off the list (a stale line would hide a new use in that file).
    assert sorted(allowed - set(found)) == []


def test_the_check_finds_each_way(tmp_path: Path) -> None:
    """The scanner is not blind: each way to start a process or a thread is found."""
    sample = tmp_path / "sample.py"
    sample.write_text("import os, asyncio\nfrom PySide6.QtCore import QProcess, QThread\n"
                      "class W(QThread):\n    pass\n"
                      "def f():\n    os.fork(); os.system('x'); asyncio.to_thread(f)\n"
                      "    QThread(); QProcess()\n")
    assert _found(sample, tmp_path) == [f"sample.py: {w}" for w in sorted(
        {"QProcess", "QThread()", "asyncio.to_thread", "class W(QThread)", "os.fork", "os.system"})]
