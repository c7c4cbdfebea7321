"""core.benchmark without a benchmark run: interleaved repeats, median and spread, the verdict rules,
the slow card among several, and references (a run's result, a table with a source per figure)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.core import benchmark as bm
from gaudi_gui.core import paths


def test_repeats_are_interleaved_and_no_workload_always_runs_first() -> None:
    order = bm.interleaved(["a", "b", "c"], 3)
    assert order == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"), (2, "c"), (2, "a"), (2, "b")]
    # Every workload's repeats are spread over the whole run, never back to back.
    assert [r for r, w in order if w == "a"] == [0, 1, 2]


def test_collect_median_spread_and_per_card_figures() -> None:
    samples = [{"workload": "matmul.bf16", "card": c, "repeat": r, "value": v}
               for c, values in (("0", (10.0, 11.0, 12.0)), ("1", (20.0, 21.0, 22.0)),
                                 ("2", (30.0, 31.0, 32.0)))
               for r, v in enumerate(values)]
    samples += [{"workload": "decode", "card": "0", "repeat": r, "value": v}
                for r, v in enumerate((90, 100, 110))]
    samples.append({"workload": "decode", "card": "0", "repeat": 3, "value": float("nan")})  # never a figure
    figures = bm.collect(samples)
    assert list(figures) == ["matmul.bf16", "decode"]  # the workloads' order, not the samples'
    matmul = figures["matmul.bf16"]
    assert matmul.samples == [20.0, 21.0, 22.0]  # each repeat's median over the cards
    assert matmul.cards == {"0": [10.0, 11.0, 12.0], "1": [20.0, 21.0, 22.0], "2": [30.0, 31.0, 32.0]}
    decode = figures["decode"]
    assert (decode.median, decode.low, decode.high, decode.n) == (100.0, 90.0, 110.0, 3)
    assert decode.spread == pytest.approx(0.2)
    assert decode.cards == {}
    assert bm.Figure.from_json("decode", decode.to_json()).samples == decode.samples


def fig(*values: float) -> bm.Figure:
    return bm.Figure("decode", list(values))


def test_verdict_rules() -> None:
    ref = fig(100, 102, 98)
    # Within the tolerance: as expected (the spreads said beside it).
    v = bm.verdict(fig(97, 99, 101), ref)
    assert (v.word, v.words) == ("as expected", "as expected (-1 %; spread 4 %, the reference's 4 %)")
    # Half the reference, every sample below the reference's lowest: slower, beyond the spread.
    v = bm.verdict(fig(49, 50, 51), ref)
    assert v.word == "slower"
    assert v.words == "slower than the reference by 50 % (beyond the spread of 3 repeats)"
    assert v.change == pytest.approx(-0.5)
    assert bm.verdict(fig(149, 150, 151), ref).word == "faster"
    # 20 % slower but the samples reach into the reference's range: the spread covers it.
    v = bm.verdict(fig(75, 82, 99), ref)
    assert (v.word, v.words) == ("cannot say", "cannot say (spread too wide: -18 % is within the spread of 3 "
                                               "repeats)")
    # A wide spread: cannot say, whatever the medians say.
    v = bm.verdict(fig(20, 50, 80), ref)
    assert v.word == "cannot say" and "spread too wide: these 3 repeats spread 120 %" in v.words
    v = bm.verdict(fig(49, 50, 51), fig(60, 100, 140))
    assert v.word == "cannot say" and "the reference's 3 repeats spread 80 %" in v.words
    # Never on one sample; no reference figure: said.
    assert bm.verdict(fig(10), ref).words == "cannot say (one sample: run at least 2 repeats)"
    assert bm.verdict(fig(10, 10), None).word == "no reference"


def test_the_slow_card_among_eight_is_named_and_two_cards_name_none() -> None:
    cards = {str(c): [400.0 + c, 402.0 + c, 404.0 + c] for c in range(8)}
    cards["5"] = [300.0, 305.0, 310.0]
    slow = bm.slow_cards(bm.Figure("matmul.bf16", [400, 401, 402], cards))
    assert [(s.card, round(s.below, 2)) for s in slow] == [("5", 0.25)]
    assert slow[0].words().startswith("card 5 is slower than the other cards by 25 % (matmul roofline, bf16")
    # Within the spreads: no card is named.
    close = {str(c): [400.0, 420.0, 440.0] for c in range(8)}
    close["5"] = [330.0, 350.0, 410.0]
    assert bm.slow_cards(bm.Figure("matmul.bf16", [], close)) == []
    assert bm.slow_cards(bm.Figure("matmul.bf16", [], {"0": [400, 401], "1": [100, 101]})) == []


def test_judged_names_the_slow_card_with_the_doctors_findings() -> None:
    cards = {str(c): [400.0, 401.0, 402.0] for c in range(4)}
    cards["2"] = [200.0, 201.0, 202.0]
    figure = bm.Figure("matmul.bf16", [400, 401, 402], cards)
    record = {"kind": "benchmark", "size": "tiny", "repeats": 3, "identity": {"card_type": "HL-225"},
              "figures": {"matmul.bf16": figure.to_json()},
              "card_findings": {"2": ["warning: card.throttle: power_brake active → check cooling"]}}
    out = bm.judged(record, None)
    assert [s["card"] for s in out["slow_cards"]] == ["2"]
    assert out["slow_cards"][0]["findings"] == ["warning: card.throttle: power_brake active → check cooling"]
    assert bm.summary_words(out) == "1 figure on ? × HL-225; slow card 2"
    text = "\n".join(bm.table_lines(out))
    assert "SLOW CARD: card 2 is slower than the other cards by 50 %" in text
    assert "  doctor: warning: card.throttle: power_brake active" in text


def test_a_table_reference_needs_a_source_per_figure_and_the_card_type(tmp_path: Path) -> None:
    table: dict[str, Any] = {"format": bm.TABLE_FORMAT, "version": 1,
             "cards": {"HL-225": {"size": "standard", "figures": {
                 "matmul.bf16": {"value": 400.0, "spread": 0.04, "source": "a measurement, software 1.22"}}}}}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    ref = bm.load_reference(str(path), card_type="HL-225", size="standard")
    assert ref.kind == "table" and ref.figures["matmul.bf16"].median == 400.0
    assert ref.figures["matmul.bf16"].source == "a measurement, software 1.22"
    with pytest.raises(bm.BenchmarkInputError, match=r"figures for HL-225, not for this machine's HL-325L"):
        bm.load_reference(str(path), card_type="HL-325L", size="standard")
    with pytest.raises(bm.BenchmarkInputError, match=r"measured at size standard, this benchmark runs tiny"):
        bm.load_reference(str(path), card_type="HL-225", size="tiny")
    del table["cards"]["HL-225"]["figures"]["matmul.bf16"]["source"]
    path.write_text(json.dumps(table))
    with pytest.raises(bm.BenchmarkInputError, match=r"needs a number 'value' and its 'source'"):
        bm.load_reference(str(path), card_type="HL-225", size="standard")
    with pytest.raises(bm.BenchmarkInputError, match=r"no such file or run"):
        bm.load_reference(str(tmp_path / "missing.json"), card_type="cpu", size="tiny")


def test_the_shipped_table_has_the_shape_and_invents_no_figure() -> None:
    """The table that ships: its shape, and only figures that say where they come from (none today:
    no published Intel figure for these workloads at these sizes was at hand)."""
    data = json.loads(paths.data_file(bm.TABLE_NAME).read_text())
    assert data["format"] == bm.TABLE_FORMAT and isinstance(data["cards"], dict)
    for card, entry in data["cards"].items():
        for key, spec in entry["figures"].items():
            assert spec.get("source") and spec.get("software"), (card, key)


def _result(card_type: str = "HL-225", count: int = 8, size: str = "standard",
            **figures: list[float]) -> dict[str, Any]:
    return {"kind": "benchmark", "version": 1, "size": size, "repeats": 3,
            "identity": {"device": "hpu", "card_type": card_type, "card_count": count},
            "figures": {k: bm.Figure(k, v).to_json() for k, v in figures.items()}}


def test_compare_judges_each_later_run_against_the_first(tmp_path: Path) -> None:
    """Compare of benchmark runs (core.benchmark_compare): a column per run, the later ones judged by the
    benchmark's verdict against the first; per card for a per-card figure; another card type or size is
    shown but not judged; a run without a result is named."""
    from gaudi_gui.core import benchmark_compare as bc

    first = _result(decode=[100.0, 101.0, 102.0], train_step=[50.0, 51.0, 52.0])
    same = [400.0, 401.0, 402.0]
    first["figures"]["matmul.bf16"] = bm.Figure("matmul.bf16", same,
                                                {"0": same, "1": [400.0, 402.0, 404.0]}).to_json()
    later = _result(decode=[70.0, 71.0, 72.0], train_step=[60.0, 90.0, 62.0])
    later["figures"]["matmul.bf16"] = bm.Figure("matmul.bf16", same,
                                                {"0": same, "1": [300.0, 301.0, 302.0]}).to_json()
    other = _result("HL-325L", decode=[300.0, 301.0, 302.0])
    (tmp_path / "empty").mkdir()
    runs = [bc.Compared("a", first), bc.Compared("b", later), bc.Compared("c", other),
            bc.Compared.read("d", tmp_path / "empty")]
    got = bc.compare(runs)
    assert got.names == ["a", "b", "c", "d"]
    assert got.machine == ["Machine of a: 8 × HL-225", "Machine of b: 8 × HL-225",
                           "Machine of c: 8 × HL-325L"]
    rows = {(r.key, r.card): r for r in got.rows}
    assert list(rows) == [("matmul.bf16", ""), ("matmul.bf16", "0"), ("matmul.bf16", "1"), ("decode", ""),
                          ("train_step", "")]
    assert rows[("matmul.bf16", "1")].label == "module 1"
    decode = rows[("decode", "")]
    assert [c.text for c in decode.cells] == ["101 ± 2 %", "71 ± 3 %", "301 ± 1 %", "–"]
    b, c, d = decode.against
    assert b.word == "slower"
    assert b.text == "0.70×: slower than the first run by 30 % (beyond the spread of 3 repeats)"
    assert c.word == "not judged" and c.words == "not judged: measured on HL-325L, the first run on HL-225"
    assert c.ratio == pytest.approx(301 / 101)
    assert d.word == "not judged" and d.ratio is None
    assert rows[("matmul.bf16", "1")].against[0].word == "slower"  # card 1 against card 1 of the first run
    assert rows[("matmul.bf16", "0")].against[0].word == "as expected"
    assert rows[("train_step", "")].against[0].word == "cannot say"  # +22 %, but its repeats spread 48 %
    assert rows[("train_step", "")].cells[2].text == "–"
    assert any(n.startswith("d: ") and "has no result.json" in n for n in got.notes), got.notes
    assert any(n.startswith("c: not judged: measured on HL-325L") for n in got.notes)
    # Another size: shown, not judged; the text form says the same.
    small = _result(size="tiny", decode=[1.0, 1.0, 1.0])
    said = bc.lines(bc.of_records({"a": first, "tiny": small}))
    assert "  tiny: 0.01×: not judged: size tiny, the first run's standard (figures of different sizes are " \
           "never compared)" in said
    assert said[0] == "Machine: 8 × HL-225"
