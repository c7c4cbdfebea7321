"""core.run_copy without a host: what ``runs pack`` writes of a run (its records and profile, never its
checkpoints, rank pids or meter samples), and that unpacking a host's answer writes only those names
under the copy (a member that climbs out, an absolute path or a link is skipped)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from gaudi_gui.core import run_copy
from gaudi_gui.core.remote import Host


def _run(folder: Path) -> Path:
    (folder / "profile").mkdir(parents=True)
    (folder / "ranks").mkdir()
    (folder / "checkpoints" / "checkpoint-3").mkdir(parents=True)
    for name, text in (("config.json", "{}"), ("status.json", '{"state": "finished"}'), ("events.jsonl", ""),
                       ("meter.jsonl", "x" * 100), ("log.txt", "log"), ("ranks/0.json", '{"pid": 1}'),
                       ("checkpoints/checkpoint-3/model.bin", "weights"), ("profile/summary.json", "{}"),
                       ("profile/rank0.1.pt.trace.json", '{"traceEvents": []}')):
        (folder / name).write_text(text)
    return folder


def test_pack_then_unpack_keeps_the_records_and_the_profile(tmp_path: Path) -> None:
    run = _run(tmp_path / "20261207-030000-demo")
    buffer = io.BytesIO()
    assert run_copy.pack(run, buffer) == 5
    buffer.seek(0)
    written = run_copy.unpack(buffer, tmp_path / "copy")
    assert sorted(written) == ["config.json", "events.jsonl", "profile/rank0.1.pt.trace.json",
                               "profile/summary.json", "status.json"]
    assert (tmp_path / "copy" / "profile" / "rank0.1.pt.trace.json").read_text() == '{"traceEvents": []}'
    assert not (tmp_path / "copy" / "ranks").exists() and not (tmp_path / "copy" / "checkpoints").exists()


def test_unpack_writes_nothing_outside_the_copy(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in ("../escaped.json", "/tmp/absolute.json", "profile/../../up.json", "ranks/0.json",
                     "status.json", "profile/summary.json"):
            data = b"{}"
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("profile/link.json")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    buffer.seek(0)
    base = tmp_path / "base"
    into = base / "a" / "copy"
    assert sorted(run_copy.unpack(buffer, into)) == ["profile/summary.json", "status.json"]
    assert sorted(p.name for p in base.rglob("*") if p.is_file()) == ["status.json", "summary.json"]
    assert not (tmp_path / "escaped.json").exists() and not (tmp_path / "up.json").exists()


def test_a_copy_never_takes_a_local_runs_name(tmp_path: Path) -> None:
    host = Host.parse("gg-remote")
    (tmp_path / "20261207-030000-demo").mkdir()  # a run of this machine with that name
    where = run_copy.local_folder(host, "/home/u/runs/20261207-030000-demo", tmp_path)
    assert where == tmp_path / "20261207-030000-demo-gg-remote"
    # The same host's run fetched before: replaced in place.
    (tmp_path / "20261207-040000-demo").mkdir()
    (tmp_path / "20261207-040000-demo" / run_copy.ORIGIN_NAME).write_text(json.dumps(
        {"host": "gg-remote", "folder": "/home/u/runs/20261207-040000-demo"}))
    assert run_copy.local_folder(host, "/home/u/runs/20261207-040000-demo", tmp_path) == \
        tmp_path / "20261207-040000-demo"
