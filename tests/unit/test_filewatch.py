"""core.filewatch: a wait on a folder ends when a file there is written (inotify), not before, and
runs out at its timeout (at most cap_s) when nothing is."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from gaudi_gui.core.filewatch import FolderWatch


def test_a_write_wakes_the_wait_and_silence_times_out(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    log.write_text("")
    with FolderWatch(tmp_path, cap_s=5.0) as watch:
        assert watch.watching  # Linux: inotify, not a poll
        t0 = time.monotonic()
        assert watch.wait(0.3) is False
        assert 0.25 <= time.monotonic() - t0 < 1.5

        def write() -> None:
            time.sleep(0.3)
            with log.open("a") as fh:
                fh.write("a line\n")
        writer = threading.Thread(target=write)
        writer.start()
        t0 = time.monotonic()
        assert watch.wait(4.0) is True
        took = time.monotonic() - t0
        writer.join()
        assert 0.25 <= took < 2.0, took
        # Drained (the close that followed the write may still wake it once): then it sleeps again
        # until its time runs out.
        time.sleep(0.05)
        watch.wait(0.0)
        assert watch.wait(0.2) is False
        # A file made by an atomic rename (status.json) wakes it too.
        (tmp_path / "status.json.tmp").write_text("{}")
        watch.wait(0.0)
        (tmp_path / "status.json.tmp").rename(tmp_path / "status.json")
        assert watch.wait(1.0) is True


def test_the_cap_bounds_a_wait_and_a_missing_folder_falls_back_to_a_sleep(tmp_path: Path) -> None:
    with FolderWatch(tmp_path, cap_s=0.2) as watch:
        t0 = time.monotonic()
        assert watch.wait(10.0) is False
        assert time.monotonic() - t0 < 1.5
    with FolderWatch(tmp_path / "gone", fallback_s=0.05) as missing:
        assert not missing.watching
        t0 = time.monotonic()
        assert missing.wait(10.0) is False
        assert time.monotonic() - t0 < 1.0
