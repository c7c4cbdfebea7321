"""The vendors' energy counters beside the integrated power (issue 27): NVML's total energy on CUDA
(pynvml), HLML's on Gaudi (pyhlml), read at the run's start and end for the run's own cards. Neither
library is on this machine: fake module objects stand in, with the libraries' own function names, and
a real Meter runs (on Gaudi with the fake hl-smi replaying recorded power)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gaudi_gui.core import meter, meter_counters, meter_words, meter_work


def _library(prefix: str, watts: dict[int, float], *, module_ids: list[int] | None = None,
             fail: frozenset[int] | set[int] = frozenset()) -> tuple[SimpleNamespace, dict[str, Any]]:
    """A pynvml / pyhlml stand-in: device i draws ``watts[i]`` since the library was imported (its
    counter in mJ since then, as the real ones count since the driver loaded)."""
    t0 = time.monotonic() - 100  # the driver loaded earlier: counters do not start at 0
    calls: dict[str, Any] = {"init": 0, "shutdown": 0}
    ids = module_ids or list(watts)

    def energy(handle: int) -> int:
        if handle in fail:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return int(watts[handle] * (time.monotonic() - t0) * 1000)

    fns = {"Init": lambda: calls.__setitem__("init", calls["init"] + 1),
           "Shutdown": lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1),
           "DeviceGetCount": lambda: len(watts),
           "DeviceGetHandleByIndex": lambda i: list(watts)[i],
           "DeviceGetTotalEnergyConsumption": energy}
    if prefix == "hlml":
        fns["DeviceGetModuleID"] = lambda handle: ids[list(watts).index(handle)]
    return SimpleNamespace(**{f"{prefix}{k}": v for k, v in fns.items()}), calls


def _run(folder: Path, device: str, env: dict[str, str], module: Any, seconds: float = 1.5) -> dict[str, Any]:
    m = meter.Meter(folder, device=device, env=env)
    m.counter_module = module
    m.start()
    time.sleep(seconds)  # the run's length: the counters and the fake hl-smi advance in real time
    return m.stop()


def test_nvml_counter_of_the_runs_own_gpus_is_the_energy_where_no_power_was_integrated(
        tmp_path: Path) -> None:
    # GPUs 0..3 draw 50, 60, 70, 80 W; the run has GPUs 1 and 3. nvidia-smi is not on PATH here.
    lib, calls = _library("nvml", {0: 50.0, 1: 60.0, 2: 70.0, 3: 80.0})
    summary = _run(tmp_path, "cuda", {"PATH": str(tmp_path), "CUDA_VISIBLE_DEVICES": "1,3"}, lib)
    counter = summary["energy_counter"]
    assert counter["source"] == "nvml" and set(counter["per_card"]) == {"GPU 1", "GPU 3"}
    wall = summary["wall_s"]
    assert counter["per_card"]["GPU 1"] == pytest.approx(60 * wall, rel=0.05)
    assert counter["energy_j"] == pytest.approx(140 * wall, rel=0.05)
    # Nothing integrated (no nvidia-smi): the counter's energy is the run's, named as such.
    assert summary["energy_source"] == "nvml" and summary["energy_j"] == counter["energy_j"]
    assert "integrated_diff_pct" not in counter
    assert calls == {"init": 1, "shutdown": 1}
    assert "NVML counter" in meter_words.describe(summary)


def test_hlml_counter_beside_the_integrated_hl_smi_power(tmp_path: Path, fake_hl_smi: Path) -> None:
    # HLML's handles are in its own order; the run's cards are module ids 2 and 3 (102 W and 103 W in
    # the recorded hl-smi output; the fake library says 100 W and 110 W).
    lib, calls = _library("hlml", {10: 100.0, 11: 110.0, 12: 90.0}, module_ids=[2, 3, 5])
    import os
    summary = _run(tmp_path, "hpu", {**os.environ, "HABANA_VISIBLE_MODULES": "2,3"}, lib, seconds=2.5)
    counter = summary["energy_counter"]
    assert counter["source"] == "hlml" and set(counter["per_card"]) == {"module 2", "module 3"}
    assert summary["energy_source"] == "hl-smi power integrated"  # the integral stays the run's figure
    assert counter["integrated_diff_pct"] == pytest.approx(
        (summary["energy_j"] - counter["energy_j"]) / counter["energy_j"] * 100, abs=0.01)
    assert "HLML counter" in meter_words.describe(summary) and "(integrated " in meter_words.describe(summary)
    assert calls["shutdown"] == 1


def test_a_counter_that_fails_is_named_never_counted_as_0(tmp_path: Path) -> None:
    lib, _calls = _library("nvml", {0: 50.0, 1: 60.0}, fail={1})
    summary = _run(tmp_path, "cuda", {"PATH": str(tmp_path)}, lib, seconds=0.3)
    counter = summary["energy_counter"]
    assert counter["per_card"].keys() == {"GPU 0"} and counter["complete"] is False
    assert "GPU 1" in counter["note"] and "NOT_SUPPORTED" in counter["note"]
    # No library at all (this machine): no counter, nothing said, the meter as before.
    plain = meter.Meter(tmp_path / "x", device="cuda", env={"PATH": str(tmp_path)})
    (tmp_path / "x").mkdir()
    plain.start()
    assert "energy_counter" not in plain.stop()
    assert meter_counters.energy_counter("cpu", None, lib) is None


def test_runs_list_line_says_wh_per_1000_tokens_of_a_serve_or_evaluate_run() -> None:
    summary = {"card_hours": 0.011, "energy_j": 4000.0, "energy_kwh": 4000 / 3.6e6,
               "energy_source": "hl-smi power integrated", "wall_s": 20.0, "generated_tokens": 2000,
               "tokens_source": "new tokens of the answers"}
    summary.update(meter_work.token_figures(summary))
    assert summary["energy_per_1k_tokens_wh"] == pytest.approx(4000 / 3600 / 2)
    assert meter_words.short(summary) == "0.011 card-h · 0.0011 kWh · 0.56 Wh/1k tok"
    assert meter_words.outcome_words(summary) == ("0.011 card-hours · 4.0 kJ (hl-smi power integrated) · "
                                                  "2,000 tokens generated · 0.56 Wh per 1,000 tokens")
    unmeasured = {**summary, "energy_j": None, "energy_kwh": None}
    unmeasured.update(meter_work.token_figures(unmeasured))
    assert unmeasured["energy_per_1k_tokens_wh"] is None
    assert unmeasured["per_1k_tokens_note"] == "energy not measured"
    assert "Wh/1k" not in meter_words.short(unmeasured)
    assert "Wh per 1,000 tokens not measured (energy not measured)" in meter_words.tokens_text(unmeasured)


def test_a_served_models_tokens_come_from_its_engines_own_count_never_0_by_default() -> None:
    """transformers serve's counter (``serve_tokens`` running totals) wins over the request log; an
    engine that cannot count says why, and one whose counter saw none of its answered requests is
    not believed: "not measured" with the reason, never 0 tokens."""
    answered = {"type": "serve_request", "method": "POST", "path": "/v1/chat/completions", "status": 200,
                "completion_tokens": None}
    ran = [{"type": "serve_tokens", "counting": True, "prompt_tokens": 0, "completion_tokens": 0},
           answered, answered,
           {"type": "serve_tokens", "counting": True, "prompt_tokens": 30, "completion_tokens": 12,
            "source": "the engine's own count"}]
    counted = meter_work.generated_tokens("serve", ran)
    assert counted["generated_tokens"] == 12 and counted["prompt_tokens"] == 30
    assert counted["token_items"] == 2 and counted["tokens_source"] == "the engine's own count"
    summary = {"energy_j": 36.0, "wall_s": 6.0, **counted}
    assert meter_work.token_figures(summary) == {
        "energy_per_1k_tokens_wh": pytest.approx(36 / 3600 / 12 * 1000), "tokens_per_s": 2.0,
        "per_1k_tokens_note": ""}
    cannot = meter_work.generated_tokens("serve", [{"type": "serve_tokens", "counting": False,
                                               "why": "transformers 9.0 has no GenerateRunner.count_tokens"},
                                              answered])
    assert cannot["generated_tokens"] is None
    figures = meter_work.token_figures({"energy_j": 36.0, "wall_s": 6.0, **cannot})
    assert figures["energy_per_1k_tokens_wh"] is None and figures["tokens_per_s"] is None
    assert figures["per_1k_tokens_note"] == ("the engine's tokens were not counted: transformers 9.0 has no "
                                             "GenerateRunner.count_tokens")
    blind = meter_work.generated_tokens("serve", [ran[0], answered])
    assert blind["generated_tokens"] is None and "saw no token of the 1 request(s)" in blind["tokens_note"]
    idle = meter_work.generated_tokens("serve", [ran[0]])  # served nobody: 0 tokens, and no Wh per 1,000
    assert idle["generated_tokens"] == 0
    assert meter_work.token_figures({"energy_j": 36.0, "wall_s": 6.0, **idle})["per_1k_tokens_note"] == \
        "no tokens generated"
    # vLLM (no serve_tokens): the request log's counts, as before.
    assert meter_work.generated_tokens("serve", [{**answered,
                                                  "completion_tokens": 4}])["generated_tokens"] == 4
