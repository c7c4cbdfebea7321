"""What a run's energy bought: its generated tokens (a Serve or an Evaluate run: from its events or
its engine's own count), the figures per token, and its pace from its logged steps (steps, samples and
tokens per second, warm-up left out), kept in the run's meter summary. Qt-free and torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gaudi_gui.core.events import EventType
from gaudi_gui.core.meter_account import PARTIAL, clean, finite, share_text

# -- Serve and Evaluate: what the energy bought --------------------------------------------------------


def generated_tokens(kind: str, events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What a Serve or Evaluate job generated, from its events: Serve's engine's own count where it
    keeps one (``serve_tokens``: ``transformers serve`` through workers/transformers_serve, vLLM's
    Prometheus counters read by ``gaudi-gui serve``; exact), else its request log (each
    ``serve_request`` to a completions endpoint, its ``completion_tokens``); Evaluate's answers (each
    ``answer``'s ``new_tokens``). A request or answer without a count is counted as such, never as 0
    tokens; ``generated_tokens`` None when none had one, with why in ``tokens_note`` where the engine
    said it."""
    events = list(events)
    if kind == "serve":
        engine = _engine_count(events)
        if engine is not None:
            return engine
    total, counted, without = 0, 0, 0
    for event in events:
        if kind == "serve" and event.get("type") == EventType.SERVE_REQUEST:
            if "completions" not in str(event.get("path") or ""):
                continue  # /v1/models and the like generate nothing
            value = event.get("completion_tokens")
        elif kind == "eval" and event.get("type") == EventType.ANSWER:
            value = event.get("new_tokens")
        else:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            total, counted = total + value, counted + 1
        else:
            without += 1
    source = "completion_tokens of the request log" if kind == "serve" else "new tokens of the answers"
    return {"generated_tokens": total if counted else None, "tokens_source": source,
            "token_items": counted, "token_items_without_count": without}


def _engine_count(events: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Serve's tokens as its engine counted them (its last ``serve_tokens``: running totals), or None
    when the engine said nothing (a vLLM run of an earlier gaudi-gui: the request log's counts then).
    An engine that counts but saw no token of the requests it answered is not believed: "not
    measured", never 0."""
    last: Mapping[str, Any] | None = None
    answered = 0
    for event in events:
        if event.get("type") == EventType.SERVE_TOKENS:
            last = event
        elif event.get("type") == EventType.SERVE_REQUEST and "completions" in str(event.get("path") or "") \
                and event.get("status") == 200:
            answered += 1
    if last is None:
        return None
    source = str(last.get("source") or "the engine's own count")
    out: dict[str, Any] = {"generated_tokens": None, "tokens_source": source, "token_items": answered,
                           "token_items_without_count": 0}
    generated, prompt = last.get("completion_tokens"), last.get("prompt_tokens")
    if last.get("counting") is False:
        out["tokens_note"] = f"the engine's tokens were not counted: {last.get('why') or 'no reason given'}"
    elif not isinstance(generated, int) or isinstance(generated, bool) or generated < 0:
        out["tokens_note"] = "the engine's token count was unreadable"
    elif generated == 0 and answered:
        out["tokens_note"] = (f"the engine's token counter saw no token of the {answered} request(s) it "
                              "answered")
    else:
        out["generated_tokens"] = generated
        if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt >= 0:
            out["prompt_tokens"] = prompt
    return out


def token_figures(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Energy per 1,000 generated tokens (Wh) and generated tokens per second of wall time, from a
    summary holding ``generated_tokens``; each None (not measured) when its parts are missing, with
    why in ``per_1k_tokens_note``."""
    tokens = finite(summary.get("generated_tokens"))
    joules, wall = finite(summary.get("energy_j")), finite(summary.get("wall_s"))
    per_1k: float | None = None
    why = ""
    if tokens is None:
        why = str(summary.get("tokens_note") or "") or (
            "no token counts in the request log (the engine's access log gives none)"
            if str(summary.get("tokens_source") or "").startswith("completion")
            else "no token counts in the answers")
    elif tokens <= 0:
        why = "no tokens generated"
    elif joules is None:
        share = finite(summary.get("energy_coverage"))
        why = (f"energy {PARTIAL}: read over {share_text(share or 0.0)} of the run only"
               if summary.get("energy_status") == PARTIAL else "energy not measured")
    else:
        per_1k = joules / 3600 / tokens * 1000
    return {"energy_per_1k_tokens_wh": None if per_1k is None else round(per_1k, 9),
            "tokens_per_s": None if tokens is None or not wall else round(tokens / wall, 3),
            "per_1k_tokens_note": why}


#: The first logged steps of a launch that the steady-state rate leaves out (at most this many; a
#: tenth of a short run): graph compilation and warm-up make them slow, and an ETA from them is wrong.
WARMUP_STEPS = 10


def true_memory_peak(records: Iterable[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """(the ranks' true device memory peak, its limit) in MiB over a run's metrics records: what the
    allocator really held (torch.hpu.memory_stats / torch.cuda), not hl-smi's pool; None unmeasured."""
    peak = limit = None
    for record in records:
        value = finite(record.get("memory_peak_mib"))
        if value is not None and value > 0:
            peak = value if peak is None else max(peak, value)
        cap = finite(record.get("memory_limit_mib"))
        if cap is not None and cap > 0:
            limit = cap
    return peak, limit


@dataclass(frozen=True)
class Rates:
    """A run's pace. ``steady``: from the steps after warm-up only (``from_step`` on); otherwise the
    worker's own averages since training began (warm-up included) and no ETA."""

    steps_per_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    eta_s: float | None = None
    steady: bool = False
    warmup_steps: int = 1
    from_step: int | None = None


def warmup_steps(max_steps: int) -> int:
    """How many first steps of a launch the steady rate leaves out: a tenth of the run, 1 to 10."""
    return max(1, min(WARMUP_STEPS, max_steps // 10)) if max_steps > 0 else 1


def _done(record: Mapping[str, Any], rate_key: str, count_key: str = "") -> float | None:
    """How many samples / tokens were done by this record: its own count, else rate x elapsed."""
    if count_key:
        count = finite(record.get(count_key))
        if count is not None:
            return count
    rate, elapsed = finite(record.get(rate_key)), finite(record.get("elapsed"))
    return None if rate is None or elapsed is None else rate * elapsed


def rates(records: Sequence[Mapping[str, Any]], *, max_steps: int = 0, start_step: int = 0) -> Rates:
    """The pace of the launch whose metrics records these are (``elapsed``: seconds since it began
    training; ``start_step``: where it began, a resumed run's checkpoint). The first
    ``warmup_steps(max_steps)`` steps are left out (compilation, warm-up): the rates and the ETA come
    from the records after them; until two such records exist, the worker's averages and no ETA."""
    points: list[Mapping[str, Any]] = []
    for record in records:
        step, elapsed = record.get("step"), finite(record.get("elapsed"))
        if record.get("summary") or not isinstance(step, int) or isinstance(step, bool) or elapsed is None:
            continue
        if points and (step <= points[-1]["step"] or elapsed <= float(points[-1]["elapsed"])):
            continue  # an evaluation's record at the same step, or a record out of order
        points.append(record)
    skip = warmup_steps(max_steps)
    if not points:
        return Rates(warmup_steps=skip)
    steady = [p for p in points if int(p["step"]) >= start_step + skip]
    last = points[-1]
    if len(steady) < 2:
        return Rates(finite(last.get("throughput")), finite(last.get("samples_per_second")),
                     finite(last.get("tokens_per_second")), None, False, skip)
    a, b = steady[0], steady[-1]
    dt = float(b["elapsed"]) - float(a["elapsed"])
    steps = (int(b["step"]) - int(a["step"])) / dt

    def per_s(rate_key: str, count_key: str = "") -> float | None:
        x, y = _done(a, rate_key, count_key), _done(b, rate_key, count_key)
        return None if x is None or y is None or y < x else (y - x) / dt

    eta = max(0.0, (max_steps - int(b["step"])) / steps) if max_steps > 0 and steps > 0 else None
    return Rates(steps, per_s("samples_per_second"), per_s("tokens_per_second", "tokens_seen"), eta, True,
                 skip, int(a["step"]))



def pace(folder: str | Path) -> dict[str, Any] | None:
    """The run's steady-state pace from its logged steps (``rates``: warm-up left out), kept in the
    summary so the Runs list and Compare read it without the events; None without steps."""
    from gaudi_gui.core.events import read_events
    from gaudi_gui.core.metrics import metric_record
    records = [r for r in (metric_record(e) for e in read_events(Path(folder) / "events.jsonl"))
               if r is not None]
    if not records:
        return None
    max_steps = max((int(r["max_steps"]) for r in records if isinstance(r.get("max_steps"), int)),
                    default=0)
    start = records[0].get("start_step")
    r = rates(records, max_steps=max_steps, start_step=start if isinstance(start, int) else 0)
    return {"steps_per_s": clean(r.steps_per_s), "samples_per_s": clean(r.samples_per_s),
            "tokens_per_s": clean(r.tokens_per_s), "steady": r.steady, "from_step": r.from_step}
