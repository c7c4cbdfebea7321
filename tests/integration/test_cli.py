"""The command line as a user runs it: real subprocesses of ``python -m gaudi_gui``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def gaudi_gui(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_version_and_help() -> None:
    assert gaudi_gui("--version").stdout.startswith("gaudi-gui ")
    out = gaudi_gui("--help").stdout
    for command in ("devices", "env", "generate", "train", "demo-model"):
        assert command in out


def test_bad_arguments_exit_2_with_one_clear_line() -> None:
    proc = gaudi_gui("no-such-command")
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr and "Traceback" not in proc.stderr
    proc = gaudi_gui("demo-model", "--steps", "lots")
    assert proc.returncode == 2 and "invalid int value" in proc.stderr


def test_env_json_reports_versions_and_device() -> None:
    proc = gaudi_gui("env", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["device"] == "cpu"
    assert info["packages"]["transformers"].startswith("5.")
    assert info["habana_frameworks"] is False and info["is_torch_hpu_available"] is False
    assert set(info["env"]) >= {"PT_ENABLE_INT64_SUPPORT", "PT_HPU_LAZY_MODE", "HABANA_VISIBLE_MODULES"}
    text = gaudi_gui("env").stdout
    assert "device used" in text and "accelerate" in text


def test_demo_model_builds_a_loadable_model(tmp_path: Path) -> None:
    target = tmp_path / "demo"
    proc = gaudi_gui("demo-model", str(target), "--steps", "5")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(target)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "gaudi_gui_demo.json"):
        assert (target / name).is_file(), name
    config = json.loads((target / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 64
    tokenizer_config = json.loads((target / "tokenizer_config.json").read_text())
    chat_template = tokenizer_config.get("chat_template") or (target / "chat_template.jinja").read_text()
    assert "im_start" in chat_template
    # A second call reuses the folder instead of rebuilding it.
    again = gaudi_gui("demo-model", str(target), "--steps", "5")
    assert again.returncode == 0 and again.stdout.strip() == str(target)


def test_demo_model_into_unwritable_place_fails_cleanly(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = gaudi_gui("demo-model", str(blocker / "demo"), "--steps", "1")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "error" in proc.stderr.lower()
