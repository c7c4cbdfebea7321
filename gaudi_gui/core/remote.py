"""Hosts: where work runs. "local" is this machine; any other host is reached with the system OpenSSH
client, exactly as ``ssh DEST`` reaches it (the user's ~/.ssh/config, agent, keys, ProxyJump and
known_hosts all apply).

A :class:`Host` turns an argv meant for the host into the argv to start here:

- local: the argv itself;
- remote: ``ssh <options> DEST <one string for the remote shell>``. ssh joins its arguments into one
  line that the remote login shell parses, so every element is quoted with ``shlex.quote``: a path or a
  prompt holding spaces, quotes, ``;`` or ``$(…)`` stays data. The remote command (``python3 -m
  gaudi_gui``, a venv's python, ``docker exec -i CONTAINER python3 -m gaudi_gui``) is split into words
  once and quoted word by word the same way.

Every ssh call runs with ``BatchMode=yes`` (nothing can wait on a hidden password prompt: a host that
needs one fails at once and :func:`explain_ssh_failure` says which command to run once in a terminal),
connection multiplexing (``ControlMaster=auto``, ``ControlPersist``, sockets in a private 0700 folder:
after the first connection a command costs one round-trip) and keep-alives (a dead connection is noticed
within ~15 s). No password or key is ever stored by the app. Qt-free and torch-free.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from gaudi_gui.core.hlsmi import HL_SMI_VAR

LOCAL = "local"
DEFAULT_REMOTE_COMMAND = "python3 -m gaudi_gui"
#: Protocol of the remote commands the app calls (hello, guard, runs …): bumped when they change.
REMOTE_PROTOCOL = 1
#: ssh exits 255 when ssh itself failed (connection, authentication), else with the remote status.
SSH_FAILED = 255
#: The config file ssh reads instead of ~/.ssh/config (tests, and users who keep one per project).
SSH_CONFIG_VAR = "GAUDI_GUI_SSH_CONFIG"

#: What the argv given to ``gaudi-gui guard`` is (see ``Host.guard_argv``).
GuardRun = Literal["program", "gaudi_gui", "python"]

_DEST = re.compile(r"^(?:[A-Za-z0-9._%+~-]+@)?(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::\d{1,5})?$")


class HostError(ValueError):
    """A host that cannot be used as given (the message says why, for the field)."""


def check_destination(dest: str) -> str:
    """``dest`` as ssh takes it (alias, user@host, host:port) or HostError.

    A leading '-' would make ssh read it as an option, and whitespace or control characters cannot be
    part of a host name: both are refused so that a destination can never smuggle an option in."""
    text = dest.strip()
    if not text:
        raise HostError("the SSH destination is empty")
    if text.startswith("-"):
        raise HostError(f"an SSH destination cannot begin with '-': {text!r}")
    if not _DEST.match(text):
        raise HostError(f"not an SSH destination (alias, user@host or host:port): {text!r}")
    if ":" in text and not text.endswith("]"):
        port = int(text.rsplit(":", 1)[1])
        if not 0 < port < 65536:
            raise HostError(f"port out of range in {text!r}")
    return text


_WITH_PORT = re.compile(r":\d+$")


def ssh_target(dest: str) -> str:
    """``dest`` as the ssh command line takes it: ``host:port`` (which ssh would read as a host named
    "host:port") as the URI ``ssh://[user@]host:port``; any other destination as it is."""
    return f"ssh://{dest}" if _WITH_PORT.search(dest) and not dest.startswith("ssh://") else dest


def split_remote_command(command: str) -> list[str]:
    """The remote command as words (HostError when it cannot be split or is empty)."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise HostError(f"the remote command cannot be read: {exc}") from None
    if not words:
        raise HostError("the remote command is empty")
    return words


@dataclass
class Host:
    """A place where work runs. ``name`` is "local" or the SSH destination."""

    name: str = LOCAL
    #: The command that runs gaudi-gui on the host (split into words, quoted word by word).
    remote_command: str = DEFAULT_REMOTE_COMMAND
    #: hl-smi on the host when it is not on the remote PATH.
    hl_smi: str = ""
    #: Where the host entry came from: "ssh-config" (an alias), "added" (by hand), "local".
    source: str = "added"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        return self.name == LOCAL

    @property
    def label(self) -> str:
        return "local (this machine)" if self.is_local else self.name

    @classmethod
    def local(cls) -> Host:
        return cls(LOCAL, source="local")

    @classmethod
    def parse(cls, name: str, remote_command: str = "", hl_smi: str = "", source: str = "added") -> Host:
        """A checked host; HostError names what is wrong."""
        name = (name or LOCAL).strip()
        if name == LOCAL:
            return cls.local()
        check_destination(name)
        command = remote_command.strip() or DEFAULT_REMOTE_COMMAND
        split_remote_command(command)
        return cls(name, command, hl_smi.strip(), source)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Host:
        return cls.parse(str(data.get("name", LOCAL)), str(data.get("remote_command", "") or ""),
                         str(data.get("hl_smi", "") or ""), str(data.get("source", "added") or "added"))

    # -- argv ---------------------------------------------------------------------------------------

    def gaudi_gui_argv(self, *args: str) -> list[str]:
        """The argv that runs ``gaudi-gui ARGS`` on the host (through the host's remote command)."""
        if self.is_local:
            import sys
            return [sys.executable, "-m", "gaudi_gui", *args]
        # The host's saved hl-smi is what every command there runs (doctor, devices, the start gate,
        # the meter, hello): it travels in the one variable they all read (core.hlsmi.hl_smi_program);
        # an explicit --hl-smi on the command line still wins there.
        carried = ["env", f"{HL_SMI_VAR}={self.hl_smi}"] if self.hl_smi else []
        return [*carried, *split_remote_command(self.remote_command), *args]

    def guard_argv(self, argv: Sequence[str], *, run: GuardRun = "program", grace: float | None = None,
                   env: Mapping[str, str] | None = None) -> list[str]:
        """The argv that runs ``argv`` on the host under ``gaudi-gui guard``, which ends it when stdin
        closes (OpenSSH does not signal a remote command when the client goes). ``run``: what
        ``argv`` is: a "program", a "gaudi_gui" command line, or arguments to the host's "python"
        (all three with the guard's own interpreter, so the remote command is spelled once).
        ``env`` travels as ``--env NAME=VALUE`` arguments, checked here the way the guard checks
        them (variables set here do not cross the connection)."""
        options = [] if grace is None else ["--grace", f"{grace:g}"]
        options += {"program": [], "gaudi_gui": ["--gaudi-gui"], "python": ["--python"]}[run]
        assignments = [f"{name}={value}" for name, value in (env or {}).items()]
        parse_env_assignments(assignments)
        for item in assignments:
            options += ["--env", item]
        return self.gaudi_gui_argv("guard", *options, "--", *argv)

    def wrap(self, argv: Sequence[str], *, config: str | None = None, control_dir: Path | None = None,
             connect_timeout: int = 10) -> list[str]:
        """The argv to start here so that ``argv`` runs on this host."""
        if self.is_local:
            return list(argv)
        return [*ssh_base(self.name, config=config, control_dir=control_dir,
                          connect_timeout=connect_timeout),
                "--", ssh_target(self.name), remote_line(argv)]

    def shell_preview(self, argv: Sequence[str]) -> str:
        """What a person would type to run ``argv`` on the host (for previews and messages)."""
        line = remote_line(argv)
        return line if self.is_local else f"ssh {shlex.quote(self.name)} {shlex.quote(line)}"


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_env_assignments(items: Sequence[str] | None) -> dict[str, str]:
    """``NAME=VALUE`` items (the guard's ``--env``) as a dict; ValueError names the first one that
    is not a plain variable name or holds a NUL."""
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.match(name):
            raise ValueError(f"--env takes NAME=VALUE with a plain variable name, not {item!r}")
        if "\0" in value:
            raise ValueError(f"--env {name}: the value holds a NUL character")
        out[name] = value
    return out


def remote_line(argv: Sequence[str]) -> str:
    """One line for the remote shell in which every word is data."""
    return " ".join(shlex.quote(str(a)) for a in argv)


def control_dir() -> Path:
    """The private folder for ssh's multiplexing sockets (created 0700; refused if someone else's).

    Short on purpose: a unix socket path is limited to ~104 bytes, so it lives in the temp folder
    (not under a deep data folder) and ssh names the socket by the %C hash."""
    explicit = os.environ.get("GAUDI_GUI_SSH_CONTROL_DIR")
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    folder = Path(explicit) if explicit else base / f"gaudi-gui-ssh-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
    except OSError:
        folder = Path(tempfile.mkdtemp(prefix="gg-ssh-"))
        info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        # Someone else's folder, or one opened up: multiplexing through it would hand them our sessions.
        folder = Path(tempfile.mkdtemp(prefix="gg-ssh-"))
    return folder


def ssh_config_file(explicit: str | None = None) -> str | None:
    """The ssh config to pass with -F: the given one, else $GAUDI_GUI_SSH_CONFIG, else none (ssh
    reads ~/.ssh/config of the user's passwd home itself)."""
    value = explicit if explicit is not None else os.environ.get(SSH_CONFIG_VAR, "")
    return value or None


def ssh_base(dest: str, *, config: str | None = None, control_dir: Path | None = None,
             connect_timeout: int = 10) -> list[str]:
    """``ssh`` with the options every call to ``dest`` uses (the caller appends ``--`` and ``dest``).

    The multiplexing socket is named by ssh's %C (local host, host, port, user) *and* by the
    destination as written: two aliases of one account (one with a key the server refuses, one
    with a key it takes) never share a connection, so an alias works or fails on its own settings,
    not on whether another alias's connection happens to be open."""
    argv = ["ssh", "-T"]
    cfg = ssh_config_file(config)
    if cfg:
        argv += ["-F", cfg]
    argv += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(connect_timeout)}",
             "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
    folder = control_dir if control_dir is not None else globals()["control_dir"]()
    # 8 hex digits keep the path inside a unix socket's ~104 bytes whatever the alias's length.
    tag = hashlib.sha256(dest.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return [*argv, "-o", "ControlMaster=auto", "-o", f"ControlPath={folder}/%C-{tag}",
            "-o", "ControlPersist=120"]


# -- ssh failures, in words ---------------------------------------------------------------------------

_AUTH = re.compile(r"Permission denied|Too many authentication failures|passphrase", re.I)
_HOSTKEY = re.compile(r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED", re.I)
_RESOLVE = re.compile(r"Could not resolve hostname|Name or service not known", re.I)
_REFUSED = re.compile(r"Connection refused|No route to host|Network is unreachable", re.I)
_TIMEOUT = re.compile(r"timed out|Connection timed out", re.I)
_CLOSED = re.compile(r"Connection closed|Connection reset|closed by remote host|Broken pipe|"
                     r"client_loop: send disconnect|Timeout, server .* not responding", re.I)


def explain_ssh_failure(dest: str, stderr: str) -> tuple[str, str]:
    """(kind, one line for a person) for an ssh that exited 255. kind: auth, hostkey, unreachable,
    dropped or ssh."""
    quoted = shlex.quote(dest)
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    if _AUTH.search(stderr):
        return ("auth", f"{dest} needs a password or an unlocked key, and the app never asks for one: "
                        f"run once in a terminal `ssh-copy-id {quoted}` (or `ssh-add` for a key with a "
                        f"passphrase), then connect again")
    if _HOSTKEY.search(stderr):
        return ("hostkey", f"{dest}'s host key is not known (or has changed): run `ssh {quoted}` once in "
                           f"a terminal and check the key, then connect again")
    if _RESOLVE.search(stderr):
        return ("unreachable", f"{dest}: the host name is unknown ({last})")
    if _REFUSED.search(stderr) or _TIMEOUT.search(stderr):
        return ("unreachable", f"{dest} is unreachable: {last}")
    if _CLOSED.search(stderr):
        return ("dropped", f"the connection to {dest} was lost: {last}")
    return ("ssh", f"ssh {dest} failed: {last or 'exit 255'}")


def failure_kind(dest: str, words: str) -> str:
    """The kind of a sentence about reaching ``dest`` that ``explain_ssh_failure`` or the agent's link
    to the host (``agent.hosts``) made (auth, hostkey, unreachable, dropped, missing, ssh); "" for
    any other sentence. A request through the agent fails with words only: this gives them back their
    kind for a view that says it."""
    for kind, start in (("auth", f"{dest} needs a password"), ("hostkey", f"{dest}'s host key"),
                        ("unreachable", f"{dest}: the host name is unknown"),
                        ("unreachable", f"{dest} is unreachable"), ("dropped", f"the connection to {dest} "),
                        ("missing", f"{dest} has no gaudi-gui"), ("ssh", f"ssh {dest} failed")):
        if words.startswith(start):
            return kind
    return ""


# -- ~/.ssh/config aliases ----------------------------------------------------------------------------

def ssh_config_aliases(path: str | Path | None = None) -> list[str]:
    """Concrete ``Host`` aliases of an ssh config (patterns with * ? ! are not hosts), includes followed.

    ssh reads the config of the user's passwd home, not $HOME, so the default is found the same way."""
    if path is None:
        path = ssh_config_file() or Path(_passwd_home()) / ".ssh" / "config"
    seen: list[str] = []
    _read_aliases(Path(path), seen, depth=0)
    return seen


def _passwd_home() -> str:
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError):
        return str(Path.home())


def _read_aliases(path: Path, out: list[str], depth: int) -> None:
    if depth > 8:
        return
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = re.split(r"\s*=\s*|\s+", line, maxsplit=1)
        if len(parts) != 2:
            continue
        key, value = parts[0].lower(), parts[1]
        if key == "host":
            for name in shlex.split(value, comments=True):
                if not any(c in name for c in "*?!") and name not in out:
                    try:
                        check_destination(name)
                    except HostError:
                        continue
                    out.append(name)
        elif key == "include":
            for pattern in shlex.split(value):
                base = Path(os.path.expanduser(pattern))
                if not base.is_absolute():
                    base = Path(_passwd_home()) / ".ssh" / base
                for match in sorted(base.parent.glob(base.name)):
                    _read_aliases(match, out, depth + 1)


# -- short calls and the handshake -------------------------------------------------------------------

class RemoteError(RuntimeError):
    """A call on a host failed; ``kind`` is auth, hostkey, unreachable, dropped, ssh, missing
    (no gaudi-gui there), version (another version there) or failed (the command failed)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def call(host: Host, argv: Sequence[str], *, input_text: str | None = None, timeout: float = 60.0,
         env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``argv`` on ``host`` and wait: (exit code, stdout, stderr). RemoteError when ssh itself
    failed (the message says what to do) or the call timed out."""
    import subprocess
    cmd = host.wrap(argv)
    try:
        done = subprocess.run(cmd, input=input_text if input_text is not None else "", capture_output=True,
                              text=True, errors="replace", timeout=timeout, env=dict(env) if env else None,
                              check=False)
    except FileNotFoundError:
        raise RemoteError("ssh", "the OpenSSH client (ssh) is not installed on this machine") from None
    except subprocess.TimeoutExpired:
        raise RemoteError("unreachable", f"{host.name} did not answer within {timeout:g} s") from None
    if not host.is_local and done.returncode == SSH_FAILED:
        kind, message = explain_ssh_failure(host.name, done.stderr)
        raise RemoteError(kind, message)
    return done.returncode, done.stdout, done.stderr


def fix_command(host: Host) -> str:
    """The one command that installs this gaudi-gui version on ``host`` (a person can run it)."""
    from gaudi_gui import __version__
    return f"gaudi-gui hosts --setup {shlex.quote(host.name)}  (installs gaudi-gui {__version__} there)"


def handshake(host: Host, timeout: float = 30.0) -> dict[str, Any]:
    """The host's ``gaudi-gui hello``: RemoteError "missing" / "version" with the command that fixes
    it when the host has no gaudi-gui, another version, or another protocol."""
    code, out, err = call(host, host.gaudi_gui_argv("hello", "--json"), timeout=timeout)
    return read_hello(host, code, out, err)


def read_hello(host: Host, code: int, out: str, err: str) -> dict[str, Any]:
    """The answer of ``gaudi-gui hello --json`` run on ``host`` (exit code, stdout, stderr), or
    RemoteError saying what is wrong and the command that fixes it (for callers that ran it
    themselves, without blocking: the Hosts tab)."""
    import contextlib
    import json

    from gaudi_gui import __version__
    if not host.is_local and code == SSH_FAILED:
        raise RemoteError(*explain_ssh_failure(host.name, err))
    info: Any = None
    if code == 0:
        with contextlib.suppress(ValueError):
            info = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    if not isinstance(info, dict):
        last = next((ln for ln in reversed(err.splitlines()) if ln.strip()), "").strip()
        if code == 0 or "No module named" in err or "unrecognized" in err or "invalid choice" in err \
                or code in (126, 127):
            raise RemoteError("missing", f"{host.name} has no gaudi-gui {__version__} behind "
                                         f"`{host.remote_command}` ({last or f'exit {code}'}); fix: "
                                         f"{fix_command(host)}, or set the host's remote command")
        raise RemoteError("failed", f"`{host.remote_command} hello` failed on {host.name}: "
                                    f"{last or f'exit {code}'}")
    if info.get("gaudi_gui") != __version__ or info.get("protocol") != REMOTE_PROTOCOL:
        raise RemoteError("version", f"{host.name} runs gaudi-gui {info.get('gaudi_gui')} (protocol "
                                     f"{info.get('protocol')}); this is {__version__} (protocol "
                                     f"{REMOTE_PROTOCOL}). Fix: {fix_command(host)}")
    return info


def host_info() -> dict[str, Any]:
    """What this machine tells a workstation about itself (``gaudi-gui hello --json``, and the agent's
    ``host.info`` asked over a host's link): gaudi-gui's version and protocol, python, the platform,
    hl-smi, and the libraries' versions (from package metadata: nothing heavy is imported)."""
    import platform
    import socket
    import sys

    from gaudi_gui import __version__
    from gaudi_gui.core.hlsmi import find_hl_smi, hl_smi_program
    from gaudi_gui.core.prepare import versions
    program, chosen = hl_smi_program()
    hl_smi = find_hl_smi() or (program if chosen else "")  # a named one that cannot run is still named
    location = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {"gaudi_gui": __version__, "protocol": REMOTE_PROTOCOL, "python": sys.version.split()[0],
            "executable": sys.executable, "location": location, "hostname": socket.gethostname(),
            "platform": platform.platform(), "hl_smi": hl_smi, "versions": versions()}


# -- the host list ------------------------------------------------------------------------------------

def hosts_file() -> Path:
    from gaudi_gui.core import paths
    return paths.config_dir() / "hosts.json"


def saved_hosts(path: Path | None = None) -> list[Host]:
    """The hosts added by hand (and aliases the user edited), as saved in ``path`` (default:
    ``hosts_file()``); bad entries are skipped."""
    import json
    try:
        data = json.loads((path or hosts_file()).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    out: list[Host] = []
    for item in data if isinstance(data, list) else []:
        if isinstance(item, Mapping):
            try:
                host = Host.from_dict(item)
            except HostError:
                continue
            if not host.is_local and all(h.name != host.name for h in out):
                out.append(host)
    return out


def save_hosts(hosts: Sequence[Host], path: Path | None = None) -> None:
    """Write ``hosts`` (not "local") to ``path`` (default: ``hosts_file()``) in one atomic replace.
    A change of the saved list goes through ``update_hosts`` (read, change and write under a lock)."""
    from gaudi_gui.core import atomic
    path = path or hosts_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, [h.to_dict() for h in hosts if not h.is_local], fsync=False)


def update_hosts(change: Callable[[list[Host]], list[Host]], path: Path | None = None) -> list[Host]:
    """Change the saved hosts: ``change`` gets the list as it is on disk now and returns the new one,
    written atomically, all under an exclusive lock, so the app and ``gaudi-gui hosts --add`` changing
    it at the same moment both keep their change. The list written."""
    from gaudi_gui.core import atomic
    path = path or hosts_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic.locked(path):
        hosts = change(saved_hosts(path))
        save_hosts(hosts, path)
    return [h for h in hosts if not h.is_local]


def all_hosts(ssh_config: str | Path | None = None, saved: Sequence[Host] | None = None) -> list[Host]:
    """"local" first, then the saved hosts (``saved``: as already read), then the ~/.ssh/config
    aliases not saved yet."""
    saved = saved_hosts() if saved is None else saved
    names = {h.name for h in saved}
    aliases = [Host(a, source="ssh-config") for a in ssh_config_aliases(ssh_config) if a not in names]
    return [Host.local(), *saved, *aliases]


def find_host(name: str, remote_command: str = "", hl_smi: str = "",
              saved: Sequence[Host] | None = None) -> Host:
    """The host called ``name`` (a saved one keeps its remote command unless one is given), or a new
    one for any valid destination; HostError when ``name`` is not one. ``saved``: as already read."""
    if (name or LOCAL).strip() == LOCAL:
        return Host.local()
    for host in saved_hosts() if saved is None else saved:
        if host.name == name.strip():
            return Host.parse(host.name, remote_command or host.remote_command, hl_smi or host.hl_smi,
                              host.source)
    return Host.parse(name, remote_command, hl_smi)


__all__ = [
    "DEFAULT_REMOTE_COMMAND",
    "LOCAL",
    "REMOTE_PROTOCOL",
    "SSH_CONFIG_VAR",
    "SSH_FAILED",
    "Host",
    "HostError",
    "RemoteError",
    "all_hosts",
    "call",
    "check_destination",
    "control_dir",
    "explain_ssh_failure",
    "find_host",
    "fix_command",
    "handshake",
    "host_info",
    "hosts_file",
    "read_hello",
    "remote_line",
    "save_hosts",
    "saved_hosts",
    "split_remote_command",
    "ssh_base",
    "ssh_config_aliases",
    "ssh_config_file",
    "update_hosts",
]
