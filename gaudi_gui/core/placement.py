"""Where a piece of work runs: this machine, one host, several hosts (accelerate multi-node), or Slurm.

A run is *work × placement*. The work is a gaudi-gui command line (``train …``, ``serve …``,
``eval …``); the placement says where it goes and builds, once for every kind of work:

- the argv to start *here* that runs ``gaudi-gui ARGS`` at the place (``start_argv``): a child of this
  process on this machine, ``ssh … DEST 'remote-command guard -- …'`` for a host (under the guard, so a
  killed app or a dropped connection leaves nothing running there);
- the options that hand the placement on to a command (``cli_args``: ``--host DEST --remote-command
  CMD``), so the GUI can run the command-line twin of any work as its child and the command does the
  rest (one path for the GUI and the CLI);
- what a person would type (``preview``), what is wrong with it for the form (``problems``), and one
  record for re-attaching to it later (``to_record`` / ``from_record``), the same for every kind.

Qt-free and torch-free. Nothing a user typed reaches a shell as code: every word of a remote line is
quoted by ``core.remote.remote_line``; destinations and remote commands are checked by ``Host.parse``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gaudi_gui.core.remote import LOCAL, Host, HostError, remote_line, ssh_base, ssh_target
from gaudi_gui.core.slurm import SlurmTarget

Kind = Literal["local", "host", "hosts", "slurm"]
KINDS: tuple[Kind, ...] = ("local", "host", "hosts", "slurm")
#: The words a person reads for each kind (the placement widget's choices, messages).
KIND_LABELS: dict[Kind, str] = {"local": "this machine", "host": "a host", "hosts": "several hosts",
                                "slurm": "Slurm"}


@dataclass(frozen=True)
class Forward:
    """A local TCP port forwarded to a port on the host's loopback (``ssh -L``)."""

    local_port: int
    remote_port: int
    local_address: str = "127.0.0.1"

    def ssh_option(self) -> list[str]:
        return ["-L", f"{self.local_address}:{self.local_port}:127.0.0.1:{self.remote_port}"]


@dataclass(frozen=True)
class Placement:
    """Where work runs. ``hosts``: the host of a "host" placement, the hosts of a "hosts" one (the
    first is the main one), none for "local" and "slurm". ``cards``: module ids per host name (the
    host's name, or "local"), empty = the place's default choice. ``slurm``: sbatch options by name."""

    kind: Kind = "local"
    hosts: tuple[Host, ...] = ()
    cards: tuple[tuple[str, tuple[int, ...]], ...] = ()
    slurm: tuple[tuple[str, str], ...] = field(default=())

    # -- building ----------------------------------------------------------------------------------

    @classmethod
    def local(cls, cards: Iterable[int] = ()) -> Placement:
        ids = tuple(int(c) for c in cards)
        return cls("local", (), ((LOCAL, ids),) if ids else ())

    @classmethod
    def on_host(cls, host: Host, cards: Iterable[int] = ()) -> Placement:
        if host.is_local:
            return cls.local(cards)
        ids = tuple(int(c) for c in cards)
        return cls("host", (host,), ((host.name, ids),) if ids else ())

    @classmethod
    def on_hosts(cls, hosts: Sequence[Host], cards: Mapping[str, Iterable[int]] | None = None) -> Placement:
        if len(hosts) < 2:
            raise HostError("a run on several hosts needs at least two hosts")
        names = [h.name for h in hosts]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise HostError("a host is named twice: " + ", ".join(twice))
        chosen = tuple((name, tuple(int(c) for c in ids)) for name, ids in (cards or {}).items() if ids)
        return cls("hosts", tuple(hosts), chosen)

    @classmethod
    def on_slurm(cls, options: Mapping[str, str] | None = None) -> Placement:
        return cls("slurm", (), (), tuple(sorted((str(k), str(v)) for k, v in (options or {}).items())))

    @classmethod
    def from_cli(cls, *, host: str = "", hosts: str = "", remote_command: str = "",
                 slurm: bool = False, find: Any = None) -> Placement:
        """The placement a command line names (``--host``, ``--hosts A,B``, ``--remote-command``,
        ``--slurm``). ``find(name, remote_command) -> Host`` resolves saved hosts (default:
        ``core.remote.find_host``). HostError names what is wrong."""
        if find is None:
            from gaudi_gui.core.remote import find_host as find
        if slurm:
            return cls.on_slurm()
        if hosts:
            names = [n.strip() for n in hosts.split(",") if n.strip()]
            return cls.on_hosts([find(n, remote_command) for n in names])
        if host and host != LOCAL:
            return cls.on_host(find(host, remote_command))
        return cls.local()

    # -- reading -----------------------------------------------------------------------------------

    @property
    def is_local(self) -> bool:
        return self.kind == "local"

    @property
    def host(self) -> Host:
        """The one host of a "host" placement (this machine for "local" and "slurm")."""
        return self.hosts[0] if self.kind == "host" else Host.local()

    @property
    def places(self) -> list[Host]:
        """One host per part of the work: this machine, the host, or each of the hosts."""
        return list(self.hosts) if self.kind in ("host", "hosts") else [Host.local()]

    def cards_of(self, name: str) -> list[int]:
        """The module ids chosen on host ``name`` (empty: the place's default)."""
        for n, ids in self.cards:
            if n == name:
                return list(ids)
        return []

    @property
    def label(self) -> str:
        if self.kind == "host":
            return self.hosts[0].name
        if self.kind == "hosts":
            return ", ".join(h.name for h in self.hosts)
        return KIND_LABELS[self.kind]

    def slurm_target(self) -> SlurmTarget:
        """The sbatch options and login host of a "slurm" placement (defaults for the others)."""
        return SlurmTarget.from_record(dict(self.slurm))

    def problems(self) -> list[tuple[str, str]]:
        """(field, message) for the form: "placement", "hosts" or "cards"."""
        out: list[tuple[str, str]] = []
        if self.kind == "host" and (len(self.hosts) != 1 or self.hosts[0].is_local):
            out.append(("placement", "choose the host the work runs on"))
        if self.kind == "hosts":
            if len(self.hosts) < 2:
                out.append(("hosts", "a run on several hosts needs at least two hosts"))
            if any(h.is_local for h in self.hosts):
                out.append(("hosts", "'local' cannot be one of several hosts: add this machine by its "
                                     "ssh name"))
            counts = {len(ids) for n, ids in self.cards}
            if len(counts) > 1:
                out.append(("cards", "every host needs the same number of cards (accelerate starts the "
                                     "same number of processes on each)"))
        return out

    # -- argv --------------------------------------------------------------------------------------

    def cli_args(self) -> list[str]:
        """The options that hand this placement to a gaudi-gui command (one host; a command that
        takes several hosts gets ``--hosts``)."""
        if self.kind == "host":
            host = self.hosts[0]
            return ["--host", host.name, "--remote-command", host.remote_command]
        if self.kind == "hosts":
            return ["--hosts", ",".join(h.name for h in self.hosts),
                    "--remote-command", self.hosts[0].remote_command]
        if self.kind == "slurm":
            return ["--slurm"]
        return []

    def start_argv(self, host: Host, args: Sequence[str], *, guard: bool = True, grace: float | None = None,
                   env: Mapping[str, str] | None = None,
                   config: str | None = None, connect_timeout: int = 10) -> list[str]:
        """The argv to start on this machine that runs ``gaudi-gui ARGS`` on ``host`` (one of
        ``places``). On a host it runs under the guard (``guard=False`` only for short calls that end
        by themselves), ``env`` travelling as the guard's checked ``--env`` arguments, and each of
        port forwards are asked of the multiplexed connection afterwards (``Forward``, ``ssh -O forward``)."""
        if host.is_local:
            return host.gaudi_gui_argv(*args)
        inner = host.guard_argv(list(args), run="gaudi_gui", grace=grace, env=env) if guard \
            else host.gaudi_gui_argv(*args)
        ssh = ssh_base(host.name, config=config, connect_timeout=connect_timeout)
        return [*ssh, "--", ssh_target(host.name), remote_line(inner)]

    def preview(self, args: Sequence[str]) -> str:
        """What a person would type to run ``gaudi-gui ARGS`` at this placement."""
        if self.kind == "local":
            return remote_line(["gaudi-gui", *args])
        if self.kind == "slurm":
            return remote_line(["gaudi-gui", *args, "--slurm"])
        lines = [h.shell_preview(h.gaudi_gui_argv(*args)) for h in self.hosts]
        return "\n".join(lines)

    # -- re-attach record --------------------------------------------------------------------------

    def to_record(self) -> dict[str, Any]:
        return {"kind": self.kind, "hosts": [h.to_dict() for h in self.hosts],
                "cards": {name: list(ids) for name, ids in self.cards}, "slurm": dict(self.slurm)}

    @classmethod
    def from_record(cls, data: Mapping[str, Any]) -> Placement:
        """The placement a record holds; HostError (a ValueError) when it is damaged."""
        kind = data.get("kind", "local")
        if kind not in KINDS:
            raise HostError(f"unknown placement {kind!r}")
        raw_hosts = data.get("hosts") or []
        raw_cards = data.get("cards") or {}
        if not isinstance(raw_hosts, list) or not isinstance(raw_cards, dict):
            raise HostError("the placement record is damaged")
        hosts = tuple(Host.from_dict(h) for h in raw_hosts if isinstance(h, Mapping))
        try:
            cards = tuple((str(n), tuple(int(c) for c in ids)) for n, ids in raw_cards.items())
        except (TypeError, ValueError) as exc:
            raise HostError(f"the placement record's cards are damaged: {exc}") from None
        slurm = data.get("slurm") or {}
        options = tuple(sorted((str(k), str(v)) for k, v in slurm.items())) if isinstance(slurm, dict) else ()
        return cls(kind, hosts, cards, options)
