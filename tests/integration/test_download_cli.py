"""``gaudi-gui download`` and ``gaudi-gui models`` as a user runs them: real child processes against a
fake Hub on 127.0.0.1 (tests/fake_hub.py); nothing here reaches the network."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from gaudi_gui.core import hub as core_hub
from tests.fake_hub import FakeHub, FakeRepo, repo_from_folder

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hf_FakeTokenForTheTestsOnly0123456789abcd"


def gaudi(*args: str, env: dict[str, str] | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    assert os.environ["HF_ENDPOINT"].startswith("http://127.0.0.1:")
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=timeout)


def events_of(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def small_repo() -> FakeRepo:
    return FakeRepo(files={"config.json": b'{"a": 1}', "model.safetensors": os.urandom(3_000_000),
                           "tokenizer.json": b'{"t": 2}', "extra/notes.txt": b"notes"})


def test_download_plans_reports_progress_and_the_model_loads_offline(fake_hub: FakeHub,
                                                                      tiny_model_dir: Path) -> None:
    repo = repo_from_folder(tiny_model_dir)
    fake_hub.repos["org/tiny-llama"] = repo
    sizes = {name: len(data) for name, data in repo.files.items()}

    result = gaudi("download", "org/tiny-llama", "--json")
    assert result.returncode == 0, result.stderr
    evs = events_of(result.stdout)
    plan = next(e for e in evs if e["type"] == "plan")
    assert {f["filename"]: f["size"] for f in plan["files"]} == sizes
    assert not any(f["cached"] for f in plan["files"])
    assert plan["remaining_bytes"] == sum(sizes.values()) and plan["free_bytes"] > 0
    progress = [e for e in evs if e["type"] == "progress"]
    assert progress, evs
    last = progress[-1]
    assert last["bytes_done"] == last["bytes_total"] == sum(sizes.values())
    assert last["files_done"] == last["files_total"] == len(sizes)
    assert all(set(e) >= {"rate", "eta_s", "elapsed_s"} for e in progress)
    done = evs[-1]
    assert done["type"] == "done" and done["attempts"] == 1
    snapshot = Path(done["path"])
    assert snapshot.name == repo.sha
    files = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    assert files == sorted(sizes)
    gets = fake_hub.file_gets()
    assert gets == len(sizes)

    # The second download plans, finds everything cached, and fetches nothing.
    again = gaudi("download", "org/tiny-llama")
    assert again.returncode == 0, again.stderr
    assert "nothing to download" in again.stdout and str(snapshot) in again.stdout
    assert fake_hub.file_gets() == gets

    # The Hub goes away; from_pretrained finds the model by its id in the cache, offline.
    fake_hub.stop()
    script = ("import sys; from transformers import AutoModelForCausalLM, AutoTokenizer\n"
              "m = AutoModelForCausalLM.from_pretrained('org/tiny-llama')\n"
              "t = AutoTokenizer.from_pretrained('org/tiny-llama')\n"
              "print('loaded', type(m).__name__, len(t('hello')['input_ids']) > 0)\n")
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert "loaded" in loaded.stdout and "True" in loaded.stdout


def test_include_and_exclude_choose_the_files(fake_hub: FakeHub) -> None:
    fake_hub.repos["org/small"] = small_repo()
    result = gaudi("download", "org/small", "--include", "*.json", "extra/*", "--exclude", "tokenizer*",
                   "--json")
    assert result.returncode == 0, result.stderr
    evs = events_of(result.stdout)
    plan = next(e for e in evs if e["type"] == "plan")
    assert sorted(f["filename"] for f in plan["files"]) == ["config.json", "extra/notes.txt"]
    snapshot = Path(evs[-1]["path"])
    assert sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()) == \
        ["config.json", "extra/notes.txt"]
    assert set(fake_hub.gets) == {"config.json", "extra/notes.txt"}

    nothing = gaudi("download", "org/small", "--include", "*.gguf")
    assert nothing.returncode == 2
    assert "no file of org/small matches" in nothing.stderr


def test_not_enough_disk_is_refused_with_the_numbers_before_any_byte(fake_hub: FakeHub,
                                                                     tmp_path: Path) -> None:
    # The repo claims a 1 PB file (listed and answered to HEAD, never served): more than any disk here.
    fake_hub.repos["org/huge"] = FakeRepo(files={"config.json": b"{}"}, virtual={"model.bin": 10**15})
    result = gaudi("download", "org/huge")
    assert result.returncode == 2
    message = result.stderr.strip()
    assert message.count("\n") == 0, message
    assert "not enough disk space" in message
    assert "1000000000000002 bytes" in message
    free = core_hub.free_bytes(os.environ["HF_HOME"])
    stated = int(message.split(" free (")[1].split(" bytes")[0])
    assert abs(stated - free) < 10**9
    assert fake_hub.file_gets() == 0


def test_space_refusal_at_the_boundary() -> None:
    plan = core_hub.Plan("org/m", "main", "c" * 40, "/cache",
                         [core_hub.PlanFile("a", 1000, False), core_hub.PlanFile("b", 500, True)])
    plan.free_bytes = 1000 + 100
    assert core_hub.space_refusal(plan, margin=100) is None
    plan.free_bytes = 1000 + 99
    refusal = core_hub.space_refusal(plan, margin=100)
    assert refusal is not None and "1000 bytes" in refusal and "1099 bytes" in refusal


def test_gated_missing_and_bad_revision_say_how_to_fix_it_without_the_token(fake_hub: FakeHub) -> None:
    fake_hub.repos["org/gated"] = FakeRepo(files={"config.json": b"{}"}, gated=True)
    fake_hub.repos["org/small"] = small_repo()
    env = {"HF_TOKEN": SECRET}
    gated = gaudi("download", "org/gated", env=env)
    assert gated.returncode == 2
    assert "gated" in gated.stderr and "accept the licence" in gated.stderr
    assert "hf auth login" in gated.stderr
    # The library sent the user's own login to the Hub; it is never shown.
    assert f"Bearer {SECRET}" in fake_hub.authorizations
    gated_json = gaudi("download", "org/gated", "--json", env=env)
    assert gated_json.returncode == 2 and events_of(gated_json.stdout)[-1]["kind"] == "gated"
    missing = gaudi("download", "org/nope", env=env)
    assert missing.returncode == 2 and "was not found" in missing.stderr and "hf auth login" in missing.stderr
    bad_rev = gaudi("download", "org/small", "--revision", "v9", env=env)
    assert bad_rev.returncode == 2 and "no revision 'v9'" in bad_rev.stderr
    bad_id = gaudi("download", "not a repo id!")
    assert bad_id.returncode == 2 and len(bad_id.stderr.strip().splitlines()) == 1
    for result in (gated, gated_json, missing, bad_rev):
        assert SECRET not in result.stdout + result.stderr
    assert fake_hub.file_gets() == 0


def test_offline_says_so_at_once(fake_hub: FakeHub) -> None:
    fake_hub.repos["org/small"] = small_repo()
    started = time.monotonic()
    result = gaudi("download", "org/small", env={"HF_HUB_OFFLINE": "1"})
    took = time.monotonic() - started
    assert result.returncode == 2
    assert "offline" in result.stderr and "HF_HUB_OFFLINE" in result.stderr
    assert fake_hub.requests == []
    assert took < 15, took
    # Once it is cached, offline mode answers where it is.
    assert gaudi("download", "org/small").returncode == 0
    cached = gaudi("download", "org/small", env={"HF_HUB_OFFLINE": "1"})
    assert cached.returncode == 0 and "complete in the cache" in cached.stdout


def test_a_stall_is_detected_retried_and_completes_and_plain_http_after_two(fake_hub: FakeHub) -> None:
    repo = small_repo()
    fake_hub.repos["org/stall"] = repo
    fake_hub.stall("org/stall", "model.safetensors", times=2)
    env = {"HF_HUB_DISABLE_XET": ""}  # as a user without it: after two stalls the command turns it on
    started = time.monotonic()
    result = gaudi("download", "org/stall", "--json", "--stall-s", "2", env=env, timeout=80)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    evs = events_of(result.stdout)
    kinds = [e["type"] for e in evs]
    assert kinds.count("stalled") == 2 and kinds.count("retry") == 2
    attempts = [e for e in evs if e["type"] == "attempt"]
    assert [a["attempt"] for a in attempts] == [1, 2, 3]
    assert [a["xet"] for a in attempts] == [True, True, False]
    assert [e["xet_disabled"] for e in evs if e["type"] == "retry"] == [False, True]
    # Finished files were not fetched again: only the stalled file was asked for on each attempt,
    # and each attempt continued it from the bytes on disk (a Range), not from byte 0.
    assert attempts[1]["files_left"] == 1 and attempts[2]["files_left"] == 1
    assert fake_hub.gets["model.safetensors"] == 3 and fake_hub.gets["config.json"] == 1
    size = len(repo.files["model.safetensors"])
    starts = fake_hub.starts["model.safetensors"]
    assert starts[0] == 0 and 0 < starts[1] <= starts[2] < size, starts
    assert [e["bytes"] for e in evs if e["type"] == "resumed"] == starts[1:]
    assert fake_hub.bytes_served["model.safetensors"] < 1.6 * size  # from byte 0 each time: 2x
    stalls = [e["seconds"] for e in evs if e["type"] == "stalled"]
    assert all(2 <= s < 4 for s in stalls), stalls
    snapshot = Path(evs[-1]["path"])
    assert (snapshot / "model.safetensors").read_bytes() == repo.files["model.safetensors"]
    blobs = snapshot.parents[1] / "blobs"
    assert not list(blobs.glob("*.incomplete"))
    assert took < 40, took


def test_the_text_output_says_the_xet_switch_and_what_a_retry_refetches(fake_hub: FakeHub) -> None:
    fake_hub.repos["org/stall"] = small_repo()
    fake_hub.stall("org/stall", "model.safetensors", times=1)
    result = gaudi("download", "org/stall", "--stall-s", "1.5", "--attempts", "2", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "stalled: no byte arrived for 1.5 s" in result.stdout
    assert "unfinished ones continue from the bytes on disk" in result.stdout
    assert "continuing model.safetensors from 1.0 MB already on disk" in result.stdout
    assert "model: " in result.stdout


def _partial(repo: str) -> list[Path]:
    blobs = Path(os.environ["HF_HOME"]) / "hub" / f"models--{repo.replace('/', '--')}" / "blobs"
    return sorted(blobs.glob("*.incomplete"))


def _wait_partial(repo: str, size: int) -> None:
    """Until what arrived before the fake Hub went silent is on disk (the whole MiB chunks of it), and
    the repo's other (small) files are done: on a loaded machine their threads finished after the
    silent file's first MiBs, and a kill then left their empty ``.incomplete`` files too."""
    def settled() -> bool:
        partial = _partial(repo)
        return len(partial) == 1 and partial[0].stat().st_size >= size

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not settled():
        time.sleep(0.05)


def _continues_where_it_stopped(fake_hub: FakeHub, repo_id: str, filename: str) -> None:
    """The same download again: the partial file is continued with a Range from its size on disk (so
    about the file's size is served in all, not that plus what the first attempt got), finished files
    are not fetched again, and the result is the Hub's bytes."""
    partial = _partial(repo_id)
    assert [p.name for p in partial] == [fake_hub.repos[repo_id].etag(filename) + ".incomplete"], \
        [(p.name, p.stat().st_size) for p in partial]
    on_disk = partial[0].stat().st_size
    assert on_disk >= 1024 * 1024
    gets = dict(fake_hub.gets)
    again = gaudi("download", repo_id, "--json")
    assert again.returncode == 0, again.stderr
    evs = events_of(again.stdout)
    assert [(e["filename"], e["bytes"]) for e in evs if e["type"] == "resumed"] == [(filename, on_disk)]
    assert fake_hub.starts[filename] == [0, on_disk]
    data = fake_hub.repos[repo_id].files[filename]
    assert fake_hub.bytes_served[filename] <= len(data) + 1024 * 1024  # the chunk not yet written
    assert {k: v for k, v in fake_hub.gets.items() if k != filename} == \
        {k: v for k, v in gets.items() if k != filename}
    assert (Path(evs[-1]["path"]) / filename).read_bytes() == data
    assert "verified" in [e["type"] for e in evs] and not _partial(repo_id)


def test_sigterm_ends_the_download_and_its_child_and_the_next_one_continues(fake_hub: FakeHub) -> None:
    fake_hub.repos["org/stall"] = FakeRepo(files={"config.json": b'{"a": 1}',
                                                  "model.safetensors": os.urandom(5_000_000)})
    fake_hub.stall("org/stall", "model.safetensors", times=1)
    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "download", "org/stall", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert fake_hub.stalled.wait(timeout=30)
        _wait_partial("org/stall", 2 << 20)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert any("gaudi_gui.workers.download" in " ".join(c.cmdline()) for c in children)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
    _continues_where_it_stopped(fake_hub, "org/stall", "model.safetensors")


def test_a_killed_download_continues_from_the_bytes_on_disk(fake_hub: FakeHub) -> None:
    fake_hub.repos["org/killed"] = FakeRepo(files={"config.json": b'{"a": 1}', "tokenizer.json": b"{}",
                                                   "model.safetensors": os.urandom(8_000_000)})
    fake_hub.stall("org/killed", "model.safetensors", times=1)
    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "download", "org/killed", "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        assert fake_hub.stalled.wait(timeout=30)
        children = psutil.Process(proc.pid).children(recursive=True)
        _wait_partial("org/killed", 3 << 20)
        proc.kill()  # no clean-up of ours runs; the worker ends itself when its stdin closes
        proc.wait(timeout=10)
        _gone, alive = psutil.wait_procs(children, timeout=10)
        assert not alive
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _continues_where_it_stopped(fake_hub, "org/killed", "model.safetensors")


def test_a_server_that_ignores_the_range_gets_the_file_whole_and_it_checks_out(fake_hub: FakeHub) -> None:
    repo = small_repo()
    fake_hub.repos["org/norange"] = repo
    fake_hub.ignore_ranges = True
    data = repo.files["model.safetensors"]
    blobs = Path(os.environ["HF_HOME"]) / "hub" / "models--org--norange" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / (repo.etag("model.safetensors") + ".incomplete")).write_bytes(data[:1_000_000])
    result = gaudi("download", "org/norange", "--json")
    assert result.returncode == 0, result.stderr
    evs = events_of(result.stdout)
    # Asked from byte 1,000,000, answered from byte 0: the partial file and its digest start again.
    assert [e["bytes"] for e in evs if e["type"] == "resumed"] == [1_000_000]
    assert "verified" in [e["type"] for e in evs] and "verify_failed" not in [e["type"] for e in evs]
    assert fake_hub.bytes_served["model.safetensors"] == len(data)
    assert (Path(evs[-1]["path"]) / "model.safetensors").read_bytes() == data
    last = [e for e in evs if e["type"] == "progress"][-1]
    assert last["bytes_done"] == last["bytes_total"]


def test_a_damaged_partial_file_is_caught_by_the_digest_and_fetched_again(fake_hub: FakeHub) -> None:
    repo = small_repo()
    fake_hub.repos["org/partial"] = repo
    # An earlier attempt's partial file whose bytes are not the Hub's (a disk fault, a broken lock).
    blobs = Path(os.environ["HF_HOME"]) / "hub" / "models--org--partial" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / (repo.etag("model.safetensors") + ".incomplete")).write_bytes(b"\0" * 1_000_000)
    result = gaudi("download", "org/partial", "--json")
    assert result.returncode == 0, result.stderr
    evs = events_of(result.stdout)
    assert [e["bytes"] for e in evs if e["type"] == "resumed"] == [1_000_000]
    failed = next(e for e in evs if e["type"] == "verify_failed")
    assert [f["filename"] for f in failed["files"]] == ["model.safetensors"]
    assert fake_hub.starts["model.safetensors"] == [1_000_000, 0]
    snapshot = Path(evs[-1]["path"])
    assert (snapshot / "model.safetensors").read_bytes() == repo.files["model.safetensors"]
    assert fake_hub.gets["config.json"] == 1


def test_models_lists_sorts_and_deletes_only_with_yes(fake_hub: FakeHub) -> None:
    fake_hub.repos["org/big"] = FakeRepo(files={"config.json": b"{}", "w.bin": os.urandom(2_000_000)})
    fake_hub.repos["org/small"] = FakeRepo(files={"config.json": b'{"s": 1}'})
    assert gaudi("download", "org/big").returncode == 0
    assert gaudi("download", "org/small").returncode == 0
    listing = json.loads(gaudi("models", "--json").stdout)
    assert [m["repo_id"] for m in listing["models"]] == ["org/big", "org/small"]
    big = listing["models"][0]
    assert big["size_on_disk"] >= 2_000_000 and big["revisions"][0]["refs"] == ["main"]
    text = gaudi("models", "--sort", "used")
    assert text.returncode == 0 and "org/big" in text.stdout and "org/small" in text.stdout

    dry = gaudi("models", "--delete", "org/big")
    assert dry.returncode == 0 and "would delete org/big" in dry.stdout and "2.0 MB" in dry.stdout
    assert [m["repo_id"] for m in json.loads(gaudi("models", "--json").stdout)["models"]] == \
        ["org/big", "org/small"]
    rev = big["revisions"][0]["commit"][:8]
    gone = gaudi("models", "--delete", f"org/big@{rev}", "--yes", "--json")
    assert gone.returncode == 0, gone.stderr
    answer = json.loads(gone.stdout)
    assert answer["deleted"] and answer["freed_bytes"] >= 2_000_000
    assert [m["repo_id"] for m in json.loads(gaudi("models", "--json").stdout)["models"]] == ["org/small"]
    unknown = gaudi("models", "--delete", "org/none", "--yes")
    assert unknown.returncode == 2 and "not in the Hub cache" in unknown.stderr


def test_what_arrived_is_checked_against_the_hub_and_a_damaged_file_is_fetched_again(
        fake_hub: FakeHub) -> None:
    repo = small_repo()
    fake_hub.repos["org/check"] = repo
    # model.safetensors's ETag is a sha256 (an LFS file); config.json's too in the fake Hub.
    fake_hub.corrupt("org/check", "model.safetensors", times=1)
    result = gaudi("download", "org/check", "--json")
    assert result.returncode == 0, result.stderr
    evs = events_of(result.stdout)
    failed = next(e for e in evs if e["type"] == "verify_failed")
    assert [f["filename"] for f in failed["files"]] == ["model.safetensors"]
    assert "sha256" in failed["files"][0]["message"] and "ETag" in failed["files"][0]["message"]
    retry = next(e for e in evs if e["type"] == "retry")
    assert "does not match what the Hub says" in retry["reason"]
    assert [e["type"] for e in evs].count("verified") == 1 and evs[-1]["type"] == "done"
    snapshot = Path(evs[-1]["path"])
    assert (snapshot / "model.safetensors").read_bytes() == repo.files["model.safetensors"]
    # Only the damaged file was fetched again.
    assert fake_hub.gets["model.safetensors"] == 2 and fake_hub.gets["config.json"] == 1

    # Damaged on every attempt: said in words, exit 1, and no damaged file is left to load.
    fake_hub.repos["org/bad"] = FakeRepo(files={"model.safetensors": os.urandom(100_000)})
    fake_hub.corrupt("org/bad", "model.safetensors", times=10)
    bad = gaudi("download", "org/bad", "--attempts", "2")
    assert bad.returncode == 1
    assert "giving up after 2 attempts" in bad.stderr and "does not match what the Hub says" in bad.stderr
    assert "damaged: model.safetensors: sha256" in bad.stdout
    blobs = Path(os.environ["HF_HOME"]) / "hub" / "models--org--bad" / "blobs"
    assert not [p for p in blobs.iterdir() if not p.name.endswith(".incomplete")]


def _wait_state(run: Any, states: tuple[str, ...]) -> Any:
    """Poll the run's status until it is one of ``states`` (pytest-timeout has the last word)."""
    while True:
        status = run.status()
        if status.state in states:
            return status
        time.sleep(0.1)


def test_detached_download_is_a_job_with_a_run_folder_and_runs_stop_ends_it(fake_hub: FakeHub,
                                                                            tmp_path: Path) -> None:
    from gaudi_gui.core.runstore import Run
    runs = tmp_path / "runs"
    fake_hub.repos["org/detached"] = small_repo()
    started = gaudi("download", "org/detached", "--detach", "--json", "--runs-dir", str(runs),
                    env={"HF_TOKEN": SECRET})
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout.strip().splitlines()[-1])
    run = Run(info["folder"])
    assert info["kind"] == "download" and run.kind == "download"
    status = _wait_state(run, ("finished", "failed", "stopped", "killed"))
    assert status.state == "finished", (status, run.log_tail(20))
    assert status.summary.startswith("Downloaded: ") and status.summary.endswith(
        f"snapshots/{fake_hub.repos['org/detached'].sha}")
    kinds = [e["type"] for e in run.events()]
    assert "plan" in kinds and "progress" in kinds and "verified" in kinds and kinds[-1] == "done"
    listed = gaudi("runs", "--runs-dir", str(runs), "list", "--json")
    assert listed.returncode == 0 and "download" in listed.stdout
    # The login went to the download (the fake Hub saw it) and into no file of the run folder.
    assert f"Bearer {SECRET}" in fake_hub.authorizations
    for path in run.folder.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path

    # A download that stalls, stopped with runs stop: 'stopped', and nothing of it is left.
    fake_hub.repos["org/stuck"] = FakeRepo(files={"model.safetensors": os.urandom(500_000)})
    fake_hub.stall("org/stuck", "model.safetensors", times=10)
    fake_hub.stalled.clear()
    started = gaudi("download", "org/stuck", "--detach", "--json", "--runs-dir", str(runs))
    assert started.returncode == 0, started.stderr
    stuck = Run(json.loads(started.stdout.strip().splitlines()[-1])["folder"])
    assert fake_hub.stalled.wait(60)
    stop = gaudi("runs", "--runs-dir", str(runs), "stop", str(stuck.folder))
    assert stop.returncode == 0, stop.stderr
    status = _wait_state(stuck, ("finished", "failed", "stopped", "killed"))
    assert status.state == "stopped", status
    left = [p for p in psutil.process_iter(["cmdline"]) if "org/stuck" in " ".join(p.info["cmdline"] or [])]
    deadline = time.monotonic() + 20
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left


def test_a_permanent_error_fails_at_once_and_names_the_file_a_transient_one_is_retried(
        fake_hub: FakeHub) -> None:
    """404 (while fetching or while planning) and 403 on one file: one attempt, exit 2, the file named;
    a 503 is retried."""
    for status, head, words in ((404, False, "not found (404)"), (404, True, "not found (404)"),
                                (403, False, "refused model.safetensors of org/fail403 (403)")):
        repo_id = f"org/fail{status}{'h' if head else ''}"
        fake_hub.repos[repo_id] = small_repo()
        fake_hub.fail(repo_id, "model.safetensors", status, head=head)
        gets = fake_hub.gets.get("model.safetensors", 0)
        result = gaudi("download", repo_id, "--json")
        assert result.returncode == 2, (status, head, result.stderr)
        evs = events_of(result.stdout)
        assert [e["type"] for e in evs].count("retry") == 0, (status, head)
        message = result.stderr.strip()
        assert message.count("\n") == 0 and "model.safetensors" in message and words in message, message
        assert fake_hub.gets.get("model.safetensors", 0) - gets == (0 if head else 1)
    fake_hub.repos["org/busy"] = small_repo()
    fake_hub.fail("org/busy", "model.safetensors", 503, head=False)
    busy = gaudi("download", "org/busy", "--json", "--attempts", "2")
    assert busy.returncode == 1, busy.stderr
    assert [e["type"] for e in events_of(busy.stdout)].count("retry") == 1
    assert "model.safetensors" in busy.stderr and "503" in busy.stderr


def test_a_read_only_cache_fails_at_once_and_says_where(fake_hub: FakeHub, tmp_path: Path) -> None:
    """The cache on a real read-only file system (a tmpfs mounted ro in a private mount namespace):
    one attempt, exit 2, the folder named; never retried."""
    tool = shutil.which("unshare")
    assert tool, "util-linux's unshare is needed to mount a read-only tmpfs for this test"
    fake_hub.repos["org/ro"] = small_repo()
    cache = tmp_path / "cache"
    cache.mkdir()
    script = (f"mount -t tmpfs -o ro,size=2g tmpfs {cache} && "
              f"{sys.executable} -m gaudi_gui download org/ro --json --cache-dir {cache}; echo \"rc=$?\"")
    unshare = [tool, "-rm"] if os.geteuid() != 0 else [tool, "-m"]
    done = subprocess.run([*unshare, "sh", "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.stdout.strip().endswith("rc=2"), (done.stdout, done.stderr)
    assert "retry" not in [e["type"] for e in events_of(done.stdout)]
    message = done.stderr.strip()
    assert message.count("\n") == 0 and "read-only" in message and str(cache) in message, message
    assert "Traceback" not in done.stderr


def test_models_marks_a_revision_whose_weights_never_arrived(fake_hub: FakeHub) -> None:
    """A download that failed midway (its weights answer 503) leaves config and tokenizer in the cache:
    `models` marks that revision incomplete and names the file, in text and JSON; finishing the
    download clears the mark. A sharded model whose second shard answers 404 is marked likewise."""
    repo = small_repo()
    fake_hub.repos["org/half"] = repo
    fake_hub.fail("org/half", "model.safetensors", 503, head=False)
    assert gaudi("download", "org/half", "--attempts", "1").returncode == 1
    listing = json.loads(gaudi("models", "--json").stdout)
    (model,) = [m for m in listing["models"] if m["repo_id"] == "org/half"]
    (rev,) = model["revisions"]
    assert rev["files"] >= 2 and "model.safetensors never arrived" in rev["incomplete"], rev
    text = gaudi("models")
    assert text.returncode == 0
    line = next(x for x in text.stdout.splitlines() if f"@{rev['commit'][:12]}" in x)
    assert "⚠ incomplete: model.safetensors never arrived" in line, text.stdout

    fake_hub.fail_files.clear()
    assert gaudi("download", "org/half").returncode == 0
    (model,) = [m for m in json.loads(gaudi("models", "--json").stdout)["models"]
                if m["repo_id"] == "org/half"]
    assert model["revisions"][0]["incomplete"] == ""
    assert "incomplete" not in gaudi("models").stdout

    shards = {f"model-0000{i}-of-00002.safetensors": os.urandom(50_000) for i in (1, 2)}
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    files = {"config.json": b"{}", **shards, "model.safetensors.index.json": json.dumps(index).encode()}
    fake_hub.repos["org/sharded"] = FakeRepo(files=files)
    fake_hub.fail("org/sharded", "model-00002-of-00002.safetensors", 404, head=False)
    assert gaudi("download", "org/sharded").returncode == 2
    (model,) = [m for m in json.loads(gaudi("models", "--json").stdout)["models"]
                if m["repo_id"] == "org/sharded"]
    assert "model-00002-of-00002.safetensors never arrived" in model["revisions"][0]["incomplete"]
