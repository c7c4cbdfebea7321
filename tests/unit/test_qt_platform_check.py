"""scripts/check_qt_platform.py: what ``make run`` checks before it opens the window."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_qt_platform.py"

LDD = """\
\tlinux-vdso.so.1 (0x00007ffd5a9f3000)
\tlibQt6XcbQpa.so.6 => /venv/PySide6/Qt/lib/libQt6XcbQpa.so.6 (0x00007f)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
\tlibxcb.so.1 => /lib/x86_64-linux-gnu/libxcb.so.1 (0x00007f)
\tlibfoo-unknown.so.7 => not found
"""


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_qt_platform", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_qt_platform"] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


def test_ldd_text_maps_to_debian_and_fedora_packages(check: ModuleType) -> None:
    report = check.diagnose(LDD, dlopened=["libxcb-cursor.so.0"], can_load=lambda name: False)
    assert report.missing == ["libfoo-unknown.so.7", "libxcb-cursor.so.0", "libxcb-icccm.so.4",
                              "libxcb-keysyms.so.1"]
    assert report.debian == ["libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1"]
    assert report.fedora == ["xcb-util-cursor", "xcb-util-keysyms", "xcb-util-wm"]
    assert report.unknown == ["libfoo-unknown.so.7"]
    assert check.diagnose("\tlibc.so.6 => /lib/libc.so.6\n", can_load=lambda name: True).ok


def test_the_issue_packages_are_all_mapped(check: ModuleType) -> None:
    debian = {deb for deb, _ in check.PACKAGES.values()}
    assert {"libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1", "libxcb-image0",
            "libxcb-render-util0", "libxcb-shape0", "libxcb-xkb1", "libxkbcommon-x11-0",
            "libxcb-randr0", "libxcb-xinerama0", "libegl1", "libgl1", "libfontconfig1",
            "libdbus-1-3"} <= debian


def test_non_root_prints_the_one_command_and_exits_non_zero(check: ModuleType,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    ran: list[list[str]] = []
    code = check.main([], env={"DISPLAY": ":0"}, ldd_output=LDD, can_load=lambda n: True,
                      is_root=False, which=lambda name: "/usr/bin/apt-get" if name == "apt-get" else None,
                      runner=_recorder(ran))
    err = capsys.readouterr().err
    assert code == 1 and ran == []
    assert "sudo apt-get install -y --no-install-recommends libxcb-icccm4 libxcb-keysyms1" in err
    assert "apt-file search libfoo-unknown.so.7" in err


def test_non_root_on_fedora_prints_dnf(check: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    code = check.main([], env={"DISPLAY": ":0"}, ldd_output=LDD, can_load=lambda n: True,
                      is_root=False, which=lambda name: "/usr/bin/dnf" if name == "dnf" else None)
    assert code == 1
    assert "sudo dnf install -y xcb-util-keysyms xcb-util-wm" in capsys.readouterr().err


def test_root_with_apt_installs_and_says_so(check: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    ran: list[list[str]] = []
    ldd = "\tlibxcb-icccm.so.4 => not found\n"
    code = check.main([], env={"DISPLAY": ":0"}, ldd_output=ldd, can_load=lambda n: True, is_root=True,
                      which=lambda name: f"/usr/bin/{name}" if name == "apt-get" else None,
                      runner=_recorder(ran))
    assert code == 0
    assert ran == [["apt-get", "update", "-q"],
                   ["apt-get", "install", "-y", "--no-install-recommends", "libxcb-icccm4"]]
    assert "installed libxcb-icccm4" in capsys.readouterr().err


def test_root_install_failure_is_reported(check: ModuleType) -> None:
    code = check.main([], env={"DISPLAY": ":0"}, ldd_output="\tlibxcb-icccm.so.4 => not found\n",
                      can_load=lambda n: True, is_root=True, which=lambda name: "/usr/bin/apt-get",
                      runner=lambda cmd: 100)
    assert code == 2


@pytest.mark.parametrize("env", [{}, {"QT_QPA_PLATFORM": "xcb"}, {"QT_QPA_PLATFORM": ""}])
def test_no_display_says_what_to_do_instead(check: ModuleType, env: dict[str, str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert check.main([], env=env, ldd_output="") == 3
    err = capsys.readouterr().err
    assert "no display" in err and "remote host" in err and "xvfb-run" in err and "gaudi-gui devices" in err


@pytest.mark.parametrize("env", [{"QT_QPA_PLATFORM": "offscreen"}, {"DISPLAY": ":1"},
                                 {"WAYLAND_DISPLAY": "wayland-0"}])
def test_a_display_or_headless_platform_is_enough(check: ModuleType, env: dict[str, str]) -> None:
    assert check.no_display_message(env) is None


def _recorder(ran: list[list[str]]) -> Callable[[list[str]], int]:
    def run(cmd: list[str]) -> int:
        ran.append(cmd)
        return 0
    return run


def _fake_ldd(tmp_path: Path, missing: str) -> dict[str, str]:
    folder = tmp_path / "bin"
    folder.mkdir()
    ldd = folder / "ldd"
    ldd.write_text(f"#!/bin/sh\necho \"\t{missing} => not found\"\necho \"\tlibc.so.6 => /lib/libc.so.6\"\n")
    ldd.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env.update(PATH=f"{folder}{os.pathsep}{env['PATH']}", DISPLAY=":0")
    return env


def test_real_script_with_a_path_injected_ldd(tmp_path: Path) -> None:
    # A real run of the script against this venv's PySide6, with an ldd that reports one library
    # missing: --no-install prints the command and exits 1 even as root.
    env = _fake_ldd(tmp_path, "libxcb-xinerama.so.0")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--no-install"], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "libxcb-xinerama.so.0" in proc.stderr
    assert "apt-get install -y --no-install-recommends" in proc.stderr and "libxcb-xinerama0" in proc.stderr


def test_real_script_without_a_display_exits_3(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert proc.returncode == 3 and "no display" in proc.stderr
