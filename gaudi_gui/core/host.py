"""The host (CPU, RAM via psutil) and NVIDIA GPUs (nvidia-smi) in the same sample model as Gaudi cards,
so the Devices panel is useful on every machine."""

from __future__ import annotations

import platform
import time
from collections.abc import Iterable

import psutil

from gaudi_gui.core.devices import DeviceSample, ProcessInfo
from gaudi_gui.core.hlsmi import parse_csv

NVIDIA_FIELDS = ("index", "name", "uuid", "utilization.gpu", "memory.used", "memory.total",
                 "temperature.gpu", "power.draw", "power.limit", "driver_version", "pci.bus_id")
#: nvidia-smi field -> the hl-smi field of the same meaning, so one parser serves both.
_AS_HLSMI = {"utilization.gpu": "utilization.aip", "temperature.gpu": "temperature.aip",
             "power.limit": "power.max", "pci.bus_id": "bus_id"}


def nvidia_args() -> list[str]:
    return [f"--query-gpu={','.join(NVIDIA_FIELDS)}", "--format=csv,noheader,nounits"]


def parse_nvidia(text: str) -> list[DeviceSample]:
    fields = [_AS_HLSMI.get(f, f) for f in NVIDIA_FIELDS]
    now = time.time()
    samples = parse_csv(text, fields, kind="cuda").samples
    for s in samples:
        s.timestamp = now
    return samples


def host_sample() -> DeviceSample:
    """CPU utilization since the previous call, and RAM in MiB."""
    memory = psutil.virtual_memory()
    return DeviceSample(
        kind="host", index=0,
        name=f"{platform.processor() or platform.machine()} ({psutil.cpu_count() or '?'} CPUs)",
        utilization=psutil.cpu_percent(interval=None),
        memory_used_mib=(memory.total - memory.available) / 2**20,
        memory_total_mib=memory.total / 2**20,
        timestamp=time.time(),
    )


def describe_processes(processes: Iterable[ProcessInfo]) -> list[ProcessInfo]:
    """Fill user and command line from psutil where the PID is visible to us (else leave None:
    without root, or inside a container, other users' processes are hidden)."""
    out = []
    for proc in processes:
        try:
            p = psutil.Process(proc.pid)
            with p.oneshot():
                proc.user = p.username()
                proc.cmdline = " ".join(p.cmdline()) or None
        except (psutil.Error, OSError):
            pass
        out.append(proc)
    return out
