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


def _calibration(folder: Path, ranks: int = 2) -> Path:
    """A calibrate run folder as `gaudi-gui calibrate` leaves it: its configs name its measurements by
    absolute path."""
    from gaudi_gui.core import fp8
    from tests.helpers import write_calibration
    folder.mkdir(parents=True)
    write_calibration(folder, "sshleifer/tiny-gpt2", ranks=ranks)
    for name, mode in ((fp8.QUANT_CONFIG_NAME, "MEASURE"), (fp8.QUANTIZE_CONFIG_NAME, "QUANTIZE")):
        (folder / name).write_text(json.dumps({"mode": mode, "dump_stats_path": fp8.dump_prefix(folder)}))
    (folder / "status.json").write_text('{"state": "finished", "kind": "calibrate"}')
    (folder / "calibrate-job.json").write_text('{"prompts": ["private"]}')
    return folder


def test_a_calibration_travels_whole_and_points_at_its_new_place(tmp_path: Path) -> None:
    """Issue 39, "downloadable with the model": the manifest, both QUANT_CONFIGs and every rank's
    measurements go; the copy's configs name the copy's measurements (INC reads the path as written)."""
    from gaudi_gui.core import fp8
    run = _calibration(tmp_path / "made" / "20261207-050000-calibrate")
    buffer = io.BytesIO()
    run_copy.pack(run, buffer)
    buffer.seek(0)
    store = tmp_path / "elsewhere" / "runs"
    copy = run_copy.receive(buffer, store, run.name, came_from="gaudi3-a", folder=str(run))
    assert copy == store / run.name
    measurements = sorted(str(p.relative_to(run)) for p in (run / fp8.MEASURE_DIR).iterdir())
    assert len(measurements) == 6  # 3 files a rank, 2 ranks
    assert sorted(str(p.relative_to(copy)) for p in (copy / fp8.MEASURE_DIR).iterdir()) == measurements
    manifest_text = (run / fp8.MANIFEST_NAME).read_text()
    assert json.loads((copy / fp8.MANIFEST_NAME).read_text()) == json.loads(manifest_text)
    for name in (fp8.QUANT_CONFIG_NAME, fp8.QUANTIZE_CONFIG_NAME):
        for folder in (copy, run):
            config = json.loads((folder / name).read_text())
            assert config["dump_stats_path"] == str(folder.resolve() / "measure" / "inc")
    assert not (copy / "calibrate-job.json").exists()  # the prompts stay where they were measured
    origin = run_copy.origin(copy)
    assert origin is not None and origin["host"] == "gaudi3-a"
    manifest, found = fp8.check(copy, here={"device": "cpu", "generation": "cpu"})
    assert found == [] and manifest["ranks"] == 2
    assert "its FP8 measurements: 6 files, measured on cpu (cpu), usable with --fp8 " + run.name \
        in run_copy.describe_fetched(copy)
    # Sent again: the same copy replaced in place; from elsewhere under the same name: a second one.
    buffer.seek(0)
    assert run_copy.receive(buffer, store, run.name, came_from="gaudi3-a", folder=str(run)) == copy
    buffer.seek(0)
    other = run_copy.receive(buffer, store, run.name, came_from="gaudi3 b", folder=str(run))
    assert other == store / f"{run.name}-gaudi3_b"


def test_a_moved_calibration_is_pointed_at_where_it_is(tmp_path: Path) -> None:
    """vLLM's QUANT_CONFIG for a calibration moved by hand names the measurements where they are now."""
    from gaudi_gui.core import fp8
    run = _calibration(tmp_path / "a" / "20261207-050000-calibrate", ranks=1)
    moved = tmp_path / "b" / run.name
    moved.parent.mkdir()
    run.rename(moved)
    config = json.loads(Path(fp8.vllm_env(moved)["QUANT_CONFIG"]).read_text())
    assert config == {"mode": "QUANTIZE", "dump_stats_path": str(moved.resolve() / "measure" / "inc")}
    assert fp8.relocate(moved) == []  # already right: nothing written


def test_receive_refuses_what_is_no_run(tmp_path: Path) -> None:
    tmp_path = tmp_path / "store"
    tmp_path.mkdir()
    for name in ("../up", "a/b", "", ".", "-x", "x" * 201):
        try:
            run_copy.receive(io.BytesIO(b""), tmp_path, name, came_from="m", folder="/f")
        except run_copy.FetchError as exc:
            assert "is not a run name" in str(exc)
        else:
            raise AssertionError(f"{name!r} was taken")
    for stream, words in ((io.BytesIO(b"not a tar at all" * 100), "not a packed run"),
                          (io.BytesIO(), "not a packed run")):
        try:
            run_copy.receive(stream, tmp_path, "20261207-run", came_from="m", folder="/f")
        except run_copy.FetchError as exc:
            assert words in str(exc), exc
        else:
            raise AssertionError("garbage was taken")
    assert [p.name for p in tmp_path.iterdir()] == []  # no staging folder left
