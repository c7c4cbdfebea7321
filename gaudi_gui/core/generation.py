"""Model runner data: load options, generation parameters, conversations, presets, protocol messages.

Qt-free and torch-free: the runner tab, the generation client, the worker and ``gaudi-gui generate``
all build and check the same values here, so a bad parameter gets the same message everywhere.

Protocol (``gaudi_gui.core.protocol`` lines):
  commands (parent -> worker): load, generate, cancel, unload, shutdown
  events (worker -> parent): ready, loading, info, loaded, token, finished, unloaded, error
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gaudi_gui.core import paths, protocol
from gaudi_gui.core import quantization as quant

DEVICES = ("auto", "hpu", "cuda", "cpu")
DTYPES = ("auto", "bf16", "fp32")
#: The one vocabulary (core.quantization), here for the runner's form and ``gaudi-gui generate``.
QUANTIZATIONS = quant.QUANTIZATIONS

#: Error kinds the worker reports, so the UI can phrase and the CLI can exit accordingly.
ERROR_KINDS = ("missing_model", "no_network", "out_of_memory", "bad_parameters", "unsupported",
               "not_loaded", "busy", "protocol", "internal")

# Bounds of the generation parameters: the runner tab's fields, the CLI and the worker all use these,
# so a value the field refuses is also refused on the command line and over the protocol.
MAX_NEW_TOKENS = 131_072       # the longest context of common models; more is a typo, not a wish
MAX_TOP_K = 100_000
TEMPERATURE_RANGE = (0.01, 10.0)   # below 0.01 the logits overflow to inf/nan; greedy is "sample off"
TOP_P_RANGE = (0.01, 1.0)
REPETITION_PENALTY_RANGE = (0.1, 10.0)
MAX_BEAMS = 16
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 200

#: What the UI and the CLI say for an empty prompt.
EMPTY_PROMPT = "type a prompt"


@dataclass
class LoadOptions:
    """How the worker loads a model."""

    model: str = paths.DEMO_MODEL_ID
    device: str = "auto"
    dtype: str = "auto"
    quantization: str = "none"
    compile: bool = False
    trust_remote_code: bool = False

    def validate(self) -> list[str]:
        problems: list[str] = []
        if not self.model.strip():
            problems.append("model: give a Hub id (org/name), a local folder, or builtin:demo")
        if self.device not in DEVICES:
            problems.append(f"device must be one of {', '.join(DEVICES)} (got {self.device!r})")
        if self.dtype not in DTYPES:
            problems.append(f"dtype must be one of {', '.join(DTYPES)} (got {self.dtype!r})")
        if quant.problem(self.quantization):
            problems.append(quant.problem(self.quantization))
        if self.quantization != "none" and self.compile:
            problems.append("torch.compile cannot be combined with bitsandbytes quantization")
        return problems

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadOptions:
        options: LoadOptions = _from_dict(cls, data)
        # Saved settings of older releases may spell it otherwise ("bnb-4bit", "nf4", "int8"...).
        options.quantization = quant.normalize(options.quantization)
        return options


@dataclass
class GenerationParams:
    """Parameters of one generate() call."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    do_sample: bool = True
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 50
    repetition_penalty: float = 1.0
    num_beams: int = 1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)

    def field_problems(self) -> dict[str, str]:
        """What is wrong, by field name (the runner tab marks those fields); empty when all is well."""
        problems: dict[str, str] = {}

        def _int(name: str, low: int, high: int, text: str) -> bool:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                problems[name] = text
                return False
            return True

        def _float(name: str, bounds: tuple[float, float], text: str) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                problems[name] = f"{name} must be a finite number"
            elif not bounds[0] <= value <= bounds[1]:
                problems[name] = text

        if _int("max_new_tokens", 1, MAX_NEW_TOKENS,
                f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS}"):
            _int("min_new_tokens", 0, self.max_new_tokens,
                 "min_new_tokens must be between 0 and max_new_tokens")
        # Checked whether or not sampling is on: a NaN must never reach generate(), and a preset saved
        # with sampling off must still be valid when sampling is turned back on.
        _float("temperature", TEMPERATURE_RANGE, "temperature must be between {} and {} (turn sampling off "
               "for greedy)".format(*TEMPERATURE_RANGE))
        _float("top_p", TOP_P_RANGE, "top_p must be between {} and {}".format(*TOP_P_RANGE))
        _int("top_k", 0, MAX_TOP_K, f"top_k must be between 0 and {MAX_TOP_K} (0 turns it off)")
        _float("repetition_penalty", REPETITION_PENALTY_RANGE,
               "repetition_penalty must be between {} and {} (1.0 turns it off)".format(
                   *REPETITION_PENALTY_RANGE))
        if _int("num_beams", 1, MAX_BEAMS, f"num_beams must be between 1 and {MAX_BEAMS}") \
                and self.num_beams > 1 and self.do_sample:
            # Beam sampling exists but streaming it shows tokens of beams that lose later; refuse.
            problems["num_beams"] = "num_beams > 1 needs sampling off (beam search is greedy here)"
        if not isinstance(self.do_sample, bool):
            problems["do_sample"] = "do_sample must be true or false"
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**63):
            problems["seed"] = "seed must be a non-negative integer"
        if not isinstance(self.stop, list) or any(not isinstance(s, str) or not s for s in self.stop):
            problems["stop"] = "stop strings must be non-empty text"
        elif len(self.stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in self.stop):
            problems["stop"] = (f"at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS} "
                                "characters each")
        return problems

    def validate(self) -> list[str]:
        return list(self.field_problems().values())

    @property
    def streams(self) -> bool:
        """Beam search cannot stream (the best beam is known only at the end): the whole answer then
        arrives as one token event when generation finishes."""
        return self.num_beams == 1

    def generate_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``model.generate``; the worker adds ``stop_strings`` (with the
        tokenizer they need) and its streamer and stopping criteria."""
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "do_sample": self.do_sample,
                                  "repetition_penalty": self.repetition_penalty,
                                  "num_beams": self.num_beams}
        if self.min_new_tokens:
            kwargs["min_new_tokens"] = self.min_new_tokens
        if self.do_sample:
            kwargs.update(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)
        return kwargs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationParams:
        return _from_dict(cls, data)

    @classmethod
    def parse(cls, data: Any) -> tuple[GenerationParams, list[str]]:
        """Strict reading of a command's params (the worker): every wrong value is a problem, never
        silently replaced by a default. Returns (params, problems)."""
        if not isinstance(data, dict):
            return cls(), ["params must be an object"]
        bad: list[str] = []
        params = _from_dict(cls, data, bad)
        problems = [f"{name}: {data[name]!r} is not a valid value" for name in bad]
        return params, problems + params.validate()


def _from_dict(cls: Any, data: dict[str, Any], bad: list[str] | None = None) -> Any:
    """Build a dataclass from a (possibly stale or hand-edited) dict: unknown keys are ignored and
    values of the wrong type fall back to the default (their names go into ``bad`` when given), so old
    settings never break the tab."""
    default = cls()
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        current = getattr(default, f.name)
        try:
            if f.name == "seed":
                values[f.name] = None if value in (None, "") else _as_int(value)
            elif f.name == "stop":
                if not isinstance(value, list):
                    raise TypeError("stop must be a list")
                values[f.name] = [str(s) for s in value]
            elif isinstance(current, bool):
                if bad is not None and not isinstance(value, bool):
                    raise TypeError("not a bool")
                values[f.name] = bool(value)
            elif isinstance(current, int):
                values[f.name] = _as_int(value)
            elif isinstance(current, float):
                if isinstance(value, bool):
                    raise TypeError("a bool is not a number")
                values[f.name] = float(value)
            else:
                values[f.name] = str(value)
        except (TypeError, ValueError, OverflowError):
            if bad is not None:
                bad.append(f.name)
            continue
    return cls(**values)


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError("a bool is not a number")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("not a whole number")
        return int(value)
    return int(value)


# -- presets --------------------------------------------------------------------------------------------

BUILTIN_PRESETS: dict[str, dict[str, Any]] = {
    "Balanced": GenerationParams().to_dict(),
    "Greedy": GenerationParams(do_sample=False).to_dict(),
    "Creative": GenerationParams(temperature=1.0, top_p=0.98, top_k=0).to_dict(),
}


# -- conversation -----------------------------------------------------------------------------------------

@dataclass
class Turn:
    role: str  # "user" | "assistant"
    content: str
    stats: dict[str, Any] | None = None


@dataclass
class Conversation:
    """A system prompt and the turns so far; what chat mode sends and what export writes."""

    system: str = ""
    turns: list[Turn] = field(default_factory=list)
    model: str = ""

    def add_user(self, text: str) -> None:
        self.turns.append(Turn("user", text))

    def add_assistant(self, text: str, stats: dict[str, Any] | None = None) -> None:
        self.turns.append(Turn("assistant", text, stats))

    def messages(self) -> list[dict[str, str]]:
        """The chat-template input: system prompt (when given) then every turn."""
        out = [{"role": "system", "content": self.system}] if self.system.strip() else []
        out += [{"role": t.role, "content": t.content} for t in self.turns]
        return out

    def last_answer(self) -> str:
        for turn in reversed(self.turns):
            if turn.role == "assistant":
                return turn.content
        return ""

    def clear(self) -> None:
        self.turns.clear()

    def to_json(self) -> str:
        return json.dumps({"model": self.model, "system": self.system,
                           "turns": [asdict(t) for t in self.turns]}, indent=2, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Conversation:
        data = json.loads(text)
        turns = [Turn(str(t["role"]), str(t["content"]), t.get("stats")) for t in data.get("turns", [])]
        return cls(system=str(data.get("system", "")), turns=turns, model=str(data.get("model", "")))

    def to_markdown(self) -> str:
        lines = ["# Conversation", ""]
        if self.model:
            lines += [f"Model: `{self.model}`", ""]
        if self.system.strip():
            lines += ["## System", "", self.system.strip(), ""]
        for turn in self.turns:
            lines += [f"## {turn.role.capitalize()}", "", turn.content.strip(), ""]
            if turn.stats:
                lines += [f"*{format_stats(turn.stats)}*", ""]
        return "\n".join(lines)


# -- the model's context: a chat kept within it ----------------------------------------------------------

#: transformers gives a tokenizer without a limit ``model_max_length = int(1e30)``: past this, no limit.
NO_LIMIT = 10**8


def context_of(config: Any, tokenizer_config: Any = None) -> int | None:
    """The longest a model takes, prompt and answer, in tokens: the smaller of its config's
    ``max_position_embeddings`` (a multimodal model's ``text_config``'s) and its tokenizer's
    ``model_max_length`` where that is a real limit; None where neither says."""
    limits: list[int] = []
    if isinstance(config, dict):
        text = config.get("text_config")
        for source in (config, text if isinstance(text, dict) else {}):
            value = source.get("max_position_embeddings")
            if isinstance(value, int) and not isinstance(value, bool) and 0 < value < NO_LIMIT:
                limits.append(value)
                break
    if isinstance(tokenizer_config, dict):
        value = tokenizer_config.get("model_max_length")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < NO_LIMIT:
            limits.append(int(value))
    return min(limits) if limits else None


def model_folder(model: str) -> str | None:
    """The folder holding ``model``'s files here: ``builtin:demo``'s, a folder, or a Hub id's cached
    snapshot (no network); None where it is not here."""
    import os

    text = model.strip()
    if paths.is_demo(text):
        return str(paths.demo_model_dir())
    expanded = os.path.expanduser(text)
    if os.path.isdir(expanded):
        return expanded
    if not text or text.startswith((".", "/", "~")):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
        found = try_to_load_from_cache(text, "config.json")
    except Exception:  # not a repo id, an unreadable cache: the context is simply not known
        return None
    return os.path.dirname(found) if isinstance(found, str) else None


def model_context(model: str) -> int | None:
    """``model``'s context length read from its own files here (``context_of``), or None."""
    import os

    folder = model_folder(model)
    if folder is None:
        return None
    found: list[Any] = []
    for name in ("config.json", "tokenizer_config.json"):
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                found.append(json.load(fh))
        except (OSError, ValueError, RecursionError):
            found.append(None)
    return context_of(found[0], found[1])


def prompt_budget(context: int, max_new_tokens: int) -> int:
    """How long a prompt may be in a ``context``-token model so the answer has room: the context less
    the answer's tokens, but never less than half of it (an answer asked longer than the context is
    cut there instead of leaving no room for the question)."""
    return context - min(max(int(max_new_tokens), 0), context // 2)


class ContextError(ValueError):
    """Even the newest message alone does not fit the model's context: ``tokens`` (with the system
    prompt) where ``budget`` were left for it."""

    def __init__(self, tokens: int, budget: int) -> None:
        super().__init__(f"the message is {tokens} tokens long with the system prompt, and the model's "
                         f"context leaves {budget} for it: shorten it or lower max new tokens")
        self.tokens = tokens
        self.budget = budget

    def said(self, context: int, *, about: bool = False) -> str:
        """The refusal for a person: the message's length (``about``: an estimate), the room the
        model's ``context`` leaves it, and what to do."""
        return (f"the message is {'about ' if about else ''}{self.tokens} tokens long with the system "
                f"prompt; the model takes {context} tokens, prompt and answer, which leaves {self.budget} "
                "for it with the answer's room: shorten it or lower max new tokens")


def fit_messages(messages: list[dict[str, str]], count: Any, budget: int,
                 *, at_least: int = 0) -> tuple[list[dict[str, str]], int]:
    """The conversation to send: the oldest turns left out until ``count(messages)`` (its tokens) is at
    most ``budget``, and at least ``at_least`` turns left out. The system prompt and the newest
    message always stay; an answer goes with the question it answered (never one without the other
    at the start). Returns (messages, how many turns were left out); ``ContextError`` where even the
    system prompt and the newest message are too long."""
    system = [m for m in messages if m.get("role") == "system"]
    turns = [m for m in messages if m.get("role") != "system"]
    dropped = 0
    while True:
        kept = system + turns
        if dropped >= at_least and count(kept) <= budget:
            return kept, dropped
        if len(turns) <= 1:
            raise ContextError(count(kept), budget)
        # The oldest turn, and the answer that followed it: the next kept turn is then a question.
        step = 2 if len(turns) > 2 and turns[1].get("role") == "assistant" else 1
        turns = turns[step:]
        dropped += step


def left_out_note(left_out: int, context: int | None) -> str:
    """'2 oldest turns left out to fit the model's 512-token context' ('' for none left out)."""
    if not left_out:
        return ""
    turns = "turn" if left_out == 1 else "turns"
    fit = f"the model's {context}-token context" if context else "the model's context"
    return f"{left_out} oldest {turns} left out to fit {fit}"


_OVERFLOW = (
    # transformers serve: "The prompt has 667 tokens, but the model takes at most 512, prompt and answer"
    re.compile(r"prompt has (?P<prompt>\d+) tokens, but the model takes at most (?P<limit>\d+)"),
    # vLLM: "This model's maximum context length is 512 tokens. However, you requested 667 tokens (…
    # 539 in the messages, 128 in the completion)"
    re.compile(r"maximum context length is (?P<limit>\d+) tokens.*?(?P<prompt>\d+) in the messages", re.S),
    re.compile(r"maximum context length is (?P<limit>\d+) tokens.*?prompt contains (?P<prompt>\d+)", re.S),
    re.compile(r"maximum context length is (?P<limit>\d+) tokens.*?request has (?P<prompt>\d+) input", re.S),
)


def context_overflow(text: str) -> tuple[int, int] | None:
    """(prompt tokens, context) from a server's refusal of a prompt too long for the model, else None."""
    for pattern in _OVERFLOW:
        match = pattern.search(text)
        if match:
            return int(match["prompt"]), int(match["limit"])
    return None


def format_stats(stats: dict[str, Any]) -> str:
    """'TTFT 12 ms · 250.3 tok/s · 64 tokens · 210 MB · eos' from a finished event's stats."""
    parts: list[str] = []
    if stats.get("ttft_s") is not None:
        parts.append(f"TTFT {stats['ttft_s'] * 1000:.0f} ms")
    if stats.get("decode_tokens_per_s") is not None:
        parts.append(f"{stats['decode_tokens_per_s']:.1f} tok/s")
    if stats.get("tokens") is not None:
        parts.append(f"{stats['tokens']} tokens")
    if stats.get("total_s") is not None:
        parts.append(f"{stats['total_s']:.2f} s")
    memory = stats.get("memory_bytes")
    if memory:
        parts.append(f"{format_bytes(memory)} {stats.get('memory_kind', '')}".strip())
    if stats.get("stop_reason"):
        parts.append(str(stats["stop_reason"]))
    note = left_out_note(int(stats.get("left_out") or 0), stats.get("context"))
    if note:
        parts.append(note)
    return " · ".join(parts)


def format_bytes(value: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit in ("B", "KB") else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


# -- protocol ---------------------------------------------------------------------------------------------

def load_command(options: LoadOptions) -> str:
    return protocol.command("load", options=options.to_dict())


def generate_command(params: GenerationParams, *, prompt: str | None = None,
                     messages: list[dict[str, str]] | None = None, request_id: int = 0,
                     profile: bool = False) -> str:
    """``profile``: record the answer's decode steps with torch.profiler (issue 40); the worker says
    where in its ``finished`` stats (``profile``: a folder holding ``profile/``, as a run's)."""
    if (prompt is None) == (messages is None):
        raise ValueError("give either a prompt or chat messages")
    fields_: dict[str, Any] = {"params": params.to_dict(), "id": request_id}
    if profile:
        fields_["profile"] = True
    if prompt is not None:
        fields_["prompt"] = prompt
    else:
        fields_["messages"] = messages
    return protocol.command("generate", **fields_)


def cancel_command(request_id: int | None = None) -> str:
    """Cancel request ``request_id`` (queued or running); without an id, every generate the worker
    received before this cancel. A generate sent after it is never affected."""
    if request_id is None:
        return protocol.command("cancel")
    return protocol.command("cancel", id=request_id)


def unload_command() -> str:
    return protocol.command("unload")


def shutdown_command() -> str:
    return protocol.command("shutdown")


def parse_messages(value: Any) -> list[dict[str, str]]:
    """Chat messages from a command, checked: a list of {role, content} with known roles."""
    if not isinstance(value, list) or not value:
        raise ValueError("messages must be a non-empty list")
    out = []
    for item in value:
        if not isinstance(item, dict) or item.get("role") not in ("system", "user", "assistant") \
                or not isinstance(item.get("content"), str):
            raise ValueError(f"bad chat message: {item!r}")
        out.append({"role": item["role"], "content": item["content"]})
    return out


def prompt_problem(text: str) -> str | None:
    """``EMPTY_PROMPT`` for a prompt with nothing in it, else None."""
    return EMPTY_PROMPT if not text.strip() else None


# -- the stop strings field ------------------------------------------------------------------------------
# Taken literally, except four escapes a single-line field needs: \n (newline), \t (tab), \, (a comma
# inside a stop string) and \\ (a backslash). Any other backslash is an ordinary character: no
# unicode_escape, which garbled non-ASCII text ("。") and raised on "\x".

_FIELD_ESCAPES = {"n": "\n", "t": "\t", ",": ",", "\\": "\\"}


def parse_stop_field(text: str) -> list[str]:
    """Stop strings from the comma-separated field; blanks around each item are dropped."""
    items: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in _FIELD_ESCAPES:
            current.append(_FIELD_ESCAPES[text[i + 1]])
            i += 2
            continue
        if ch == ",":
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    items.append("".join(current))
    return [item.strip(" ") for item in items if item.strip(" ")]


def format_stop_field(stops: list[str]) -> str:
    """The field text that ``parse_stop_field`` reads back as ``stops``."""
    def one(s: str) -> str:
        return s.replace("\\", "\\\\").replace(",", "\\,").replace("\n", "\\n").replace("\t", "\\t")
    return ", ".join(one(s) for s in stops)

