"""The command line as a user runs it: real subprocesses of ``python -m gaudi_gui``."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import children_get_sigint


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


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_ctrl_c_while_building_the_demo_model_ends_the_builder(tmp_path: Path, sigint: str) -> None:
    """The builder runs in a session of its own: Ctrl+C reaches the command, which ends it (exit 130)
    instead of leaving it pre-training in the background. Also when the command was started with SIGINT
    ignored (a script's background job, some CI runners): a command that must stop on Ctrl-C installs
    its own handler rather than inherit none."""
    import os
    import signal

    import psutil

    with children_get_sigint(sigint):
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
    try:
        _out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # it ignored the Ctrl-C: end it here, the test fails
        for child in [psutil.Process(proc.pid), *builders]:
            with contextlib.suppress(psutil.Error):
                child.kill()
        raise
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err[-2000:]
    _gone, alive = psutil.wait_procs(builders, timeout=30)
    assert alive == []


def test_every_command_ends_quietly_when_its_reader_goes_away(tmp_path: Path) -> None:
    """``gaudi-gui runs list | head``: the reader leaves before the command has said everything. The
    command ends there without a word (no BrokenPipeError traceback, no "Exception ignored" at exit),
    with 141 (128 + SIGPIPE) as a tool that SIGPIPE ended, whichever subcommand it was."""
    import os
    import shlex

    from tests.helpers import run_history

    runs = tmp_path / "runs"
    newest = run_history(runs, 300)[0]
    where = ["runs", "--runs-dir", str(runs)]
    for argv in ([*where, "list"], [*where, "list", "--json"], [*where, "show", newest],
                 [*where, "show", newest, "--json"], ["queue", "list"], ["queue", "list", "--json"],
                 ["models"], ["models", "--json"]):
        # A reader already gone: the first write fails, wherever the command makes it.
        read, write = os.pipe()
        os.close(read)
        try:
            proc = subprocess.run([sys.executable, "-m", "gaudi_gui", *argv], stdout=write,
                                  stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, timeout=120)
        finally:
            os.close(write)
        assert (proc.returncode, proc.stderr) == (141, ""), (argv, proc.stderr[-2000:])
    # A real `head -c 1`: runs list --json of 300 runs is ~170 kB, more than a pipe holds, so the
    # command is still writing when head has read its byte and gone.
    line = f"{shlex.join([sys.executable, '-m', 'gaudi_gui', *where, 'list', '--json'])} | head -c 1"
    proc = subprocess.run(["sh", "-c", f"{line}; echo \" $?\" >&2"], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout == "["
    assert proc.stderr == " 0\n", proc.stderr[-2000:]  # head's status; the command said nothing
    piped = subprocess.run(["bash", "-c", f"set -o pipefail; {line}"], capture_output=True, text=True,
                           timeout=120)
    assert (piped.returncode, piped.stderr) == (141, ""), piped.stderr[-2000:]


def test_removing_a_host_that_is_not_saved_says_so(tmp_path: Path) -> None:
    """``hosts --remove NAME`` of a host that is not saved is a mistake (a typo, the wrong name): exit 2
    naming it and the saved hosts, the list unchanged; a saved one is forgotten (exit 0)."""
    assert gaudi_gui("hosts", "--add", "gg-alpha").returncode == 0
    assert gaudi_gui("hosts", "--add", "someone@gg-beta:2222").returncode == 0
    proc = gaudi_gui("hosts", "--remove", "gg-alfa")
    assert proc.returncode == 2, proc.stderr
    assert "'gg-alfa'" in proc.stderr and "gg-alpha" in proc.stderr and "someone@gg-beta:2222" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    proc = gaudi_gui("hosts", "--remove", "gg-alpha")
    assert (proc.returncode, proc.stderr) == (0, "")
    proc = gaudi_gui("hosts", "--remove", "gg-alpha")
    assert proc.returncode == 2 and "gg-alpha" in proc.stderr and "someone@gg-beta:2222" in proc.stderr


def test_ctrl_c_in_the_terminal_closes_the_window_as_its_close_button_does(tmp_path: Path) -> None:
    """``gaudi-gui`` (the window) started from a terminal: Ctrl-C there asks the window to close, as
    its close button does (nothing runs here, so it closes and the app exits 0), instead of a
    KeyboardInterrupt traceback from whichever view's slot ran next and a window that stays up."""
    import signal

    import psutil

    from tests.helpers import wait_until

    with children_get_sigint():  # as from a terminal
        proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Painted: its background services start after the first paint, the environment probe first
        # (the agent's child, asked for by the window: this test's GAUDI_GUI_HOME names both).
        from tests.helpers import processes_with_env

        def probing() -> bool:
            for found in processes_with_env("GAUDI_GUI_HOME", os.environ["GAUDI_GUI_HOME"]):
                with contextlib.suppress(psutil.Error):
                    if "gaudi_gui.workers.probe" in " ".join(found.cmdline()):
                        return True
            return False

        assert wait_until(lambda: probing() or proc.poll() is not None, 120), "no window in 120 s"
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # it ignored the Ctrl-C: end it here, the test fails
            for child in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
                with contextlib.suppress(psutil.Error):
                    child.kill()
            proc.wait(30)
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
