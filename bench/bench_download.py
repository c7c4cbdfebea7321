"""Hub downloads and the model library (issue 28), against the fake Hub on 127.0.0.1 (tests/fake_hub.py,
plain HTTP; nothing reaches the network).

- download: the wall time of ``gaudi-gui download REPO`` (the command, its watchdog, and one attempt
  child that plans, fetches and hashes the bytes against the Hub's digests as they arrive) against
  ``hf download REPO`` (huggingface_hub's own command, the same snapshot_download, no digest check) on
  the same file set, each into a fresh cache, interleaved. Goal: the app's throughput at least 0.95 of
  the library's (time ratio <= 1.05). A second row without the digest check (``--no-verify``) shows
  what the check costs. The machine's load (1-minute average, before and after) is in each row: the
  figures of a shared machine are only as good as its quiet.
- library: ``core.hub.list_cache`` (what ``gaudi-gui models`` and the Models tab read) against
  ``scan_cache_dir`` itself on a cache of 200 models, and ``gaudi-gui models --json`` as a command
  (goal < 1 s).

BENCH_DOWNLOAD_MB sets the model's size (default 200, quick 50), BENCH_DOWNLOAD_REPEATS the pairs
(5, quick 3).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import environ, interleaved, interleaved_metrics, row
from tests.fake_hub import FakeHub, FakeRepo

ROOT = Path(__file__).resolve().parents[1]
HF = Path(sys.executable).with_name("hf")


def _timed(argv: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=600)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed: {done.stderr[-1500:]}")
    return took


def _timed_cpu(argv: list[str]) -> dict[str, float]:
    """Wall time and CPU seconds (user + system of the command and every process it waited for): the
    CPU figure is the work done, which a busy shared machine disturbs far less than the wall time."""
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    took = _timed(argv)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"time": took, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def _download_rows(work: Path, megabytes: int, repeats: int) -> list[dict[str, Any]]:
    hub = FakeHub().start()
    try:
        data = os.urandom(megabytes * 1024 * 1024)
        hub.repos["bench/model"] = FakeRepo(files={"config.json": b'{"model_type": "llama"}',
                                                   "tokenizer.json": b"{}" * 5000,
                                                   "model.safetensors": data})
        counter = [0]

        def fresh() -> str:
            counter[0] += 1
            cache = work / f"cache-{counter[0]}"
            shutil.rmtree(cache, ignore_errors=True)
            return str(cache)

        def app(*extra: str) -> dict[str, float]:
            cache = fresh()
            try:
                return _timed_cpu([sys.executable, "-m", "gaudi_gui", "download", "bench/model",
                                   "--cache-dir", cache, *extra])
            finally:
                shutil.rmtree(cache, ignore_errors=True)

        def base() -> dict[str, float]:
            cache = fresh()
            try:
                if HF.exists():
                    return _timed_cpu([str(HF), "download", "bench/model", "--cache-dir", cache])
                return _timed_cpu([sys.executable, "-c", "import sys; from huggingface_hub import "
                               "snapshot_download as s; s('bench/model', cache_dir=sys.argv[1])", cache])
            finally:
                shutil.rmtree(cache, ignore_errors=True)

        with environ(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HUB_OFFLINE="0",
                     HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1"):
            load = [round(os.getloadavg()[0], 2)]
            checked = interleaved_metrics(app, base, repeats, warmup=1)
            load.append(round(os.getloadavg()[0], 2))
            unchecked = interleaved_metrics(lambda: app("--no-verify"), base, repeats)
            load.append(round(os.getloadavg()[0], 2))
        size = f"{megabytes} MB + 2 small files"
        baseline = "hf download" if HF.exists() else "snapshot_download"
        print(f"[download] load (1 min) {load[0]} -> {load[1]} -> {load[2]} on {os.cpu_count()} cores",
              file=sys.stderr)
        return [{**row(f"download: gaudi-gui download vs {baseline}, {size} (time)", checked["time"],
                       unit="s", goal="ratio <= 1.05 (throughput >= 0.95x)"), "load": load[:2]},
                {**row("download: same, CPU seconds (user+sys, all processes)", checked["cpu"], unit="s",
                       goal="ratio <= 1.05"), "load": load[:2]},
                {**row("download: same, --no-verify (time)", unchecked["time"], unit="s",
                       goal="ratio <= 1.05"), "load": load[1:]},
                {**row("download: --no-verify, CPU seconds", unchecked["cpu"], unit="s",
                       goal="ratio <= 1.05"), "load": load[1:]}]
    finally:
        hub.stop()


def _fake_cache(root: Path, models: int) -> None:
    """``models`` repos as huggingface_hub lays them out: a blob, a snapshot link, refs/main."""
    for i in range(models):
        repo = root / f"models--bench--model-{i:03d}"
        commit = f"{i:040x}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(commit)
        (repo / "blobs").mkdir()
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            blob = repo / "blobs" / f"{i:08x}{abs(hash(name)) % 10**8:08x}{'0' * 24}"
            blob.write_bytes(b"x" * (1000 + i))
            (snap / name).symlink_to(os.path.relpath(blob, snap))


def _library_rows(work: Path, repeats: int) -> list[dict[str, Any]]:
    cache = work / "library"
    _fake_cache(cache, 200)
    from huggingface_hub import scan_cache_dir

    from gaudi_gui.core import hub

    def app() -> float:
        started = time.perf_counter()
        listing = hub.list_cache(str(cache))
        assert len(listing.models) == 200
        return time.perf_counter() - started

    def base() -> float:
        started = time.perf_counter()
        assert len(scan_cache_dir(cache).repos) == 200
        return time.perf_counter() - started

    inproc = interleaved(app, base, repeats * 2, warmup=1)
    command = interleaved(lambda: _timed([sys.executable, "-m", "gaudi_gui", "models", "--json",
                                          "--cache-dir", str(cache)]),
                          lambda: _timed([sys.executable, "-c", "import sys; from huggingface_hub import "
                                          "scan_cache_dir; scan_cache_dir(sys.argv[1])", str(cache)]),
                          repeats)
    return [row("library: list_cache vs scan_cache_dir, 200 models", inproc, unit="ms", scale=1000,
                goal="ratio <= 1.2"),
            row("library: gaudi-gui models --json, 200 models (vs python + scan_cache_dir)", command,
                unit="s", goal="< 1 s")]


def run(quick: bool = False) -> list[dict[str, Any]]:
    megabytes = int(os.environ.get("BENCH_DOWNLOAD_MB", "50" if quick else "200"))
    repeats = int(os.environ.get("BENCH_DOWNLOAD_REPEATS", "3" if quick else "5"))
    work = Path(tempfile.mkdtemp(prefix="bench-download-"))
    try:
        return _download_rows(work, megabytes, repeats) + _library_rows(work, repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
