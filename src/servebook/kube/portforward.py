"""Port-forwards servebook opens and owns for the length of one command.

On Kubernetes, verify, bench, status and run reach every role's API and ``/metrics`` port
from this machine through forwards opened here.  servebook itself binds and listens on
each local port (127.0.0.1 only) for the whole command, and for every connection it
accepts it opens a byte stream to (Pod, port) through a pluggable *dialer*.  So a taken
local port is an error at open time (never a port silently shared with some other
process), and the transport can be tested apart from the cluster.

API::

    with Forwards(Kr8sDialer(api), pod_identity=kr8s_pod_identity(api), timeout_s=10) as fw:
        url = fw.open(role="decode", pod="tiny-pd-decode-abc", namespace="ns",
                      remote_port=8000)              # -> "http://127.0.0.1:PORT"
        ...                                          # HTTP through url (any thread/process)
        fw.problems()    # {} or {role: reason}, the first failure of each role
        fw.alive("decode")                           # False once any forward of it failed
        fw.check()       # checks the Pods now; raises ForwardFailed(role, reason) if any

``Forwards(dialer, *, pod_identity, timeout_s=10.0, watch_period_s=2.0)``
    ``pod_identity(namespace, pod) -> str | None`` says which incarnation of the Pod is
    running (e.g. its UID and container restart count), or None when the Pod is gone or
    being deleted.  It is called once at open (and a Pod that is not there then is
    ``ForwardUnavailable``), then every ``watch_period_s`` for every forwarded Pod, each
    call bounded by ``timeout_s``.  Any change, None, an error or a timeout fails every
    forward of that Pod: counters read across a replaced Pod would silently mean nothing.
``open(role, pod, namespace, remote_port, local_port=0) -> str``
    Listens on 127.0.0.1:``local_port`` (0: a free port chosen by the OS) and returns the
    base URL.  Opening the same (namespace, pod, remote_port) again returns the same URL
    (for the same role; another role, or another explicit local port, is a ValueError).
    Raises ``ForwardUnavailable`` (a ``UsageError``: exit 2, "could not run") naming the
    role, Pod and port when the local port is taken or the Pod is not there.
``problems() -> dict[str, str]``
    role -> the first failure recorded for that role; the reason names the Pod and port.
``alive(role) -> bool``
    True while every forward of ``role`` works (KeyError for a role never opened).
``check() -> None``
    Runs the Pod identity checks now (bounded), then raises ``ForwardFailed`` for the
    first problem, if any.  Call it after the work whose results depend on the forwards.
``close()`` (and leaving the ``with``; ``start()`` is the explicit entry)
    Closes every listener and stream and the dialer (``dialer.aclose()``), stops the
    watcher and joins the thread, within about ``1.25 * timeout_s`` even with streams in
    flight.  It raises nothing and does not check: call ``check()`` first.
``ForwardFailed(role, reason)`` carries ``exit_code = 2`` but is not a UsageError (the
command did start); ``ForwardUnavailable(role, reason, pod=, port=)`` is one.

A forward *fails* when its dialer cannot open a stream within ``timeout_s`` (refused, HTTP
403/404 on the port-forward upgrade), when a stream to the Pod breaks (a WebSocket that
drops or closes abnormally), when the kubelet reports on the error channel that nothing
listens on the port (``REFUSED``), or when its Pod is replaced. Any other error the
kubelet reports for a stream (``StreamReported``: a connection reset inside the Pod,
containerd#9875) resets that client connection alone, and fails the forward only when
``REPORTED_IN_A_ROW`` streams in a row end so. A failure is recorded under the role
(``problems()``), every open connection of that forward is reset and every later one is
reset at once: the client sees a connection reset, never a clean short answer, and the
local port stays held so nothing else can answer on it. A clean end of a stream from the
Pod (an HTTP server closing the connection after its response) is relayed as a clean
close, and is not a failure (a client reading a short answer still sees it as short; an
engine that crashed and was restarted is caught by ``pod_identity``). The port-forward
protocol has no half-close, so a client that ends its side ends the connection.

A dialer is any object with ``connect(namespace, pod, port)`` returning an async context
manager that yields a ``Stream`` (``read() -> bytes``, b"" at a clean end, raising at a
break; ``write(data)``), and ``async aclose()``; both run on the forwards' event loop
thread.  The cluster's is ``kube.kr8s_dialer.Kr8sDialer`` (the API server's port-forward
WebSocket), with ``kr8s_pod_identity`` as the ``pod_identity``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from servebook.errors import UsageError
from servebook.findings import EXIT_UNUSABLE

LOOPBACK = "127.0.0.1"
_CHUNK = 64 * 1024

PodIdentity = Callable[[str, str], str | None]
T = TypeVar("T")


class ForwardUnavailable(UsageError):
    """A forward could not be opened (the local port is taken, the Pod is not there): the
    command cannot run, exit 2."""

    def __init__(self, role: str, reason: str, *, pod: str = "", port: int | None = None):
        self.role = role
        self.reason = reason
        self.pod = pod
        self.port = port
        super().__init__(f"cannot open a port-forward for role {role!r}: {reason}")


class ForwardFailed(Exception):
    """A forward that was working failed during the command (dialing, a broken stream, a
    replaced Pod).  Whatever was measured through it cannot be trusted: exit 2."""

    exit_code = EXIT_UNUSABLE

    def __init__(self, role: str, reason: str):
        self.role = role
        self.reason = reason
        super().__init__(f"port-forward for role {role!r} failed: {reason}")


class StreamBroken(Exception):
    """Raised by a Stream (or a dialer) when the byte stream to the Pod breaks, as opposed
    to ending cleanly."""


class StreamReported(StreamBroken):
    """The far end reported an error for this one stream (the kubelet's port-forward error
    channel): its connection to the container's port failed, the transport did not."""


# A reported error that fails the forward at once: nothing listens on the Pod's port.
REFUSED = "connection refused"
# Reported errors on this many streams in a row, none working between, fail the forward:
# the kubelet reports ordinary connection resets there (containerd#9875), one of which
# among hundreds of streams says nothing about the Pod.
REPORTED_IN_A_ROW = 3


class Stream(Protocol):
    async def read(self) -> bytes: ...

    async def write(self, data: bytes) -> None: ...


class Dialer(Protocol):
    def connect(
        self, namespace: str, pod: str, port: int
    ) -> AbstractAsyncContextManager[Stream]: ...

    async def aclose(self) -> None: ...


@dataclass(eq=False)
class _Forward:
    role: str
    namespace: str
    pod: str
    remote_port: int
    sock: socket.socket
    identity: str
    server: asyncio.Server | None = None
    failed: str | None = None
    conns: set[asyncio.Task[None]] = field(default_factory=set)
    reported: int = 0  # streams in a row that ended in a reported error

    @property
    def local_port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.local_port}"

    @property
    def what(self) -> str:
        return f"pod {self.namespace}/{self.pod} port {self.remote_port}"


def describe_error(e: BaseException) -> str:
    """An exception as one line of a reason: its type, and its text when it has one."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close a local connection with a TCP reset, so the client sees an error rather than
    a clean (possibly short) end of the answer."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Forwards:
    """Port-forwards owned by one command; see the module docstring."""

    def __init__(
        self,
        dialer: Dialer,
        *,
        pod_identity: PodIdentity,
        timeout_s: float = 10.0,
        watch_period_s: float = 2.0,
    ) -> None:
        if timeout_s <= 0 or watch_period_s <= 0:
            raise ValueError("timeout_s and watch_period_s must be positive")
        self._dialer = dialer
        self._pod_identity = pod_identity
        self._timeout_s = timeout_s
        self._period_s = watch_period_s
        self._forwards: dict[tuple[str, str, int], _Forward] = {}
        self._problems: dict[str, str] = {}
        self._lock = threading.Lock()
        self._open_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> Forwards:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        if self._closed:
            raise RuntimeError("these port-forwards are closed")
        if self._loop is not None:
            return
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="servebook-portforward", daemon=True)
        self._thread.start()
        ready.wait(self._timeout_s)
        self._run(self._start_watcher())

    def close(self) -> None:
        if self._closed or self._loop is None or self._thread is None:
            self._closed = True
            return
        self._closing = True
        self._closed = True
        loop, thread = self._loop, self._thread
        with contextlib.suppress(Exception):
            self._run(self._shutdown(), timeout=self._timeout_s)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(max(1.0, self._timeout_s / 4))
        for fwd in self._forwards.values():
            fwd.sock.close()

    # -- public API ------------------------------------------------------------------
    def open(
        self, role: str, pod: str, namespace: str, remote_port: int, local_port: int = 0
    ) -> str:
        if self._loop is None or self._closed:
            raise RuntimeError("use Forwards as a context manager (or call start()) first")
        if not 0 < remote_port < 65536 or not 0 <= local_port < 65536:
            raise ValueError(
                f"bad port for role {role!r}: remote {remote_port}, local {local_port}"
            )
        with self._open_lock:
            return self._open(role, pod, namespace, remote_port, local_port)

    def _open(self, role: str, pod: str, namespace: str, remote_port: int, local_port: int) -> str:
        key = (namespace, pod, remote_port)
        with self._lock:
            known = self._forwards.get(key)
        if known is not None:
            if known.role != role:
                raise ValueError(
                    f"{known.what} is already forwarded for role {known.role!r}, not {role!r}"
                )
            if local_port not in (0, known.local_port):
                raise ValueError(
                    f"{known.what} is already forwarded on local port {known.local_port}"
                )
            return known.url

        try:
            identity = self._run(self._identity(namespace, pod), timeout=self._timeout_s + 1)
        except TimeoutError as e:
            raise ForwardUnavailable(
                role,
                f"cannot read pod {namespace}/{pod}: no answer within {self._timeout_s:g} s",
                pod=pod,
            ) from e
        except Exception as e:
            raise ForwardUnavailable(
                role, f"cannot read pod {namespace}/{pod}: {describe_error(e)}", pod=pod
            ) from e
        if identity is None:
            raise ForwardUnavailable(
                role, f"pod {namespace}/{pod} is not there or is being deleted", pod=pod
            )

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            # SO_REUSEADDR lets a port in TIME_WAIT be reused; it never lets two sockets
            # listen on one port (that needs SO_REUSEPORT, which is not set).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((LOOPBACK, local_port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                reason = (
                    f"local port {local_port} on {LOOPBACK} is already in use "
                    f"({e.strerror}); free it or choose another port"
                )
            else:
                reason = f"cannot listen on {LOOPBACK}:{local_port}: {describe_error(e)}"
            raise ForwardUnavailable(role, reason, pod=pod, port=local_port) from e

        fwd = _Forward(role, namespace, pod, remote_port, sock, identity)
        try:
            self._run(self._listen(fwd), timeout=self._timeout_s)
        except BaseException:
            sock.close()
            raise
        with self._lock:
            self._forwards[key] = fwd
        return fwd.url

    def problems(self) -> dict[str, str]:
        with self._lock:
            return dict(self._problems)

    def alive(self, role: str) -> bool:
        with self._lock:
            mine = [f for f in self._forwards.values() if f.role == role]
            if not mine:
                raise KeyError(f"no port-forward was opened for role {role!r}")
            return role not in self._problems and all(f.failed is None for f in mine)

    def check(self) -> None:
        if self._loop is not None and not self._closed:
            with contextlib.suppress(TimeoutError):
                self._run(self._check_pods(), timeout=self._timeout_s + 1)
        with self._lock:
            first = next(iter(self._problems.items()), None)
        if first is not None:
            raise ForwardFailed(*first)

    # -- on the event loop -----------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        assert self._loop is not None
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(self._timeout_s if timeout is None else timeout)
        except TimeoutError:
            fut.cancel()
            raise

    async def _start_watcher(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _listen(self, fwd: _Forward) -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            # The connection's own task: cancelled only by a failure or by close(), which
            # have dealt with it; a cancelled task here would be logged as an error.
            with contextlib.suppress(asyncio.CancelledError):
                await self._serve(fwd, reader, writer)

        fwd.server = await asyncio.start_server(serve, sock=fwd.sock, limit=_CHUNK)

    def _fail(self, fwd: _Forward, reason: str) -> None:
        if self._closing:
            return
        with self._lock:
            if fwd.failed is not None:
                return
            fwd.failed = reason
            self._problems.setdefault(fwd.role, reason)
        me = asyncio.current_task()
        for task in list(fwd.conns):
            if task is not me:
                task.cancel()

    async def _serve(
        self, fwd: _Forward, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        fwd.conns.add(task)
        broken: str | None = "closing"
        try:
            if fwd.failed is not None or self._closing:
                return
            async with contextlib.AsyncExitStack() as stack:
                try:
                    async with asyncio.timeout(self._timeout_s):
                        stream = await stack.enter_async_context(
                            self._dialer.connect(fwd.namespace, fwd.pod, fwd.remote_port)
                        )
                except TimeoutError:
                    broken = f"no stream to {fwd.what} within {self._timeout_s:g} s"
                    self._fail(fwd, broken)
                    return
                except Exception as e:
                    broken = f"cannot open a stream to {fwd.what}: {describe_error(e)}"
                    self._fail(fwd, broken)
                    return
                broken, alone = await self._relay(fwd, stream, reader, writer)
                if broken is None:
                    fwd.reported = 0
                elif alone and fwd.reported + 1 < REPORTED_IN_A_ROW:
                    fwd.reported += 1  # this connection is reset; the forward stands
                else:
                    self._fail(fwd, broken)
        except asyncio.CancelledError:
            broken = broken or "cancelled"
            raise
        except BaseException as e:  # a dialer's close failing: the stream broke
            broken = f"the stream to {fwd.what} failed: {describe_error(e)}"
            self._fail(fwd, broken)
        finally:
            fwd.conns.discard(task)
            if broken is None:
                writer.close()
            else:
                _reset(writer)

    async def _relay(
        self,
        fwd: _Forward,
        stream: Stream,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> tuple[str | None, bool]:
        """Copy bytes both ways until one side ends; the reason when the Pod side broke,
        and whether it broke for this stream alone (a ``StreamReported`` other than
        ``REFUSED``)."""
        alone = False

        async def up() -> str | None:  # client -> Pod
            while True:
                try:
                    data = await reader.read(_CHUNK)
                except OSError:
                    return None  # the client went away: not the forward's failure
                if not data:
                    return None
                try:
                    await stream.write(data)
                except Exception as e:
                    return f"writing to {fwd.what} failed: {describe_error(e)}"

        async def down() -> str | None:  # Pod -> client
            nonlocal alone
            while True:
                try:
                    data = await stream.read()
                except Exception as e:
                    alone = isinstance(e, StreamReported) and REFUSED not in str(e)
                    return f"the stream from {fwd.what} broke: {describe_error(e)}"
                if not data:
                    return None
                try:
                    writer.write(data)
                    await writer.drain()
                except OSError:
                    return None

        t_up = asyncio.ensure_future(up())
        t_down = asyncio.ensure_future(down())
        try:
            await asyncio.wait({t_up, t_down}, return_when=asyncio.FIRST_COMPLETED)
            if t_down.done():
                return t_down.result(), alone
            failed_write = t_up.result()
            if failed_write is None:
                return None, False
            # A write fails when the Pod side has ended: let the reading side say whether
            # that end was clean, for a bounded moment.
            await asyncio.wait({t_down}, timeout=min(1.0, self._timeout_s))
            return (t_down.result(), alone) if t_down.done() else (failed_write, False)
        finally:
            for t in (t_up, t_down):
                t.cancel()
            await asyncio.gather(t_up, t_down, return_exceptions=True)

    async def _identity(self, namespace: str, pod: str) -> str | None:
        """pod_identity in a daemon thread of its own, bounded by timeout_s: a hung call
        cannot hang the command (nor its exit)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[str | None] = loop.create_future()

        def settle(value: str | None, error: BaseException | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(value)

        def work() -> None:
            value: str | None = None
            error: BaseException | None = None
            try:
                value = self._pod_identity(namespace, pod)
            except BaseException as e:
                error = e
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, value, error)

        threading.Thread(target=work, name="servebook-pod-identity", daemon=True).start()
        async with asyncio.timeout(self._timeout_s):
            return await fut

    async def _check_pods(self) -> None:
        with self._lock:
            by_pod: dict[tuple[str, str], list[_Forward]] = {}
            for fwd in self._forwards.values():
                if fwd.failed is None:
                    by_pod.setdefault((fwd.namespace, fwd.pod), []).append(fwd)

        async def one(namespace: str, pod: str, fwds: list[_Forward]) -> None:
            try:
                now = await self._identity(namespace, pod)
            except TimeoutError:
                why = f"pod identity check timed out after {self._timeout_s:g} s"
                reason = f"cannot confirm pod {namespace}/{pod} is still the same: {why}"
            except Exception as e:
                reason = (
                    f"cannot confirm pod {namespace}/{pod} is still the same: {describe_error(e)}"
                )
            else:
                for fwd in fwds:
                    if now != fwd.identity:
                        self._fail(
                            fwd,
                            f"pod {namespace}/{pod} is gone or being deleted"
                            if now is None
                            else f"pod {namespace}/{pod} was replaced ({fwd.identity} -> {now})",
                        )
                return
            for fwd in fwds:
                self._fail(fwd, reason)

        await asyncio.gather(*(one(ns, pod, fwds) for (ns, pod), fwds in by_pod.items()))

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._period_s)
            await self._check_pods()

    async def _shutdown(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        tasks: list[asyncio.Task[Any]] = [self._watcher] if self._watcher else []
        with self._lock:
            forwards = list(self._forwards.values())
        for fwd in forwards:
            if fwd.server is not None:
                fwd.server.close()
            for task in list(fwd.conns):
                task.cancel()
                tasks.append(task)
        budget = self._timeout_s * 0.6
        if tasks:
            await asyncio.wait(tasks, timeout=budget)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self._timeout_s * 0.3):
                await self._dialer.aclose()


__all__ = [
    "Dialer",
    "ForwardFailed",
    "ForwardUnavailable",
    "Forwards",
    "PodIdentity",
    "Stream",
    "StreamBroken",
    "describe_error",
]
