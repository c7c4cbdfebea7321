"""Units of gaudi_gui.core.generation: validation, dict round-trips, export, protocol commands."""

from __future__ import annotations

from gaudi_gui.core import generation, protocol
from gaudi_gui.core.generation import Conversation, GenerationParams, LoadOptions


def test_params_validation_messages() -> None:
    assert GenerationParams().validate() == []
    assert any("temperature must be between" in p for p in GenerationParams(temperature=0).validate())
    assert any("num_beams" in p for p in GenerationParams(num_beams=2).validate())
    assert not GenerationParams(num_beams=2, do_sample=False).streams
    assert any("max_new_tokens" in p for p in GenerationParams(max_new_tokens=0).validate())


def test_load_options_validation_and_round_trip() -> None:
    assert LoadOptions().validate() == []
    bad = LoadOptions(model=" ", device="tpu", quantization="2bit")
    assert len(bad.validate()) == 3
    opts = LoadOptions(model="x/y", dtype="bf16", quantization="4bit")
    assert LoadOptions.from_dict(opts.to_dict()) == opts
    # Stale or hand-edited settings never break: wrong types fall back to defaults.
    assert LoadOptions.from_dict({"compile": "yes", "junk": 1}).compile is True


def test_presets_round_trip() -> None:
    # As the runner saves a preset in the settings and reads it back.
    mine = GenerationParams(top_k=3, seed=7, stop=["\n\n"])
    assert GenerationParams.from_dict(mine.to_dict()) == mine
    assert GenerationParams.from_dict({"seed": "", "top_k": "bad"}) == GenerationParams()


def test_conversation_export() -> None:
    conv = Conversation(system="Be brief.", model="builtin:demo")
    conv.add_user("hi")
    conv.add_assistant("hello", {"ttft_s": 0.01, "tokens": 3, "decode_tokens_per_s": 100.0})
    assert conv.messages()[0] == {"role": "system", "content": "Be brief."}
    assert Conversation.from_json(conv.to_json()) == conv
    md = conv.to_markdown()
    assert "## User" in md and "## Assistant" in md and "TTFT 10 ms" in md
    assert conv.last_answer() == "hello"


def test_protocol_commands() -> None:
    line = generation.generate_command(GenerationParams(), prompt="x", request_id=3)
    message = protocol.decode(line)
    assert message is not None and message["cmd"] == "generate" and message["id"] == 3
    assert protocol.decode(generation.load_command(LoadOptions()))["options"]["model"] == "builtin:demo"  # type: ignore[index]


def test_bounds_and_non_finite_values() -> None:
    nan, inf = float("nan"), float("inf")
    for bad in (dict(temperature=nan), dict(top_p=inf), dict(repetition_penalty=nan),
                dict(temperature=-inf, do_sample=False), dict(num_beams=generation.MAX_BEAMS + 1),
                dict(max_new_tokens=generation.MAX_NEW_TOKENS + 1), dict(top_k=-1),
                dict(repetition_penalty=0.0), dict(seed=-1), dict(stop=[""]), dict(stop=["x"] * 17)):
        found = GenerationParams(**bad).field_problems()
        assert set(found) == {next(iter(bad))}, (bad, found)
    assert GenerationParams(num_beams=4, do_sample=False).validate() == []
    params, problems = GenerationParams.parse({"temperature": "hot", "max_new_tokens": True,
                                               "do_sample": "yes", "junk": 1})
    assert len(problems) == 3 and params == GenerationParams()
    assert GenerationParams.parse({"max_new_tokens": 5.0})[1] == []
    assert GenerationParams.parse([1])[1] == ["params must be an object"]
    assert generation.prompt_problem("  \n") == generation.EMPTY_PROMPT
    assert generation.prompt_problem("hi") is None


def test_stop_field_is_literal_and_round_trips() -> None:
    text = "。, \\x, \\n\\n, a\\,b, c:\\\\d,  ### "
    stops = generation.parse_stop_field(text)
    assert stops == ["。", "\\x", "\n\n", "a,b", "c:\\d", "###"]
    assert generation.parse_stop_field(generation.format_stop_field(stops)) == stops
    assert generation.parse_stop_field(" , ,") == []


def test_cancel_command_carries_the_request() -> None:
    assert protocol.decode(generation.cancel_command(7)) == {"cmd": "cancel", "id": 7}
    assert protocol.decode(generation.cancel_command()) == {"cmd": "cancel"}
