"""Folders and files watched for changes made by other processes, through one ``QFileSystemWatcher`` for
the whole window process (inotify on Linux, read on the event loop: no thread, no polling).

Each watcher holds an inotify instance and a user gets 128 of them, so every view shares this one:
``watch`` and ``unwatch`` count who asked for a path (two views on one folder do not take each other's
watch away), and ``changed`` carries the path that changed to everyone (each view keeps to its own
paths). A path the kernel would not watch (no inotify, a network file system, the watch limit) comes
back from ``watch``: the view looks at it some other way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from PySide6.QtCore import QCoreApplication, QFileSystemWatcher, QObject, Signal


class DiskWatch(QObject):
    #: A watched folder's entries or a watched file changed: its path.
    changed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.watcher = QFileSystemWatcher(self)
        self.watcher.directoryChanged.connect(self.changed)
        self.watcher.fileChanged.connect(self.changed)
        self._askers: Counter[str] = Counter()

    def watch(self, paths: Iterable[str]) -> list[str]:
        """Watch ``paths`` (once more each); the ones that cannot be watched."""
        wanted = [p for p in dict.fromkeys(paths) if p]
        # Not watched now (a file replaced by an atomic rename loses its watch: it is taken again).
        new = [p for p in wanted if not self.watching(p)]
        failed = set(self.watcher.addPaths(new)) if new else set()
        for path in wanted:
            if path not in failed:
                self._askers[path] += 1
        return sorted(failed)

    def unwatch(self, paths: Iterable[str]) -> None:
        """Give up one watch of each of ``paths`` (the last one removes it)."""
        gone = []
        for path in dict.fromkeys(paths):
            if self._askers[path] <= 0:
                continue
            self._askers[path] -= 1
            if self._askers[path] == 0:
                del self._askers[path]
                gone.append(path)
        if gone:
            self.watcher.removePaths(gone)

    def watching(self, path: str) -> bool:
        """Whether the kernel watches ``path`` now."""
        return path in self.watcher.directories() or path in self.watcher.files()


_SHARED: DiskWatch | None = None


def shared() -> DiskWatch:
    """The process's one watch (made on first use, owned by the application)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = DiskWatch(QCoreApplication.instance())
    return _SHARED


__all__ = ["DiskWatch", "shared"]
