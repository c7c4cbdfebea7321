"""Device samples (one card at one moment), processes on cards, warnings, and a bounded history.

The same model serves Gaudi cards (from hl-smi), NVIDIA GPUs (from nvidia-smi) and the host (psutil),
so the Devices panel looks the same on every machine. ``None`` always means "unknown" (hl-smi printed
N/A or the field is not supported), never zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

#: Name prefix -> generation. Match by prefix; always show the raw name too.
GENERATIONS = (("HL-205", "Gaudi 1"), ("HL-225", "Gaudi 2"), ("HL-3", "Gaudi 3"))


def generation(name: str | None) -> str | None:
    if not name:
        return None
    for prefix, label in GENERATIONS:
        if name.strip().upper().startswith(prefix):
            return label
    return None


def card_name(module_id: int | None, index: int | None = None, kind: str = "hpu") -> str:
    """The one name of a card in every view, alert, notification and message: "module 3" on Gaudi.

    The module id is what ``HABANA_VISIBLE_MODULES``, the card picker and the doctor's ``--cards``
    take, and it stays with the card across reboots; the index (hl-smi's row, the accel node) is
    only a secondary column or a tooltip (``card_detail``). CUDA GPUs are named by their index
    ("GPU 1", what ``CUDA_VISIBLE_DEVICES`` takes); a Gaudi card whose module id is unknown by its
    index ("index 2")."""
    if kind == "host":
        return "host"
    if kind == "cuda":
        return f"GPU {index}"
    if module_id is not None:
        return f"module {module_id}"
    return f"index {index}" if index is not None else "card"


def cards_name(ids: Iterable[int], kind: str = "hpu") -> str:
    """Several cards by ``card_name``'s word: "module 3", "modules 2 and 4", "modules 0, 4 and 7",
    "GPUs 0 and 1"; "no card" for none."""
    unique = sorted(set(ids))
    if not unique:
        return "no card"
    if len(unique) == 1:
        return card_name(unique[0], unique[0], kind)
    word = "GPUs" if kind == "cuda" else "modules"
    numbers = [str(i) for i in unique]
    return f"{word} {', '.join(numbers[:-1])} and {numbers[-1]}"


def card_detail(module_id: int | None, index: int | None, bus_id: str | None = None) -> str:
    """The secondary names of a Gaudi card for a tooltip: "index 2 · bus 0000:1b:00.0"."""
    parts = [] if index is None else [f"index {index}"]
    if bus_id:
        parts.append(f"bus {bus_id}")
    return " · ".join(parts)


def sample_name(sample: DeviceSample) -> str:
    """``card_name`` of a device sample."""
    return card_name(sample.module_id, sample.index, sample.kind)


@dataclass
class ProcessInfo:
    """A process using a card, from hl-smi's Compute Processes section (plus psutil where visible)."""

    index: int
    pid: int
    name: str
    memory_mib: float | None = None
    kind: str | None = None
    user: str | None = None
    cmdline: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessInfo:
        """The inverse of ``to_dict`` (a host's ``gaudi-gui devices --json``); ValueError when a field
        has the wrong type."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a process is a JSON object, not {type(data).__name__}")
        return cls(index=_int(data, "index"), pid=_int(data, "pid"), name=_text(data, "name") or "",
                   memory_mib=_number(data, "memory_mib"), kind=_text(data, "kind"),
                   user=_text(data, "user"), cmdline=_text(data, "cmdline"))


@dataclass
class DeviceSample:
    """One card at one moment."""

    kind: str  # "hpu", "cuda" or "host"
    index: int
    name: str | None = None
    module_id: int | None = None
    bus_id: str | None = None
    uuid: str | None = None
    serial: str | None = None
    driver_version: str | None = None
    utilization: float | None = None  # percent
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_max_w: float | None = None
    timestamp: float = 0.0
    processes: list[ProcessInfo] = field(default_factory=list)

    @property
    def generation(self) -> str | None:
        return generation(self.name) if self.kind == "hpu" else None

    @property
    def key(self) -> str:
        """Stable identity across samples: module id on Gaudi (indices can change across reboots)."""
        if self.kind == "hpu" and self.module_id is not None:
            return f"hpu:m{self.module_id}"
        return f"{self.kind}:{self.index}"

    @property
    def memory_fraction(self) -> float | None:
        if self.memory_used_mib is None or not self.memory_total_mib:
            return None
        return max(0.0, min(1.0, self.memory_used_mib / self.memory_total_mib))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["generation"] = self.generation
        data["problems"] = value_problems(self)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceSample:
        """The inverse of ``to_dict`` (read from a host's ``gaudi-gui devices --json``): the derived
        ``generation`` and ``problems`` and unknown keys are ignored, a missing value is unknown (None).
        ValueError names the field of the wrong type (text printed by another program is checked)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a device sample is a JSON object, not {type(data).__name__}")
        kind = _text(data, "kind")
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
        processes = data.get("processes")
        if processes is None:
            processes = []
        if not isinstance(processes, list):
            raise ValueError("processes is not a list")
        module_id = data.get("module_id")
        return cls(kind=kind, index=_int(data, "index"), name=_text(data, "name"),
                   module_id=None if module_id is None else _int(data, "module_id"),
                   bus_id=_text(data, "bus_id"), uuid=_text(data, "uuid"), serial=_text(data, "serial"),
                   driver_version=_text(data, "driver_version"),
                   utilization=_number(data, "utilization"),
                   memory_used_mib=_number(data, "memory_used_mib"),
                   memory_total_mib=_number(data, "memory_total_mib"),
                   temperature_c=_number(data, "temperature_c"), power_w=_number(data, "power_w"),
                   power_max_w=_number(data, "power_max_w"),
                   timestamp=_number(data, "timestamp") or 0.0,
                   processes=[ProcessInfo.from_dict(p) for p in processes])


#: The kinds of DeviceSample.
KINDS = ("hpu", "cuda", "host")


def _int(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} is not a whole number: {value!r}")
    return value


def _number(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} is not a finite number: {value!r}")
    return float(value)


def _text(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{key} is not text: {value!r}")
    return value


#: Plausible ranges; a value outside is shown as reported but flagged (a driver or parse fault).
TEMPERATURE_RANGE_C = (-40.0, 150.0)
POWER_MAX_W = 3000.0


def value_problems(sample: DeviceSample) -> list[str]:
    """Values no card can have (utilization above 100 %, negative memory, used above total, an absurd
    temperature or power). Each starts with "implausible"."""
    out: list[str] = []
    util = sample.utilization
    if util is not None and not 0 <= util <= 100:
        out.append(f"implausible utilization {util:g} %")
    for label, value in (("memory used", sample.memory_used_mib), ("memory total", sample.memory_total_mib)):
        if value is not None and value < 0:
            out.append(f"implausible {label} {value:g} MiB")
    used, total = sample.memory_used_mib, sample.memory_total_mib
    if used is not None and total is not None and total > 0 and used > total:
        out.append(f"implausible memory: {used:g} MiB used of {total:g} MiB")
    temp = sample.temperature_c
    low, high = TEMPERATURE_RANGE_C
    if temp is not None and not low <= temp <= high:
        out.append(f"implausible temperature {temp:g} C")
    for label, value in (("power", sample.power_w), ("power limit", sample.power_max_w)):
        if value is not None and not 0 <= value <= POWER_MAX_W:
            out.append(f"implausible {label} {value:g} W")
    return out


def card_warnings(sample: DeviceSample, hot_c: float = 85.0, busy_util: float = 5.0, *,
                  busy: bool = True) -> list[str]:
    """Visible warnings for one card: implausible values, failed to initialise (0 C), hot, busy
    (``busy=False``: not the utilization, which has a column of its own in the Devices table)."""
    out: list[str] = value_problems(sample)
    if sample.kind == "hpu" and sample.temperature_c == 0:
        out.append("reports 0 C: the card failed to initialise")
    elif (sample.temperature_c is not None and sample.temperature_c >= hot_c
          and sample.temperature_c <= TEMPERATURE_RANGE_C[1]):
        out.append(f"hot: {sample.temperature_c:.0f} C")
    if not busy:
        return out
    working = sample.utilization is not None and sample.utilization >= busy_util
    if sample.kind != "host" and (working or sample.processes):
        who = f" by {len(sample.processes)} process(es)" if sample.processes else ""
        out.append(f"busy{who}")
    return out


METRICS = ("utilization", "memory_used_mib", "power_w", "temperature_c")


class History:
    """Per-card ring buffers of the METRICS, bounded by ``capacity`` samples per card.

    8 cards x 1 Hz x 1 hour is 8 x 3600 x 5 float64 = 1.2 MB, allocated once: memory never grows.
    """

    def __init__(self, capacity: int = 3600) -> None:
        self.capacity = capacity
        self._data: dict[str, np.ndarray] = {}  # key -> (capacity, 1 + len(METRICS)) ring
        self._count: dict[str, int] = {}
        self._labels: dict[str, str] = {}

    def add(self, samples: Iterable[DeviceSample]) -> None:
        import numpy as np  # lazily: the window's first paint should not wait for numpy

        for s in samples:
            ring = self._data.get(s.key)
            if ring is None:
                ring = np.full((self.capacity, 1 + len(METRICS)), np.nan)
                self._data[s.key] = ring
                self._count[s.key] = 0
            row = self._count[s.key] % self.capacity
            ring[row, 0] = s.timestamp
            for i, metric in enumerate(METRICS, start=1):
                value = getattr(s, metric)
                ring[row, i] = math.nan if value is None else float(value)
            self._count[s.key] += 1
            self._labels[s.key] = _label(s)

    def keys(self) -> list[str]:
        return sorted(self._data)

    def label(self, key: str) -> str:
        return self._labels.get(key, key)

    def series(self, key: str, metric: str, since: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(timestamps, values) in time order, optionally only those at or after ``since``."""
        import numpy as np

        ring = self._data.get(key)
        if ring is None:
            return np.empty(0), np.empty(0)
        count = self._count[key]
        if count <= self.capacity:
            rows = ring[:count]
        else:
            start = count % self.capacity
            rows = np.concatenate((ring[start:], ring[:start]))
        column = 1 + METRICS.index(metric)
        t, v = rows[:, 0], rows[:, column]
        if since is not None:
            keep = t >= since
            t, v = t[keep], v[keep]
        return t, v

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._data.values())


def _label(s: DeviceSample) -> str:
    return sample_name(s)


def attach_processes(samples: Sequence[DeviceSample], processes: Sequence[ProcessInfo]) -> None:
    """Put each process on the sample of the card (by index) it runs on."""
    by_index = {s.index: s for s in samples}
    for s in samples:
        s.processes = []
    for p in processes:
        if p.index in by_index:
            by_index[p.index].processes.append(p)
