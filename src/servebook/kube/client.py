"""One way into the Kubernetes API: connect, call with a bound, describe what went wrong.

Every servebook request to a cluster goes through here, so the kubeconfig, the context and
the timeouts a command was given hold for all of its requests (the probe Pod once read one
cluster and was created in another, because it opened kr8s its own way).

* ``connect(kubeconfig=None, context=None, request_timeout_s=..., connect_timeout_s=...)``
  returns a kr8s ``Api`` (kr8s's own session, credentials and re-authentication) with a
  timeout on every request.  kr8s loads the credentials and asks ``/version`` before it
  hands the Api back, and no request timeout applies to that yet: connecting runs in a
  thread of its own, bounded by ``connect_timeout_s``.
* ``call(api, method, path, doing, ...)`` sends one request through kr8s's
  ``Api.call_api`` and returns the JSON answer; the whole request, reading the body
  included, is bounded.  Every failure is a ``RequestFailed`` (exit 2) whose message names
  what was being done and the request (``GET /api/v1/nodes``), and which carries the HTTP
  code and the API server's ``Status`` for callers that treat some codes on their own
  (a 404 with ``missing_ok``, a 409 conflict).
* ``describe(err, doing)`` is the one-line description of a failed request.

kr8s is used directly, not wrapped: callers hold the kr8s ``Api`` and may hand it to kr8s
objects; ``call`` exists because raw paths, dry-run parameters and apply bodies are what
servebook sends most, and each needs the same bound and the same error.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, Unpack

from servebook.errors import UsageError

REQUEST_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 15.0

Obj = dict[str, Any]

_SERVICEACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


class ClusterUnreachable(UsageError):
    """The cluster could not be reached or read (no kubeconfig, unreachable, refused, timed
    out).  Exit code 2, like any input the command cannot use: "could not check" is never a
    pass.  ``reason`` is the bare why, for a caller that words the message its own way."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


class RequestFailed(ClusterUnreachable):
    """One request failed.  ``request`` is ``METHOD /path``; ``code`` the HTTP status (None
    when no answer came); ``status`` the API server's ``Status`` body (``reason``,
    ``message``, ``details.causes``), empty when there was none."""

    def __init__(
        self,
        message: str,
        *,
        request: str,
        doing: str,
        code: int | None = None,
        status: Obj | None = None,
    ) -> None:
        super().__init__(message)
        self.request = request
        self.doing = doing
        self.code = code
        self.status = status or {}

    @property
    def server_message(self) -> str:
        """What the API server said (its Status message), or this error's own text."""
        return str(self.status.get("message") or self.reason)


# ---------------------------------------------------------------------------------------
# Where the credentials are.


def kubeconfig_paths(kubeconfig: str | None = None) -> list[Path]:
    """The kubeconfig files to read: ``kubeconfig``, else ``KUBECONFIG``, else
    ``~/.kube/config``; several joined by the path separator, as kubectl allows."""
    raw = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p]


def credentials_problem(kubeconfig: str | None = None) -> str | None:
    """Why no cluster can be addressed at all, or None when there is a config to try."""
    paths = kubeconfig_paths(kubeconfig)
    if any(p.is_file() for p in paths):
        return None
    if os.environ.get("KUBERNETES_SERVICE_HOST") and _SERVICEACCOUNT_TOKEN.is_file():
        return None
    if kubeconfig:
        where = f"--kubeconfig {kubeconfig}"
    elif os.environ.get("KUBECONFIG"):
        where = f"KUBECONFIG={os.environ['KUBECONFIG']}"
    else:
        where = "~/.kube/config (KUBECONFIG is unset)"
    return f"no kubeconfig: {where} does not exist, and this is not a Pod in a cluster"


def _status_body(err: BaseException) -> Obj:
    status = getattr(err, "status", None)
    if isinstance(status, dict):
        return status
    response = getattr(err, "response", None)
    with contextlib.suppress(Exception):
        body = response.json() if response is not None else None
        if isinstance(body, dict):
            return body
    return {}


def describe(err: BaseException, doing: str, request: str = "") -> str:
    """One line for a failed request, naming what was being done and, when given, the
    request (``GET /api/v1/nodes``)."""
    from kr8s import APITimeoutError, ServerError

    if isinstance(err, RequestFailed):
        return str(err)
    tail = f"; {request}" if request else ""
    if isinstance(err, ServerError):
        response = getattr(err, "response", None)
        code = getattr(response, "status_code", None)
        status = _status_body(err)
        message = str(status.get("message") or err)
        reason = str(status.get("reason") or "")
        said = f"{code} {reason}".strip() if code else "an error"
        if code in (401, 403):
            return f"the API server refused {doing} ({said}: {message}{tail})"
        return f"{doing}: the API server answered {said} ({message}{tail})"
    if isinstance(err, APITimeoutError | TimeoutError):
        detail = "; ".join(x for x in (str(err), request) if x)
        return f"timed out {doing}" + (f" ({detail})" if detail else "")
    name = type(err).__name__
    text = f"{name} {doing}" + (f": {err}" if str(err) else "")
    return text + (f" ({request})" if request else "")


# ---------------------------------------------------------------------------------------
# Connecting.


@dataclass
class _Connecting:
    api: list[Any] = field(default_factory=list)
    failed: list[BaseException] = field(default_factory=list)


def connect(
    kubeconfig: str | None = None,
    context: str | None = None,
    *,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
) -> Any:
    """A kr8s ``Api`` for ``kubeconfig`` (else ``KUBECONFIG``, else ``~/.kube/config``, else
    the in-cluster service account) and ``context`` (else the current one), with
    ``request_timeout_s`` on every request.  ``ClusterUnreachable`` (exit 2) when there are
    no credentials, they cannot be loaded, the context does not exist, or the server does
    not answer ``/version`` within ``connect_timeout_s``."""
    problem = credentials_problem(kubeconfig)
    if problem:
        raise ClusterUnreachable(
            f"cannot reach the cluster: {problem}. Point KUBECONFIG (or --kubeconfig) at the "
            "cluster's config.",
            reason=problem,
        )
    import httpx
    import kr8s

    _quiet_kr8s_version_warning()
    # kr8s caches one Api per set of arguments and, asked with none, hands back any cached
    # one (possibly another cluster's): always name the kubeconfig, so the one given here
    # (or a changed KUBECONFIG) is the one used.
    paths = [str(p) for p in kubeconfig_paths(kubeconfig) if p.is_file()]
    config = os.pathsep.join(paths) or None
    box = _Connecting()

    def work() -> None:
        try:
            box.api.append(kr8s.api(kubeconfig=config, context=context))
        except BaseException as e:
            box.failed.append(e)

    # A daemon thread: a server that never answers cannot keep the process alive.
    worker = threading.Thread(target=work, name="servebook-kube-connect", daemon=True)
    worker.start()
    worker.join(connect_timeout_s)
    if box.failed or not box.api:
        where = f" (context {context})" if context else ""
        if box.failed:
            reason = _connect_failure(box.failed[0], context)
        else:
            reason = f"no answer from the API server within {connect_timeout_s:g} s"
        raise ClusterUnreachable(
            f"cannot reach the cluster{where}: {reason}. Check `kubectl get nodes` works with "
            f"the same kubeconfig ({_which_kubeconfig(kubeconfig, paths)}) and context.",
            reason=reason,
        ) from (box.failed[0] if box.failed else None)
    api = box.api[0]
    api.timeout = httpx.Timeout(request_timeout_s)
    share_reauthentication(api)
    return api


# kr8s warns on every connection to a Kubernetes release newer than the ones it lists (kr8s
# 0.20.15: "Kubernetes version v1.37.2 is not supported. Supported versions ... are 1.28 to
# 1.35"), on the user's terminal, for calls servebook's tests run against v1.37 (the test
# plane). The newest kr8s on PyPI lists no more; a real incompatibility shows up as an error.
_KR8S_VERSION_WARNING = r"Kubernetes version .* is not supported\. Supported versions for kr8s"


def _quiet_kr8s_version_warning() -> None:
    import warnings

    if not any(
        f[1] is not None and f[1].pattern == _KR8S_VERSION_WARNING for f in warnings.filters
    ):
        warnings.filterwarnings("ignore", message=_KR8S_VERSION_WARNING, category=UserWarning)


# A re-authentication this recent answers every 401 that comes after it: the requests that
# failed with the expired credentials were sent before it.
REAUTH_FRESH_S = 5.0


def share_reauthentication(api: Any) -> None:
    """Make kr8s's re-authentication safe under concurrent calls.

    kr8s answers a 401 (or 403) by re-loading the credentials (running an exec plugin
    again) and replacing its one HTTP client, closing the old one, inside each failed
    call.  With many calls in flight, as servebook's polls and Pod checks are when an EKS
    token expires, every one of them does so: the plugin runs once per call, the
    credentials are blank while it runs, and each replacement closes the client under the
    calls still using it, which then fail.  Here the re-authentications are one at a time
    and one that has just happened serves the calls queued behind it, and the client is
    replaced only when its credentials are not the current ones, the old one closed once
    its calls have had their request timeout to finish.  The credentials are the bearer
    token and the client certificate: an exec plugin may hand out either (a certificate
    that expired was renewed, and the client kept presenting the old one: every call then
    failed 401, found on the test plane).  (kr8s 0.20: ``Api.call_api``,
    ``Api._create_session``, ``KubeAuth.reauthenticate``.)"""
    import asyncio

    import anyio

    auth = api.auth
    reload_credentials = auth.reauthenticate
    new_session = api._create_session
    locks: dict[int, Any] = {}  # per event loop: kr8s's, and the forwards' own
    last = [float("-inf")]

    def credentials() -> tuple[Any, ...]:
        # kr8s writes a certificate an exec plugin gave to a new file on each run
        return (auth.token, auth.client_cert_file, auth.client_key_file)

    made_with = [credentials() if api._session is not None else None]

    async def reauthenticate() -> None:
        loop = id(asyncio.get_running_loop())
        async with locks.setdefault(loop, anyio.Lock()):
            if auth.server and asyncio.get_running_loop().time() - last[0] < REAUTH_FRESH_S:
                return
            await reload_credentials()
            last[0] = asyncio.get_running_loop().time()

    async def create_session() -> None:
        old = api._session
        if old is not None and not old.is_closed and made_with[0] == credentials():
            return  # already a client with the current credentials
        api._session = None  # kr8s would close it under the calls using it
        made_with[0] = credentials()
        await new_session()
        if old is not None and not old.is_closed:
            grace = _request_timeout(api) * 2
            asyncio.get_running_loop().call_later(
                grace, lambda: asyncio.ensure_future(old.aclose())
            )

    auth.reauthenticate = reauthenticate
    api._create_session = create_session


def _which_kubeconfig(kubeconfig: str | None, found: list[str]) -> str:
    """Where the credentials came from, for a person checking them."""
    if kubeconfig:
        return f"--kubeconfig {kubeconfig}"
    if os.environ.get("KUBECONFIG"):
        return f"KUBECONFIG={os.environ['KUBECONFIG']}"
    return found[0] if found else "the in-cluster service account"


def _connect_failure(err: BaseException, context: str | None) -> str:
    text = str(err)
    if context and isinstance(err, ValueError) and "context" in text.lower():
        return f"the kubeconfig has no context {context!r} ({text})"
    return describe(err, "loading the kubeconfig and asking the server for its version")


def server_of(api: Any) -> str:
    """``cluster URL (context NAME)``, for messages."""
    active = getattr(api.auth, "active_context", "")
    return f"cluster {api.auth.server}" + (f" (context {active})" if active else "")


# ---------------------------------------------------------------------------------------
# Calling.


def split_path(path: str) -> tuple[str, str, str]:
    """kr8s's (base, version, url) for an API path: ``/api/v1/nodes`` is
    (``/api``, ``v1``, ``nodes``), ``/apis/apps/v1/namespaces/x/deployments`` is
    (``/apis``, ``apps/v1``, ``namespaces/x/deployments``)."""
    parts = path.strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 2:
        return "/api", parts[1], "/".join(parts[2:])
    if parts[0] == "apis" and len(parts) >= 3:
        return "/apis", f"{parts[1]}/{parts[2]}", "/".join(parts[3:])
    raise ValueError(f"not a Kubernetes API path: {path!r}")


@dataclass(frozen=True)
class Answer:
    """A response: its status code, body text and the API server's warnings (``Warning``
    headers: Pod Security for workload objects, deprecated APIs)."""

    code: int
    text: str
    warnings: tuple[str, ...] = ()

    def json(self) -> Obj:
        with contextlib.suppress(ValueError):
            data = json.loads(self.text) if self.text else {}
            return data if isinstance(data, dict) else {}
        return {}


def _warnings(headers: Any) -> tuple[str, ...]:
    # RFC 7234 warn-code 299 "-" "text": the API server's admission and deprecation warnings.
    out = []
    for value in headers.get_list("warning") if hasattr(headers, "get_list") else []:
        text = str(value)
        if text.startswith("299 "):
            text = text[4:].lstrip("- ").strip()
            if len(text) >= 2 and text[0] == text[-1] == '"':
                # A quoted-string: the API server escapes the quotes inside it
                # (`would violate PodSecurity \"restricted:latest\": ...`).
                text = re.sub(r"\\(.)", r"\1", text[1:-1])
        out.append(text)
    return tuple(out)


class SendOptions(TypedDict, total=False):
    """The optional parts of one request, as ``send`` takes them (``call`` and
    ``resources.request`` pass them on as they are)."""

    params: Mapping[str, str] | None
    body: Obj | None
    content_type: str
    timeout_s: float | None


class CallOptions(SendOptions, total=False):
    """``send``'s options, and whether a 404 is an answer (None) rather than a failure."""

    missing_ok: bool


def send(
    api: Any,
    method: str,
    path: str,
    doing: str,
    *,
    params: Mapping[str, str] | None = None,
    body: Obj | None = None,
    content_type: str = "application/json",
    timeout_s: float | None = None,
) -> Answer:
    """One request through kr8s's ``Api.call_api``, on kr8s's event loop, bounded as a
    whole by ``timeout_s`` (default: the Api's request timeout).  ``RequestFailed`` for any
    failure, naming ``doing`` and the request."""
    import anyio
    from kr8s import ServerError
    from kr8s._async_utils import as_sync_func

    base, version, url = split_path(path)
    kwargs: dict[str, Any] = {}
    if params:
        kwargs["params"] = dict(params)
    if body is not None:
        kwargs["content"] = json.dumps(body)
        kwargs["headers"] = {"Content-Type": content_type}
    bound = timeout_s if timeout_s is not None else _request_timeout(api)

    async def go() -> Answer:
        with anyio.fail_after(bound):
            async with api.call_api(method, base=base, version=version, url=url, **kwargs) as r:
                return Answer(r.status_code, r.text, _warnings(r.headers))

    request = f"{method} {path}"
    try:
        return as_sync_func(go)()
    except Exception as e:
        code = getattr(getattr(e, "response", None), "status_code", None)
        status = _status_body(e) if isinstance(e, ServerError) else {}
        raise RequestFailed(
            describe(e, doing, request), request=request, doing=doing, code=code, status=status
        ) from e


def call(
    api: Any,
    method: str,
    path: str,
    doing: str,
    *,
    missing_ok: bool = False,
    **options: Unpack[SendOptions],
) -> Obj | None:
    """``send``, returning the answer's JSON object; None for a 404 when ``missing_ok``
    and the API server's ``Status`` says the object is not found (a plain-text 404 is an
    API the cluster does not serve: a failure)."""
    try:
        return send(api, method, path, doing, **options).json()
    except RequestFailed as e:
        if missing_ok and e.code == 404 and e.status:
            return None
        raise


def list_items(
    api: Any,
    path: str,
    doing: str,
    *,
    params: Mapping[str, str] | None = None,
    page: int = 500,
) -> list[Obj]:
    """Every item of a list, page by page (``limit``/``continue``, as kubectl pages), each
    request bounded on its own."""
    items: list[Obj] = []
    query = {**(params or {}), "limit": str(page)}
    while True:
        got = call(api, "GET", path, doing, params=query) or {}
        items.extend(i for i in got.get("items") or () if isinstance(i, dict))
        more = (got.get("metadata") or {}).get("continue")
        if not more:
            return items
        query["continue"] = str(more)


def _request_timeout(api: Any) -> float:
    timeout = getattr(api, "timeout", None)
    read = getattr(timeout, "read", None)
    return float(read) if isinstance(read, int | float) else REQUEST_TIMEOUT_S


__all__ = [
    "CONNECT_TIMEOUT_S",
    "REQUEST_TIMEOUT_S",
    "Answer",
    "CallOptions",
    "ClusterUnreachable",
    "RequestFailed",
    "SendOptions",
    "call",
    "connect",
    "credentials_problem",
    "describe",
    "kubeconfig_paths",
    "list_items",
    "send",
    "server_of",
    "share_reauthentication",
    "split_path",
]
