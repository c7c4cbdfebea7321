"""The training worker's side of issue 37 item 9, with the real ``datasets`` loader: rows that cannot
train (no answer) are dropped and counted, never trained on as empty answers, and refused past the
threshold; a file the loader cannot read names the file, the line and the problem (the loader's own
error was often empty: "cannot load dataset '…': ")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gaudi_gui.workers import sft_data
from tests.helpers import QA, qa_job, write_jsonl


def test_rows_without_an_answer_are_dropped_and_counted(tmp_path: Path) -> None:
    rows = [({"question": r["question"]} if i in (4, 30) else r) for i, r in enumerate(QA)]
    job = qa_job(write_jsonl(tmp_path / "qa.jsonl", rows))
    raw, _ = sft_data.load_raw(job)
    data, skipped = sft_data.to_sft(job, raw, chat=False)
    assert len(data) == 46 and skipped.count == 2 and "row 5" in skipped.first
    assert all(row["completion"].strip() for row in data)


def test_past_the_threshold_the_worker_refuses(tmp_path: Path) -> None:
    rows = [({"question": r["question"]} if i % 3 == 0 else r) for i, r in enumerate(QA)]
    job = qa_job(write_jsonl(tmp_path / "qa.jsonl", rows))
    raw, _ = sft_data.load_raw(job)
    with pytest.raises(sft_data.DataError, match="16 of 48 rows"):
        sft_data.to_sft(job, raw, chat=False)
    # The render preview's first rows are a sample: one bad row of three is dropped, not a refusal.
    data, skipped = sft_data.to_sft(job, raw.select(range(3)), chat=False, sample=True)
    assert (len(data), skipped.count) == (2, 1)


@pytest.mark.parametrize(("content", "needle"), [
    (b"", "is empty"),
    (json.dumps(QA[0]).encode() + b"\n" + b'{"question": "caf\xe9"}\n', "line 2: not UTF-8"),
    (json.dumps(QA[0]).encode() + b"\n" + b'{"question": "cu', "line 2: not valid JSON"),
], ids=["empty", "not-utf8", "truncated"])
def test_an_unreadable_file_names_the_file_and_the_line(tmp_path: Path, content: bytes, needle: str) -> None:
    data = tmp_path / "data.jsonl"
    data.write_bytes(content)
    with pytest.raises(sft_data.DataError) as caught:
        sft_data.load_raw(qa_job(data))
    assert str(data) in str(caught.value) and needle in str(caught.value)
