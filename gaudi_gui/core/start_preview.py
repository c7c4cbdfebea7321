"""What Start runs for a job at a placement, in words a person can check and copy: the one preview
the Training tab shows for every placement (Qt-free).

- this machine: the ``accelerate launch`` command the supervisor starts (its environment first);
- a host: the ssh line that hands the job to the host's ``gaudi-gui train --detach`` (job on stdin);
- several hosts: a pre-flight note, then per host its machine rank, its accelerate options and the
  ssh line of its part;
- Slurm: the whole sbatch script (``train --slurm --print-script`` shows the same).

Each preview carries how many lines to keep in view and what the form's cards hint says.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gaudi_gui.core import multi_host, visibility
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.placement import Placement
from gaudi_gui.core.prepare import preview_command
from gaudi_gui.core.remote import Host


@dataclass(frozen=True)
class StartPreview:
    text: str
    #: How many lines the preview box keeps in view (0: its default height).
    lines: int = 0
    #: The form's "cards" hint ("" on this machine: the tab adds its own, from the card selection).
    cards_hint: str = ""


def cards_phrase(placement: Placement, host: Host) -> str:
    """"all of HOST's cards" or "cards 2,3 of HOST" for the cards ``placement`` chose there."""
    cards = placement.cards_of(host.name)
    return f"cards {visibility.format_ids(cards)} of {host.name}" if cards else f"all of {host.name}'s cards"


def train_args(placement: Placement, host: Host, grace_s: float) -> list[str]:
    """``gaudi-gui train`` as Start runs it on ``host`` (the job on stdin)."""
    return ["train", "--config", "-", "--detach", "--json", "--device", "auto", "--grace",
            repr(float(grace_s)), *visibility.cards_argv(placement.cards_of(host.name))]


def start_preview(job: JobConfig, placement: Placement, *, device: str, device_env: Mapping[str, str],
                  runs_root: Path, grace_s: float, address_of: Callable[[Host], str],
                  errors: Sequence[tuple[str, str]] = ()) -> StartPreview:
    """What Start would run for ``job`` at ``placement`` now. ``address_of(host)``: host 0's address
    as the other hosts reach it (a placeholder while unknown); ``errors``: the form's problems (a
    Slurm script is not made from a job that has some)."""
    if placement.kind == "hosts":
        text = _several_hosts(job, placement, grace_s, address_of)
        phrase = "; ".join(cards_phrase(placement, h) for h in placement.hosts)
        return StartPreview(text, text.count("\n") + 1,
                            phrase or "every host uses its own cards, not this machine's selection")
    if placement.kind == "slurm":
        if errors:
            text = "# cannot make the sbatch script: " + "; ".join(f"{f}: {m}" for f, m in errors[:4])
        else:
            try:
                text = placement.slurm_target().script(job, runs_root)
            except (ValueError, OSError) as exc:
                text = f"# cannot make the sbatch script: {exc}"
        return StartPreview(text, 14, "the nodes' cards (Cards/node and Gres), not this machine's selection")
    if placement.kind == "host":
        host = placement.host
        return StartPreview(f"{placement.preview(train_args(placement, host, grace_s))} < job.json", 0,
                            f"the run uses {cards_phrase(placement, host)}, not this machine's selection")
    return StartPreview(preview_command(job, device=device, device_env=device_env, runs_root=runs_root))


def _several_hosts(job: JobConfig, placement: Placement, grace_s: float,
                   address_of: Callable[[Host], str]) -> str:
    hosts = list(placement.hosts)
    if len(hosts) < 2:
        return "# check two or more hosts"
    port = int(job.launch.main_process_port or multi_host.DEFAULT_PORT)
    address = job.launch.main_process_ip.strip() or address_of(hosts[0])
    n = job.launch.num_processes
    lines = [f"# {len(hosts)} machines × {n} process(es); main process {address}:{port} on "
             f"{hosts[0].name}; a pre-flight on every host first"]
    parts = multi_host.host_jobs(job, len(hosts), address, port)
    for rank, (host, part) in enumerate(zip(hosts, parts, strict=True)):
        launch = part.launch
        lines.append(f"# machine rank {rank} on {host.name}: accelerate launch --num_machines "
                     f"{launch.num_machines} --machine_rank {launch.machine_rank} --main_process_ip "
                     f"{launch.main_process_ip} --main_process_port {launch.main_process_port} …")
        lines.append(f"{host.shell_preview(host.gaudi_gui_argv(*train_args(placement, host, grace_s)))} "
                     f"< job-rank{rank}.json")
    return "\n".join(lines)


__all__ = ["StartPreview", "cards_phrase", "start_preview", "train_args"]
