"""Parsing Intel Gaudi's ``hl-smi`` output: the CSV query (``-Q ... -f csv``) and the summary table.

Everything keys on header names and on the ``index`` column, never on row order or positions: real
machines print rows unsorted and layouts differ across versions (see tests/data/hlsmi/FORMAT.md).
A bad line is counted (``rejected``) and its reason kept in ``errors``, never silently dropped;
nothing here raises on odd input. Text that came from hl-smi passes ``clean_text`` before it is
shown: a terminal escape sequence in a card name must not reach the user's terminal raw.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gaudi_gui.core import textclean
from gaudi_gui.core.devices import DeviceSample, ProcessInfo

#: The fields the poller asks for (all documented -Q fields; power.max is not documented, so omitted).
QUERY_FIELDS = ("index", "module_id", "name", "bus_id", "uuid", "serial", "driver_version",
                "utilization.aip", "memory.used", "memory.total", "temperature.aip", "power.draw")

#: hl-smi field -> DeviceSample attribute, and whether it is numeric.
_FIELD_MAP: dict[str, tuple[str, str]] = {
    "index": ("index", "int"),
    "module_id": ("module_id", "int"),
    "name": ("name", "str"),
    "bus_id": ("bus_id", "str"),
    "uuid": ("uuid", "str"),
    "serial": ("serial", "str"),
    "driver_version": ("driver_version", "str"),
    "utilization.aip": ("utilization", "float"),
    "memory.used": ("memory_used_mib", "float"),
    "memory.total": ("memory_total_mib", "float"),
    "temperature.aip": ("temperature_c", "float"),
    "power.draw": ("power_w", "float"),
    "power.max": ("power_max_w", "float"),
}

#: Names the hl-smi to run when it is not the one on PATH. A user sets it; a saved host's hl-smi path
#: travels in it to every command run on that host (``core.remote.Host.gaudi_gui_argv``).
HL_SMI_VAR = "GAUDI_GUI_HL_SMI"


def hl_smi_program(explicit: str = "", env: Mapping[str, str] | None = None) -> tuple[str, bool]:
    """(program, chosen): the one place that says which hl-smi a view or command runs. ``explicit``
    (``--hl-smi``, the Devices setting), else ``$GAUDI_GUI_HL_SMI`` (on a host: its saved path),
    else "hl-smi" from PATH. ``chosen``: it was named, so a failure to run it is that choice's
    failure, never "not installed"."""
    named = (explicit or "").strip() or (os.environ if env is None else env).get(HL_SMI_VAR, "").strip()
    return (named, True) if named else ("hl-smi", False)


def find_hl_smi(explicit: str = "", env: Mapping[str, str] | None = None) -> str:
    """The hl-smi ``hl_smi_program`` chooses, resolved to a runnable file ("" when there is none)."""
    program, _chosen = hl_smi_program(explicit, env)
    return shutil.which(program, path=(os.environ if env is None else env).get("PATH")) or ""


_UNIT = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(MiB|GiB|KiB|W|mW|C|%|MHz)?\s*$")
_UNSET = ("", "N/A", "[N/A]", "NA", "n/a", "[Not Supported]", "Not Supported")
def clean_text(text: str) -> str:
    """``text`` cleaned (``core.textclean``), tabs as spaces: a tab inside a table cell or a card
    name would break the columns it is shown in."""
    return textclean.clean(text).replace("\t", " ")


def query_args(fields: Sequence[str] = QUERY_FIELDS, loop_s: int | None = None,
               header: bool = True, units: bool = False) -> list[str]:
    """Arguments for ``hl-smi -Q <fields> -f csv[,noheader][,nounits] [-l N]``."""
    fmt = "csv" + ("" if header else ",noheader") + ("" if units else ",nounits")
    args = ["-Q", ",".join(fields), "-f", fmt]
    if loop_s is not None:
        args += ["-l", str(loop_s)]
    return args


def parse_number(text: str) -> float | None:
    """'672 MiB' / '226 W' / '36' -> float; N/A, garbage, or a non-finite value -> None."""
    text = text.strip()
    if text in _UNSET:
        return None
    m = _UNIT.match(text)
    if not m:
        return None
    value = float(m.group(1))
    if not math.isfinite(value):
        return None
    unit = m.group(2)
    if unit == "GiB":
        value *= 1024
    elif unit == "KiB":
        value /= 1024
    elif unit == "mW":
        value /= 1000
    return value


def header_fields(line: str) -> list[str] | None:
    """The field names of a CSV header line ('memory.used [MiB]' -> 'memory.used'), or None."""
    parts = [p.strip() for p in line.split(",")]
    names = [re.sub(r"\s*\[.*\]\s*$", "", p) for p in parts]
    if not names or not all(re.fullmatch(r"[a-z_]+(\.[a-z_.]+)?", n) for n in names):
        return None
    if not any(n in _FIELD_MAP for n in names):
        return None
    return names


def parse_row(fields: Sequence[str], line: str, kind: str = "hpu",
              problems: list[str] | None = None) -> DeviceSample:
    """One CSV row; raises ValueError with a reason when it cannot be a card's row. A numeric value
    that is neither a number nor N/A becomes None and, when ``problems`` is given, a reason there."""
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(fields):
        # Truncated line, or (no hl-smi value holds a comma) a header that does not match the rows.
        raise ValueError(f"expected {len(fields)} fields, got {len(values)}")
    sample = DeviceSample(kind=kind, index=-1)
    for name, value in zip(fields, values, strict=True):
        target = _FIELD_MAP.get(name)
        if target is None:
            continue
        attr, typ = target
        if typ == "str":
            text = clean_text(value).strip()
            setattr(sample, attr, None if text in _UNSET else text)
            continue
        number = parse_number(value)
        if typ == "int":
            if number is None or number != int(number) or number < 0 or number > 1 << 20:
                if value in _UNSET and name != "index":
                    continue
                raise ValueError(f"bad {name}: {value!r}")
            setattr(sample, attr, int(number))
        else:
            if number is None and value not in _UNSET and problems is not None:
                # Not N/A but not a number either ('five', 'inf'): shown as unknown, and reported.
                problems.append(f"bad {name} {clean_text(value)[:40]!r}, shown as unknown")
            setattr(sample, attr, number)
    if sample.index < 0 and "index" in fields:
        raise ValueError("no index")
    return sample


@dataclass
class CsvResult:
    samples: list[DeviceSample] = field(default_factory=list)
    #: One reason per line that could not be parsed (line number, why, the line as repr).
    errors: list[str] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)
    #: Values of kept rows that were neither a number nor N/A (read as unknown).
    warnings: list[str] = field(default_factory=list)

    @property
    def rejected(self) -> int:
        """How many non-empty, non-header lines were skipped."""
        return len(self.errors)


def parse_csv(text: str, fields: Sequence[str] | None = None, kind: str = "hpu") -> CsvResult:
    """A whole ``-f csv`` output (header optional when ``fields`` is given). Rows are keyed by index:
    without an index column, row order is the only identity and the samples are numbered in order."""
    result = CsvResult(fields=list(fields or []))
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        names = header_fields(line)
        if names is not None:
            result.fields = names
            continue
        if not result.fields:
            result.errors.append(f"line {number}: no header and no field list: {line[:80]!r}")
            continue
        problems: list[str] = []
        try:
            sample = parse_row(result.fields, line, kind, problems)
        except ValueError as exc:
            result.errors.append(f"line {number}: {exc}: {line[:80]!r}")
            continue
        result.warnings += [f"line {number}: {p}" for p in problems]
        if "index" not in result.fields:
            sample.index = len(result.samples)
        result.samples.append(sample)
    result.samples.sort(key=lambda s: s.index)
    return result


class CsvStream:
    """Incremental parser for ``hl-smi -Q ... -l N``: the header comes once, then a group of rows per
    period, in any order (keyed on ``index``).

    A snapshot ends when the index column wraps (an index already pending comes again) or, once the
    set of cards is known, when every known card has reported. The set is learned from the last
    snapshot that ended on a wrap, or given with ``expect`` (the poller passes the cards of the plain
    hl-smi table and of its previous run). A row of a card outside the known set means the set is
    stale: that snapshot then waits for the wrap, which teaches the new set.

    Time never ends a snapshot: rows that arrive seconds apart still make one whole snapshot, and a
    stalled stream publishes nothing (``flush`` at end of stream drops a partial snapshot when the
    card set is known).
    """

    def __init__(self, fields: Sequence[str] | None = None, kind: str = "hpu",
                 expected: Iterable[int] | None = None) -> None:
        self.fields = list(fields or [])
        self.kind = kind
        self._pending: dict[int, DeviceSample] = {}
        self._known: frozenset[int] | None = frozenset(expected) if expected else None
        #: The newest reasons for skipped lines (bounded); ``rejected`` counts all of them.
        self.errors: list[str] = []
        #: Lines that could not be parsed, since the start of the stream.
        self.rejected = 0
        #: Values of kept rows that were neither a number nor N/A (read as unknown).
        self.bad_values = 0

    def feed_line(self, line: str) -> list[DeviceSample] | None:
        """Feed one line; returns a complete snapshot (sorted by index) when one is finished."""
        line = line.strip()
        if not line:
            return None
        names = header_fields(line)
        if names is not None:
            self.fields = names
            return None
        if not self.fields:
            self._error(f"no header yet: {line[:80]!r}")
            return None
        problems: list[str] = []
        try:
            sample = parse_row(self.fields, line, self.kind, problems)
        except ValueError as exc:
            self._error(f"{exc}: {line[:80]!r}")
            return None
        for problem in problems:
            self.bad_values += 1
            self.errors.append(f"index {sample.index}: {problem}")
            del self.errors[:-50]
        done = None
        if sample.index in self._pending:
            done = self._flush()
            self._known = frozenset(s.index for s in done)
        self._pending[sample.index] = sample
        if done is None and self._complete():
            done = self._flush()
        return done

    def expect(self, indices: Iterable[int]) -> list[DeviceSample] | None:
        """Tell the stream which cards exist (when it has not learned that itself yet); returns the
        pending snapshot if that makes it complete."""
        ids = frozenset(indices)
        if not ids or self._known is not None:
            return None
        self._known = ids
        return self._flush() if self._complete() else None

    @property
    def expected(self) -> int:
        """Cards per snapshot once the card set is known (0 before)."""
        return len(self._known) if self._known is not None else 0

    @property
    def known(self) -> frozenset[int] | None:
        """The indices of the cards a complete snapshot holds, once known."""
        return self._known

    def flush(self) -> list[DeviceSample] | None:
        """At end of stream: the pending rows when no card set is known (a one-shot query's whole
        output), else None; a partial snapshot is never passed off as a whole one."""
        if not self._pending:
            return None
        if self._known is not None:
            self._pending = {}
            return None
        return self._flush()

    def _complete(self) -> bool:
        return self._known is not None and self._pending.keys() == self._known

    def _flush(self) -> list[DeviceSample]:
        done = sorted(self._pending.values(), key=lambda s: s.index)
        self._pending = {}
        return done

    def _error(self, message: str) -> None:
        self.rejected += 1
        self.errors.append(message)
        del self.errors[:-50]  # keep the newest reasons only


@dataclass
class TableResult:
    samples: list[DeviceSample] = field(default_factory=list)
    processes: list[ProcessInfo] = field(default_factory=list)
    hl_smi_version: str | None = None
    driver_version: str | None = None
    errors: list[str] = field(default_factory=list)


# -- hl-smi -q, -n link and the process table (the doctor's reads) -------------------------------


@dataclass(frozen=True)
class ProcessRow:
    """One row of hl-smi's process table."""

    aip: int
    #: None: hl-smi lists a process it cannot name a pid for (another container's).
    pid: int | None
    kind: str
    name: str
    memory_mib: float | None


_CARD_HEAD = re.compile(r"^\s*\[(\d+)\]\s+AIP\s+\((accel\d+)\)\s+(\S+)")
_KV = re.compile(r"^(\s*)(.*?)\s*:\s*(.*?)\s*$")


def _norm(key: str) -> str:
    # "[ 3] On Chip 2" -> "On Chip 2"; keys compared case-insensitively across hl-smi releases.
    return re.sub(r"^\[\s*\d+\]\s*", "", key).strip().lower()


def parse_query(text: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """``hl-smi -q`` (or ``-L -i BUS`` on older releases): (header fields, one dict per card).

    Each card dict maps a lower-cased path of section names joined with "/" to the value, e.g.
    "replaced rows/double bit ecc" -> "0", "aip link info/link speed/max" -> "16GT/s", plus
    "_index", "_accel" and "_bus_id" from the card's heading line. Indentation gives the nesting, so a
    release that adds, drops or reorders lines still parses.
    """
    header: dict[str, str] = {}
    cards: list[dict[str, str]] = []
    card: dict[str, str] | None = None
    stack: list[tuple[int, str]] = []  # (indent, section name)
    last_key: tuple[int, str] | None = None
    for raw in text.replace("\t", "        ").splitlines():
        if not raw.strip() or raw.lstrip().startswith("#") or raw.strip().startswith("="):
            continue
        head = _CARD_HEAD.match(raw)
        if head:
            card = {"_index": head.group(1), "_accel": head.group(2), "_bus_id": head.group(3)}
            cards.append(card)
            stack, last_key = [], None
            continue
        indent = len(raw) - len(raw.lstrip())
        stripped = raw.strip()
        if stripped.startswith(":") and last_key is not None:
            # "Thermal Slowdown" on one line and ": Not Active" on the next (hl-smi 1.12).
            target = card if card is not None else header
            target[last_key[1]] = stripped[1:].strip()
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        m = _KV.match(raw) if ":" in stripped else None
        path = "/".join([s for _, s in stack])
        if m is None or (m.group(3) == "" and card is not None):
            name = _norm(stripped.rstrip(":"))
            key = f"{path}/{name}" if path else name
            stack.append((indent, name))
            last_key = (indent, key)
            continue
        name = _norm(m.group(2))
        key = f"{path}/{name}" if path else name
        (card if card is not None else header)[key] = m.group(3)
        last_key = None
    return header, cards


def parse_links(text: str) -> dict[int, bool]:
    """``hl-smi -n link -i BUS``: {port: up}; unparsable lines are ignored (an empty dict: unknown)."""
    ports: dict[int, bool] = {}
    for m in re.finditer(r"port\s*(\d+)\s*:\s*(UP|DOWN)", text, flags=re.IGNORECASE):
        ports[int(m.group(1))] = m.group(2).upper() == "UP"
    return ports


def process_rows(text: str) -> list[ProcessRow]:
    """Every row of hl-smi's "Compute Processes" section, idle ones ("N/A") left out.

    Columns are found by their header names ("AIP", "PID", "Type", "Process name", "Usage"), so a
    release that pads or reorders them still parses; lines that are not rows are left out. The one
    reader of hl-smi's process table, for the doctor and the Devices table alike."""
    out: list[ProcessRow] = []
    columns: list[str] | None = None
    for raw in text.splitlines():
        line = raw.strip().strip("|").strip()
        if columns is None:
            if re.match(r"AIP\b", line) and re.search(r"\bPID\b", line):
                # "Process name" is one column: join it before splitting on runs of spaces.
                columns = [c.lower() for c in re.sub(r"(?i)process\s+name", "process_name", line).split()]
            continue
        if not line or line.startswith(("=", "-", "+")):
            if line.startswith("+"):
                break
            continue
        parts = line.split()
        if len(parts) < len(columns) or not parts[0].isdigit():
            continue
        # The name may hold spaces: it takes every token between the columns before and after it.
        n_after = len(columns) - columns.index("process_name") - 1 if "process_name" in columns else 0
        before = columns.index("process_name") if "process_name" in columns else len(columns)
        row = dict(zip(columns[:before], parts[:before], strict=True))
        row.update(zip(columns[len(columns) - n_after:], parts[len(parts) - n_after:], strict=True))
        name = " ".join(parts[before:len(parts) - n_after]) if "process_name" in columns else ""
        pid_text = row.get("pid", "N/A")
        if pid_text.upper() == "N/A" and name.upper() in ("N/A", ""):
            continue  # an idle card
        kind = row.get("type", "")
        usage = row.get("usage", "")
        out.append(ProcessRow(aip=int(row.get("aip", parts[0])),
                              pid=int(pid_text) if pid_text.isdigit() else None,
                              kind="" if kind.upper() == "N/A" else kind,
                              name="" if name.upper() == "N/A" else clean_text(name).strip(),
                              memory_mib=parse_number(usage.replace("MiB", " MiB")) if usage else None))
    return out


def parse_processes(text: str) -> dict[int, list[tuple[int | None, str]]]:
    """hl-smi's own process list: {AIP index: [(pid or None when hl-smi cannot see it, name)]}
    (``process_rows`` grouped by card). The per-card "Compute Processes" section of hl-smi's summary
    is the only place hl-smi lists pids; the recorded ``-q`` / ``-L`` outputs have none. An empty dict
    means nothing is listed (or the section is missing): the /proc scan still runs beside it."""
    out: dict[int, list[tuple[int | None, str]]] = {}
    for row in process_rows(text):
        out.setdefault(row.aip, []).append((row.pid, row.name))
    return out


_CARD_LINE1 = re.compile(r"^\|\s*(\d+)\s+(\S+)\s+.*?\|\s*([0-9a-fA-F:.]+)\s+")
_CARD_LINE2 = re.compile(
    r"^\|\s*(\S+)\s+(N/A|\d+)\s*C\s+(\S+)\s+(N/A|\d+)\s*W\s*/\s*(N/A|\d+)\s*W\s*\|"
    r"\s*(N/A|\d+)\s*MiB\s*/\s*(N/A|\d+)\s*MiB\s*\|\s*(N/A|\d+)\s*%")


def _num(text: str) -> float | None:
    return parse_number(text.replace("MiB", " MiB"))


def parse_table(text: str) -> TableResult:
    """The plain ``hl-smi`` summary table: versions, one sample per card, and the process rows."""
    result = TableResult()
    in_processes = False
    pending: DeviceSample | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if "HL-SMI Version:" in line:
            result.hl_smi_version = line.split(":", 1)[1].strip(" |")
            continue
        if "Driver Version:" in line and "Nic" not in line:
            result.driver_version = line.split(":", 1)[1].strip(" |")
            continue
        if "Compute Processes" in line:
            in_processes = True
            continue
        if in_processes:
            continue  # read by process_rows below, by column names
        m1 = _CARD_LINE1.match(line)
        if m1 and not line.startswith("| AIP"):
            pending = DeviceSample(kind="hpu", index=int(m1.group(1)), name=clean_text(m1.group(2)),
                                   bus_id=m1.group(3), driver_version=result.driver_version)
            continue
        m2 = _CARD_LINE2.match(line)
        if m2 and pending is not None:
            pending.temperature_c = _num(m2.group(2))
            pending.power_w = _num(m2.group(4))
            pending.power_max_w = _num(m2.group(5))
            pending.memory_used_mib = _num(m2.group(6))
            pending.memory_total_mib = _num(m2.group(7))
            pending.utilization = _num(m2.group(8))
            result.samples.append(pending)
            pending = None
    result.processes = [ProcessInfo(index=r.aip, pid=r.pid, kind=r.kind, name=r.name, memory_mib=r.memory_mib)
                        for r in process_rows(text) if r.pid is not None]
    if not result.samples and not result.processes:
        result.errors.append("no card rows found in the hl-smi table")
    result.samples.sort(key=lambda s: s.index)
    return result
