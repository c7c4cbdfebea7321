"""``gaudi-gui devices`` in a real subprocess with the fake hl-smi on PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MODULES = {0: 2, 1: 6, 2: 3, 3: 7, 4: 0, 5: 4, 6: 5, 7: 1}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", "devices", *args], capture_output=True,
                          text=True, timeout=60, env=env or dict(os.environ))


def test_json_snapshot(fake_hl_smi: Path) -> None:
    done = cli("--json")
    assert done.returncode == 0, done.stderr
    cards = json.loads(done.stdout)
    assert [c["index"] for c in cards] == list(range(8))
    assert {c["index"]: c["module_id"] for c in cards} == MODULES
    first = cards[0]
    assert first["name"] == "HL-205" and first["generation"] == "Gaudi 1"
    assert isinstance(first["utilization"], float) and first["memory_total_mib"] == 32768
    assert first["power_max_w"] is None  # not queried: unknown, not 0
    assert [p["pid"] for p in first["processes"]] == [10]


def test_json_na_is_null(fake_hl_smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "na")
    cards = json.loads(cli("--json").stdout)
    assert all(c["power_w"] is None and c["serial"] is None for c in cards)


def test_table_output(fake_hl_smi: Path) -> None:
    done = cli()
    assert done.returncode == 0
    assert "Gaudi 1 (HL-205)" in done.stdout and done.stdout.count("\n") >= 8


def test_explicit_path_via_option_and_env(fake_hl_smi: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PATH=os.defpath)
    assert cli("--json", "--hl-smi", str(fake_hl_smi), env=env).returncode == 0
    env["GAUDI_GUI_HL_SMI"] = str(fake_hl_smi)
    assert len(json.loads(cli("--json", env=env).stdout)) == 8


def test_broken_explicit_path_fails_clearly(tmp_path: Path) -> None:
    done = cli("--json", "--hl-smi", str(tmp_path / "missing"))
    assert done.returncode == 2
    assert "cannot run hl-smi" in done.stderr and "Traceback" not in done.stderr


def test_missing_hl_smi_prints_host(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=str(tmp_path))
    done = cli("--json", env=env)
    assert done.returncode == 0
    assert "not installed" in done.stderr
    cards = json.loads(done.stdout)
    assert cards[-1]["kind"] == "host" and cards[-1]["memory_total_mib"] > 0


def test_missing_hl_smi_beside_accel_nodes_is_a_failure(tmp_path: Path) -> None:
    """/dev/accel nodes (a fixture /dev) and no hl-smi: the cards are there and cannot be read, exit 1
    saying so (it said "hl-smi is not installed" and exit 0, as on a CPU machine)."""
    dev = tmp_path / "dev"
    (dev / "accel").mkdir(parents=True)
    for i in range(8):
        (dev / "accel" / f"accel{i}").touch()
    env = dict(os.environ, PATH=str(tmp_path), GAUDI_GUI_DOCTOR_DEV=str(dev))
    env.pop("GAUDI_GUI_HL_SMI", None)
    done = cli("--json", env=env)
    assert done.returncode == 1, done.stderr
    assert "no hl-smi on PATH, but 8 /dev/accel nodes (accel0..accel7)" in done.stderr
    assert "--hl-smi PATH" in done.stderr and "Traceback" not in done.stderr
    assert json.loads(done.stdout)[-1]["kind"] == "host"


def test_failing_hl_smi_exits_non_zero(fake_hl_smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "fail")
    done = cli("--json")
    assert done.returncode == 1
    assert "no Habana devices found" in done.stderr and "Traceback" not in done.stderr
    assert json.loads(done.stdout)[-1]["kind"] == "host"


def test_explicit_timeout_accepted_and_output_clean(fake_hl_smi: Path) -> None:
    done = cli("--timeout", "5")
    assert done.returncode == 0, done.stderr
    assert not any(ord(c) < 32 and c != "\n" for c in done.stdout)


def test_json_carries_problems(fake_hl_smi: Path) -> None:
    cards = json.loads(cli("--json").stdout)
    assert all(c["problems"] == [] for c in cards)  # the recorded server has plausible values
