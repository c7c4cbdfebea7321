"""One training job on several hosts: what the command line (``gaudi-gui train --hosts A,B``) and the
Training tab share. Qt-free: every function here may run in a plain thread.

Nothing home-made: every host runs the same ``accelerate launch`` as a single-host run, with
accelerate's own multi-node options (``--num_machines N --machine_rank i --main_process_ip H0
--main_process_port P``, built by ``core/launch.py`` from the job's launch section). ``host_jobs``
makes the per-host jobs; ``preflight`` says what would stop or hang the run before anything starts;
``main_address`` is host 0's address as the other hosts reach it (ssh's own resolution of it);
``preflight_answer`` is both, as ``gaudi-gui hosts --preflight`` prints them (the Training tab asks
its agent for that command as a child: the window starts no thread). ``keep_job_meter`` keeps the whole
job's meter in host 0's run (``gaudi-gui hosts --keep-job-meter``, the same way).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gaudi_gui.core import remote, visibility
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.remote import Host, HostError, RemoteError

#: Libraries whose versions must match on every host (collectives and checkpoints depend on them).
MATCHED = ("torch", "transformers", "accelerate", "gaudi-gui")
#: The main process port when the job names none.
DEFAULT_PORT = 29500


def parse_hosts(text: str, option: str = "--hosts") -> list[Host]:
    """``A,B,…`` as hosts (saved ones keep their remote command); HostError for a bad or repeated one
    (``option``: the option that named them, as the error says it)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if len(names) < 2:
        raise HostError(f"{option} takes two or more hosts, comma-separated (one host: --host)")
    if len(set(names)) != len(names):
        raise HostError(f"a host is named twice in {option}: {text!r}")
    return [remote.find_host(n) for n in names]


def parse_host_cards(text: str, hosts: Sequence[str]) -> dict[str, list[int]]:
    """``train --hosts``'s ``--cards``: ``0,1`` (the same cards on every host) or ``A=0,1;B=2,3``
    (per host; a host not named uses all its cards). ValueError with one readable line otherwise."""
    text = text.strip()
    if not text:
        return {}
    if "=" not in text:
        ids = visibility.parse_cards(text)
        return {name: list(ids) for name in hosts}
    out: dict[str, list[int]] = {}
    for item in (i.strip() for i in text.split(";")):
        if not item:
            continue
        name, sep, ids_text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"--cards: expected HOST=IDS, not {item!r} (e.g. \"A=0,1;B=2,3\")")
        if name not in hosts:
            raise ValueError(f"--cards names {name!r}, which is not one of --hosts ({', '.join(hosts)})")
        if name in out:
            raise ValueError(f"--cards names {name!r} twice")
        out[name] = visibility.parse_cards(ids_text)
    return out


def ssh_g_argv(host: Host) -> list[str]:
    """``ssh -G`` for ``host``: ssh's resolved configuration of it, without connecting."""
    argv = ["ssh", "-G"]
    cfg = remote.ssh_config_file()
    if cfg:
        argv += ["-F", cfg]
    return [*argv, "--", remote.ssh_target(host.name)]


def address_from_ssh_g(host: Host, text: str) -> str:
    """The ``hostname`` line of ``ssh -G`` output, else the host part of the destination."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value.strip():
            return value.strip()
    name = host.name.rsplit("@", 1)[-1]
    return name.split(":", 1)[0]


def main_address(host: Host) -> str:
    """Host 0's address as the other hosts reach it: ssh's resolution of its HostName (``ssh -G``)."""
    if host.is_local:
        import socket
        return socket.getfqdn()
    try:
        done = subprocess.run(ssh_g_argv(host), capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RemoteError("ssh", f"ssh -G {host.name} failed: {exc}") from None
    return address_from_ssh_g(host, done.stdout)


def host_jobs(job: JobConfig, count: int, main_ip: str, port: int) -> list[JobConfig]:
    """The job each of ``count`` hosts runs: the same job with its machine rank, in host order."""
    parts = []
    for rank in range(count):
        part = copy.deepcopy(job)
        part.launch.num_machines = count
        part.launch.machine_rank = rank
        part.launch.main_process_ip = main_ip
        part.launch.main_process_port = port
        parts.append(part)
    return parts


def paths_to_check(job: Any) -> list[str]:
    """The job's paths every host must hold itself (a Hub id or builtin:demo resolves on the host)."""
    paths = []
    for value in (job.model, job.dataset.source, job.resume_from_checkpoint if job.resume_from_checkpoint
                  not in ("", "latest") else ""):
        if value and (value.startswith(("/", "~", "./", "../")) or value.endswith((".json", ".jsonl",
                                                                                    ".csv", ".txt"))):
            paths.append(value)
    return paths


def preflight(hosts: list[Host], job: Any, port: int, timeout: float = 60.0) -> list[str]:
    """What stops this job from running on these hosts (empty: go). Every host is asked at once:
    reachable with this gaudi-gui, the same library versions, the job's paths present, and the main
    port free on host 0."""
    paths = paths_to_check(job)

    def check(index_host: tuple[int, Host]) -> tuple[Host, dict[str, Any] | None, str]:
        index, host = index_host
        try:
            remote.handshake(host, timeout=timeout)
            argv = ["hello", "--json", *[a for p in paths for a in ("--path", p)]]
            if index == 0:
                argv += ["--port", str(port)]
            code, out, err = remote.call(host, host.gaudi_gui_argv(*argv), timeout=timeout)
            info = json.loads(out.strip().splitlines()[-1]) if code == 0 and out.strip() else None
            if not isinstance(info, dict):
                return host, None, f"{host.name}: hello failed ({err.strip()[-200:] or code})"
            return host, info, ""
        except RemoteError as exc:
            return host, None, str(exc)
        except ValueError as exc:
            return host, None, f"{host.name}: hello printed no JSON ({exc})"

    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        answers = list(pool.map(check, enumerate(hosts)))
    problems = [why for _h, _i, why in answers if why]
    infos = [(h, i) for h, i, _w in answers if i is not None]
    if infos:
        first_host, first = infos[0]
        for name in MATCHED:
            want = (first.get("versions") or {}).get(name)
            for host, info in infos[1:]:
                have = (info.get("versions") or {}).get(name)
                if have != want:
                    problems.append(f"{name} differs: {first_host.name} has {want}, {host.name} has {have}; "
                                    f"every host needs the same (gaudi-gui hosts --setup installs this "
                                    f"gaudi-gui)")
    for host, info in infos:
        missing = [p for p, ok in (info.get("paths") or {}).items() if not ok]
        for path in missing:
            problems.append(f"{path} is not on {host.name}: every host reads the job's paths itself "
                            f"(copy it there, or use a shared file system)")
        if host is hosts[0] and info.get("port_free") is False:
            problems.append(f"port {port} is in use on {host.name} (the main host): choose another "
                            f"main process port")
    return problems


def preflight_answer(hosts: list[Host], job: Any, port: int, main_ip: str = "",
                     timeout: float = 60.0) -> tuple[str, list[str]]:
    """What a run on several hosts asks before it starts: host 0's address as the others reach it
    (``main_ip`` when given, else :func:`main_address`) and what stops the run (:func:`preflight`;
    empty: go). A failed look-up is one of the problems (the address is then ``main_ip``)."""
    try:
        address = main_ip or main_address(hosts[0])
        problems = preflight(hosts, job, port, timeout=timeout)
    except (RemoteError, OSError, ValueError) as exc:
        address, problems = main_ip, [str(exc)]
    return address, problems


# What a host's ranks say when another host's ranks are gone from a collective (gloo, NCCL, HCCL):
# a consequence of that host's end, not a cause of its own.
_PEER_LOST = re.compile(r"closed by peer|reset by peer|remote worker crashing|communicator was aborted|"
                        r"remote process exited|ncclRemoteError|Broken pipe", re.I)


def consequence(why: str) -> bool:
    """Whether a host's failure reads as the consequence of another's: its ranks lost a peer in a
    collective, or were killed on request (by the end of the other hosts after a first failure)."""
    return bool(_PEER_LOST.search(why)) or "killed on request" in why


def first_cause(failures: Sequence[str]) -> int:
    """Of the hosts' failures in the order they were heard of, the one that caused the run's end: the
    first that is not a consequence of another (:func:`consequence`), else the first heard of. Two
    hosts end within a moment of each other when one's rank dies: which end reaches this machine
    first is a matter of connections and load, and the peer that saw its collective fail often wins."""
    return next((i for i, why in enumerate(failures) if not consequence(why)), 0)


__all__ = ["DEFAULT_PORT", "MATCHED", "address_from_ssh_g", "consequence", "first_cause", "host_jobs",
           "keep_job_meter", "keep_job_meter_answer", "main_address", "no_run_folder", "not_kept",
           "parse_hosts", "paths_to_check", "preflight", "preflight_answer", "ssh_g_argv"]


def not_kept(host: Host, why: str) -> str:
    """The sentence that says the whole job's meter was not kept on ``host`` (host 0), and ``why``."""
    return f"the whole job's meter was not kept on {host.name}: {why}"


def no_run_folder(host: Host) -> str:
    """The sentence that says the whole job's meter was not kept: host 0 never named its run folder."""
    return f"the whole job's meter was not kept: host 0 ({host.name}) named no run folder"


def keep_job_meter_answer(host: Host, folder: str, whole: dict[str, Any],
                          timeout: float = 60.0) -> tuple[bool, str]:
    """Keep the whole job's meter (``core.meter_account.combine`` of every host's part) in host 0's run
    ``folder`` on ``host`` (``runs job-meter FOLDER``, the JSON on stdin: nothing of it reaches a
    shell), so that ``runs show`` / ``runs list`` there say the whole job, not only host 0's part.
    (whether it was kept, what to tell a person: where it was kept, or why not)."""
    if not folder:
        return False, no_run_folder(host)
    try:
        code, out, err = remote.call(host, host.gaudi_gui_argv("runs", "job-meter", folder),
                                     input_text=json.dumps(whole), timeout=timeout)
    except RemoteError as exc:
        return False, not_kept(host, str(exc))
    if code != 0:
        why = (err.strip().splitlines() or out.strip().splitlines() or [f"exit {code}"])[-1]
        return False, not_kept(host, why)
    return True, f"meter: the whole job's kept in {host.name}'s run {folder} (runs --host {host.name} show)"


def keep_job_meter(host: Host, folder: str, whole: dict[str, Any], timeout: float = 60.0) -> str:
    """:func:`keep_job_meter_answer`'s sentence: where the whole job's meter was kept, or why not."""
    return keep_job_meter_answer(host, folder, whole, timeout)[1]
