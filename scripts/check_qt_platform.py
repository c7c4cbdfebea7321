#!/usr/bin/env python3
"""Check, before ``make run`` starts the window, that Qt's platform plugin can load on this machine.

PySide6's wheels bundle Qt but not the system libraries its xcb (X11) plugin links to: on a fresh
desktop ``libxcb-cursor0``, ``libxcb-icccm4``, ``libxcb-keysyms1`` ... are often missing, and Qt then
aborts with "xcb-cursor0 or libxcb-cursor0 is needed to load the Qt xcb platform plugin". This script
runs ``ldd`` on the plugin and the libraries it loads, adds the ones Qt opens at run time (dlopen; ldd
cannot see them), and maps every missing soname to its Debian and Fedora package:

* as root with apt-get (or dnf) available it installs the missing packages and says so;
* otherwise it prints the one command that installs them and exits 1;
* with no display at all (no DISPLAY / WAYLAND_DISPLAY, and QT_QPA_PLATFORM not a headless platform)
  it says what to do instead and exits 3.

``make test`` never runs it (the tests are offscreen). Usage::

    python scripts/check_qt_platform.py [--no-install] [--quiet]

Exit codes: 0 ready, 1 libraries missing (the command to run was printed), 2 the install failed,
3 no display.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: soname -> (Debian/Ubuntu package, Fedora/RHEL package)
PACKAGES: dict[str, tuple[str, str]] = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb"),
    "libxcb-xinerama.so.0": ("libxcb-xinerama0", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb"),
    "libxcb-xinput.so.0": ("libxcb-xinput0", "libxcb"),
    "libxcb-glx.so.0": ("libxcb-glx0", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libX11.so.6": ("libx11-6", "libX11"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libSM.so.6": ("libsm6", "libSM"),
    "libICE.so.6": ("libice6", "libICE"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl"),
    "libGL.so.1": ("libgl1", "libglvnd-glx"),
    "libGLX.so.0": ("libglx0", "libglvnd-glx"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2"),
    "libgthread-2.0.so.0": ("libglib2.0-0", "glib2"),
    "libwayland-client.so.0": ("libwayland-client0", "libwayland-client"),
    "libwayland-cursor.so.0": ("libwayland-cursor0", "libwayland-cursor"),
    "libwayland-egl.so.1": ("libwayland-egl1", "libwayland-egl"),
}

#: Libraries Qt opens at run time (dlopen), which ldd does not list: the xcb plugin refuses to start
#: without libxcb-cursor since Qt 6.5.
DLOPENED = ("libxcb-cursor.so.0",)

#: QT_QPA_PLATFORM values that need no display server.
HEADLESS = ("offscreen", "minimal", "vnc", "linuxfb", "eglfs", "vkkhrdisplay", "minimalegl")

_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)


@dataclass
class Report:
    """What is missing, and how to get it."""

    missing: list[str] = field(default_factory=list)      # sonames, sorted
    debian: list[str] = field(default_factory=list)       # packages, sorted
    fedora: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)      # sonames with no known package

    @property
    def ok(self) -> bool:
        return not self.missing


def missing_sonames(ldd_output: str) -> set[str]:
    """The sonames ``ldd`` printed as ``NAME => not found``."""
    return set(_NOT_FOUND.findall(ldd_output))


def plugin_files(platform: str, pyside_dir: Path) -> list[Path]:
    """The Qt files a platform needs: its plugin and the integration libraries/plugins it loads."""
    qt = pyside_dir / "Qt"
    if platform.startswith("wayland"):
        files = [qt / "plugins" / "platforms" / "libqwayland.so", *qt.glob("lib/libQt6WaylandClient.so*")]
        files += sorted((qt / "plugins" / "wayland-shell-integration").glob("*.so"))
    elif platform in HEADLESS:
        files = [qt / "plugins" / "platforms" / f"libq{platform}.so"]
    else:
        files = [qt / "plugins" / "platforms" / "libqxcb.so", *qt.glob("lib/libQt6XcbQpa.so*")]
        files += sorted((qt / "plugins" / "xcbglintegrations").glob("*.so"))
    return [f for f in files if f.exists()]


def run_ldd(files: Iterable[Path]) -> str:
    """``ldd`` on every file (from PATH, so tests can put a fake one first)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return ""
    out = []
    for f in files:
        proc = subprocess.run([ldd, str(f)], capture_output=True, text=True, errors="replace", check=False)
        out.append(proc.stdout)
    return "\n".join(out)


def loadable(soname: str) -> bool:
    try:
        ctypes.CDLL(soname)
    except OSError:
        return False
    return True


def diagnose(ldd_output: str, dlopened: Iterable[str] = DLOPENED,
             can_load: Callable[[str], bool] = loadable) -> Report:
    """Turn ldd's text (and the run-time libraries that fail to load) into a Report."""
    missing = missing_sonames(ldd_output) | {name for name in dlopened if not can_load(name)}
    report = Report(missing=sorted(missing))
    for soname in report.missing:
        if soname in PACKAGES:
            deb, rpm = PACKAGES[soname]
            report.debian.append(deb)
            report.fedora.append(rpm)
        else:
            report.unknown.append(soname)
    report.debian = sorted(set(report.debian))
    report.fedora = sorted(set(report.fedora))
    return report


def install_command(report: Report, manager: str) -> list[str]:
    """argv that installs the missing packages with ``manager`` ('apt-get' or 'dnf')."""
    if manager == "dnf":
        return ["dnf", "install", "-y", *report.fedora]
    return ["apt-get", "install", "-y", "--no-install-recommends", *report.debian]


def no_display_message(env: dict[str, str] | os._Environ[str]) -> str | None:
    """Why the window cannot open here and what to do instead, or None when there is a display."""
    platform = env.get("QT_QPA_PLATFORM", "").split(":")[0].strip()
    if platform in HEADLESS:
        return None
    if env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):
        return None
    return (
        "check_qt_platform: no display here (DISPLAY and WAYLAND_DISPLAY are unset), so the window "
        "cannot open. Instead:\n"
        "  * run gaudi-gui on your workstation and add this machine as a remote host, so jobs and "
        "devices are reached over ssh;\n"
        "  * or use the command line here: gaudi-gui devices | env | generate | train | demo-model "
        "(gaudi-gui --help);\n"
        "  * or start it under a virtual display: xvfb-run -a make run (apt-get install xvfb), or "
        "ssh -X to forward it;\n"
        "  * or QT_QPA_PLATFORM=offscreen for a window nobody sees (screenshots, tests).")


def _pyside_dir() -> Path | None:
    # find_spec locates the package without loading any Qt library.
    spec = importlib.util.find_spec("PySide6")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _manager(which: Callable[[str], str | None]) -> str | None:
    for name in ("apt-get", "dnf"):
        if which(name):
            return name
    return None


def main(argv: Sequence[str] | None = None, *, env: dict[str, str] | None = None,
         ldd_output: str | None = None, can_load: Callable[[str], bool] = loadable,
         is_root: bool | None = None, which: Callable[[str], str | None] = shutil.which,
         runner: Callable[[list[str]], int] | None = None) -> int:
    """The check; the keyword arguments let tests feed ldd text, root-ness and the installer."""
    parser = argparse.ArgumentParser(prog="check_qt_platform", description=__doc__.split("\n")[0])
    parser.add_argument("--no-install", action="store_true",
                        help="only report and print the install command, even as root")
    parser.add_argument("--quiet", action="store_true", help="print nothing when all is well")
    args = parser.parse_args(argv)
    environ = os.environ if env is None else env

    message = no_display_message(environ)
    if message:
        print(message, file=sys.stderr)
        return 3
    platform = environ.get("QT_QPA_PLATFORM", "").split(":")[0].strip() or (
        "wayland" if environ.get("WAYLAND_DISPLAY") and not environ.get("DISPLAY") else "xcb")
    if ldd_output is None:
        pyside = _pyside_dir()
        if pyside is None:
            print("check_qt_platform: PySide6 is not installed in this Python (run make setup)",
                  file=sys.stderr)
            return 1
        ldd_output = run_ldd(plugin_files(platform, pyside))
    dlopened = DLOPENED if platform in ("xcb", "") else ()
    report = diagnose(ldd_output, dlopened, can_load)
    if report.ok:
        if not args.quiet:
            print(f"check_qt_platform: the Qt {platform} platform plugin has every library it needs")
        return 0

    print(f"check_qt_platform: the Qt {platform} platform plugin cannot load; missing: "
          f"{', '.join(report.missing)}", file=sys.stderr)
    for soname in report.unknown:
        print(f"check_qt_platform: no known package for {soname}: find it with "
              f"'apt-file search {soname}' or 'dnf provides */{soname}'", file=sys.stderr)
    manager = _manager(which)
    root = (os.geteuid() == 0) if is_root is None else is_root
    packages = report.fedora if manager == "dnf" else report.debian
    if root and manager and packages and not args.no_install:
        run = runner or (lambda cmd: subprocess.run(cmd, check=False).returncode)
        commands = [["apt-get", "update", "-q"]] if manager == "apt-get" else []
        commands.append(install_command(report, manager))
        print(f"check_qt_platform: running as root: installing {' '.join(packages)}", file=sys.stderr)
        for cmd in commands:
            print(f"check_qt_platform: $ {shlex.join(cmd)}", file=sys.stderr)
            if run(cmd) != 0:
                print(f"check_qt_platform: '{shlex.join(cmd)}' failed; install the packages above "
                      "yourself", file=sys.stderr)
                return 2
        print(f"check_qt_platform: installed {' '.join(packages)}", file=sys.stderr)
        return 0 if not report.unknown else 1
    sudo = "" if root else "sudo "
    if manager == "dnf":
        line = sudo + shlex.join(install_command(report, "dnf"))
    elif manager == "apt-get" or report.debian:
        line = sudo + shlex.join(install_command(report, "apt-get"))
    else:
        line = ""
    if line:
        print("check_qt_platform: install them with:", file=sys.stderr)
        print(f"    {line}", file=sys.stderr)
        if manager is None:
            print(f"    (Fedora/RHEL: {sudo}{shlex.join(install_command(report, 'dnf'))})",
                  file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
