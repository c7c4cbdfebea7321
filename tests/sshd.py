"""A real SSH server on 127.0.0.1 for the remote-host tests (asyncssh: needs no root).

It behaves as OpenSSH's sshd does where the app depends on it: each exec request runs
``/bin/sh -c COMMAND`` in a session of its own with the server's environment; stdin, stdout and
stderr are pipes (no pty); when the client goes away the command only sees its stdin close, and is
never signalled. Public-key authentication against one authorized key; any number of channels per
connection (OpenSSH's connection multiplexing).

    python tests/sshd.py --host-key KEY --authorized-keys PUB --port-file FILE \
        [--max-sessions N] [--sessions-file FILE]

``--max-sessions N`` refuses a connection's session beyond N open ones ("Session refused"), as
OpenSSH's ``MaxSessions`` does (10 by default there; no limit here unless given). ``--sessions-file``
is kept up to date with ``{"open": N, "peak": M}``: the sessions open now over all connections and the
most that were ever open at once (what a test of "one session per host" reads).

SIGUSR1 drops every connection at once (a network cut, from the client's side); SIGTERM stops the
server (what it started keeps running, as with sshd).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from typing import Any

import asyncssh

CONNECTIONS: set[asyncssh.SSHServerConnection] = set()
#: A connection's sessions beyond this many open ones are refused (0: no limit).
MAX_SESSIONS = 0
#: Where the session counts are written ("" : nowhere).
SESSIONS_FILE = ""
_COUNTS = {"open": 0, "peak": 0}


def _count(change: int) -> None:
    _COUNTS["open"] += change
    _COUNTS["peak"] = max(_COUNTS["peak"], _COUNTS["open"])
    if SESSIONS_FILE:
        tmp = SESSIONS_FILE + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(_COUNTS, fh)
        os.replace(tmp, SESSIONS_FILE)


class Server(asyncssh.SSHServer):
    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        self.sessions = 0
        CONNECTIONS.add(conn)

    def session_requested(self) -> Any:
        """A session channel: refused beyond MAX_SESSIONS open ones on this connection (MaxSessions)."""
        if MAX_SESSIONS and self.sessions >= MAX_SESSIONS:
            return False
        self.sessions += 1
        _count(+1)
        server = self

        async def run(process: asyncssh.SSHServerProcess) -> None:
            try:
                await handle(process)
            finally:
                server.sessions -= 1
                _count(-1)

        return asyncssh.SSHServerProcess(run, None, 0, False)

    def connection_lost(self, exc: Exception | None) -> None:
        CONNECTIONS.discard(self.conn)

    def begin_auth(self, username: str) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return False

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str,
                             orig_port: int) -> bool:
        # ``ssh -L`` (direct-tcpip), as OpenSSH's default AllowTcpForwarding=yes: the serve tests
        # reach the host's loopback through it.
        return True


#: Where commands start, as sshd starts them in the user's home (not wherever the server was started).
WORKDIR = ""


async def handle(process: asyncssh.SSHServerProcess) -> None:
    command = process.command
    if command is None:  # a shell request: the app never makes one
        process.stderr.write("this test server runs commands only\n")
        process.exit(1)
        return
    child = await asyncio.create_subprocess_exec(
        "/bin/sh", "-c", command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True, cwd=WORKDIR or None)

    async def pump_in() -> None:
        assert child.stdin is not None
        try:
            while True:
                data = await process.stdin.read(65536)
                if not data:
                    break
                child.stdin.write(data)
                await child.stdin.drain()
        except Exception:
            pass  # the connection is gone: like sshd, only close the command's stdin
        with contextlib.suppress(Exception):
            child.stdin.close()

    async def pump_out(reader: asyncio.StreamReader, writer: asyncssh.SSHWriter) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            with contextlib.suppress(Exception):
                writer.write(data)

    feeder = asyncio.ensure_future(pump_in())
    assert child.stdout is not None and child.stderr is not None
    await asyncio.gather(pump_out(child.stdout, process.stdout), pump_out(child.stderr, process.stderr))
    code = await child.wait()
    feeder.cancel()
    with contextlib.suppress(Exception):
        if code < 0:
            process.exit_with_signal(signal.Signals(-code).name[3:])
        else:
            process.exit(code)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host-key", required=True)
    parser.add_argument("--authorized-keys", required=True)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--cwd", default="", help="where commands start (sshd: the user's home)")
    parser.add_argument("--max-sessions", type=int, default=0, help="sshd's MaxSessions (0: no limit)")
    parser.add_argument("--sessions-file", default="", help="kept up to date with the session counts")
    args = parser.parse_args()
    global WORKDIR, MAX_SESSIONS, SESSIONS_FILE
    WORKDIR = args.cwd
    MAX_SESSIONS = args.max_sessions
    SESSIONS_FILE = args.sessions_file
    if SESSIONS_FILE:
        _count(0)
    server = await asyncssh.create_server(
        Server, "127.0.0.1", 0, server_host_keys=[args.host_key],
        authorized_client_keys=args.authorized_keys, encoding=None,
        keepalive_interval=0)
    port = server.sockets[0].getsockname()[1]
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(str(port))
    os.replace(tmp, args.port_file)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def drop() -> None:
        for conn in list(CONNECTIONS):
            conn.abort()

    loop.add_signal_handler(signal.SIGUSR1, drop)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()
    drop()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    sys.exit(0)
