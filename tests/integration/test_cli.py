"""The command line as a user runs it: real subprocesses of ``python -m gaudi_gui``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def gaudi_gui(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


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


def test_unknown_option_exits_2_with_one_line_instead_of_opening_the_window() -> None:
    proc = gaudi_gui("--bogus", timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "unrecognized arguments: --bogus" in proc.stderr and proc.stdout == ""


def test_env_json_reports_versions_and_device() -> None:
    proc = gaudi_gui("env", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["device"] == "cpu"
    assert info["packages"]["transformers"].startswith("5.")
    assert info["habana_frameworks"] is False and info["is_torch_hpu_available"] is False
    assert info["gaudi_gui_version"] and set(info["optional_packages"]) == {"deepspeed", "optimum-habana"}
    assert set(info["gaudi"]) >= {"driver_version", "firmware_version", "error"}
    assert set(info["env"]) >= {"PT_ENABLE_INT64_SUPPORT", "PT_HPU_LAZY_MODE", "HABANA_VISIBLE_MODULES"}
    text = gaudi_gui("env").stdout
    assert "device used" in text and "accelerate" in text


def test_demo_model_builds_a_loadable_model(tmp_path: Path) -> None:
    # The folder's name begins with '-': after '--' it is a path, never an option.
    target = tmp_path / "-demo"
    proc = gaudi_gui("demo-model", "--steps", "5", "--", "-demo", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(target)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "gaudi_gui_demo.json",
                 ".gaudi-gui-demo-model"):
        assert (target / name).is_file(), name
    config = json.loads((target / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 64
    tokenizer_config = json.loads((target / "tokenizer_config.json").read_text())
    chat_template = tokenizer_config.get("chat_template") or (target / "chat_template.jinja").read_text()
    assert "im_start" in chat_template
    # A second call (./-demo: the other way to say it) reuses the folder instead of rebuilding it.
    again = gaudi_gui("demo-model", "./-demo", "--steps", "5", cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.strip() == str(target)
    # Without '--' the name is refused with a hint, and nothing is built.
    bare = gaudi_gui("demo-model", "-other", cwd=tmp_path)
    assert bare.returncode == 2 and "gaudi-gui demo-model -- -other" in bare.stderr
    assert not (tmp_path / "-other").exists()
    # --force refuses once the folder holds a file the demo did not write, and deletes nothing.
    (target / "notes.txt").write_text("mine")
    forced = gaudi_gui("demo-model", "--force", "--steps", "1", "--", "-demo", cwd=tmp_path)
    assert forced.returncode == 1 and "notes.txt" in forced.stderr and "nothing was deleted" in forced.stderr
    assert (target / "notes.txt").read_text() == "mine" and (target / "config.json").is_file()


def test_demo_model_force_refuses_a_folder_it_did_not_write(tmp_path: Path) -> None:
    user = tmp_path / "my-model"
    user.mkdir()
    (user / "config.json").write_text("{}")
    (user / "weights.bin").write_bytes(b"precious")
    proc = gaudi_gui("demo-model", str(user), "--force", "--steps", "1")
    assert proc.returncode == 1 and "does not hold a demo model" in proc.stderr
    assert sorted(p.name for p in user.iterdir()) == ["config.json", "weights.bin"]
    assert (user / "weights.bin").read_bytes() == b"precious"


def test_demo_model_force_check(tmp_path: Path) -> None:
    from gaudi_gui.commands.demo_model import MARKER, why_not_replaceable, write_marker

    assert why_not_replaceable(tmp_path / "absent") is None
    folder = tmp_path / "demo"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert "does not hold" in (why_not_replaceable(folder) or "")
    write_marker(folder)
    assert why_not_replaceable(folder) is None
    (folder / MARKER).write_text("{not json")
    assert "not a valid" in (why_not_replaceable(folder) or "")
    write_marker(folder)
    (folder / "sub").mkdir()
    assert "sub" in (why_not_replaceable(folder) or "")
    link = tmp_path / "link"
    link.symlink_to(folder)
    assert "not a folder" in (why_not_replaceable(link) or "")


def test_demo_model_into_unwritable_place_fails_cleanly(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = gaudi_gui("demo-model", str(blocker / "demo"), "--steps", "1")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "error" in proc.stderr.lower()


def test_ctrl_c_while_building_the_demo_model_ends_the_builder(tmp_path: Path) -> None:
    """The builder runs in a session of its own: Ctrl+C reaches the command, which ends it (exit 130)
    instead of leaving it pre-training in the background."""
    import os
    import signal

    import psutil

    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "demo-model", "--steps", "100000",
                             str(tmp_path / "demo")], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # the builder is pre-training
        seen.append(line)
        if line.startswith("pre-training step"):
            break
    builders = psutil.Process(proc.pid).children(recursive=True)
    assert builders, seen
    os.kill(proc.pid, signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err[-2000:]
    _gone, alive = psutil.wait_procs(builders, timeout=30)
    assert alive == []
