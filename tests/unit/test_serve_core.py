"""core/serve: engine choice, argv, context sizing, the warm-up and access-log parsers, snippets, ports."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gaudi_gui.core import serve

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm"


def test_engine_choice_says_why() -> None:
    assert serve.choose_engine("auto", vllm_importable=False, device="hpu") == serve.EngineChoice(
        "transformers", "transformers serve: vLLM is not importable here")
    cpu = serve.choose_engine("auto", vllm_importable=True, device="cpu")
    assert cpu.engine == "transformers" and "cpu" in cpu.reason
    hpu = serve.choose_engine("auto", vllm_importable=True, device="hpu")
    assert hpu.engine == "vllm" and "hpu" in hpu.reason
    assert serve.choose_engine("transformers", vllm_importable=True, device="hpu").engine == "transformers"
    with pytest.raises(serve.ServeError) as missing:
        serve.choose_engine("vllm", vllm_importable=False, device="hpu")
    assert missing.value.field == "engine" and "vllm-gaudi" in missing.value.message


def test_context_sized_to_blocks_and_model_limit() -> None:
    assert serve.size_max_model_len(1000, 200) == 1280
    assert serve.size_max_model_len(100, 28) == 128
    assert serve.size_max_model_len(3000, 1000, model_max=4000) == 4000
    with pytest.raises(serve.ServeError, match="exceed the model's context of 2048"):
        serve.size_max_model_len(2000, 100, model_max=2048)
    with pytest.raises(serve.ServeError):
        serve.size_max_model_len(0, 10)


def test_argv_of_each_engine() -> None:
    spec = serve.ServeSpec(model="m", port=8123, device="cpu", dtype="bf16", quantization="4bit",
                           max_model_len=512)
    argv = serve.transformers_argv(["transformers"], "/models/m", spec, bind="127.0.0.1")
    assert argv == ["transformers", "serve", "--host", "127.0.0.1", "--port", "8123", "--device", "cpu",
                    "--dtype", "bfloat16", "--quantization", "bnb-4bit", "--max-model-len", "512", "--",
                    "/models/m"]
    v = serve.vllm_argv(["vllm"], "org/m", spec, bind="127.0.0.1", adapter="/runs/r/adapter")
    assert v[:3] == ["vllm", "serve", "org/m"]
    at = v.index("--max-model-len")
    assert v[at:at + 2] == ["--max-model-len", "512"]
    assert v[-3:] == ["--enable-lora", "--lora-modules", "adapter=/runs/r/adapter"]
    assert not any("key" in word.lower() for word in v)  # the key travels in VLLM_API_KEY


def test_spec_problems_and_cli_args() -> None:
    bad = serve.ServeSpec(model="", port=0, engine="tgi", api_key_env="1 2", listen_all=True)
    fields = {f for f, _ in bad.problems()}
    assert {"model", "port", "engine", "api_key_env"} <= fields
    assert ("listen_all", "listening on all interfaces requires an API key") in \
        serve.ServeSpec(model="m", listen_all=True).problems()
    spec = serve.ServeSpec(model="-odd", port=9000, adapter="/a", max_model_len=256, api_key_env="K")
    assert "--model=-odd" in spec.cli_args() and "--api-key-env=K" in spec.cli_args()


def test_the_model_rule_is_the_one_of_every_job_kind(tmp_path: Path) -> None:
    """Serve checks its model with jobcheck.model_problem, as training and Evaluate do."""
    from gaudi_gui.core.jobcheck import model_problem
    assert model_problem("builtin:demo") is None
    assert model_problem("org/name") is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no config.json" in (model_problem(str(empty)) or "")
    assert "not found" in (model_problem(str(tmp_path / "missing")) or "")
    assert "not found" in (model_problem("models/llama/7b") or "")  # two slashes: a path, not a Hub id
    (tmp_path / "f.txt").write_text("x")
    assert "is a file" in (model_problem(str(tmp_path / "f.txt")) or "")
    assert "neither" in (model_problem("not a model!") or "")
    assert "neither" in (model_problem("org--x/name") or "")
    (empty / "config.json").write_text("{}")
    assert model_problem(str(empty)) is None
    assert serve.ServeSpec(model=str(tmp_path / "missing")).problems() == [
        ("model", f"model folder not found: {tmp_path / 'missing'}")]
    assert serve.ServeSpec(model=str(tmp_path / "missing")).problems(local=False) == []


def test_warmup_progress_from_written_gaudi_log() -> None:
    parser = serve.WarmupParser()
    seen = [p for line in (DATA / "startup_gaudi.log").read_text().splitlines()
            if (p := parser.feed(line)) is not None]
    assert len(seen) == 72
    fractions = [p.fraction for p in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert seen[0].phase == "Prompt" and seen[24].phase == "Decode"
    # Half-way through the prompt buckets: a quarter done (decode assumed as big until it starts).
    assert seen[11].fraction == pytest.approx(12 / 48)
    # ETA from the log's own stamps: 11 s for 25% done -> 33 s left.
    assert seen[11].eta_s == pytest.approx(33.0)
    assert seen[-1].eta_s == 0.0
    assert parser.feed("INFO 08-01 22:27:00 something else") is None


def test_request_lines_from_both_engines() -> None:
    records = [r for line in (DATA / "transformers_serve.log").read_text().splitlines()
               if (r := serve.parse_request(line, now=5.0)) is not None]
    assert [(r.method, r.path, r.status) for r in records] == [
        ("GET", "/v1/models", 200), ("POST", "/v1/chat/completions", 400),
        ("POST", "/v1/chat/completions", 200), ("POST", "/v1/chat/completions", 500), ("GET", "/health", 200)]
    assert serve.RequestRecord.from_dict(records[1].to_dict()) == records[1]
    text = (DATA / "startup_gaudi.log").read_text().splitlines()
    vllm_records = [r for line in text if (r := serve.parse_request(line)) is not None]
    assert [r.status for r in vllm_records] == [200, 200, 400]


def test_snippets_are_valid_as_pasted() -> None:
    url = serve.endpoint_url(8123)
    assert url == "http://127.0.0.1:8123/v1"
    code = serve.python_snippet(url, "it's/model", "MY_KEY")
    compile(code, "<snippet>", "exec")
    assert "os.environ['MY_KEY']" in code
    curl = serve.curl_snippet(url, "it's/model", "MY_KEY")
    # The shell reads it back as the words meant: the body is one argument holding valid JSON.
    words = subprocess.run([sys.executable, "-c", "import shlex,sys; print(shlex.split(sys.argv[1])[-1])",
                            curl], capture_output=True, text=True, check=True).stdout.strip()
    assert '"model": "it\'s/model"' in words
    assert '$MY_KEY' in curl


def test_port_checks() -> None:
    port = serve.pick_free_port()
    assert serve.port_free(port)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert not serve.port_free(port)


def test_sse_reader_keeps_partial_lines_and_reads_done() -> None:
    from gaudi_gui.core.serve import SseReader, chunk_finish, chunk_text
    reader = SseReader()
    first = b'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\ndata: {"choices": [{"del'
    assert [chunk_text(e) for e in reader.feed(first)] == ["Hel"]
    rest = b'ta": {"content": "lo"}, "finish_reason": "stop"}]}\n\n: keep-alive\n\ndata: [DONE]\n\n'
    events = reader.feed(rest)
    assert chunk_text(events[0]) == "lo" and chunk_finish(events[0]) == "stop" and events[1] == "[DONE]"
    assert reader.feed(b"data: not json\n") == [{"error": {"message": "not json"}}]
    assert chunk_text({"choices": [{"text": " world", "index": 0}]}) == " world"  # /completions
    assert chunk_text({"choices": "garbage"}) == "" and chunk_finish({}) == ""


def test_chat_body_maps_the_runner_settings() -> None:
    from gaudi_gui.core.generation import GenerationParams
    from gaudi_gui.core.serve import chat_body
    greedy = chat_body("m", GenerationParams(do_sample=False, max_new_tokens=9, seed=3, stop=["\n\n"]),
                       messages=[{"role": "user", "content": "hi"}])
    assert greedy == {"stream": True, "stream_options": {"include_usage": True}, "max_tokens": 9,
                      "model": "m", "temperature": 0.0, "seed": 3, "stop": ["\n\n"],
                      "messages": [{"role": "user", "content": "hi"}]}
    sampled = chat_body("", GenerationParams(temperature=0.5, top_p=0.9), prompt="Once")
    assert sampled["prompt"] == "Once" and "model" not in sampled and "messages" not in sampled
    assert (sampled["temperature"], sampled["top_p"]) == (0.5, 0.9)


def test_endpoint_stats_from_usage_or_chunks() -> None:
    from gaudi_gui.core.generation import format_stats
    from gaudi_gui.core.serve import endpoint_stats
    stats = endpoint_stats(started=10.0, first=10.25, ended=11.25, chunks=5,
                           usage={"completion_tokens": 11}, finish="length")
    assert stats["tokens"] == 11 and stats["ttft_s"] == 0.25 and stats["decode_tokens_per_s"] == 10.0
    assert format_stats(stats) == "TTFT 250 ms · 10.0 tok/s · 11 tokens · 1.25 s · max tokens"
    none = endpoint_stats(started=0.0, first=None, ended=1.0, chunks=0, usage=None, finish="")
    assert none["tokens"] == 0 and "ttft_s" not in none


def test_spec_cards_reach_the_command_line() -> None:
    from gaudi_gui.core.serve import ServeSpec
    assert ServeSpec(model="m", cards=(3, 2, 2)).cli_args()[-1] == "--cards=2,3"
    assert not any(a.startswith("--cards") for a in ServeSpec(model="m").cli_args())


def test_vllm_hint_reads_the_compatibility_table() -> None:
    from gaudi_gui.core.serve import VLLM_INSTALL_HINT, vllm_install_hint
    assert vllm_install_hint("") == VLLM_INSTALL_HINT  # no Gaudi software here: the docs' page alone
    hint = vllm_install_hint("1.23.0")
    assert hint.startswith(VLLM_INSTALL_HINT) and "vLLM fork from v0.9.0.1" in hint
    assert "Support_Matrix.html" in hint and "read 2026-12-03" in hint
    assert "(the 1.23.0 row)" in vllm_install_hint("1.23.1")  # a patch release: its release's row
    assert "not in the compatibility table" in vllm_install_hint("1.99.0")
    table = {"rows": [{"gaudi_software": "1.20.0", "source": "S", "date": "D"}]}
    assert "the table does not name a vLLM version (S, read D)" in vllm_install_hint("1.20.0", table)


def test_token_tally_sums_the_engines_processes_and_keeps_a_restarted_ones_count() -> None:
    tally = serve.TokenTally()
    assert serve.tokens_line({}) == ""
    assert tally.take({"type": "serve_request"}) is None
    assert tally.take({"type": "serve_tokens", "pid": 7, "prompt_tokens": 0, "completion_tokens": 0}) == {
        "counting": True, "prompt_tokens": 0, "completion_tokens": 0, "source": serve.TOKENS_SOURCE}
    assert tally.take({"type": "serve_tokens", "pid": 7, "prompt_tokens": 0, "completion_tokens": 0}) is None
    tally.take({"type": "serve_tokens", "pid": 7, "prompt_tokens": 20, "completion_tokens": 9})
    # an API server's zeros
    tally.take({"type": "serve_tokens", "pid": 8, "prompt_tokens": 0, "completion_tokens": 0})
    # pid 7 again from 0: a new model process on a reused pid; what the first one counted stays.
    fields = tally.take({"type": "serve_tokens", "pid": 7, "prompt_tokens": 5, "completion_tokens": 2})
    assert fields is not None and (fields["prompt_tokens"], fields["completion_tokens"]) == (25, 11)
    assert tally.take({"type": "serve_tokens", "pid": 7, "prompt_tokens": -1, "completion_tokens": 2}) is None
    said = serve.tokens_line(tally.fields())
    assert said == f"11 tokens generated, 25 prompt tokens ({serve.TOKENS_SOURCE})"
    tally.take({"type": "serve_tokens", "counting": False, "why": "no hook"})
    assert tally.fields()["counting"] is False
    assert serve.tokens_line(tally.fields()) == "tokens not counted: no hook"


def test_vllms_token_counters_are_read_from_its_metrics_text() -> None:
    text = (DATA / "metrics.txt").read_text()
    # Summed over label sets; vllm:prompt_tokens_by_source_total, the histograms' _sum and the
    # counters' _created gauges are other series.
    assert serve.vllm_token_counts(text) == (37, 48)
    # A data-parallel server: one series per engine. Past a million prometheus_client writes 1.5e+06.
    two = text + ('vllm:generation_tokens_total{engine="1",model_name="/data/models/Llama-3.1-8B-Instruct"} '
                  '1.5e+06\nvllm:prompt_tokens_total{engine="1",model_name="a \\"b} c"} 3.0 1765000000000\n')
    assert serve.vllm_token_counts(two) == (40, 1_500_048)
    with pytest.raises(serve.MetricsUnreadable, match=r"no vllm:generation_tokens_total and no "
                                                      r"vllm:prompt_tokens_total .*--disable-log-stats"):
        serve.vllm_token_counts("# HELP python_info x\npython_info 1.0\n")
    with pytest.raises(serve.MetricsUnreadable, match="reads 'NaN', not a count"):
        serve.vllm_token_counts(text.replace("} 48.0", "} NaN"))
    with pytest.raises(serve.MetricsUnreadable, match="reads 'x', not a count"):
        serve.vllm_token_counts(text.replace("} 37.0\n# HELP vllm:prompt_tokens_created", "} x\n#"))


def test_vllm_token_reader_says_not_measured_with_why_never_a_short_count() -> None:
    text = (DATA / "metrics.txt").read_text()
    reader = serve.VllmTokenReader(42)
    assert reader.tally.source == serve.VLLM_TOKENS_SOURCE
    assert reader.read(200, text, now=1.0) == {"counting": True, "prompt_tokens": 37, "completion_tokens": 48,
                                               "source": serve.VLLM_TOKENS_SOURCE}
    assert reader.read(200, text, now=2.0) is None  # unchanged: nothing to say
    assert reader.read(0, "timed out", now=3.0) is None  # passing while serving: the next read counts it
    assert reader.read(200, text.replace("} 48.0", "} 50.0"), now=4.0)["completion_tokens"] == 50  # type: ignore[index]
    # The read before the stop failed: the count would be short by the last second.
    fields = reader.read(0, "Connection refused", now=4.5, final=True)
    assert fields is not None and fields["counting"] is False
    assert fields["why"] == ("the reading of vLLM's /metrics just before the stop failed (Connection "
                             "refused); its last reading, 0.5 s earlier, misses what was generated since")
    assert reader.read(200, text, now=5.0) is None  # said once, for good
    assert serve.tokens_line(reader.tally.fields()).startswith("tokens not counted: the reading of vLLM's")
    for status, body, why in ((404, "", "vLLM's /metrics answered 404: this server exposes no Prometheus "
                                        "metrics"),
                              (401, "", "vLLM's /metrics refused the request (401)"),
                              (200, "python_info 1.0\n",
                               "vLLM's /metrics has no vllm:generation_tokens_total")):
        said = serve.VllmTokenReader(7).read(status, body, now=1.0)
        assert said is not None and said["counting"] is False and said["why"].startswith(why), said
    never = serve.VllmTokenReader(7)
    assert never.read(0, "Connection refused", now=1.0, final=True) == {
        "counting": False, "source": serve.VLLM_TOKENS_SOURCE,
        "why": "the reading of vLLM's /metrics just before the stop failed (Connection refused)"}


_HOOK_SCRIPT = """
import json
from transformers.cli.serving import utils as serving
from gaudi_gui.workers import transformers_serve as worker
wrapped = getattr(serving.GenerateRunner.count_tokens, "_gaudi_gui_counted", False)
said = {"why_not": worker.WHY_NOT, "wrapped": wrapped, "again": worker.install()}
class Runner:
    def generate(self): ...
serving.GenerateRunner = Runner
said["missing"] = worker.install()
class Other:
    def count_tokens(self, n=0): ...
serving.GenerateRunner = Other
said["changed"] = worker.install()
said["cb"] = worker.why_not_counted(["serve", "--continuous-batching", "--port", "1", "--", "m"])
said["plain"] = worker.why_not_counted(["serve", "--port", "1", "--", "--continuous-batching"])
print(json.dumps(said))
"""


def test_the_token_counter_says_why_where_transformers_has_no_hook_point() -> None:
    """Another transformers version (no ``GenerateRunner.count_tokens``): the worker names the missing
    hook point instead of counting nothing as 0; this one's is wrapped once (in a child: the wrap is
    for the whole process)."""
    done = subprocess.run([sys.executable, "-c", _HOOK_SCRIPT], capture_output=True, text=True, timeout=120)
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert (said["why_not"], said["wrapped"], said["again"]) == ("", True, ""), done.stderr
    assert "has no GenerateRunner.count_tokens in transformers.cli.serving.utils" in said["missing"]
    assert "takes no prompt/generated counts" in said["changed"]
    # Continuous batching counts its generated tokens elsewhere: said, never counted short.
    assert said["cb"].startswith("continuous batching (--continuous-batching) counts its generated tokens")
    assert said["plain"] == ""  # a model folder named like the option is no option
