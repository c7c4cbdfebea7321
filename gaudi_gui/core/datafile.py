"""A local dataset file read whole before any launch, as the worker's loader will read it: Qt-free,
torch-free, and without ``datasets`` (the GUI and the command line import this).

Two things are found here that ``datasets`` finds only in the launched ranks, after the model load,
and then often says with an empty reason (issue 37, item 9):

- a file that cannot be read: empty, a line that is not UTF-8, a line that is not JSON (a truncated
  last line), a row that is not an object. The problem names the file and the line.
- rows that cannot train: a row without the column a field is fed by (no answer), or whose field
  renders empty. ``datasets`` fills a missing column with null, which SFTTrainer then trained on as an
  empty answer. Such rows are counted: the worker drops them and says how many; more than
  ``BAD_ROWS_LIMIT`` of the rows refuses the job (a file that is mostly not what the mapping says is a
  wrong mapping or a wrong file, not a few holes).

A scan is kept per file version (path, size, modification time) and mapping, so the form, which checks
the job at every change, reads an unchanged file once.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gaudi_gui.core import sft

#: Past this share of a file's rows that cannot train, the job is refused (docs/guide.md says so too).
BAD_ROWS_LIMIT = 0.10
#: How much of a file the window reads in its own thread when it checks the form: 1 MiB, tens of ms
#: on a loaded 2-core machine (measured: ~39 MB/s), once per file version. 64 MiB froze the window
#: ~1.7 s at the first look at a large file. The rest is read whole by `train` and `queue add`, which
#: the window's Start runs as a child, and counted by the worker.
WINDOW_SCAN_BYTES = 1024 * 1024


@dataclass
class Scan:
    """What reading a dataset file found."""

    path: str
    #: Rows read (blank lines of a JSON-lines file are no rows: the loader skips them too).
    rows: int = 0
    #: Rows that cannot train, and what the first of them lacks ("line 5: completion: no 'answer'").
    bad: int = 0
    first_bad: str = ""
    #: Why the file cannot be read at all ("FILE: line 6: not valid JSON (…)"); "" when it can.
    problem: str = ""
    #: False when only the first ``limit`` bytes were read.
    complete: bool = True

    def refusal(self) -> str | None:
        """Why a job on this file must not launch, or None."""
        if self.problem:
            return self.problem
        if self.rows and self.bad > self.rows * BAD_ROWS_LIMIT:
            return (f"{self.path}: {self.bad} of {self.rows} rows cannot train (first: {self.first_bad}); "
                    f"more than {BAD_ROWS_LIMIT:.0%} of the rows: check the column mapping or the file")
        return None

    def note(self) -> str:
        """What to say about rows that will be skipped ("" when none are)."""
        if not self.bad or self.refusal():
            return ""
        return (f"{self.path}: {self.bad} of {self.rows} rows cannot train and are skipped (first: "
                f"{self.first_bad})")


_cache: dict[tuple[Any, ...], Scan] = {}
_CACHE_SIZE = 16


def scan(source: str, fmt: str, *, kind: str = "text", columns: Mapping[str, str] | None = None,
         text_column: str = "text", limit: int | None = None) -> Scan:
    """Read ``source`` (a local file of format "json", "csv" or "text") as the worker's loader will,
    and every row as the worker maps it (``sft.row_problem``). ``limit``: read at most that many bytes
    (then ``complete`` is False and a cut-off last line is not a problem)."""
    path = Path(source).expanduser()
    mapping = dict(columns or {})
    try:
        st = path.stat()
        key: tuple[Any, ...] = (str(path), st.st_size, st.st_mtime_ns, fmt, kind,
                                tuple(sorted(mapping.items())), text_column, limit)
    except OSError as exc:
        return Scan(source, problem=f"{source}: cannot read it: {exc.strerror or exc}")
    found = _cache.get(key)
    if found is not None:
        return found
    result = Scan(source)
    try:
        _Reader(kind, mapping, text_column, result).read(path, fmt, limit)
    except OSError as exc:
        result.problem = f"{source}: cannot read it: {exc.strerror or exc}"
    if len(_cache) >= _CACHE_SIZE:
        _cache.pop(next(iter(_cache)))
    _cache[key] = result
    return result


def _lines(path: Path, limit: int | None, result: Scan) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, is the file's unterminated last line) of a UTF-8 file; a line that does not
    decode sets ``result.problem`` and ends the reading."""
    read = 0
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            read += len(raw)
            if limit is not None and read > limit:
                result.complete = False
                return
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a spreadsheet's byte-order mark (the loaders skip it too)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                byte = raw[exc.start]
                result.problem = (f"{result.path}: line {number}: not UTF-8 text (byte 0x{byte:02x} at "
                                  f"column {exc.start + 1}): save the file as UTF-8")
                return
            yield number, text, not raw.endswith(b"\n")


@dataclass
class _Reader:
    """One scan's mapping and result, shared by the readers of each layout."""

    kind: str
    columns: Mapping[str, str]
    text_column: str
    result: Scan

    def read(self, path: Path, fmt: str, limit: int | None) -> None:
        result = self.result
        lines = _lines(path, limit, result)  # streamed: a large file is never held whole (but an array)
        skipped: list[tuple[int, str, bool]] = []
        for line in lines:
            skipped.append(line)
            if line[1].strip():
                break
        if result.problem:
            return
        if not skipped or not skipped[-1][1].strip():
            if result.complete:
                result.problem = f"{result.path}: the file is empty: no rows to train on"
            return
        rest = itertools.chain(skipped, lines)
        if fmt == "text":
            result.rows = sum(1 for _n, text, _last in rest if text.strip())
            return  # a text file's blank lines separate paragraphs: no row of it is bad
        if fmt == "csv":
            self.read_csv(rest)
            return
        if skipped[-1][1].lstrip().startswith("["):
            text = "".join(t for _n, t, _last in rest)
            if not result.problem and result.complete:
                self.read_json_array(text)
            return
        for number, text, last in rest:
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except ValueError as exc:
                cut = " — the file ends inside this line: it looks cut off" if last else ""
                result.problem = f"{result.path}: line {number}: not valid JSON ({_json_reason(exc)}){cut}"
                return
            self.row(row, f"line {number}")
            if result.problem:
                return

    def read_json_array(self, text: str) -> None:
        result = self.result
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            cut = " — the file ends before the array does: it looks cut off" \
                if exc.pos >= len(text.rstrip()) else ""
            result.problem = (f"{result.path}: line {exc.lineno}: not valid JSON ({exc.msg} at column "
                              f"{exc.colno}){cut}")
            return
        if not isinstance(rows, list):
            result.problem = (f"{result.path}: a JSON file must hold an array of row objects or one object "
                              f"per line")
            return
        for number, row in enumerate(rows, start=1):
            self.row(row, f"row {number}")
            if result.problem:
                return

    def read_csv(self, lines: Iterable[tuple[int, str, bool]]) -> None:
        reader = csv.DictReader(text for _n, text, _last in lines)
        try:
            for row in reader:
                # csv's line_num is the physical line the row ended on (a quoted cell may span lines).
                self.row(dict(row), f"line {reader.line_num}")
        except csv.Error as exc:
            self.result.problem = f"{self.result.path}: line {reader.line_num}: not valid CSV ({exc})"

    def row(self, row: Any, where: str) -> None:
        result = self.result
        if not isinstance(row, dict):
            result.problem = f"{result.path}: {where}: a row must be a JSON object, got {type(row).__name__}"
            return
        result.rows += 1
        why = sft.row_problem(self.kind, self.columns, row, self.text_column)
        if why:
            result.bad += 1
            if not result.first_bad:
                result.first_bad = f"{where}: {why}"


def _json_reason(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at column {exc.colno}"
    return str(exc)


def is_local(source: str, fmt: str) -> bool:
    """A file this module can read (not a Hub dataset)."""
    return fmt in ("json", "csv", "text") and os.path.isfile(os.path.expanduser(source))


__all__ = ["BAD_ROWS_LIMIT", "WINDOW_SCAN_BYTES", "Scan", "is_local", "scan"]
