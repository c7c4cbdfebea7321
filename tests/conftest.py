"""Shared fixtures: an isolated home for every test, one tiny demo model per session, no network."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"

# No test may reach the network: the Hub libraries honour these, and every child inherits them.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# A user's default accelerate config must never change what a test launches.
os.environ.pop("ACCELERATE_CONFIG_FILE", None)


@pytest.fixture(scope="session")
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("session-home")


@pytest.fixture(scope="session")
def tiny_model_dir(session_home: Path) -> Path:
    """The demo model recipe with few pre-training steps, built once per session in a real child."""
    out = session_home / "tiny-model"
    subprocess.run([sys.executable, "-m", "gaudi_gui.workers.demo", str(out), "--steps", "30"],
                   check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  request: pytest.FixtureRequest) -> Iterator[Path]:
    """Every test gets its own GAUDI_GUI_HOME (settings, runs, cache) and a fresh HF cache."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("GAUDI_GUI_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("GAUDI_GUI_RUNS_DIR", raising=False)
    monkeypatch.delenv("GAUDI_GUI_HL_SMI", raising=False)
    if "tiny_model_dir" in request.fixturenames or "demo_model" in request.fixturenames:
        monkeypatch.setenv("GAUDI_GUI_DEMO_MODEL_DIR", str(request.getfixturevalue("tiny_model_dir")))
    yield home


@pytest.fixture
def demo_model(tiny_model_dir: Path) -> Path:
    """Makes ``builtin:demo`` resolve to the session's tiny model (no 8-second rebuild per test)."""
    return tiny_model_dir


@pytest.fixture
def fake_hl_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``hl-smi`` on PATH replaying recorded output; returns its path. Tune it with the
    FAKE_HLSMI_* variables (see tests/fake_hl_smi.py)."""
    folder = tmp_path / "fake-bin"
    folder.mkdir()
    program = folder / "hl-smi"
    fake = Path(__file__).parent / "fake_hl_smi.py"
    program.write_text(f"#!/bin/sh\nexec {sys.executable} {fake} \"$@\"\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_HLSMI_PERIOD", "0.1")
    return program
