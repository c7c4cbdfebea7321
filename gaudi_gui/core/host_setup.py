"""Set up a host: install this very gaudi-gui version into a venv on it, from a wheel built here.

What a person would otherwise do by hand on every server, in the order they would do it:

1. build a wheel of the running gaudi-gui (``pip wheel --no-deps`` of its source tree), so the host
   gets exactly this version, whatever is on PyPI;
2. stream it over the same ssh connection the app uses (no scp, no second authentication) into
   ``<venv>.setup/`` on the host;
3. create the venv with ``--system-site-packages``, so Intel's torch and habana_frameworks of the host's
   Python (or of the Gaudi container) stay visible, and install the wheel with pip constrained to the
   torch that is already there: nothing can replace it. A host with no torch at all gets
   ``torch==2.13.0`` (the CPU build), as ``make`` does here;
4. save the host with the venv's python as its remote command and run the handshake.

Everything on the host runs as one constant ``sh`` script whose inputs (venv path, python, file
name) are positional parameters: a path holding spaces, quotes or ``$(…)`` stays data. Qt-free.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from gaudi_gui import __version__
from gaudi_gui.core import paths, remote
from gaudi_gui.core.remote import SSH_FAILED, Host, HostError, RemoteError

#: Where the venv goes on a host unless told otherwise (``~`` is the remote user's home).
DEFAULT_VENV = "~/.local/share/gaudi-gui/venv"
#: The torch a host without one gets (the CPU build; Gaudi hosts have Intel's own).
FALLBACK_TORCH = "torch==2.13.0"

# $1 venv, $2 python on the host, $3 wheel file name, $4 "deps" or "no-deps". The wheel is on stdin.
# The last line printed is the venv's absolute path (the remote command is made from it).
_SCRIPT = r"""set -eu
venv=$1
case $venv in "~/"*) venv="$HOME/${venv#??}";; "~") venv=$HOME;; esac
stage="$venv.setup"
mkdir -p "$stage"
cat > "$stage/$3"
if [ ! -x "$venv/bin/python" ]; then
    echo "creating $venv (--system-site-packages) with $2" >&2
    "$2" -m venv --system-site-packages "$venv"
fi
py="$venv/bin/python"
: > "$stage/constraints.txt"
if tv=$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
    echo "keeping the host's torch $tv" >&2
    echo "torch==$tv" > "$stage/constraints.txt"
elif [ "$4" = deps ]; then
    echo "no torch on the host: installing $5" >&2
    "$py" -m pip install -q "$5"
fi
if [ "$4" = deps ]; then
    "$py" -m pip install -q -c "$stage/constraints.txt" --force-reinstall --no-deps "$stage/$3"
    "$py" -m pip install -q -c "$stage/constraints.txt" "$stage/$3"
else
    "$py" -m pip install -q --force-reinstall --no-deps "$stage/$3"
fi
printf '%s\n' "$venv"
"""


class SetupError(RuntimeError):
    """Setting up a host failed; the message says at which step and why."""


def source_tree() -> Path | None:
    """The source tree of the running gaudi-gui (an editable or source install), else None."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "gaudi_gui").is_dir() else None


#: What a wheel is built from: the package, its data (mapped into the package by pyproject.toml) and
#: the files pyproject.toml names.
_BUILD_FOLDERS = ("gaudi_gui", "resources")
_BUILD_FILES = ("pyproject.toml", "README.md")


def build_wheel(out_dir: Path, *, python: str = sys.executable, timeout: float = 300.0) -> Path:
    """A wheel of this gaudi-gui in ``out_dir`` (built offline: no isolation, no dependencies).

    It is built from a copy of the source tree in a temporary folder: setuptools builds in place, and
    the tree's ``build/lib`` keeps files deleted from the source since the last build (they would be
    shipped), and two builds at once would share it. A wheel that lacks a data file the package reads
    at run time (``paths.DATA_FILES``) is refused: installed, it would fail on the host."""
    root = source_tree()
    if root is None:
        raise SetupError("this gaudi-gui was not installed from a source tree, so no wheel can be built "
                         "here: install the same version on the host by hand "
                         f"(pip install gaudi-gui=={__version__})")
    out_dir = out_dir.resolve()  # pip runs in the copy's folder
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gaudi-gui-src-") as tmp:
        src = Path(tmp) / "gaudi-gui"
        for folder in _BUILD_FOLDERS:
            shutil.copytree(root / folder, src / folder,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in _BUILD_FILES:
            if (root / name).is_file():
                shutil.copy2(root / name, src / name)
        done = subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                               "--wheel-dir", str(out_dir), str(src)], cwd=tmp,
                              capture_output=True, text=True, errors="replace", timeout=timeout, check=False)
    wheels = sorted(out_dir.glob(f"gaudi_gui-{__version__}-*.whl"))
    if done.returncode != 0 or not wheels:
        lines = done.stderr.strip().splitlines()
        # setuptools' deprecation notices end the output; the error is the last line that says so
        last = next((ln.strip() for ln in reversed(lines) if "error" in ln.lower()),
                    lines[-1].strip() if lines else f"exit {done.returncode}")
        raise SetupError(f"building the gaudi-gui wheel failed: {last}")
    with zipfile.ZipFile(wheels[-1]) as archive:
        carried = set(archive.namelist())
    missing = [name for name in paths.DATA_FILES if f"gaudi_gui/resources/{name}" not in carried]
    if missing:
        raise SetupError(f"the gaudi-gui wheel lacks its data files {', '.join(missing)} (package data in "
                         "pyproject.toml): a host would get an incomplete installation")
    return wheels[-1]


def host_python(host: Host) -> str:
    """The Python on the host to make the venv from: the remote command's interpreter when it is a
    plain ``PYTHON -m gaudi_gui``, else ``python3``."""
    words = remote.split_remote_command(host.remote_command)
    if words[0] in ("docker", "podman", "kubectl", "apptainer", "singularity"):
        raise HostError(f"{host.name} runs gaudi-gui inside a container ({words[0]}): install gaudi-gui "
                        f"{__version__} in the container's Python (pip install the wheel there) instead")
    if len(words) >= 3 and words[1:3] == ["-m", "gaudi_gui"]:
        return words[0]
    return "python3"


def setup(host: Host, *, venv: str = DEFAULT_VENV, python: str = "", deps: bool = True,
          say: Callable[[str], None] = print, timeout: float = 1800.0) -> Host:
    """Install this gaudi-gui on ``host`` and return the host with its new remote command (saved).

    SetupError / RemoteError / HostError say what went wrong."""
    if host.is_local:
        raise HostError("'local' is this machine: `make run` sets it up")
    if not venv.strip():
        raise HostError("the venv path is empty")
    interpreter = python.strip() or host_python(host)
    with tempfile.TemporaryDirectory(prefix="gaudi-gui-wheel-") as tmp:
        say(f"building the gaudi-gui {__version__} wheel")
        wheel = build_wheel(Path(tmp))
        say(f"copying {wheel.name} to {host.name} and installing it into {venv}")
        argv = ["sh", "-c", _SCRIPT, "gaudi-gui-setup", venv, interpreter, wheel.name,
                "deps" if deps else "no-deps", FALLBACK_TORCH]
        try:
            with wheel.open("rb") as data:
                done = subprocess.run(host.wrap(argv), stdin=data, capture_output=True, timeout=timeout,
                                      check=False)
        except FileNotFoundError:
            raise RemoteError("ssh", "the OpenSSH client (ssh) is not installed on this machine") from None
        except subprocess.TimeoutExpired:
            raise SetupError(f"setting up {host.name} took longer than {timeout:g} s") from None
    out = done.stdout.decode("utf-8", errors="replace")
    err = done.stderr.decode("utf-8", errors="replace")
    for line in err.splitlines():
        if line.strip():
            say(f"  {host.name}: {line.strip()}")
    if done.returncode == SSH_FAILED:
        raise RemoteError(*remote.explain_ssh_failure(host.name, err))
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if done.returncode != 0 or not lines:
        last = (err.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise SetupError(f"installing on {host.name} failed: {last}")
    installed = Host.parse(host.name, f"{shlex.quote(lines[-1] + '/bin/python')} -m gaudi_gui", host.hl_smi,
                           host.source if host.source != "ssh-config" else "added")
    say(f"checking: {installed.remote_command} hello")
    remote.handshake(installed)
    remote.update_hosts(lambda saved: [h for h in saved if h.name != host.name] + [installed])
    say(f"{host.name}: gaudi-gui {__version__} ready ({installed.remote_command})")
    return installed


__all__ = ["DEFAULT_VENV", "FALLBACK_TORCH", "SetupError", "build_wheel", "host_python", "setup",
           "source_tree"]
