"""A run on a host brought back here (issue 40: "profiling on a host writes the trace on the host and
brings it back with the run"). Qt-free, torch-free.

``gaudi-gui runs pack RUN`` on the host writes a tar of what a person reads of the run here: its
records (config, job, status, events, the meter's summaries) and its profile (``profile/``: the trace
and summary.json; ``hpu-metrics/``, which the profile's graph compilations are counted from). Never the
checkpoints or the saved model (the host's output folder), nor the pids of the host's processes
(``ranks/``), nor the meter's samples (``meter.jsonl``: tens of MB for a long run).

``fetch`` runs that over the host's ssh connection and unpacks it into this machine's runs store as
``<run name>`` (``<run name>-<host>`` where a local run already has the name), with ``remote.json``
saying where it came from: Training → Runs lists it and Profile… opens its trace here. Fetching again
replaces the earlier copy of the same host's run.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import IO, Any

from gaudi_gui.core import events as events_mod
from gaudi_gui.core import hpu_metrics, meter_files
from gaudi_gui.core import profile as profile_mod
from gaudi_gui.core.remote import SSH_FAILED, Host, explain_ssh_failure

#: The files of a run that travel (a folder: all of it).
FILES = ("config.json", "job.json", "spec.json", "status.json", events_mod.EVENTS_NAME,
         meter_files.SUMMARY_NAME, meter_files.JOB_SUMMARY_NAME)
FOLDERS = (profile_mod.FOLDER_NAME, hpu_metrics.FOLDER_NAME)
#: Where a brought-back run says where it came from.
ORIGIN_NAME = "remote.json"
#: How long a fetch may take (a Gaudi trace is tens to hundreds of MB).
FETCH_TIMEOUT_S = 600.0


class FetchError(RuntimeError):
    """The run could not be brought back: one sentence."""


def packed_names(run_folder: Path) -> list[str]:
    """The names under ``run_folder`` that ``pack`` writes (those that exist)."""
    return [name for name in (*FILES, *FOLDERS) if (run_folder / name).exists()]


def pack(run_folder: Path, out: IO[bytes]) -> int:
    """Write ``run_folder``'s travelling files to ``out`` as a tar stream; the number of files."""
    count = 0
    with tarfile.open(fileobj=out, mode="w|") as tar:
        for name in packed_names(run_folder):
            path = run_folder / name
            files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
            for file in files:
                if file.is_symlink():
                    continue
                tar.add(str(file), arcname=file.relative_to(run_folder).as_posix(), recursive=False)
                count += 1
    return count


def _safe_name(name: str) -> PurePosixPath | None:
    """A member's path if it may be written under the copy (one of the travelling names, relative, no
    ``..``); None otherwise (skipped: a host's answer is data, never a path to write anywhere)."""
    path = PurePosixPath(name)
    if path.is_absolute() or not path.parts or ".." in path.parts:
        return None
    top = path.parts[0]
    if len(path.parts) == 1 and top in FILES:
        return path
    if len(path.parts) > 1 and top in FOLDERS:
        return path
    return None


def unpack(stream: IO[bytes], into: Path) -> list[str]:
    """Unpack a ``pack`` stream into the folder ``into`` (made); the names written."""
    written: list[str] = []
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            path = _safe_name(member.name)
            if path is None or not member.isfile():
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            target = into.joinpath(*path.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as fh:
                shutil.copyfileobj(source, fh)
            written.append(path.as_posix())
    return written


def _host_tag(host: Host) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", host.name)[:40] or "host"


def local_folder(host: Host, remote_folder: str, runs_root: Path) -> Path:
    """Where the copy of ``host``'s run goes: its name, unless a local run (or another host's copy)
    has it."""
    name = PurePosixPath(remote_folder.rstrip("/")).name or "run"
    plain = runs_root / name
    if not plain.exists() or _origin(plain) == (host.name, remote_folder):
        return plain
    return runs_root / f"{name}-{_host_tag(host)}"


def _origin(folder: Path) -> tuple[str, str] | None:
    try:
        data = json.loads((folder / ORIGIN_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return (str(data.get("host")), str(data.get("folder"))) if isinstance(data, dict) else None


def origin(folder: Path) -> dict[str, Any] | None:
    """Where a brought-back run came from ({host, folder, fetched_at}); None for a run of this machine."""
    try:
        data = json.loads((Path(folder) / ORIGIN_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def fetch(host: Host, remote_folder: str, runs_root: Path, *, timeout: float = FETCH_TIMEOUT_S) -> Path:
    """Bring ``host``'s run ``remote_folder`` (its path there, or its name in the host's runs store)
    into ``runs_root``; the local folder. FetchError (one sentence) when ssh or the host failed."""
    argv = host.wrap(host.gaudi_gui_argv("runs", "pack", remote_folder))
    runs_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=runs_root))
    try:
        with tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
            except FileNotFoundError:
                raise FetchError("the OpenSSH client (ssh) is not installed on this machine") from None
            assert proc.stdout is not None
            deadline = time.monotonic() + timeout
            try:
                written = unpack(proc.stdout, staging)
            except tarfile.TarError:
                written = []
            finally:
                proc.stdout.close()
                try:
                    code = proc.wait(max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    raise FetchError(f"{host.name} did not send the run within {timeout:g} s") from None
            err.seek(0)
            said = err.read().decode("utf-8", errors="replace").strip()
        if code != 0:
            if not host.is_local and code == SSH_FAILED:
                raise FetchError(explain_ssh_failure(host.name, said)[1])
            last = said.splitlines()[-1] if said else f"exit {code}"
            raise FetchError(f"{host.name} could not pack {remote_folder}: {last}")
        if "status.json" not in written:
            raise FetchError(f"{host.name} sent nothing of {remote_folder} (not a run folder there)")
        target = local_folder(host, remote_folder, runs_root)
        (staging / ORIGIN_NAME).write_text(json.dumps({"host": host.name, "folder": remote_folder,
                                                       "fetched_at": time.time()}), encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        return target
    finally:
        with contextlib.suppress(OSError):
            if staging.exists():
                shutil.rmtree(staging)


def describe_fetched(folder: Path) -> str:
    """One line on a brought-back run: where it is here and its trace."""
    traces = profile_mod.trace_files(folder)
    trace = f"; its profile trace: {traces[-1]}" if traces else "; it has no profile trace"
    return f"brought back to {folder}{trace}"


__all__ = ["FILES", "FOLDERS", "ORIGIN_NAME", "FetchError", "describe_fetched", "fetch", "local_folder",
           "origin", "pack", "packed_names", "unpack"]
