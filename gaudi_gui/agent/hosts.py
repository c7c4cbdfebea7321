"""Hosts: every request that names a host is carried to that host's agent over ONE ssh session per host.

OpenSSH refuses the 11th session on a connection (``MaxSessions``, 10 by default): a window that opened
one ssh session per thing it watched (devices, health, the meter, a run, a forward, a download, the
queue) on a busy host got there. So the agent keeps one :class:`Link` per host: one ``ssh … HOST
<the host's gaudi-gui command> agent --stdio`` child (``core.remote``'s ssh options, the saved host's
remote command, every word quoted for the remote shell), whose stdin and stdout are the host agent's
wire. Requests are re-numbered on the link and answered to the session that asked; a subscription
that names the host is made on the link, and the host's events come back to exactly the sessions that
subscribed through it, with ``"host"`` added.

A link that drops is made again with back-off (1, 2, 5, 10, 30 s), said as ``host`` events in words,
and its subscriptions are made again; requests in flight get ``ok:false`` with words. Nothing on the
host is touched by a drop: only the relay there ends (its stdin closed), the host's agent and its work
go on. A link nobody uses lingers ``GAUDI_GUI_HOST_LINGER_S`` seconds (60), then closes. Links never
keep this agent up (``busy`` is empty): a client that uses one is connected anyway.

A port forward to a host (``hosts.forward``: a dashboard's or a server's port there, reached at a port
here) rides on the link's connection: the link's ssh is a multiplexing client (``core.remote.ssh_base``:
``ControlMaster=auto``), so the forward is ``ssh -O forward -L …`` asked of that connection's master (a
short child of this agent; it opens no session on the host). The agent keeps each forward with the
session that asked for it, keeps the link open while one is held (the master lives as long as its
clients), and cancels it (``-O cancel``) when asked, when that session ends (a closed window) and when
the agent stops. The window starts no ssh for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from typing import Any

from gaudi_gui.agent import tasks
from gaudi_gui.agent.server import Agent, Handler, Refused, Session
from gaudi_gui.core import agentwire, remote
from gaudi_gui.core.agentwire import Ev, WireError
from gaudi_gui.core.placement import Forward
from gaudi_gui.core.remote import Host, HostError

#: Seconds between tries to make a dropped link again (the last one repeats).
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
#: Seconds a link with no user stays open (GAUDI_GUI_HOST_LINGER_S changes it).
LINGER_S = 60.0
#: Seconds the host's agent has to answer ``hello`` (it may have to start first: a Python import).
HELLO_TIMEOUT_S = 45.0
#: Seconds a request waits for its host's link to come up before it is refused in words.
WAIT_UP_S = 60.0
#: Failures that trying again cannot mend: the link stays down until someone asks again.
_FINAL = ("auth", "hostkey", "missing")
#: Seconds an ``ssh -O forward|cancel`` may take (it only speaks to the master on this machine).
FORWARD_TIMEOUT_S = 30.0
#: Operations of this service: they name a host but are answered here, never forwarded.
_OWN = ("hosts.connect", "hosts.disconnect", "hosts.forward")

Subs = dict[str, set[str] | None]


class LinkLost(Exception):
    """The link went away while a request waited for its answer."""


class Link:
    """One host's ssh session to its agent, and who uses it."""

    def __init__(self, service: HostsService, name: str) -> None:
        self.service = service
        self.name = name
        self.state = "connecting"
        self.message = f"connecting to {name}…"
        self.retry_s = 0.0
        self.proc: asyncio.subprocess.Process | None = None
        self.since = 0.0
        #: the link's own request id -> the future its answer resolves
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        #: the link's request id of a child.start -> the local session that asked
        self.hears: dict[int, Session] = {}
        #: What the link asked of the host's agent the last time it came up (``_subscribe_again``).
        self.made: Subs = {}
        self._next = 0
        #: local session -> what it subscribed to on this host (event -> keys, None: all)
        self.subs: dict[Session, Subs] = {}
        #: the port forwards held on this link's connection: local port -> (forward, who asked)
        self.forwards: dict[int, tuple[Forward, Session]] = {}
        self.last_used = time.monotonic()
        #: the outcome of the current try: None when up, else the words of why it failed
        self.attempt: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self.closed = False
        self.task = asyncio.create_task(self._run())

    # -- state --------------------------------------------------------------------------------------
    def _set(self, state: str, message: str, retry_s: float = 0.0) -> None:
        self.state, self.message, self.retry_s = state, message, retry_s
        self.service.agent.publish(Ev.HOST, self.name, host=self.name, state=state, message=message,
                                   retry_s=retry_s)

    def _settle(self, outcome: str | None) -> None:
        if not self.attempt.done():
            self.attempt.set_result(outcome)

    def _new_attempt(self) -> None:
        if self.attempt.done():
            self.attempt = asyncio.get_running_loop().create_future()

    def in_use(self) -> bool:
        # A held forward keeps the link (and so the connection's master, which carries it) open.
        return bool(self.pending) or any(self.subs.values()) or bool(self.forwards)

    def describe(self) -> dict[str, Any]:
        return {"host": self.name, "state": self.state, "message": self.message, "retry_s": self.retry_s,
                "pid": self.proc.pid if self.proc is not None and self.proc.returncode is None else None,
                "since": self.since, "sessions": sum(1 for s in self.subs.values() if s),
                "pending": len(self.pending),
                "forwards": [f"{f.local_port}->{f.remote_port}" for f, _ in self.forwards.values()],
                "subscriptions": sorted({ev for s in self.subs.values() for ev in s})}

    # -- the loop: connect, read, reconnect -------------------------------------------------------
    async def _run(self) -> None:
        tries = 0
        while not self.closed:
            self._new_attempt()
            self._set("connecting", f"connecting to {self.name}…")
            kind, words = await self._session()
            if self.closed:
                break
            if kind == "up":
                tries = 0  # it was up: a drop is retried after the first step of the back-off again
                words = f"the connection to {self.name} was lost"
                # A request from now on waits for the next try (its try was the one that was up).
                self._new_attempt()
            self._fail_pending(words)
            if kind in _FINAL:
                self._settle(words)
                self._set("down", words)
                self.service.links.pop(self.name, None)
                self.closed = True
                return
            delay = BACKOFF_S[min(tries, len(BACKOFF_S) - 1)]
            tries += 1
            if kind != "up":
                self._settle(words)
            self._set("connecting", f"{words}; connecting… (retry in {delay:g} s)", delay)
            await asyncio.sleep(delay)

    async def _session(self) -> tuple[str, str]:
        """One ssh session: ("up", "") after it was up and ended, else (kind, why it never came up)."""
        try:
            host = remote.find_host(self.name)
            argv = host.wrap(host.gaudi_gui_argv("agent", "--stdio"))
        except (HostError, OSError) as exc:
            return "missing", f"{self.name}: {exc}"
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True, limit=agentwire.MAX_LINE)
        except OSError as exc:
            return "ssh", f"ssh could not start: {exc.strerror or exc}"
        proc = self.proc
        assert proc.stdout is not None and proc.stderr is not None
        err: list[str] = []
        errors = asyncio.create_task(_read_tail(proc.stderr, err))
        was_up = False
        reader = asyncio.create_task(self._read(proc.stdout))
        try:
            hello = self._send({"op": "hello", "client": "host-link", "pid": os.getpid()})
            waits: set[asyncio.Future[Any]] = {reader, hello}
            done, _ = await asyncio.wait(waits, timeout=HELLO_TIMEOUT_S,
                                         return_when=asyncio.FIRST_COMPLETED)
            answer = hello.result() if hello in done and not hello.exception() else {}
            if answer and not answer.get("ok"):
                refused = str(answer.get("error") or "refused")
                return "failed", f"{self.name}'s agent refused the link: {refused}"
            if answer.get("ok"):
                was_up = True
                self.since = time.time()
                agent = hello.result().get("agent") or {}
                # "up" once the subscriptions are made again: an event published on the host after
                # a client heard "up" reaches it.
                await self._subscribe_again()
                self._settle(None)
                self._set("up", f"connected to {self.name} (gaudi-gui {agent.get('version', '?')})")
                await reader
            else:
                if reader in done:
                    # Its output ended with no hello (no agent behind the command): let ssh exit by
                    # itself first, so its exit status and stderr say why (killed, it read "dropped").
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(proc.wait(), 5)
                self._stop_proc()
            await asyncio.wait({reader}, timeout=5)
        finally:
            reader.cancel()
            self._stop_proc()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 10)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(errors, 2)
        if was_up:
            self._fail_pending(f"the connection to {self.name} was lost")
            return "up", ""
        return _explain(host, proc.returncode, "\n".join(err))

    async def _read(self, stdout: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                return
            if not line:
                return
            try:
                message = agentwire.decode(line)
            except WireError:
                self._other_protocol(line)  # else a login script's words, before the relay starts
                continue
            if "ev" in message:
                self._deliver(message)
                continue
            future = self.pending.pop(message.get("re", 0), None) if message.get("re") else None
            hears = self.hears.pop(message.get("re", 0), None) if message.get("re") else None
            if hears is not None and message.get("ok") and message.get("child_id"):
                # The host's agent subscribed the link to the child it started: its asker hears it
                # from its first line on, before the next line read here (its output) is delivered.
                keys = self.subs.setdefault(hears, {}).get(Ev.OUTPUT.value, set())
                if keys is not None:
                    keys.add(str(message["child_id"]))
                    self.subs[hears][Ev.OUTPUT.value] = keys
            if future is not None and not future.done():
                future.set_result(message)

    def _other_protocol(self, line: bytes) -> None:
        """A reply in another protocol version: its request is answered in words, not left waiting."""
        try:
            message = json.loads(line)
        except ValueError:
            return
        if isinstance(message, dict) and message.get("re") in self.pending:
            future = self.pending.pop(message["re"])
            words = (f"the agent on {self.name} speaks protocol {message.get('v')!r}, this one "
                     f"{agentwire.VERSION}: install the same gaudi-gui there "
                     f"(gaudi-gui hosts --setup {self.name})")
            if not future.done():
                future.set_result({"ok": False, "error": words})

    def _deliver(self, message: dict[str, Any]) -> None:
        """A host's event to the sessions that subscribed to it through this link, marked with the host."""
        ev = str(message.get("ev"))
        key = _key_of(message)
        out = {**message, "host": self.name}
        for session, subs in list(self.subs.items()):
            if ev in subs and (subs[ev] is None or key is None or key in (subs[ev] or ())):
                session.send(out)

    def _stop_proc(self) -> None:
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()

    def _fail_pending(self, words: str) -> None:
        pending, self.pending = self.pending, {}
        self.hears.clear()
        for future in pending.values():
            if not future.done():
                future.set_exception(LinkLost(words))

    # -- requests ---------------------------------------------------------------------------------
    def _send(self, message: dict[str, Any], asker: Session | None = None) -> asyncio.Future[dict[str, Any]]:
        """Write one request on the link; the future resolves with its reply (LinkLost on a drop).
        ``asker``: the local session that started a child there (it hears the child's output)."""
        self._next += 1
        if asker is not None:
            self.hears[self._next] = asker
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        proc = self.proc
        if proc is None or proc.stdin is None or proc.returncode is not None or proc.stdin.is_closing():
            future.set_exception(LinkLost(f"the connection to {self.name} is not open"))
            future.add_done_callback(_quiet)
            return future
        self.pending[self._next] = future
        future.add_done_callback(_quiet)
        proc.stdin.write(agentwire.encode({**message, "id": self._next}))
        return future

    async def wait_up(self, timeout: float = WAIT_UP_S) -> None:
        """Return once the link is up; Refused with the link's words when the try fails or times out."""
        if self.state == "up":
            return
        try:
            outcome = await asyncio.wait_for(asyncio.shield(self.attempt), timeout)
        except asyncio.TimeoutError:
            raise Refused(f"{self.name} did not answer within {timeout:g} s ({self.message})") from None
        if outcome is not None and self.state != "up":
            raise Refused(outcome)

    async def request(self, message: dict[str, Any], asker: Session | None = None) -> dict[str, Any]:
        """Carry ``message`` to the host's agent and return its reply's fields (Refused on ok:false)."""
        self.last_used = time.monotonic()
        await self.wait_up()
        body = {k: v for k, v in message.items() if k not in ("id", "host", "v")}
        try:
            reply = await self._send(body, asker if body.get("op") == "child.start" else None)
        except LinkLost as exc:
            raise Refused(f"{exc}; '{message.get('op')}' was not answered") from None
        finally:
            self.last_used = time.monotonic()
        if not reply.get("ok"):
            raise Refused(str(reply.get("error") or f"{self.name} refused '{message.get('op')}'"))
        return {k: v for k, v in reply.items() if k not in ("v", "re", "ok")}

    async def _subscribe_again(self) -> None:
        """After a reconnect: what the sessions had subscribed to on this host, asked again."""
        asked: list[asyncio.Future[dict[str, Any]]] = []
        self.made = _union(self.subs.values())
        for ev, keys in self.made.items():
            if keys is None:
                asked.append(self._send({"op": "subscribe", "events": [ev]}))
            else:
                asked += [self._send({"op": "subscribe", "events": [ev], "key": key}) for key in sorted(keys)]
        if asked:
            await asyncio.wait(asked, timeout=HELLO_TIMEOUT_S)

    def forget(self, session: Session, ev: str, key: str | None) -> bool:
        """Take ``session``'s subscription off; True when no session wants (ev, key) any more, so the
        host's agent may be told."""
        subs = self.subs.get(session)
        if subs is not None and ev in subs:
            keys = subs[ev]
            if key is not None and keys:
                keys.discard(key)
                if not keys:
                    subs.pop(ev)
            else:
                subs.pop(ev)
        union = _union(self.subs.values())
        if ev not in union:
            return True
        keys = union[ev]
        return key is not None and keys is not None and key not in keys

    async def close(self, words: str) -> None:
        self.closed = True
        forwards, self.forwards = list(self.forwards.values()), {}
        for forward, _ in forwards:  # before the link: the master would keep them after it
            await _ssh_forward(self.name, forward, cancel=True)
        self.task.cancel()
        self._stop_proc()
        self._fail_pending(words)
        self._settle(words)
        await tasks.end(self.task)
        self._set("down", words)


class HostsService:
    name = "hosts"

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.links: dict[str, Link] = {}
        self.linger_s = float(os.environ.get("GAUDI_GUI_HOST_LINGER_S", LINGER_S))
        self._watch: asyncio.Task[None] | None = None
        #: forwards being cancelled in the background (a session that ended: nobody awaits them)
        self._cancelling: set[asyncio.Task[Any]] = set()
        agent.forward = self.forward

    def ops(self) -> dict[str, Handler]:
        return {"hosts.connect": self._connect, "hosts.disconnect": self._disconnect,
                "hosts.forward": self._forward_port}

    async def start(self) -> None:
        self._watch = asyncio.create_task(self._linger())

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        # The forwards first (the master outlives the link by ControlPersist: it would keep the ports).
        cancels = [_ssh_forward(link.name, forward, cancel=True)
                   for link in self.links.values() for forward, _ in link.forwards.values()]
        for link in self.links.values():
            link.forwards.clear()
        if cancels or self._cancelling:
            await asyncio.wait([asyncio.ensure_future(c) for c in cancels] + list(self._cancelling),
                               timeout=FORWARD_TIMEOUT_S)
        for link in list(self.links.values()):
            await link.close(f"the agent ended its link to {link.name}")
        self.links.clear()

    def busy(self) -> list[str]:
        return []  # an open link never keeps the agent up

    def holds(self) -> list[str]:
        return [f"a port forward {f.local_port}->{f.remote_port} to {link.name}"
                for link in self.links.values() for f, _ in link.forwards.values()]

    def status(self) -> dict[str, Any]:
        links = [link.describe() for link in self.links.values()]
        summary = ", ".join(f"{d['host']} {d['state']}" for d in links)
        return {"links": links, "summary": f"links: {summary}" if links else ""}

    def subscribed(self, session: Session, ev: str, key: str | None) -> None:
        return None

    def session_gone(self, session: Session) -> None:
        for link in list(self.links.values()):
            for port, (forward, owner) in list(link.forwards.items()):
                if owner is session:  # its window is gone: nobody reads through the port any more
                    del link.forwards[port]
                    task = asyncio.ensure_future(_ssh_forward(link.name, forward, cancel=True))
                    self._cancelling.add(task)
                    task.add_done_callback(self._cancelling.discard)
            subs = link.subs.pop(session, None)
            for ev in subs or {}:
                if ev not in _union(link.subs.values()) and link.state == "up":
                    with contextlib.suppress(Exception):
                        link._send({"op": "unsubscribe", "events": [ev]})

    # -- links --------------------------------------------------------------------------------------
    def link(self, name: str) -> Link:
        """The host's link, opened when there is none (HostError for a name ssh cannot take)."""
        link = self.links.get(name)
        if link is None or link.closed:
            remote.check_destination(name)
            link = self.links[name] = Link(self, name)
        return link

    async def _linger(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, max(self.linger_s / 4, 0.05)))
            now = time.monotonic()
            for link in list(self.links.values()):
                if link.in_use():
                    link.last_used = now
                elif now - link.last_used >= self.linger_s:
                    self.links.pop(link.name, None)
                    await link.close(f"{link.name}: closed after {self.linger_s:g} s unused")

    async def forward(self, session: Session, message: dict[str, Any]) -> dict[str, Any] | None:
        """The agent's ``forward``: a request that names a host, carried over its link."""
        op = str(message.get("op", ""))
        if op in _OWN:
            return await self.ops()[op](session, message)
        name = str(message.get("host"))
        try:
            link = self.link(name)
        except HostError as exc:
            raise Refused(str(exc)) from None
        if op == "subscribe":
            return await self._subscribe(link, session, message)
        if op == "unsubscribe":
            return await self._unsubscribe(link, session, message)
        return await link.request(message, session)

    async def _subscribe(self, link: Link, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        names = [str(n) for n in message.get("events") or []]
        key = None if message.get("key") is None else str(message.get("key"))
        # Recorded before it is asked: the host's agent replays a job's history before its reply, and
        # events are delivered only to the sessions recorded here (a history sent first was lost).
        was_up = link.state == "up"
        subs = link.subs.setdefault(session, {})
        for name in names:
            if key is None:
                subs[name] = None
            else:
                keys = subs.get(name, set())
                if keys is not None:
                    keys.add(key)
                    subs[name] = keys
        if not was_up:
            # The link asks the host again for every subscription as it comes up: one it asked then is
            # not asked twice (the host's agent would replay a job's history twice).
            await link.wait_up()
            if all(_covers(link.made, name, key) for name in names):
                return {}
        return await link.request(message)

    async def _unsubscribe(self, link: Link, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        key = None if message.get("key") is None else str(message.get("key"))
        tell = [ev for ev in (str(n) for n in message.get("events") or []) if link.forget(session, ev, key)]
        if tell and link.state == "up":
            return await link.request({**message, "events": tell})
        return {}

    async def _connect(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        name = str(message.get("host") or "")
        try:
            link = self.link(name)
        except HostError as exc:
            raise Refused(str(exc)) from None
        link.last_used = time.monotonic()
        await link.wait_up()
        return {"state": link.state, "message": link.message}

    async def _forward_port(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        """``hosts.forward``: ``local_port`` here forwarded to ``remote_port`` on the host's loopback,
        on the connection of the host's link (made when there is none), or with ``cancel`` given back."""
        name = str(message.get("host") or "").strip()
        if name in ("", remote.LOCAL):
            raise Refused("hosts.forward needs a host (an SSH destination): this machine's own ports need "
                          "no forward")
        try:
            remote.check_destination(name)
        except HostError as exc:
            raise Refused(str(exc)) from None
        forward = Forward(_port(message, "local_port"), _port(message, "remote_port"))
        if message.get("cancel"):
            link = self.links.get(name)
            if link is not None:
                link.forwards.pop(forward.local_port, None)
            code, said = await _ssh_forward(name, forward, cancel=True)
            # No master (the connection went) or no such forward: either way the port is not forwarded.
            return {"cancelled": code == 0, "message": said}
        known = self.links.get(name)
        held = known.forwards.get(forward.local_port) if known is not None and not known.closed else None
        if held is not None and held[0] != forward:
            raise Refused(f"port {forward.local_port} here is already forwarded to port "
                          f"{held[0].remote_port} on {name}")
        if held is None:
            from gaudi_gui.core.serve import port_free
            # ssh answers 0 to a forward of a port someone else holds: the port is checked here first.
            if not port_free(forward.local_port, forward.local_address):
                raise Refused(f"port {forward.local_port} is already taken on this machine; choose another")
        # Asked again (a re-attached server, a connection made again): the master may be a new one.
        link = self.link(name)
        link.last_used = time.monotonic()
        await link.wait_up()
        code, said = await _ssh_forward(name, forward)
        if code != 0:
            raise Refused(f"the forward of port {forward.local_port} here to port {forward.remote_port} on "
                          f"{name} failed (ssh exit {code}{': ' + said if said else ''})")
        link.forwards[forward.local_port] = (forward, session)
        return {"local_port": forward.local_port, "remote_port": forward.remote_port}

    async def _disconnect(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        name = str(message.get("host") or "")
        link = self.links.pop(name, None)
        if link is not None:
            await link.close(f"disconnected from {name}")
        else:  # every client hears it, whether or not a link was open
            self.agent.publish(Ev.HOST, name, host=name, state="down", message=f"disconnected from {name}",
                               retry_s=0.0)
        return {"state": "down"}


def _port(message: dict[str, Any], name: str) -> int:
    """A TCP port argument (1..65535), or Refused naming it."""
    value = message.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise Refused(f"{name} must be a TCP port (1 to 65535), not {value!r}")
    return value


async def _ssh_forward(name: str, forward: Forward, *, cancel: bool = False) -> tuple[int, str]:
    """``ssh -O forward|cancel -L …`` on the multiplexed connection to ``name`` (the one its link rides
    on): (ssh's exit status, its last words). An argv: nothing here reaches a shell."""
    argv = [*remote.ssh_base(name), "-O", "cancel" if cancel else "forward", *forward.ssh_option(), "--",
            remote.ssh_target(name)]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        return remote.SSH_FAILED, f"ssh could not start: {exc.strerror or exc}"
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), FORWARD_TIMEOUT_S)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5)
        return remote.SSH_FAILED, f"ssh did not answer within {FORWARD_TIMEOUT_S:g} s"
    text = out.decode("utf-8", "replace")
    said = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
    return proc.returncode if proc.returncode is not None else remote.SSH_FAILED, said


def _quiet(future: asyncio.Future[Any]) -> None:
    """A request nobody awaits (a subscription made again) may fail with its link: not an error."""
    if not future.cancelled():
        future.exception()


def _union(all_subs: Any) -> Subs:
    out: Subs = {}
    for subs in all_subs:
        for ev, keys in subs.items():
            if keys is None or out.get(ev, set()) is None:
                out[ev] = None
            else:
                out.setdefault(ev, set()).update(keys)  # type: ignore[union-attr]
    return out


def _covers(made: Subs, ev: str, key: str | None) -> bool:
    """``made`` holds the subscription to ``ev`` (for ``key``: all of ``ev``, or that key)."""
    if ev not in made:
        return False
    keys = made[ev]
    return keys is None or (key is not None and key in keys)


def _key_of(message: dict[str, Any]) -> str | None:
    """The key an event is published under (a job's or a child's id), as the client reads it."""
    for name in ("job_id", "child_id"):
        value = message.get(name)
        if isinstance(value, str) and value:
            return value
    return None


async def _read_tail(stream: asyncio.StreamReader, out: list[str], keep: int = 20) -> None:
    """ssh's stderr, its last lines kept (what explains a failure)."""
    while True:
        line = await stream.readline()
        if not line:
            return
        out.append(line.decode("utf-8", "replace").rstrip())
        del out[:-keep]


def _explain(host: Host, code: int | None, err: str) -> tuple[str, str]:
    """(kind, words) for a session that never came up."""
    last = next((ln.strip() for ln in reversed(err.splitlines()) if ln.strip()), "")
    if code == remote.SSH_FAILED:
        return remote.explain_ssh_failure(host.name, err)
    if "No module named" in err or "invalid choice" in err or code in (126, 127):
        return "missing", (f"{host.name} has no gaudi-gui agent behind `{host.remote_command}` "
                           f"({last or f'exit {code}'}); fix: {remote.fix_command(host)}")
    if code is None or code < 0:
        return "dropped", f"the connection to {host.name} did not answer"
    return "failed", f"{host.name}'s agent did not answer ({last or f'exit {code}'})"


def make(agent: Agent) -> HostsService:
    return HostsService(agent)
