"""A chat kept within the model's context (issue 37, items 7 and 11): the context read from a model's
files, the oldest turns left out first, a server's refusal read, a malformed request named, and what a
stop does said for each kind of job. Qt-free and torch-free."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gaudi_gui.core import generation, jobkind
from gaudi_gui.core.serve import chat_request_problem, completion_request_problem


def test_the_context_is_the_smaller_real_limit(tmp_path: Path) -> None:
    assert generation.context_of({"max_position_embeddings": 512}, {"model_max_length": 1024}) == 512
    assert generation.context_of({"max_position_embeddings": 4096}, {"model_max_length": 2048}) == 2048
    # transformers' "no limit" placeholder is not a limit; a multimodal model's text config says it.
    assert generation.context_of({"text_config": {"max_position_embeddings": 8192}},
                                 {"model_max_length": int(1e30)}) == 8192
    assert generation.context_of({}, None) is None
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 300}))
    assert generation.model_context(str(tmp_path)) == 300
    assert generation.model_context(str(tmp_path / "nothing")) is None


def _turns(n: int) -> list[dict[str, str]]:
    out = [{"role": "system", "content": "s"}]
    for i in range(n):
        out += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    return [*out, {"role": "user", "content": "last"}]


def test_the_oldest_turns_go_first_in_pairs_the_system_prompt_and_the_last_stay() -> None:
    messages = _turns(5)  # system + 10 turns + the new question

    def count(kept: list[dict[str, str]]) -> int:
        return 10 * len(kept)

    kept, left_out = generation.fit_messages(messages, count, 60)
    assert left_out == 6 and kept[0]["role"] == "system" and kept[-1]["content"] == "last"
    assert [m["content"] for m in kept[1:]] == ["q3", "a3", "q4", "a4", "last"]
    assert generation.fit_messages(messages, count, 1000) == (messages, 0)
    kept, left_out = generation.fit_messages(messages, count, 1000, at_least=1)
    assert left_out == 2 and kept[1]["content"] == "q1"  # never an answer without its question
    with pytest.raises(generation.ContextError) as refused:
        generation.fit_messages(messages, count, 15)
    assert (refused.value.tokens, refused.value.budget) == (20, 15)
    assert "takes 512 tokens" in refused.value.said(512)


def test_the_prompt_leaves_the_answer_room_but_never_less_than_half() -> None:
    assert generation.prompt_budget(512, 128) == 384
    assert generation.prompt_budget(512, 100_000) == 256


def test_what_was_left_out_is_said() -> None:
    assert generation.left_out_note(2, 512) == "2 oldest turns left out to fit the model's 512-token context"
    assert generation.left_out_note(0, 512) == ""
    line = generation.format_stats({"tokens": 5, "stop_reason": "eos", "left_out": 4, "context": 512})
    assert line == "5 tokens · eos · 4 oldest turns left out to fit the model's 512-token context"


def test_a_servers_refusal_of_a_long_prompt_is_read() -> None:
    said = ("The prompt has 667 tokens, but the model takes at most 512, prompt and answer "
            "(`--max-model-len`).")
    assert generation.context_overflow(said) == (667, 512)
    vllm = ("This model's maximum context length is 512 tokens. However, you requested 667 tokens "
            "(539 in the messages, 128 in the completion). Please reduce the length of the messages.")
    assert generation.context_overflow(vllm) == (539, 512)
    assert generation.context_overflow("Server is pinned to x") is None


def test_a_malformed_request_is_named() -> None:
    assert "messages must be a non-empty list" in (chat_request_problem({"messages": "hello"}) or "")
    assert "messages must be" in (chat_request_problem({}) or "")
    assert "messages[1].role" in (chat_request_problem(
        {"messages": [{"role": "user", "content": "x"}, {"content": "y"}]}) or "")
    assert "max_tokens" in (chat_request_problem({"messages": [{"role": "user", "content": "x"}],
                                                  "max_tokens": "ten"}) or "")
    assert chat_request_problem({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]},
                                              {"role": "assistant", "content": None}]}) is None
    assert "max_tokens" in (completion_request_problem({"prompt": "x", "max_tokens": 0}) or "")


def test_a_stop_is_said_for_its_kind() -> None:
    assert "checkpoint" in jobkind.stop_words("train")
    assert "checkpoint" not in jobkind.stop_words("serve") and "port" in jobkind.stop_words("serve")
    assert all("checkpoint" not in jobkind.stop_words(k) for k in jobkind.KINDS if k != "train")
