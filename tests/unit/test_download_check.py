"""The download worker's digest of a file while it arrives (``workers.download.InflightCheck`` behind the
file it hands to huggingface_hub's ``http_get``), and the rate of a resumed download; no network."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from gaudi_gui.core import hub
from gaudi_gui.workers.download import InflightCheck, _Tee


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def _fetch(path: Path, etag: str, data: bytes, prefix: int, writes: list[tuple[str, bytes]]) -> hub.FileCheck:
    """``prefix`` bytes of ``data`` already on disk (an earlier attempt's), then the writes/seeks
    ``http_get`` would make; the check's verdict."""
    path.write_bytes(data[:prefix])
    with open(path, "ab") as fh:
        check = InflightCheck("model.safetensors", path, etag, len(data), resume=fh.tell(), enabled=True)
        tee = _Tee(fh, check)
        for op, chunk in writes:
            if op == "seek0":
                tee.seek(max(tee.tell() - prefix, 0))
                tee.truncate()
            elif op == "seek_back":
                tee.seek(tee.tell() - 10)
                tee.truncate()
            else:
                tee.write(chunk)
    return check.result()


def test_a_resumed_file_is_checked_against_its_etag_prefix_included(tmp_path: Path) -> None:
    data = os.urandom(3_000_000)
    for etag in (hashlib.sha256(data).hexdigest(), _git_sha1(data)):
        ok = _fetch(tmp_path / "f.incomplete", etag, data, 1_000_000,
                    [("w", data[1_000_000:2_000_000]), ("w", data[2_000_000:])])
        assert ok.result == "ok", ok
    # A prefix on disk that is not the Hub's bytes: the digest says so.
    bad_prefix = b"\0" * 1_000_000 + data[1_000_000:]
    bad = _fetch(tmp_path / "g.incomplete", hashlib.sha256(data).hexdigest(), bad_prefix, 1_000_000,
                 [("w", data[1_000_000:])])
    assert bad.result == "hash" and "sha256" in bad.message and "ETag" in bad.message


def test_a_server_that_restarts_from_byte_0_restarts_the_digest(tmp_path: Path) -> None:
    data = os.urandom(2_000_000)
    etag = hashlib.sha256(data).hexdigest()
    # http_get asked from byte 500,000 and got the whole file (200): it goes back to 0 and truncates.
    check = _fetch(tmp_path / "f.incomplete", etag, data, 500_000, [("seek0", b""), ("w", data)])
    assert check.result == "ok", check
    assert (tmp_path / "f.incomplete").read_bytes() == data


def test_a_stream_the_check_cannot_follow_hashes_the_file_and_sizes_are_checked(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    etag = hashlib.sha256(data).hexdigest()
    check = _fetch(tmp_path / "f.incomplete", etag, data, 0,
                   [("w", data[:50_000]), ("seek_back", b""), ("w", data[49_990:])])
    assert check.result == "ok", check
    short = _fetch(tmp_path / "g.incomplete", etag, data, 0, [("w", data[:99_000])])
    assert short.result == "size" and "99,000 bytes" in short.message


def test_resumed_bytes_count_as_done_but_not_in_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(hub, "time", SimpleNamespace(monotonic=lambda: now[0]))
    progress = hub.Progress(bytes_total=10**9)
    now[0] += 1.0
    progress.add_resumed(9 * 10**8)
    now[0] += 1.0
    progress.add_bytes(10**6)
    event = progress.event()
    assert event["bytes_done"] == 9 * 10**8 + 10**6
    assert event["rate"] == 5 * 10**5  # 1 MB in 2 s, not the 900 MB an earlier attempt fetched
    assert event["eta_s"] == 198.0


def test_the_window_says_a_partial_file_is_continued() -> None:
    # The Models tab's row says what the command line says: an earlier attempt's bytes are kept.
    from gaudi_gui.services.downloads import describe_event

    text = describe_event({"type": "resumed", "filename": "model.safetensors", "bytes": 3 * 1024 ** 2,
                           "size": 10 * 1024 ** 2})
    assert text.startswith("continuing model.safetensors from 3") and "already on disk" in text


def test_a_full_or_unwritable_destination_is_permanent_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the cache's file system refuses (full, read-only, not this user's) is not retried: the
    next attempt would be refused the same way. A dropped connection is retried."""
    import errno

    path = "/cache/models--org--m/blobs/abc.incomplete"
    for code, words in ((errno.ENOSPC, "full"), (errno.EROFS, "read-only"), (errno.EACCES, "may not write")):
        problem = hub.describe_error(OSError(code, os.strerror(code), path), "org/m", None)
        assert (problem.kind, problem.exit_code) == ("disk", hub.EXIT_FIX), code
        assert path in problem.message and words in problem.message, problem.message
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    dropped = hub.describe_error(ConnectionResetError(errno.ECONNRESET, "reset"), "org/m", None)
    assert (dropped.kind, dropped.exit_code) == ("network", hub.EXIT_TRANSIENT)


def test_no_eta_before_enough_bytes_and_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 23-byte first file 3 s in says nothing about a 300 MB download: no ETA ("ETA 10881h59m"
    before); once a MB arrived over seconds, the ETA is the rate's."""
    now = [1000.0]
    monkeypatch.setattr(hub, "time", SimpleNamespace(monotonic=lambda: now[0]))
    progress = hub.Progress(bytes_total=300 * 10**6, files_total=3)
    now[0] += 3.0
    progress.add_bytes(23)
    assert progress.event()["eta_s"] is None
    assert "ETA ?" in hub.progress_text(progress.event())
    now[0] += 1.0
    progress.add_bytes(2 * 10**6)
    event = progress.event()
    assert event["eta_s"] is not None and 100 < event["eta_s"] < 1000, event


def test_the_plan_counts_what_is_on_disk_and_says_counts_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    """300 MB of files not cached, 100 MB of them already on disk as partial files an attempt continues:
    200 MB to download, in the window and on the command line; one file is "1 file"."""
    from gaudi_gui.commands.download import _Out, _print_plan
    from gaudi_gui.services.downloads import describe_event

    plan = hub.Plan("org/m", "main", "c" * 40, "/cache",
                    [hub.PlanFile("config.json", 10**6, True), hub.PlanFile("model.safetensors", 3 * 10**8,
                                                                            False)],
                    free_bytes=10**12, partial_bytes=10**8)
    assert plan.to_download_bytes == 2 * 10**8
    text = describe_event({"type": "plan", **plan.to_dict()})
    assert "200.0 MB to download" in text and "100.0 MB of it already on disk" in text, text
    assert "2 files" in text and "1 already cached" in text
    _print_plan(_Out(False), plan)
    out = capsys.readouterr().out
    assert "to download 1 file (200.0 MB; 100.0 MB of it already on disk)" in out, out
    assert describe_event({"type": "verified", "files": 1, "seconds": 0.2}).startswith("checked 1 file ")
    again = describe_event({"type": "attempt", "attempt": 2, "attempts": 4, "files_left": 1,
                            "bytes_left": 3 * 10**8, "partial_bytes": 10**8})
    assert again == "attempt 2 of 4: 1 file (300.0 MB) left, 100.0 MB of it already on disk", again
