"""A dataset file read whole before any launch (issue 37, item 9): rows that cannot train are counted
and said, refused past ``datafile.BAD_ROWS_LIMIT`` of the rows; a file that cannot be read names the
file, the line and the problem. Qt-free, torch-free: what `train`, `queue add` and the form use."""

from __future__ import annotations

import json
from pathlib import Path

from gaudi_gui.core import datafile, jobcheck
from tests.helpers import QA, qa_job, write_jsonl


def test_a_few_rows_without_the_answer_are_skipped_and_said(tmp_path: Path) -> None:
    rows = [({"question": r["question"]} if i in (4, 30) else r) for i, r in enumerate(QA)]
    job = qa_job(write_jsonl(tmp_path / "qa.jsonl", rows))
    assert [p for p in jobcheck.check(job, schema=None) if p[0].startswith("dataset")] == []
    (note,) = jobcheck.notes(job)
    assert "2 of 48 rows" in note and "skipped" in note and "line 5" in note and "'answer'" in note


def test_past_the_threshold_the_job_is_refused_at_the_dataset_field(tmp_path: Path) -> None:
    rows = [({"question": r["question"], "answer": None} if i % 3 == 0 else r) for i, r in enumerate(QA)]
    job = qa_job(write_jsonl(tmp_path / "qa.jsonl", rows))
    problems = dict(jobcheck.check(job, schema=None))
    assert "16 of 48 rows" in problems["dataset.source"]
    assert f"{datafile.BAD_ROWS_LIMIT:.0%}" in problems["dataset.source"]


def test_an_empty_optional_column_of_a_template_is_no_bad_row(tmp_path: Path) -> None:
    """alpaca's input is often empty: the rendered prompt is the instruction alone, a good row."""
    rows = [{"instruction": f"Do {i}.", "input": "", "output": "Done."} for i in range(10)]
    scan = datafile.scan(str(write_jsonl(tmp_path / "alpaca.jsonl", rows)), "json", kind="prompt_completion",
                         columns={"prompt": "{instruction}\n\n{input}", "completion": "output"})
    assert (scan.rows, scan.bad, scan.problem) == (10, 0, "")


def test_csv_rows_with_a_missing_cell_are_counted(tmp_path: Path) -> None:
    data = tmp_path / "qa.csv"
    data.write_text("question,answer\n" + "".join(f"q{i},a{i}\n" for i in range(8)) + "q8,\nq9\n")
    scan = datafile.scan(str(data), "csv", kind="prompt_completion",
                         columns={"prompt": "question", "completion": "answer"})
    assert (scan.rows, scan.bad) == (10, 2)
    assert scan.refusal() is not None and "2 of 10 rows" in str(scan.refusal())


def test_unreadable_files_name_the_file_the_line_and_the_problem(tmp_path: Path) -> None:
    cases = {
        "empty.jsonl": (b"\n  \n", "is empty"),
        "latin1.jsonl": (json.dumps(QA[0]).encode() + b"\n" + '{"question": "café"}\n'.encode("latin-1"),
                         "line 2: not UTF-8"),
        "cut.jsonl": (json.dumps(QA[0]).encode() + b"\n" + b'{"question": "cu', "line 2: not valid JSON"),
        "array.json": (b'[\n {"question": "a", "answer": "b"},\n {"question": "c", ', "line 3"),
        "scalars.jsonl": (b'{"question": "a", "answer": "b"}\n[1, 2]\n',
                          "line 2: a row must be a JSON object"),
        "latin1.txt": ("héllo\n".encode("latin-1"), "line 1: not UTF-8"),
    }
    for name, (content, needle) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        fmt = "text" if name.endswith(".txt") else "json"
        scan = datafile.scan(str(path), fmt, kind="prompt_completion" if fmt == "json" else "text",
                             columns={"prompt": "question", "completion": "answer"})
        assert str(path) in scan.problem and needle in scan.problem, (name, scan.problem)
        assert scan.refusal() == scan.problem


def test_the_scan_is_read_once_per_file_version(tmp_path: Path) -> None:
    """The form checks the job at every change: an unchanged file is not read again."""
    data = write_jsonl(tmp_path / "qa.jsonl", QA)
    first = datafile.scan(str(data), "json", kind="prompt_completion",
                          columns={"prompt": "question", "completion": "answer"})
    again = datafile.scan(str(data), "json", kind="prompt_completion",
                          columns={"prompt": "question", "completion": "answer"})
    assert again is first and first.rows == 48
    write_jsonl(data, [*QA, {"question": "q"}])
    changed = datafile.scan(str(data), "json", kind="prompt_completion",
                            columns={"prompt": "question", "completion": "answer"})
    assert (changed.rows, changed.bad) == (49, 1)
