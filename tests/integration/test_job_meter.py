"""Serve and Evaluate runs are metered like training runs (issue 27): their supervisor meters the cards
their command names from its start to its end, and the summary says the energy per 1,000 generated
tokens (Serve: the engine's own count, else the request log's completion tokens; Evaluate: the
answers' new tokens). Real supervisors, real children, the fake hl-smi replaying recorded output, and
for vLLM the stand-in of tests/fake_vllm.py (its /metrics in vLLM's exposition format)."""

from __future__ import annotations

import itertools
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.core import jobkind, meter_account, meter_files, meter_words
from gaudi_gui.core import serve as sv
from gaudi_gui.core.runstore import Run

# A stand-in for `gaudi-gui serve --events`: three requests in the request log (two with completion
# tokens, one a /v1/models), then it serves until SIGTERM, as serve does.
_SERVE = """
import signal, sys, time
from gaudi_gui.core import protocol
done = []
signal.signal(signal.SIGTERM, lambda *_: done.append(1))
say = lambda kind, **f: protocol.write_line(sys.stdout, protocol.event(kind, **f))
say("serve_state", state="ready", message="ready")
for path, tokens in (("/v1/chat/completions", 120), ("/v1/models", None), ("/v1/completions", 80)):
    say("serve_request", time=time.time(), method="POST", path=path, status=200, completion_tokens=tokens)
end = time.monotonic() + 60
while not done and time.monotonic() < end:
    time.sleep(0.05)
say("serve_state", state="stopped", message="stopped; port 1 is free")
"""


def _supervise_child(tmp_path: Path, kind: str, argv: list[str], *, stop_after_s: float = 0.0) -> Any:
    """``argv`` as a ``kind`` job under the real supervisor, in a process of its own (the supervisor
    installs no handler here: it is this helper's child); SIGTERM after ``stop_after_s``."""
    script = f"""
import sys, json
from gaudi_gui.commands.terminal import StopSignals
from gaudi_gui.core import jobkind
from gaudi_gui.core.supervisor import supervise
import signal
job = jobkind.create({kind!r}, "job", {argv!r}, runs_dir={str(tmp_path / 'runs')!r})
signals = StopSignals()
signal.signal(signal.SIGTERM, signals.handler)
print(job.run.folder, flush=True)
result = supervise(job, grace_s=10, signals=signals, say=lambda m: print(m, file=sys.stderr),
                   echo=lambda _l: None)
print(json.dumps({{"state": result.state, "summary": result.summary}}), flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    folder = Path(proc.stdout.readline().strip())
    if stop_after_s:
        run = Run(folder)
        # Wait for the child's requests to be kept, and a few meter samples, then stop it.
        import time
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                (folder / jobkind.REQUESTS_NAME).is_file()
                and len((folder / meter_files.METER_NAME).read_text().splitlines()) >= 5
                if (folder / meter_files.METER_NAME).is_file() else False):
            time.sleep(0.1)
        assert run.status().state == "running", run.status()
        proc.send_signal(15)
    out, err = proc.communicate(timeout=120)
    return folder, json.loads(out.strip().splitlines()[-1]), err


def _trapezoid(samples: list[dict[str, Any]], module: int) -> float:
    """The meter's rule, written out: trapezoids, except that a stretch longer than GAP_S holds the
    earlier reading (a loaded machine can leave one: a full run at load 14 did)."""
    points = [(s["t"], c["power_w"]) for s in samples for c in s["cards"] if c["module_id"] == module]
    return sum((w0 if t1 - t0 > meter_account.GAP_S else (w0 + w1) / 2) * (t1 - t0)
               for (t0, w0), (t1, w1) in itertools.pairwise(points))


def test_a_served_models_run_says_its_energy_and_wh_per_1000_tokens(tmp_path: Path,
                                                                    fake_hl_smi: Path) -> None:
    folder, result, err = _supervise_child(
        tmp_path, "serve", [sys.executable, "-c", _SERVE, "--device", "hpu", "--cards", "2,3"],
        stop_after_s=1)
    assert result["state"] == "stopped", (result, err)
    lines = [json.loads(line) for line in (folder / meter_files.METER_NAME).read_text().splitlines()]
    samples = [s for s in lines if "cards" in s]
    assert samples and {c["module_id"] for s in samples for c in s["cards"]} == {2, 3}
    summary = json.loads((folder / meter_files.SUMMARY_NAME).read_text())
    expected = _trapezoid(samples, 2) + _trapezoid(samples, 3)
    # meter.jsonl keeps each time to the millisecond: the file's sum can differ from the meter's by
    # up to the run's power times 2 ms (the ends' rounding; the rest telescopes).
    watts = max(sum(c["power_w"] for c in s["cards"]) for s in samples)
    assert summary["energy_j"] == pytest.approx(expected, rel=1e-3, abs=watts * 0.002) and expected > 0
    assert summary["card_hours"] == pytest.approx(2 * summary["wall_s"] / 3600, abs=1e-6)  # 6 decimals
    # 200 completion tokens (the /v1/models request generates nothing and is not counted).
    assert summary["generated_tokens"] == 200 and summary["token_items_without_count"] == 0
    assert summary["energy_per_1k_tokens_wh"] == pytest.approx(summary["energy_j"] / 3600 / 200 * 1000,
                                                               rel=1e-6)
    assert summary["tokens_per_s"] == pytest.approx(200 / summary["wall_s"], rel=1e-3)
    # The outcome (status and what the supervisor returns) says what it cost.
    status = Run(folder).status()
    assert status.summary.startswith("Stopped: stopped; port 1 is free — ")
    assert "card-hours" in status.summary and "hl-smi power integrated" in status.summary
    assert "Wh per 1,000 tokens" in status.summary and "200 tokens generated" in status.summary
    shown = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(tmp_path / "runs"),
                            "show", folder.name], capture_output=True, text=True, timeout=60)
    assert "meter: modules 2 and 3" in shown.stdout and "Wh per 1,000 tokens" in shown.stdout, shown.stdout
    as_json = json.loads(subprocess.run(
        [sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(tmp_path / "runs"), "show", folder.name,
         "--json"], capture_output=True, text=True, timeout=60).stdout)
    assert as_json["meter"]["energy_per_1k_tokens_wh"] == summary["energy_per_1k_tokens_wh"]


def test_a_request_log_without_token_counts_says_not_measured_never_0(tmp_path: Path,
                                                                      fake_hl_smi: Path) -> None:
    # transformers serve's access log gives no token counts: per 1,000 tokens is "not measured".
    script = _SERVE.replace("(\"/v1/chat/completions\", 120)", "(\"/v1/chat/completions\", None)").replace(
        "(\"/v1/completions\", 80)", "(\"/v1/completions\", None)")
    folder, result, _err = _supervise_child(tmp_path, "serve", [sys.executable, "-c", script, "--cards", "2"],
                                            stop_after_s=1)
    summary = json.loads((folder / meter_files.SUMMARY_NAME).read_text())
    assert summary["cards"] == [2]  # --device auto with hl-smi found: the Gaudi card of --cards
    assert summary["energy_j"] > 0
    assert summary["generated_tokens"] is None and summary["token_items_without_count"] == 2
    assert summary["energy_per_1k_tokens_wh"] is None
    assert "Wh per 1,000 tokens not measured" in result["summary"]  # the outcome, short
    assert "not measured (no token counts in the request log" in meter_words.describe(summary)  # runs show


def test_a_real_evaluation_is_metered_with_its_generated_tokens(tiny_model_dir: Path, tmp_path: Path,
                                                                fake_hl_smi: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The learning rate\nA model\n")
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "eval", "--model", str(tiny_model_dir),
                           "--base", str(tiny_model_dir), "--prompts", str(prompts), "--max-new-tokens", "4",
                           "--metrics", "exact_match", "--runs-dir", str(tmp_path / "runs"), "--detach",
                           "--json"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    run = Run(info["folder"])
    follow = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(tmp_path / "runs"),
                             "follow", run.name], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                            timeout=300)
    end = json.loads(follow.stdout.splitlines()[-1])
    assert end["t"] == "end" and end["status"]["state"] == "finished", follow.stdout[-2000:]
    summary = end["meter"]
    events = run.events()
    tokens = sum(e["new_tokens"] for e in events if e.get("type") == "answer")
    assert tokens > 0 and summary["generated_tokens"] == tokens
    # No --cards: every card hl-smi shows (the evaluation names none); energy integrated, never 0.
    assert summary["energy_source"] == "hl-smi power integrated" and summary["energy_j"] > 0
    assert summary["card_hours"] > 0
    assert summary["energy_per_1k_tokens_wh"] == pytest.approx(
        summary["energy_j"] / 3600 / tokens * 1000, rel=1e-6)
    assert "Finished: results written — " in end["status"]["summary"]
    assert f"{tokens:,} tokens generated" in end["status"]["summary"]


def test_meter_target_reads_the_commands_device_and_cards(tmp_path: Path, fake_hl_smi: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    job = jobkind.ChildJob(kind="serve", run=Run(tmp_path), argv=["x", "--device", "cuda", "--cards=1,0"])
    assert jobkind.meter_target(job)[0] == "cuda"
    assert jobkind.meter_target(job)[1]["CUDA_VISIBLE_DEVICES"] == "0,1"
    auto = jobkind.ChildJob(kind="evaluate", run=Run(tmp_path), argv=["x"], env=dict(os.environ))
    assert jobkind.meter_target(auto)[0] == "hpu"  # the fake hl-smi is on PATH
    bare = jobkind.ChildJob(kind="evaluate", run=Run(tmp_path), argv=["x"], env={"PATH": str(tmp_path)})
    assert jobkind.meter_target(bare)[0] == "cpu"


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``vllm`` on PATH (tests/fake_vllm.py) and an importable ``vllm`` package (``vllm_here`` looks
    it up, never imports it); returns the program."""
    folder = tmp_path / "fake-vllm"
    (folder / "bin").mkdir(parents=True)
    (folder / "lib" / "vllm").mkdir(parents=True)
    (folder / "lib" / "vllm" / "__init__.py").write_text("")
    program = folder / "bin" / "vllm"
    fake = Path(__file__).parent.parent / "fake_vllm.py"
    program.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(fake))} \"$@\"\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(folder / "lib"), os.environ.get("PYTHONPATH", "")) if p))
    return program


def _chat(port: int, key: str, words: str, max_tokens: int) -> dict[str, Any]:
    body = json.dumps({"model": "fake-org/tiny", "messages": [{"role": "user", "content": words}],
                       "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        usage: dict[str, Any] = json.loads(response.read())["usage"]
        return usage


def _wait(check: Any, what: str, run: Run) -> Any:
    """Poll ``check`` until it gives something true (no upper bound: pytest-timeout has the last word)."""
    while not (value := check()):
        assert run.status().state not in ("failed", "killed"), f"{what}: {run.status()} {run.log_tail(20)}"
        time.sleep(0.05)
    return value


def test_vllms_own_token_counters_are_the_runs_count(tmp_path: Path, fake_hl_smi: Path, fake_vllm: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve --engine vllm` reads vLLM's counters from /metrics (not behind the API key) while serving
    and once more just before it stops the engine: runs show --json gives exactly what the responses'
    usage says, from vLLM's counters, and the reads are not requests of the log."""
    monkeypatch.setenv("GG_TEST_VLLM_KEY", "s3cret")
    port = sv.pick_free_port()
    cli = [sys.executable, "-m", "gaudi_gui"]
    done = subprocess.run([*cli, "serve", "--model", "fake-org/tiny", "--engine", "vllm", "--device", "hpu",
                           "--cards", "2", "--port", str(port), "--api-key-env", "GG_TEST_VLLM_KEY",
                           "--detach", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    run = Run(json.loads(done.stdout.strip().splitlines()[-1])["folder"])
    _wait(lambda: jobkind.endpoint(run), "the endpoint", run)
    first = _chat(port, "s3cret", "hello there world", 5)

    def counted() -> list[dict[str, Any]]:
        return [e for e in run.events() if e["type"] == "serve_tokens" and e.get("completion_tokens")]

    # Read while serving (at most once a second)...
    assert _wait(counted, "vLLM's counters read while serving", run)[-1]["completion_tokens"] == 5
    # ...and once more before the engine stops: a request answered just before the stop is counted.
    second = _chat(port, "s3cret", "and again", 7)
    stop = subprocess.run([*cli, "runs", "stop", run.name], capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stderr
    _wait(lambda: run.status().state == "stopped", "the stop", run)
    generated = first["completion_tokens"] + second["completion_tokens"]
    prompts = first["prompt_tokens"] + second["prompt_tokens"]
    shown = json.loads(subprocess.run([*cli, "runs", "show", run.name, "--json"], capture_output=True,
                                      text=True, timeout=60).stdout)
    summary = shown["meter"]
    assert (summary["generated_tokens"], summary["prompt_tokens"]) == (generated, prompts) == (12, 5), summary
    assert summary["tokens_source"] == sv.VLLM_TOKENS_SOURCE and summary["cards"] == [2]
    assert summary["energy_per_1k_tokens_wh"] == pytest.approx(summary["energy_j"] / 3600 / generated * 1000,
                                                               rel=1e-6)
    assert "12 tokens generated" in run.status().summary
    kept = (run.folder / jobkind.REQUESTS_NAME).read_text().splitlines()
    paths = [json.loads(line)["path"] for line in kept]
    assert paths.count("/v1/chat/completions") == 2 and "/metrics" not in paths, paths
    tokens = [e for e in run.events() if e["type"] == "serve_tokens"]
    assert tokens[0]["completion_tokens"] == 0 and tokens[0]["counting"] is True  # as it became ready
