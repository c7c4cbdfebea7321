"""A fake Hugging Face Hub on 127.0.0.1 for the download tests (no test may reach the network).

It answers exactly what huggingface_hub 2.4's ``snapshot_download`` calls on the plain HTTP path
(``HF_HUB_DISABLE_XET=1``), read from its source:

- ``GET /api/models/{repo_id}/revision/{rev}`` (``HfApi.repo_info``): ``{"id", "sha", "siblings"}``
- ``GET /api/models/{repo_id}/tree/{sha}?recursive=True`` (``HfApi.list_repo_tree``): a list of
  ``{"type": "file", "path", "size", "oid"}``
- ``HEAD|GET /{repo_id}/resolve/{rev}/{file}`` (``get_hf_file_metadata`` then ``http_get``):
  ``X-Repo-Commit``, ``ETag``, ``Content-Length``, ``Accept-Ranges``; a ``Range: bytes=N-`` GET answers 206.

Errors carry ``X-Error-Code`` as the Hub does (``RepoNotFound``, ``RevisionNotFound``, ``GatedRepo``),
which is what ``hf_raise_for_status`` turns into its typed errors.

Knobs for the tests: a repo may be ``gated`` (its files answer 403 GatedRepo; the API answers, as on the
Hub), a file may be ``virtual`` (a claimed size that is never served), and ``stall(repo, file, times)``
makes the next GETs of a file send half its bytes and then go silent until the server stops (later GETs
are normal); ``corrupt(repo, file, times)`` serves the next GETs with the first byte changed (same size,
so only a digest check sees it); ``ignore_ranges`` answers a Range with 200 and the whole file;
``fail(repo, file, status)`` answers that file's GETs (and HEADs, unless ``head=False``) with the status.
Every request, its Authorization header, the bytes served per file and where each GET of a file
started (``starts``: 0, or N for ``Range: bytes=N-``) are recorded.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    sha: str = ""
    gated: bool = False
    #: path -> claimed size of a file that is listed but never served
    virtual: dict[str, int] = field(default_factory=dict)
    _etags: dict[str, tuple[bytes, str]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.sha:
            digest = hashlib.sha1()
            for name in sorted(self.files):
                digest.update(name.encode() + hashlib.sha1(self.files[name]).digest())
            self.sha = digest.hexdigest()

    def size(self, path: str) -> int | None:
        if path in self.virtual:
            return self.virtual[path]
        data = self.files.get(path)
        return None if data is None else len(data)

    def etag(self, path: str) -> str:
        # Kept per content, as the Hub stores it: hashing a 1 GB file at every tree listing and HEAD
        # would charge a client that asks twice (a plan, then the download) for the fake's own work.
        data = self.files.get(path, path.encode())
        known = self._etags.get(path)
        if known is None or known[0] is not data:
            known = self._etags[path] = (data, hashlib.sha256(data).hexdigest())
        return known[1]


def repo_from_folder(folder: Path) -> FakeRepo:
    files = {p.relative_to(folder).as_posix(): p.read_bytes()
             for p in sorted(folder.rglob("*")) if p.is_file()}
    return FakeRepo(files=files)


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        #: (commit, file) -> how many more GETs of it go silent after half the bytes
        self.stall_gets: dict[tuple[str, str], int] = {}
        #: (commit, file) -> how many more GETs of it are served with their first byte changed
        self.corrupt_gets: dict[tuple[str, str], int] = {}
        #: (commit, file) -> (the HTTP status its requests answer, whether HEADs answer it too)
        self.fail_files: dict[tuple[str, str], tuple[int, bool]] = {}
        self.requests: list[tuple[str, str]] = []
        self.authorizations: list[str] = []
        self.bytes_served: dict[str, int] = {}
        self.gets: dict[str, int] = {}
        #: file -> the first byte each GET asked for (0 without a Range)
        self.starts: dict[str, list[int]] = {}
        self.stalled = threading.Event()
        #: Answer a Range request with 200 and the whole file, as some CDNs do.
        self.ignore_ranges = False
        self._release = threading.Event()
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._handle(self, head=True)

            def do_GET(self) -> None:
                hub._handle(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def stall(self, repo_id: str, filename: str, times: int = 1) -> None:
        """The next ``times`` GETs of the file send half its bytes, then nothing until the hub stops."""
        self.stall_gets[(self.repos[repo_id].sha, filename)] = times

    def corrupt(self, repo_id: str, filename: str, times: int = 1) -> None:
        """The next ``times`` GETs of the file serve its bytes with the first one changed (same size)."""
        self.corrupt_gets[(self.repos[repo_id].sha, filename)] = times

    def fail(self, repo_id: str, filename: str, status: int, *, head: bool = True) -> None:
        """The file's GETs (and HEADs with ``head``) answer ``status`` (404 EntryNotFound, 5xx ...)."""
        self.fail_files[(self.repos[repo_id].sha, filename)] = (status, head)

    def file_gets(self) -> int:
        with self._lock:
            return sum(self.gets.values())

    def start(self) -> FakeHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    # --- request handling -------------------------------------------------------------------------
    def _reply(self, h: BaseHTTPRequestHandler, status: int, body: bytes = b"",
               headers: dict[str, str] | None = None, head: bool = False) -> None:
        h.send_response(status)
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        if "Content-Length" not in (headers or {}):
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head and body:
            h.wfile.write(body)

    def _json(self, h: BaseHTTPRequestHandler, payload: object, head: bool) -> None:
        self._reply(h, 200, json.dumps(payload).encode(), {"Content-Type": "application/json"}, head)

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, message: str, head: bool) -> None:
        self._reply(h, status, json.dumps({"error": message}).encode(),
                    {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message},
                    head)

    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = unquote(urlparse(h.path).path)
        with self._lock:
            self.requests.append(("HEAD" if head else "GET", h.path))
            self.authorizations.append(h.headers.get("Authorization", ""))
        if path.startswith("/api/models/"):
            rest = path[len("/api/models/"):]
            for marker in ("/revision/", "/tree/"):
                if marker in rest:
                    repo_id, rev = rest.split(marker, 1)
                    repo = self.repos.get(repo_id)
                    if repo is None:
                        return self._error(h, 401, "RepoNotFound", "Repository not found", head)
                    if rev not in ("main", repo.sha):
                        return self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
                    names = sorted([*repo.files, *repo.virtual])
                    if marker == "/revision/":
                        return self._json(h, {"id": repo_id, "sha": repo.sha, "gated": repo.gated,
                                              "private": False,
                                              "siblings": [{"rfilename": n} for n in names]}, head)
                    return self._json(h, [{"type": "file", "path": n, "size": repo.size(n),
                                           "oid": repo.etag(n)[:40]} for n in names], head)
            return self._error(h, 404, "RepoNotFound", "Repository not found", head)
        if "/resolve/" in path:
            repo_id, rest = path.lstrip("/").split("/resolve/", 1)
            rev, _, filename = rest.partition("/")
            repo = self.repos.get(repo_id)
            if repo is None:
                return self._error(h, 401, "RepoNotFound", "Repository not found", head)
            if rev not in ("main", repo.sha):
                return self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
            if repo.gated:
                return self._error(h, 403, "GatedRepo",
                                   f"Access to model {repo_id} is restricted and you are not in the "
                                   "authorized list.", head)
            failing = self.fail_files.get((repo.sha, filename))
            if failing is not None and (failing[1] or not head):
                if not head:
                    with self._lock:
                        self.gets[filename] = self.gets.get(filename, 0) + 1
                code = "EntryNotFound" if failing[0] == 404 else "Failed"
                return self._error(h, failing[0], code, f"answered {failing[0]} by the test", head)
            size = repo.size(filename)
            if size is None:
                return self._error(h, 404, "EntryNotFound", "Entry not found", head)
            headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{repo.etag(filename)}"',
                       "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            if head:
                headers["Content-Length"] = str(size)
                return self._reply(h, 200, b"", headers, head=True)
            return self._serve_file(h, repo, filename, headers)
        return self._error(h, 404, "NotFound", "no such route", head)

    def _serve_file(self, h: BaseHTTPRequestHandler, repo: FakeRepo, filename: str,
                    headers: dict[str, str]) -> None:
        data = repo.files.get(filename)
        if data is None:  # a virtual file is never served
            return self._error(h, 500, "Virtual", "this file is only listed", False)
        start = 0
        ranged = h.headers.get("Range", "")
        if ranged.startswith("bytes=") and not self.ignore_ranges:
            start = int(ranged[len("bytes="):].split("-", 1)[0] or 0)
        body = data[start:]
        headers["Content-Length"] = str(len(body))
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        key = (repo.sha, filename)
        with self._lock:
            self.gets[filename] = self.gets.get(filename, 0) + 1
            self.starts.setdefault(filename, []).append(start)
            stall = self.stall_gets.get(key, 0) > 0
            if stall:
                self.stall_gets[key] -= 1
            if self.corrupt_gets.get(key, 0) > 0 and body and not start:
                self.corrupt_gets[key] -= 1
                body = bytes([body[0] ^ 0xFF]) + body[1:]
        h.send_response(206 if start else 200)
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        if stall:
            half = body[: len(body) // 2]
            h.wfile.write(half)
            h.wfile.flush()
            self._count(filename, len(half))
            self.stalled.set()
            # Silent until the test ends: the connection stays open, no byte comes.
            self._release.wait(timeout=120)
            h.close_connection = True
            return
        step = 256 * 1024
        for offset in range(0, len(body), step):
            part = body[offset:offset + step]
            h.wfile.write(part)
            self._count(filename, len(part))

    def _count(self, filename: str, n: int) -> None:
        with self._lock:
            self.bytes_served[filename] = self.bytes_served.get(filename, 0) + n
