"""``gaudi-gui generate`` through the real worker on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("demo_model")


def gaudi_gui(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=180)


def test_generate_streams_and_reports_stats() -> None:
    proc = gaudi_gui("generate", "--prompt", "The learning rate", "--max-new-tokens", "8")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "tok/s" in proc.stderr and "loaded builtin:demo on cpu" in proc.stderr


def test_generate_json_chat() -> None:
    proc = gaudi_gui("generate", "--prompt", "What is the loss?", "--chat", "--system", "Be brief.",
                     "--max-new-tokens", "6", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["stats"]["tokens"] >= 1 and isinstance(result["text"], str)


def test_generate_bad_arguments_and_missing_model(tmp_path: Path) -> None:
    proc = gaudi_gui("generate", "--prompt", "x", "--do-sample", "--temperature", "0")
    assert proc.returncode == 2 and "temperature" in proc.stderr
    proc = gaudi_gui("generate", "--prompt", "x", "--model", str(tmp_path / "missing"))
    assert proc.returncode == 1
    assert "error" in proc.stderr and "Traceback" not in proc.stderr


def test_generate_stop_strings_are_literal() -> None:
    # "。" was garbled and "\x" raised in unicode_escape; both are plain text now.
    proc = gaudi_gui("generate", "--prompt", "The learning rate", "--max-new-tokens", "6",
                     "--stop", "。", "--stop", "\\x", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stats"]["stop_reason"] in ("max_new_tokens", "eos", "stop_string")
