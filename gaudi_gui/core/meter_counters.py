"""The run meter's energy counters, beside its power readings: the CPU package counters (RAPL,
``<root>/intel-rapl:N/energy_uj``, root ``RAPL_ROOT`` or ``GAUDI_GUI_RAPL_ROOT``; readable only where the
kernel allows: since 2020 they are root-only) and the vendor's own counter of the run's cards (NVML /
HLML where their library imports), a cross-check of the integrated energy. A counter's energy is its
difference (with its wrap), not an integral. Qt-free and torch-free.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gaudi_gui.core.meter_account import MEASURED, coverage_status, finite, rounded

#: Where the package energy counters live; ``GAUDI_GUI_RAPL_ROOT`` overrides it (tests).
RAPL_ROOT = "/sys/class/powercap"


def rapl_root() -> Path:
    return Path(os.environ.get("GAUDI_GUI_RAPL_ROOT") or RAPL_ROOT)


def rapl_zones(root: Path | None = None) -> list[tuple[Path, int | None]]:
    """The package zones (``intel-rapl:N``, not their ``intel-rapl:N:M`` subzones) whose energy_uj
    can be read now, each with its wrap (``max_energy_range_uj``, None when unreadable)."""
    root = root or rapl_root()
    zones = []
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not re.fullmatch(r"intel-rapl:\d+", entry.name):
            continue
        try:
            int((entry / "energy_uj").read_text().strip())
        except (OSError, ValueError):
            continue  # root-only on kernels since 2020: not readable is not measured
        wrap: int | None = None
        with contextlib.suppress(OSError, ValueError):
            wrap = int((entry / "max_energy_range_uj").read_text().strip())
        zones.append((entry, wrap))
    return zones


# -- the vendors' energy counters: a cross-check of the integrated power --------------------------------

SOURCE_NVML = "nvml"
SOURCE_HLML = "hlml"


class EnergyCounter:
    """A vendor library's total-energy counter (mJ since the driver was loaded) of the run's own cards,
    read when the run starts and when it ends: NVML's ``nvmlDeviceGetTotalEnergyConsumption`` on CUDA
    (pynvml), HLML's ``hlmlDeviceGetTotalEnergyConsumption`` on Gaudi (pyhlml). ``module``: the
    library's module object (tests give a fake one); found by import otherwise."""

    def __init__(self, source: str, module: Any, cards: Sequence[int] | None) -> None:
        self.source = source
        self.lib = module
        prefix = "nvml" if source == SOURCE_NVML else "hlml"
        self._call = lambda name, *args: getattr(module, f"{prefix}{name}")(*args)
        self._call("Init")
        try:
            handles: dict[str, Any] = {}
            for index in range(int(self._call("DeviceGetCount"))):
                handle = self._call("DeviceGetHandleByIndex", index)
                # Gaudi: the run's cards are module ids (HABANA_VISIBLE_MODULES); CUDA: nvidia-smi's index.
                ident = int(self._call("DeviceGetModuleID", handle)) if source == SOURCE_HLML else index
                if not cards or ident in cards:
                    handles[f"module {ident}" if source == SOURCE_HLML else f"GPU {ident}"] = handle
        except Exception:
            self.close()
            raise
        if not handles:
            self.close()
            raise LookupError(f"{source}: none of the run's cards {list(cards or [])} found")
        self.handles = handles
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.errors: list[str] = []

    def read(self) -> dict[str, float]:
        """Each card's counter now, in mJ (a card whose read fails is left out and its error kept)."""
        out: dict[str, float] = {}
        for name, handle in self.handles.items():
            try:
                value = float(self._call("DeviceGetTotalEnergyConsumption", handle))
            except Exception as exc:  # one card's failing counter is that card's, not the run's
                self.errors.append(f"{name}: {exc}")
                continue
            if math.isfinite(value) and value >= 0:
                out[name] = value
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call("Shutdown")

    def result(self) -> dict[str, Any]:
        """The energy between the two reads: {"source", "energy_j", "per_card", "note"}; energy None
        (never 0) when no card was read at both ends, or a counter went backwards (a driver reload)."""
        per_card: dict[str, float] = {}
        skipped: list[str] = []
        for name in self.handles:
            a, b = self.start.get(name), self.end.get(name)
            if a is None or b is None or b < a:
                skipped.append(name)
            else:
                per_card[name] = round((b - a) / 1000, 3)
        notes = []
        if skipped:
            notes.append(f"no counter difference from {', '.join(skipped)}")
        notes += self.errors[-2:]
        return {"source": self.source, "energy_j": round(sum(per_card.values()), 3) if per_card else None,
                "per_card": per_card, "complete": not skipped, "cards": len(self.handles),
                "note": "; ".join(notes)}


def energy_counter(device: str, cards: Sequence[int] | None, module: Any = None) -> EnergyCounter | None:
    """The run's vendor energy counter where its library imports (cuda: pynvml; hpu: pyhlml), else
    None (not an error: most machines have neither)."""
    source = SOURCE_NVML if device == "cuda" else SOURCE_HLML if device == "hpu" else ""
    if not source:
        return None
    if module is None:
        import importlib
        try:
            module = importlib.import_module("pynvml" if source == SOURCE_NVML else "pyhlml")
        except Exception:  # ImportError, or a library that fails to load its shared object
            return None
    try:
        return EnergyCounter(source, module, cards)
    except Exception:
        return None


def with_counter(summary: Mapping[str, Any], counter: Mapping[str, Any]) -> dict[str, Any]:
    """The summary's keys given by a counter's result: ``energy_counter`` beside the integrated
    figure (with how far the integral is from it); where the power could not be integrated, the
    counter's energy becomes the run's (its source named: "nvml" / "hlml")."""
    found = dict(counter)
    joules, integrated = finite(found.get("energy_j")), finite(summary.get("energy_j"))
    if joules is not None and integrated is not None and joules > 0:
        found["integrated_diff_pct"] = round((integrated - joules) / joules * 100, 2)
    out: dict[str, Any] = {"energy_counter": found}
    if integrated is None and joules is not None:
        # The counter is read at the run's start and end: it covers the whole run, on the cards it
        # read at both ends (a card skipped lowers the share, as an unread card does the integral's).
        wall = finite(summary.get("wall_s"))
        read = len(found.get("per_card") or {})
        cards = finite(found.get("cards")) or read
        share = min(1.0, read / cards) if cards else 0.0
        status = coverage_status(share)
        out.update(energy_source=str(found["source"]), energy_status=status, energy_coverage=round(share, 4))
        if status == MEASURED:
            out.update(energy_j=joules, energy_kwh=round(joules / 3.6e6, 9), energy_read_j=None,
                       power_mean_w=rounded(joules / wall) if wall else None)
        else:
            out.update(energy_read_j=joules)
    return out
