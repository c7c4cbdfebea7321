"""The architecture's one rule, enforced: core imports without PySide6, torch or transformers, and
the GUI's own modules never pull torch in."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKER = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = {"PySide6", "shiboken6", "torch", "transformers", "habana_frameworks", "peft",
               "bitsandbytes", "accelerate", "datasets", "pyqtgraph"}
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"blocked import: {name}")
            return None
    sys.meta_path.insert(0, Block())
""")


def test_core_imports_without_qt_or_torch() -> None:
    code = BLOCKER + textwrap.dedent("""
        import pkgutil, importlib, gaudi_gui.core as core
        names = [m.name for m in pkgutil.walk_packages(core.__path__, "gaudi_gui.core.")]
        for name in names:
            importlib.import_module(name)
        print(len(names))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) >= 3


def test_gui_modules_do_not_import_torch() -> None:
    code = textwrap.dedent("""
        import pkgutil, importlib, sys
        import gaudi_gui.ui, gaudi_gui.services, gaudi_gui.commands
        import gaudi_gui.cli, gaudi_gui.app
        for pkg in (gaudi_gui.ui, gaudi_gui.services, gaudi_gui.commands):
            for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
                importlib.import_module(m.name)
        heavy = sorted(n for n in ("torch", "transformers", "peft", "bitsandbytes", "accelerate",
                                   "datasets", "habana_frameworks") if n in sys.modules)
        print(heavy)
        assert not heavy, heavy
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_window_paints_before_loading_what_only_its_background_needs() -> None:
    """What runs before the first paint (``app.run_gui`` up to ``exec``) loads no chart library, no
    numerical one, and none of the agent's wire, sockets, subprocesses or hashes: those come with the
    background services and the tabs, after the window is on screen."""
    code = textwrap.dedent("""
        import os, sys
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
        before = set(sys.modules)
        from PySide6.QtWidgets import QApplication
        app = QApplication([sys.argv[0]])
        qt = set(sys.modules)
        from gaudi_gui import app as gui_app
        from gaudi_gui.services.ctrl_c import CtrlC
        from gaudi_gui.ui.main_window import MainWindow
        ctrl_c = CtrlC(app)
        services = gui_app.window_services(app)
        window = MainWindow(services)
        window.show()
        gui_app._show_settings_problems(services, window)
        late = ("pyqtgraph", "numpy", "socket", "subprocess", "hashlib", "ssl", "gaudi_gui.core.agentwire",
                "gaudi_gui.services.agent_child", "gaudi_gui.ui.devices_tab")
        print(sorted(n for n in late if n in sys.modules and n not in qt))
        ctrl_c.uninstall()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout
