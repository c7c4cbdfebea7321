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

An FP8 calibration travels whole (issue 39: "downloadable with the model"): its manifest, its two
QUANT_CONFIG files and INC's measurements (``measure/``, every rank's), a few MB. Its configs name the
measurements by absolute path, so the copy's are pointed at the copy (``fp8.relocate``). ``push`` is the
other way: ``runs --host DEST push RUN`` sends a run of this machine (a calibration made on one Gaudi
host, for serving on another of the same generation) into the host's runs store, where ``runs
receive`` unpacks it; ``serve --fp8 RUN`` there checks its manifest against that machine.
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
from gaudi_gui.core import fp8, hpu_metrics, meter_files
from gaudi_gui.core import profile as profile_mod
from gaudi_gui.core.remote import SSH_FAILED, Host, explain_ssh_failure

#: The files of a run that travel (a folder: all of it).
FILES = ("config.json", "job.json", "spec.json", "status.json", events_mod.EVENTS_NAME,
         meter_files.SUMMARY_NAME, meter_files.JOB_SUMMARY_NAME,
         fp8.MANIFEST_NAME, fp8.QUANT_CONFIG_NAME, fp8.QUANTIZE_CONFIG_NAME)
FOLDERS = (profile_mod.FOLDER_NAME, hpu_metrics.FOLDER_NAME, fp8.MEASURE_DIR)
#: Where a brought-back run says where it came from.
ORIGIN_NAME = "remote.json"
#: How long a fetch or a push may take (a Gaudi trace is tens to hundreds of MB).
FETCH_TIMEOUT_S = 600.0
#: A run's name as ``runs receive`` takes it: one folder name of the runs store.
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


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
    return _place(runs_root, name, (host.name, remote_folder), _host_tag(host))


def _place(runs_root: Path, name: str, came_from: tuple[str, str], tag: str) -> Path:
    """``runs_root/name``, unless a run of another origin has it: ``name-tag`` then."""
    plain = runs_root / name
    if not plain.exists() or _origin(plain) == came_from:
        return plain
    return runs_root / f"{name}-{tag}"


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
        return _settle(staging, local_folder(host, remote_folder, runs_root), host.name, remote_folder)
    finally:
        with contextlib.suppress(OSError):
            if staging.exists():
                shutil.rmtree(staging)


def _settle(staging: Path, target: Path, came_from: str, folder: str) -> Path:
    """The unpacked copy in ``staging`` becomes ``target`` (an earlier copy of the same run replaced),
    saying where it came from; a calibration's configs pointed at the copy's measurements."""
    (staging / ORIGIN_NAME).write_text(json.dumps({"host": came_from, "folder": folder,
                                                   "fetched_at": time.time()}), encoding="utf-8")
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    fp8.relocate(target)
    return target


def receive(stream: IO[bytes], runs_root: Path, name: str, *, came_from: str, folder: str) -> Path:
    """``runs receive NAME``: a ``pack`` stream (a run sent by ``push``) unpacked into ``runs_root`` as
    ``NAME`` (``NAME-<sender>`` where a run of another origin has it); the folder. FetchError when the
    name is no run name or the stream holds no run."""
    if not _RUN_NAME.fullmatch(name) or name in (".", ".."):
        raise FetchError(f"{name!r} is not a run name (letters, digits, '.', '_' and '-')")
    runs_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".receive-", dir=runs_root))
    try:
        try:
            written = unpack(stream, staging)
        except tarfile.TarError as exc:
            raise FetchError(f"what came is not a packed run ({exc})") from None
        if "status.json" not in written:
            raise FetchError(f"what came for {name} is not a run (no status.json)")
        tag = re.sub(r"[^A-Za-z0-9._-]+", "_", came_from)[:40] or "sent"
        return _settle(staging, _place(runs_root, name, (came_from, folder), tag), came_from, folder)
    finally:
        with contextlib.suppress(OSError):
            if staging.exists():
                shutil.rmtree(staging)


def push(host: Host, run_folder: Path, *, timeout: float = FETCH_TIMEOUT_S) -> dict[str, Any]:
    """Send this machine's run at ``run_folder`` into ``host``'s runs store over its ssh connection
    (``runs receive`` there); the host's answer ({folder, name, …}). FetchError (one sentence) when ssh
    or the host failed."""
    folder = Path(run_folder).resolve()
    if not (folder / "status.json").is_file():
        raise FetchError(f"{folder} is not a run folder (no status.json)")
    sender = _this_machine()
    argv = host.wrap(host.gaudi_gui_argv("runs", "receive", folder.name, f"--from={sender}",
                                         f"--folder={folder}"))
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err)
        except FileNotFoundError:
            raise FetchError("the OpenSSH client (ssh) is not installed on this machine") from None
        assert proc.stdin is not None
        try:
            pack(folder, proc.stdin)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the host stopped reading: its exit status and words say why
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise FetchError(f"{host.name} did not take the run within {timeout:g} s") from None
        err.seek(0)
        said = err.read().decode("utf-8", errors="replace").strip()
        out.seek(0)
        answer_text = out.read().decode("utf-8", errors="replace").strip()
    if code != 0:
        if not host.is_local and code == SSH_FAILED:
            raise FetchError(explain_ssh_failure(host.name, said)[1])
        last = said.splitlines()[-1] if said else f"exit {code}"
        raise FetchError(f"{host.name} did not take {folder.name}: {last}")
    try:
        answer = json.loads(answer_text.splitlines()[-1])
    except (ValueError, IndexError):
        raise FetchError(f"{host.name} answered no run folder: {answer_text[-200:]!r}") from None
    if not isinstance(answer, dict) or not answer.get("folder"):
        raise FetchError(f"{host.name} answered no run folder: {answer_text[-200:]!r}")
    return answer


def _this_machine() -> str:
    import socket
    return socket.gethostname() or "workstation"


def describe_fetched(folder: Path) -> str:
    """One line on a brought-back run: where it is here, and its trace or its FP8 measurements."""
    return f"brought back to {folder}{_contents(folder)}"


def _contents(folder: Path) -> str:
    traces = profile_mod.trace_files(folder)
    if traces:
        return f"; its profile trace: {traces[-1]}"
    if (folder / fp8.MANIFEST_NAME).is_file():
        try:
            manifest = fp8.read_manifest(folder)
        except fp8.Fp8Error:
            return "; its FP8 manifest is unreadable"
        files = fp8.measurement_files(folder)
        return (f"; its FP8 measurements: {len(files)} files, measured on {manifest.get('device')} "
                f"({manifest.get('generation')}), usable with --fp8 {folder.name}")
    return "; it has no profile trace"


def describe_pushed(host: Host, answer: dict[str, Any]) -> str:
    """One line on a run sent to a host."""
    extra = f" (as {answer.get('name')}: the host had a run of that name)" \
        if answer.get("renamed") else ""
    return f"sent to {host.name}: {answer.get('folder')}{extra}"


__all__ = ["FILES", "FOLDERS", "ORIGIN_NAME", "FetchError", "describe_fetched", "describe_pushed", "fetch",
           "local_folder", "origin", "pack", "packed_names", "push", "receive", "unpack"]
