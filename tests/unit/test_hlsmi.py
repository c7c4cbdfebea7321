"""The hl-smi parsers over every recorded shape and over bad input: nothing raises, bad lines are reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from gaudi_gui.core import hlsmi

DATA = Path(__file__).resolve().parents[1] / "data" / "hlsmi"
HL325_FIELDS = ["index", "uuid", "name", "driver_version", "memory.total", "memory.used", "memory.free",
                "power.draw", "power.max", "temperature.aip", "utilization.aip"]


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_header_with_units_bare_values() -> None:
    result = hlsmi.parse_csv(read("csv-nounits-hl205.txt"))
    assert result.errors == []
    assert len(result.samples) == 8
    first = result.samples[0]
    assert (first.name, first.generation) == ("HL-205", "Gaudi 1")
    assert (first.power_w, first.temperature_c) == (102, 29)
    assert (first.utilization, first.memory_used_mib, first.memory_total_mib) == (14, 512, 32768)
    assert result.fields[2] == "power.draw"  # unit brackets stripped


def test_noheader_values_with_units() -> None:
    result = hlsmi.parse_csv(read("csv-noheader-units-hl325l.txt"), HL325_FIELDS)
    assert result.errors == []
    second = result.samples[1]
    assert second.index == 1 and second.generation == "Gaudi 3" and second.name == "HL-325L"
    assert (second.memory_total_mib, second.memory_used_mib, second.power_w, second.power_max_w) == (
        131072, 672, 230, 850)
    assert (second.temperature_c, second.utilization) == (39, 0)
    assert second.driver_version == "1.22.1-97ec1a4"


def test_noheader_without_fields_is_reported() -> None:
    result = hlsmi.parse_csv(read("csv-noheader-units-hl325l.txt"))
    assert result.samples == [] and len(result.errors) == 2


def test_module_map() -> None:
    samples = hlsmi.parse_csv(read("csv-index-module_id.txt"), ["index", "module_id"]).samples
    assert {s.index: s.module_id for s in samples} == {0: 2, 1: 6, 2: 3, 3: 7, 4: 0, 5: 4, 6: 5, 7: 1}


def test_unsorted_rows_keyed_on_index() -> None:
    text = "index, module_id, utilization.aip [%]\n3, 7, 30\n1, 6, 10\n2, 3, 20\n0, 2, 0\n"
    samples = hlsmi.parse_csv(text).samples
    assert [s.index for s in samples] == [0, 1, 2, 3]
    assert [s.utilization for s in samples] == [0, 10, 20, 30]
    assert [s.module_id for s in samples] == [2, 6, 3, 7]


@pytest.mark.parametrize("name, version, driver, busy", [
    ("table-hl205-1.18.0.txt", "hl-1.18.0-fw-53.1.1.1", "1.18.0-ee698fb", 2),
    ("table-hl225-1.12.1.txt", "hl-1.12.1-fw-46.0.5.0", "1.12.1-cb7a7bc", 0),
])
def test_summary_tables(name: str, version: str, driver: str, busy: int) -> None:
    table = hlsmi.parse_table(read(name))
    assert table.errors == []
    assert (table.hl_smi_version, table.driver_version) == (version, driver)
    assert [s.index for s in table.samples] == list(range(8))
    assert len(table.processes) == busy
    card = table.samples[2]
    assert card.bus_id and card.temperature_c and card.power_max_w and card.memory_total_mib
    assert card.driver_version == driver


def test_table_processes() -> None:
    procs = hlsmi.parse_table(read("table-hl205-1.18.0.txt")).processes
    assert [(p.index, p.pid, p.name, p.memory_mib) for p in procs] == [
        (0, 10, "python name", 1024), (6, 20, "custom process", 2040)]


def test_table_gaudi2_values() -> None:
    card = hlsmi.parse_table(read("table-hl225-1.12.1.txt")).samples[6]
    assert (card.name, card.generation, card.utilization, card.power_w, card.power_max_w) == (
        "HL-225", "Gaudi 2", 2, 98, 600)
    assert (card.memory_used_mib, card.memory_total_mib, card.bus_id) == (768, 98304, "0000:cc:00.0")


@pytest.mark.parametrize("text", ["", "\n\n", "garbage \x00 ###", "hl-smi: error\n", "+---+\n| x |\n"])
def test_table_bad_input(text: str) -> None:
    table = hlsmi.parse_table(text)
    assert table.samples == [] and table.errors


def test_na_is_unknown_not_zero() -> None:
    text = ("index, name, power.draw [W], temperature.aip [C], serial, module_id\n"
            "0, HL-225, N/A, N/A, N/A, N/A\n")
    s = hlsmi.parse_csv(text).samples[0]
    assert s.power_w is None and s.temperature_c is None and s.serial is None and s.module_id is None


def test_bad_lines_reported_not_raised() -> None:
    text = ("index, utilization.aip [%], memory.used [MiB]\n"
            "0, 5, 100\n"
            "1, 5\n"  # truncated
            "2, 5, 100, 7\n"  # extra field
            "\x00\x01 garbage line\n"
            "x, 5, 100\n"  # bad index
            "3, 1e999, 99999999999999999999999\n"  # huge numbers
            "4, five, 100\n")
    result = hlsmi.parse_csv(text)
    assert [s.index for s in result.samples] == [0, 3, 4]
    assert len(result.errors) == 4
    huge = result.samples[1]
    assert huge.utilization is None  # not finite: unknown
    assert huge.memory_used_mib == pytest.approx(1e23)
    assert result.samples[2].utilization is None


def test_huge_index_rejected() -> None:
    result = hlsmi.parse_csv("index, name\n99999999999999, HL-205\n")
    assert result.samples == [] and result.errors


def test_empty_output() -> None:
    result = hlsmi.parse_csv("")
    assert result.samples == [] and result.errors == []


@pytest.mark.parametrize("text, value", [("672 MiB", 672), ("226 W", 226), ("36 C", 36), ("0 %", 0),
                                         ("2 GiB", 2048), ("1500 mW", 1.5), ("12.5", 12.5), ("N/A", None),
                                         ("", None), ("abc", None), ("nan", None), ("inf", None)])
def test_parse_number(text: str, value: float | None) -> None:
    assert hlsmi.parse_number(text) == value


def test_stream_loop_mode() -> None:
    stream = hlsmi.CsvStream()
    header = "index, module_id, utilization.aip [%]"
    snaps = [stream.feed_line(header)]
    rows = ["1, 6, 10", "0, 2, 0", "1, 6, 11", "0, 2, 1", "1, 6, 12"]
    snaps += [stream.feed_line(r) for r in rows]
    done = [s for s in snaps if s]
    # first snapshot completes when index 1 repeats; later ones when the known count is reached
    assert [[x.utilization for x in s] for s in done] == [[0, 10], [1, 11]]
    # end of stream mid-snapshot: the card set is known, so the partial snapshot is dropped
    assert stream.flush() is None
    assert stream.errors == []


HEADER = "index, module_id, utilization.aip [%]"


def _rows(period: int, order: list[int]) -> list[str]:
    return [f"{i}, {i + 10}, {period * 10 + i}" for i in order]


def test_stream_first_snapshot_waits_for_the_wrap_not_a_timer() -> None:
    stream = hlsmi.CsvStream()
    stream.feed_line(HEADER)
    # rows of one period arrive one by one (however slowly): nothing is published before the wrap
    assert [stream.feed_line(r) for r in _rows(0, [3, 1, 2, 0])] == [None] * 4
    first = stream.feed_line(_rows(1, [3])[0])
    assert first is not None and [s.index for s in first] == [0, 1, 2, 3]
    assert stream.expected == 4
    # from now on the known set ends a snapshot as soon as its last card reported
    out = [stream.feed_line(r) for r in _rows(1, [1, 2, 0])]
    assert out[:2] == [None, None] and out[2] is not None and len(out[2]) == 4


def test_stream_expect_from_the_table_ends_the_first_snapshot() -> None:
    stream = hlsmi.CsvStream()
    stream.feed_line(HEADER)
    for row in _rows(0, [2, 0]):
        assert stream.feed_line(row) is None
    assert stream.expect([0, 1, 2]) is None  # card 1 has not reported yet
    done = stream.feed_line(_rows(0, [1])[0])
    assert done is not None and [s.index for s in done] == [0, 1, 2]
    seeded = hlsmi.CsvStream(expected=[0, 1])
    seeded.feed_line(HEADER)
    assert seeded.feed_line(_rows(0, [1])[0]) is None
    assert seeded.expect([0, 1, 2, 3]) is None  # already known: not replaced
    assert len(seeded.feed_line(_rows(0, [0])[0]) or []) == 2


def test_stream_expect_completes_pending_rows() -> None:
    stream = hlsmi.CsvStream()
    stream.feed_line(HEADER)
    for row in _rows(0, [1, 0]):
        stream.feed_line(row)
    done = stream.expect([0, 1])
    assert done is not None and [s.index for s in done] == [0, 1]


def test_stream_stale_card_set_relearns_on_wrap() -> None:
    # told 2 cards, but 3 report: the snapshot of 3 ends on the wrap, and 3 are known from then on
    stream = hlsmi.CsvStream(expected=[0, 1])
    stream.feed_line(HEADER)
    out = [stream.feed_line(r) for r in _rows(0, [2, 0, 1])]
    assert out == [None, None, None]  # card 2 is outside the known set: wait for the wrap
    done = stream.feed_line(_rows(1, [0])[0])
    assert done is not None and [s.index for s in done] == [0, 1, 2] and stream.expected == 3
    # a card that vanished: the wrap ends the smaller snapshot and teaches it
    stream.feed_line(_rows(1, [1])[0])
    done = stream.feed_line(_rows(2, [0])[0])
    assert done is not None and [s.index for s in done] == [0, 1] and stream.expected == 2


def test_stream_counts_rejected_rows_and_bad_values() -> None:
    stream = hlsmi.CsvStream(["index", "utilization.aip"])
    assert stream.feed_line("0, 5") is None
    assert stream.feed_line("### \x1b[31mbusy\x1b[0m") is None
    assert stream.feed_line("1, five") is None
    assert stream.rejected == 1 and stream.bad_values == 1
    assert any("five" in e for e in stream.errors)


def test_clean_text_strips_terminal_escapes() -> None:
    raw = "HL-\x1b[31m205\x1b[0m\x07 \x1b]0;pwned\x07ok\x1b[2J\r\x9b1mz\tq"
    assert hlsmi.clean_text(raw) == "HL-205 okz q"
    assert hlsmi.clean_text("line1\nline2") == "line1\nline2"


def test_names_from_hl_smi_are_cleaned() -> None:
    result = hlsmi.parse_csv("index, name\n0, \x1b[31mHL-205\x1b[0m\n")
    assert result.samples[0].name == "HL-205"


def test_parse_csv_counts_values_that_are_not_numbers() -> None:
    result = hlsmi.parse_csv("index, utilization.aip [%]\n0, five\n1, N/A\n2, 7\n")
    assert [s.utilization for s in result.samples] == [None, None, 7]
    assert result.rejected == 0 and len(result.warnings) == 1 and "five" in result.warnings[0]


def test_stream_reports_garbage_without_header() -> None:
    stream = hlsmi.CsvStream()
    assert stream.feed_line("0, 2, 0") is None
    assert stream.feed_line("@@@ garbage") is None
    assert len(stream.errors) == 2
    stream = hlsmi.CsvStream(["index", "utilization.aip"])
    assert stream.feed_line("0, 5") is None
    assert stream.feed_line("0, 6") is not None


def test_query_args() -> None:
    args = hlsmi.query_args(["index", "name"], loop_s=2)
    assert args == ["-Q", "index,name", "-f", "csv,nounits", "-l", "2"]
    assert hlsmi.query_args(["index"], header=False, units=True) == ["-Q", "index", "-f", "csv,noheader"]
