"""Device samples, warnings, the bounded history, host and nvidia-smi parsing."""

from __future__ import annotations

import numpy as np
import pytest

from gaudi_gui.core import host, visibility
from gaudi_gui.core.devices import (
    DeviceSample,
    History,
    ProcessInfo,
    attach_processes,
    card_warnings,
    generation,
    value_problems,
)


@pytest.mark.parametrize("name, gen", [("HL-205", "Gaudi 1"), ("HL-225", "Gaudi 2"), ("HL-225B", "Gaudi 2"),
                                       ("HL-325L", "Gaudi 3"), ("HL-338", "Gaudi 3"), ("HL-100", None),
                                       (None, None), ("", None)])
def test_generation(name: str | None, gen: str | None) -> None:
    assert generation(name) == gen


def test_warnings() -> None:
    ok = DeviceSample(kind="hpu", index=0, temperature_c=40, utilization=0)
    assert card_warnings(ok) == []
    dead = DeviceSample(kind="hpu", index=0, temperature_c=0, utilization=0)
    assert "failed to initialise" in card_warnings(dead)[0]
    hot = DeviceSample(kind="hpu", index=0, temperature_c=90, utilization=0)
    assert card_warnings(hot, hot_c=85)[0].startswith("hot")
    busy = DeviceSample(kind="hpu", index=0, temperature_c=40, utilization=50)
    assert card_warnings(busy) == ["busy"]
    unknown = DeviceSample(kind="hpu", index=0)
    assert card_warnings(unknown) == []
    attach_processes([unknown], [ProcessInfo(index=0, pid=1, name="python")])
    assert card_warnings(unknown) == ["busy by 1 process(es)"]


def test_to_dict_numbers_and_nulls() -> None:
    data = DeviceSample(kind="hpu", index=1, name="HL-225", power_w=90.0).to_dict()
    assert data["generation"] == "Gaudi 2" and data["power_w"] == 90.0 and data["temperature_c"] is None


def test_history_is_bounded_and_ordered() -> None:
    history = History(capacity=100)
    for k in range(250):
        history.add([DeviceSample(kind="hpu", index=i, module_id=i, utilization=float(k), timestamp=float(k))
                     for i in range(8)])
    assert len(history.keys()) == 8
    t, v = history.series("hpu:m3", "utilization")
    assert len(t) == 100 and v[-1] == 249 and t[0] == 150 and t[-1] == 249 and np.all(np.diff(t) > 0)
    t, v = history.series("hpu:m3", "utilization", since=240)
    assert list(v) == [float(x) for x in range(240, 250)]
    nbytes = history.nbytes()
    history.add([DeviceSample(kind="hpu", index=0, module_id=0, timestamp=1e9)])
    assert history.nbytes() == nbytes  # no growth
    t, v = history.series("hpu:m0", "power_w")
    assert np.isnan(v[-1])  # unknown stays unknown


def test_history_hour_of_8_cards_fits() -> None:
    assert History(capacity=3600).capacity * 8 * 5 * 8 < 2_000_000


def test_nvidia_parse() -> None:
    text = ("0, NVIDIA H100, GPU-1234, 37, 1024, 81559, 41, 70.5, 700.00, 550.54, 00000000:18:00.0\n"
            "1, NVIDIA H100, GPU-5678, [N/A], 10, 81559, 39, [N/A], 700.00, 550.54, 00000000:2A:00.0\n")
    samples = host.parse_nvidia(text)
    assert [s.kind for s in samples] == ["cuda", "cuda"]
    first, second = samples
    assert (first.utilization, first.memory_used_mib) == (37, 1024)
    assert (first.power_w, first.power_max_w) == (70.5, 700)
    assert first.temperature_c == 41 and first.uuid == "GPU-1234" and first.bus_id == "00000000:18:00.0"
    assert second.utilization is None and second.power_w is None
    assert second.generation is None and second.key == "cuda:1"


def test_nvidia_garbage() -> None:
    assert host.parse_nvidia("NVIDIA-SMI has failed because it couldn't communicate with the driver") == []


def test_host_sample() -> None:
    s = host.host_sample()
    assert s.kind == "host" and s.memory_total_mib and s.memory_total_mib > 0
    assert s.memory_used_mib is not None and 0 <= s.memory_used_mib <= s.memory_total_mib


def test_describe_processes_own_pid() -> None:
    import os

    out = host.describe_processes([ProcessInfo(index=0, pid=os.getpid(), name="python"),
                                   ProcessInfo(index=1, pid=2**22 + 12345, name="gone")])
    assert out[0].cmdline and out[0].user
    assert out[1].user is None and out[1].cmdline is None


def test_implausible_values_are_flagged() -> None:
    ok = DeviceSample(kind="hpu", index=0, utilization=100, memory_used_mib=0, memory_total_mib=32768,
                      temperature_c=-10, power_w=0)
    assert value_problems(ok) == []
    bad = DeviceSample(kind="hpu", index=0, utilization=250, memory_used_mib=-5, memory_total_mib=32768,
                       temperature_c=9999, power_w=-1)
    problems = value_problems(bad)
    assert len(problems) == 4 and all(p.startswith("implausible") for p in problems)
    assert "utilization 250" in problems[0]
    over = DeviceSample(kind="hpu", index=0, memory_used_mib=40000, memory_total_mib=32768)
    assert value_problems(over) == ["implausible memory: 40000 MiB used of 32768 MiB"]
    # flagged first in the card's warnings; an absurd temperature is not also "hot"
    warnings = card_warnings(bad)
    assert warnings[:4] == problems and not any(w.startswith("hot") for w in warnings)
    assert bad.to_dict()["problems"] == problems


def test_single_card_needs_no_partial_server_group() -> None:
    eight = list(range(8))
    assert visibility.selection_warnings("hpu", [5], eight) == []
    assert "2 or 4 cards" in visibility.selection_warnings("hpu", [0, 1, 2], eight)[0]
    assert "not a supported group" in visibility.selection_warnings("hpu", [1, 2], eight)[0]
    assert visibility.selection_warnings("hpu", [0, 1], eight) == []
    assert visibility.selection_warnings("hpu", eight, eight) == []


PROBE_CPU_TORCH = {"habana_frameworks": False, "is_torch_hpu_available": False, "cuda_count": 0,
                   "executable": "/venv/bin/python", "device": "cpu", "packages": {"habana_frameworks": None}}
PROBE_GAUDI = {"habana_frameworks": True, "is_torch_hpu_available": True, "cuda_count": 0, "device": "hpu"}


def test_jobs_device_follows_the_probe() -> None:
    assert visibility.jobs_device("hpu", None) == "hpu"  # not probed yet: assume the cards work
    assert visibility.jobs_device("hpu", PROBE_GAUDI) == "hpu"
    assert visibility.jobs_device("hpu", PROBE_CPU_TORCH) == "cpu"
    assert visibility.jobs_device("cuda", PROBE_CPU_TORCH) == "cpu"
    assert visibility.jobs_device("cpu", PROBE_GAUDI) == "cpu"
    text = visibility.runtime_mismatch("hpu", PROBE_CPU_TORCH)
    assert text is not None and "CPU" in text and "habana-torch-plugin" in text and "/venv/bin/python" in text
    assert visibility.runtime_mismatch("hpu", PROBE_GAUDI) is None
    broken = dict(PROBE_GAUDI, is_torch_hpu_available=False, errors={"hpu": "RuntimeError: no driver"})
    assert "no driver" in (visibility.runtime_mismatch("hpu", broken) or "")
