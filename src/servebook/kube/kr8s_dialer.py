"""The cluster's side of ``kube.portforward``: a dialer that opens the API server's
port-forward WebSocket to a Pod with a kr8s ``Api``'s credentials, and the ``pod_identity``
that tells a replaced or restarted Pod from the one a forward was opened to.

``Kr8sDialer(api)`` takes a kr8s ``Api`` (``kr8s.api()``) and uses its credentials
(``api.auth``: server, token, TLS context, proxy, SNI name, as kr8s loaded them from the
kubeconfig or service account) for its own HTTP client on the forwards' event loop; it
opens ``/api/v1/namespaces/NS/pods/POD/portforward?ports=PORT`` with the
``v4.channel.k8s.io`` subprotocol.  ``kr8s_pod_identity(api)`` is the ``pod_identity`` for
a synchronous ``kr8s.api()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from servebook.kube.objects import is_terminating, restarts
from servebook.kube.portforward import (
    PodIdentity,
    Stream,
    StreamBroken,
    StreamReported,
    describe_error,
)

PORTFORWARD_PROTOCOL = "v4.channel.k8s.io"

# A WebSocket port-forward's upgrade is a GET, authorized as `get pods/portforward`; from
# Kubernetes 1.35 the API server also checks `create` on it (preflight.admission's
# portforward_access: KEP-4006, kubernetes#134577).
PORTFORWARD_403 = (
    " (RBAC: needs get on pods/portforward, and create on it too from Kubernetes 1.35; "
    "`servebook preflight` lists what is missing)"
)


class _ChannelStream:
    """One port over the v4.channel.k8s.io protocol: binary frames whose first byte is the
    channel (0 data, 1 error for the first port); the first two bytes on each channel
    are the port number, little-endian."""

    def __init__(self, ws: Any, port: int, what: str) -> None:
        self._ws = ws
        self._port = port
        self._what = what
        self._prefix = {0: b"", 1: b""}

    async def read(self) -> bytes:
        from httpx_ws import (
            WebSocketDisconnect,
            WebSocketInvalidTypeReceived,
            WebSocketNetworkError,
        )

        while True:
            try:
                frame = await self._ws.receive_bytes()
            except WebSocketDisconnect as e:
                if e.code in (1000, 1005):  # normal closure / closed without a status
                    return b""
                raise StreamBroken(
                    f"the API server closed the port-forward to {self._what} "
                    f"(WebSocket code {e.code}{': ' + e.reason if e.reason else ''})"
                ) from e
            except WebSocketNetworkError as e:
                raise StreamBroken(
                    f"the connection to the API server for {self._what} broke"
                ) from e
            except WebSocketInvalidTypeReceived as e:
                raise StreamBroken(f"unexpected text frame from the API server: {e}") from e
            if not frame:
                continue
            channel, body = frame[0], bytes(frame[1:])
            if channel not in self._prefix:
                raise StreamBroken(f"unexpected port-forward channel {channel} for {self._what}")
            need = 2 - len(self._prefix[channel])
            if need > 0:
                self._prefix[channel] += body[:need]
                body = body[need:]
                got = self._prefix[channel]
                if len(got) == 2 and int.from_bytes(got, "little") != self._port:
                    raise StreamBroken(
                        f"the API server answered for port {int.from_bytes(got, 'little')}, "
                        f"not {self._port}"
                    )
            if not body:
                continue
            if channel == 1:
                text = body.decode("utf-8", errors="replace").strip()
                raise StreamReported(f"the port-forward to {self._what} reported: {text}")
            return body

    async def write(self, data: bytes) -> None:
        try:
            await self._ws.send_bytes(b"\x00" + data)
        except Exception as e:
            raise StreamBroken(f"sending to {self._what} failed: {describe_error(e)}") from e


class Kr8sDialer:
    """Dials a Pod's port through the API server's port-forward WebSocket, using the
    credentials of a kr8s ``Api`` (``kr8s.api()``).

    kr8s's own HTTP client belongs to kr8s's event loop, so this dialer builds its own
    httpx client on the forwards' loop from ``api.auth`` exactly as kr8s configures its
    own (server, bearer token, TLS context, proxy, SNI name); an HTTP 401 on the upgrade
    re-authenticates once through kr8s (exec plugins, refreshed tokens) and retries.
    """

    def __init__(self, api: Any, *, timeout_s: float = 10.0) -> None:
        self._api = api
        self._timeout_s = timeout_s
        self._client: Any = None

    async def _http(self) -> Any:
        import httpx

        auth = self._api.auth
        if not auth.server:
            await auth.reauthenticate()
        if self._client is None:
            verify = await auth.ssl_context()
        if self._client is None:  # (another dial may have made it meanwhile)
            self._client = httpx.AsyncClient(
                base_url=auth.server,
                verify=verify,
                timeout=httpx.Timeout(self._timeout_s),
                # Every forwarded connection holds one WebSocket, so one of this pool's
                # connections, for its life: httpx's default of 100 made the 101st dial
                # wait and time out at a bench level above 100 streams.  The forwards
                # open as many as the load has streams, no more.
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
                proxy=auth.proxy,
                headers={"User-Agent": "servebook"},
            )
        return self._client

    @contextlib.asynccontextmanager
    async def connect(self, namespace: str, pod: str, port: int) -> AsyncIterator[Stream]:
        import httpx
        from httpx_ws import WebSocketUpgradeError, aconnect_ws

        what = f"pod {namespace}/{pod} port {port}"
        client = await self._http()
        auth = self._api.auth
        url = f"/api/v1/namespaces/{namespace}/pods/{pod}/portforward"
        ws: Any = None
        async with contextlib.AsyncExitStack() as stack:
            for attempt in (1, 2):
                headers = {"Authorization": f"Bearer {auth.token}"} if auth.token else {}
                extensions = {"sni_hostname": auth.tls_server_name} if auth.tls_server_name else {}
                try:
                    ws = await stack.enter_async_context(
                        aconnect_ws(
                            url,
                            client,
                            subprotocols=[PORTFORWARD_PROTOCOL],
                            params={"ports": str(port)},
                            headers=headers,
                            extensions=extensions,
                            max_message_size_bytes=1024 * 1024,
                        )
                    )
                except WebSocketUpgradeError as e:
                    status = e.response.status_code
                    if status == 401 and attempt == 1:
                        await auth.reauthenticate()
                        continue
                    hint = {
                        401: " (the credentials were refused)",
                        403: PORTFORWARD_403,
                        404: " (no such pod)",
                    }.get(status, "")
                    raise StreamBroken(
                        f"the API server answered HTTP {status} {e.response.reason_phrase} "
                        f"to the port-forward for {what}{hint}"
                    ) from None
                except httpx.HTTPError as e:
                    raise StreamBroken(
                        f"cannot reach the API server {auth.server}: {describe_error(e)}"
                    ) from e
                break
            if ws.subprotocol != PORTFORWARD_PROTOCOL:
                raise StreamBroken(
                    f"the API server did not accept the {PORTFORWARD_PROTOCOL} protocol "
                    f"(it chose {ws.subprotocol!r})"
                )
            yield _ChannelStream(ws, port, what)

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


def kr8s_pod_identity(api: Any) -> PodIdentity:
    """A ``pod_identity`` for Forwards from a (synchronous) kr8s ``Api``: the Pod's UID and
    its containers' total restart count (a restarted engine has fresh counters just as a
    replaced Pod has), or None when the Pod is gone or being deleted."""

    from kr8s.objects import Pod  # the class itself: no API discovery requests

    def identity(namespace: str, pod: str) -> str | None:
        found = list(api.get(Pod, namespace=namespace, field_selector={"metadata.name": pod}))
        if not found:
            return None
        raw = dict(found[0].raw)
        if is_terminating(raw):
            return None
        return f"uid {raw.get('metadata', {}).get('uid')} restarts {restarts(raw)}"

    return identity


__all__ = ["PORTFORWARD_PROTOCOL", "Kr8sDialer", "kr8s_pod_identity"]
