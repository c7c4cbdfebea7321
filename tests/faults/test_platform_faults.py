"""Faults at the platform's edges: spoofed or choking protocol lines, hand-edited settings, a config
folder that is a file, demo-model --force on a user's folder and a path that begins with '-'.

Real files and real processes: the app itself is started (``python -m gaudi_gui``, offscreen) against a
broken settings file and must come up; the harness here (not the product) closes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gaudi_gui.core import protocol

# -- protocol -------------------------------------------------------------------------------------------


def test_prefix_mid_line_is_not_an_event(tmp_path: Path) -> None:
    # A dataset column named like an event, printed by a Trainer log line, once spoofed final_loss.
    line = "{'text': 'col " + protocol.event("finished", final_loss=-123) + "'}"
    assert protocol.decode(line) is None
    assert protocol.decode("[rank0]: " + protocol.event("finished", final_loss=-123)) is None


def test_a_child_printing_100k_brackets_does_not_choke_the_reader(tmp_path: Path) -> None:
    # A real child writes the choking line between two good events; the reader keeps both events.
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(f"""
        print({protocol.event("a")!r})
        print({protocol.PREFIX!r} + "[" * 100_000)
        print({protocol.event("b")!r})
    """))
    proc = subprocess.run([sys.executable, str(child)], capture_output=True, text=True, timeout=60,
                          check=True)
    events, errors = [], []
    for line in proc.stdout.splitlines():
        try:
            message = protocol.decode(line)
        except protocol.ProtocolError as exc:
            errors.append(str(exc))
            continue
        if message is not None:
            events.append(message["type"])
    assert events == ["a", "b"] and len(errors) == 1 and "deeply" in errors[0]


# -- settings -------------------------------------------------------------------------------------------


def _write_ini(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


BROKEN_INI = """\
    [runner]
    chat_mode=yes
    load_options="{\\"trust_remote_code\\": \\"false\\", \\"device\\": \\"cpu\\"}"
    [devices]
    interval_s=inf
    process_interval_s=3e6
    history_window_s=lots
    """


def test_string_booleans_and_huge_intervals_in_a_real_ini(qapp, isolated_home: Path) -> None:
    from gaudi_gui.services.settings import Settings

    _write_ini(isolated_home / "config" / "settings.ini", BROKEN_INI)
    settings = Settings()
    assert settings.get("runner/load_options") == {"device": "cpu"}  # "false" never reaches True
    assert settings.get("runner/chat_mode") is True
    assert settings.get("devices/interval_s") == 1.0
    assert settings.get("devices/process_interval_s") == 3600.0
    assert settings.get("devices/history_window_s") == 300
    assert len(settings.problems) == 5


def _start_app(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``python -m gaudi_gui`` for real, offscreen; a sitecustomize in THIS harness closes the window
    once every tab is built, and records what the window showed."""
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    report = tmp_path / "report.json"
    (hook / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import json
        from PySide6.QtCore import QTimer
        from PySide6.QtWidgets import QApplication, QMainWindow

        def _watch():
            app = QApplication.instance()
            if app is None:
                QTimer.singleShot(50, _watch)
                return
            windows = [w for w in app.topLevelWidgets() if isinstance(w, QMainWindow) and w.isVisible()]
            if not windows or not hasattr(windows[0], "tabs_ready"):
                QTimer.singleShot(50, _watch)
                return
            window = windows[0]
            def done():
                with open({str(report)!r}, "w") as f:
                    json.dump({{"status": window.statusBar().currentMessage(),
                               "tabs": window.tabs.count()}}, f)
                window.close()
            window.tabs_ready.connect(lambda: QTimer.singleShot(200, done))

        _orig_init = QApplication.__init__
        def _init(self, *a, **k):
            _orig_init(self, *a, **k)
            QTimer.singleShot(0, _watch)
        QApplication.__init__ = _init
    """))
    env = dict(env, QT_QPA_PLATFORM="offscreen",
               PYTHONPATH=os.pathsep.join([str(hook), *filter(None, [env.get("PYTHONPATH")])]))
    env.pop("GAUDI_GUI_HL_SMI", None)
    proc = subprocess.run([sys.executable, "-m", "gaudi_gui"], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    proc.report = json.loads(report.read_text()) if report.exists() else None  # type: ignore[attr-defined]
    return proc


def test_the_app_starts_with_a_broken_settings_file(isolated_home: Path, tmp_path: Path) -> None:
    _write_ini(isolated_home / "config" / "settings.ini", BROKEN_INI)
    proc = _start_app(dict(os.environ), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.report is not None and proc.report["tabs"] == 6  # type: ignore[attr-defined]
    assert proc.report["status"].startswith("Settings: ")  # type: ignore[attr-defined]
    assert "trust_remote_code must be boolean" in proc.stderr and "Traceback" not in proc.stderr


def test_the_app_starts_when_the_config_folder_is_a_file(isolated_home: Path, tmp_path: Path) -> None:
    (isolated_home / "config").write_text("not a folder")
    proc = _start_app(dict(os.environ), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.report is not None  # type: ignore[attr-defined]
    assert "is a file" in proc.report["status"]  # type: ignore[attr-defined]
    assert (isolated_home / "config").read_text() == "not a folder"


# -- demo-model -----------------------------------------------------------------------------------------


def _gaudi_gui(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, check=False)


def test_demo_model_force_leaves_a_users_folder_untouched(tmp_path: Path) -> None:
    folder = tmp_path / "work"
    (folder / "src").mkdir(parents=True)
    (folder / "config.json").write_text('{"mine": true}')
    (folder / "src" / "thesis.tex").write_text("years of work")
    before = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    proc = _gaudi_gui("demo-model", str(folder), "--force", "--steps", "0", cwd=tmp_path)
    assert proc.returncode == 1 and "nothing was deleted" in proc.stderr
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == before
    assert (folder / "src" / "thesis.tex").read_text() == "years of work"


def test_demo_model_force_refuses_a_forged_marker_with_extra_files(tmp_path: Path) -> None:
    from gaudi_gui.commands.demo_model import MARKER

    folder = tmp_path / "demo"
    folder.mkdir()
    (folder / MARKER).write_text(json.dumps({"written_by": "gaudi-gui demo-model", "entries": []}))
    (folder / "notes.txt").write_text("mine")
    proc = _gaudi_gui("demo-model", str(folder), "--force", cwd=tmp_path)
    assert proc.returncode == 1 and (folder / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("args", [["-dir"], ["--force", "-dir"]])
def test_dash_dir_without_double_dash_is_refused_not_misread(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "-dir").mkdir()
    (tmp_path / "-dir" / "keep.txt").write_text("x")
    proc = _gaudi_gui("demo-model", *args, cwd=tmp_path)
    assert proc.returncode == 2 and "-- -dir" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "-dir").iterdir()) == ["keep.txt"]


def test_dash_dir_after_double_dash_is_a_path(tmp_path: Path) -> None:
    # The user folder named "-dir" is a path here: --force refuses it because it is not a demo model,
    # and says so by its absolute path (the worker is never handed "-dir" as an option).
    (tmp_path / "-dir").mkdir()
    (tmp_path / "-dir" / "keep.txt").write_text("x")
    proc = _gaudi_gui("demo-model", "--force", "--", "-dir", cwd=tmp_path)
    assert proc.returncode == 1 and str(tmp_path / "-dir") in proc.stderr
    assert (tmp_path / "-dir" / "keep.txt").read_text() == "x"
