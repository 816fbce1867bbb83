"""Local backend: run a Plan as processes on this machine.

Each role is a process in its own process group, on its own port, logging to a file in the
deployment's state directory.  PIDs (with their kernel start times, so a recycled PID is
never mistaken for ours) and endpoints go to ``state.json`` as soon as each process starts,
so ``down`` works from another shell and after an interrupted ``up``.  Readiness means a
real completion through the entry point, within a bounded time; early death or timeout
fails with the role's last log lines and stops everything that was started.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from servebook import auth, http, redact
from servebook.backends.base import Down, Found, Ready
from servebook.deployment import DeploymentView, RoleView
from servebook.engines import vllm
from servebook.files import read_model, write_atomic
from servebook.findings import Finding, UsageError
from servebook.recipe.plan import Plan
from servebook.recipe.resolve import servebook_home
from servebook.recipe.schema import Generate
from servebook.verify.smoke import completion

HOST = "127.0.0.1"
STATE_FILE = "state.json"
# A Kubernetes deployment's record, beside where a local one's would be (backends.kubernetes).
KUBE_STATE_FILE = "kube-state.json"
SMOKE_PROMPT = "The quick brown fox"
PORT_RETRIES = 3


def port_clash(log_text: str) -> bool:
    """Whether a role's log says it died because its port was taken."""
    return "address already in use" in log_text.lower()


class RoleProcess(BaseModel):
    name: str
    kind: str
    pid: int
    start_ticks: int | None
    port: int
    url: str
    log: str
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    # A port of its own for /metrics (the router's Prometheus port); None: the API port.
    metrics_port: int | None = None


class Deployment(BaseModel):
    name: str
    backend: str = "local"
    recipe: str
    state_dir: str
    created: str
    served_model_name: str
    entry_role: str
    entry_url: str = ""
    roles: list[RoleProcess] = Field(default_factory=list)
    kv_storage: list[str] = Field(default_factory=list)
    ready: bool = False
    plan: dict[str, Any] = Field(default_factory=dict)

    def role(self, name: str) -> RoleProcess:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)


class UpFailed(Exception):
    """The deployment did not become ready: the message carries the evidence."""

    exit_code = 1

    def __init__(self, message: str, role: str | None = None, log_tail: str = "") -> None:
        super().__init__(message)
        self.role = role
        self.log_tail = log_tail


def deployments_dir() -> Path:
    return servebook_home() / "deployments"


def state_dir_for(name: str) -> Path:
    return deployments_dir() / name


# --- process bookkeeping ------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 on: [state, ppid, pgrp, ...], or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    return stat[stat.rindex(")") + 2 :].split()


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def is_ours_alive(proc: RoleProcess) -> bool:
    fields = _stat_fields(proc.pid)
    if not fields:
        return False
    if proc.start_ticks is not None and int(fields[19]) != proc.start_ticks:
        return False  # the PID was recycled by an unrelated process
    return fields[0] != "Z"


def group_members(pgids: Iterable[int]) -> set[int]:
    """Live (non-zombie) processes in the given process groups."""
    wanted = set(pgids)
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and int(fields[2]) in wanted and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies still count for killpg; look for a live member.
    return bool(group_members([pgid]))


def stop_process_group(proc: RoleProcess, grace_s: float = 15.0) -> str:
    """Stop the role's process group (the engine and the workers it spawned)."""
    # When the leader is gone its group may still hold children (vLLM's engine core).
    if not is_ours_alive(proc) and not _group_alive(proc.pid):
        return "not running"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(proc.pid)
        if not _group_alive(proc.pid):
            return "stopped"
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        _reap(proc.pid)
        if not _group_alive(proc.pid):
            return "killed"
        time.sleep(0.1)
    return "still running"


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def log_tail(path: str | Path, lines: int = 25) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    # Printed in up's failure messages and read into verify's findings: never a secret.
    return redact.text("\n".join(data.splitlines()[-lines:]))


# --- state file ---------------------------------------------------------------------------


def write_state(dep: Deployment) -> None:
    """Atomically: a reader never sees half a state file."""
    write_atomic(Path(dep.state_dir) / STATE_FILE, dep.model_dump_json(indent=2))


def read_state(name: str) -> Deployment | None:
    return read_model(
        state_dir_for(name) / STATE_FILE,
        Deployment,
        "a servebook state file",
        "Remove it if no processes of that deployment are running.",
    )


def list_deployments() -> list[Deployment]:
    root = deployments_dir()
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.iterdir()):
        dep = read_state(d.name) if (d / STATE_FILE).is_file() else None
        if dep is not None:
            out.append(dep)
    return out


def pick_deployment(name: str | None) -> Deployment | None:
    """The named deployment, or the only one there is."""
    if name:
        return read_state(name)
    deps = list_deployments()
    if len(deps) > 1:
        raise UsageError(
            "several deployments are recorded: "
            + ", ".join(d.name for d in deps)
            + ". Name one, e.g. `servebook down "
            + deps[0].name
            + "`."
        )
    return deps[0] if deps else None


# --- prerequisites ------------------------------------------------------------------------


def check_engine_installed() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise UsageError(
            f"vLLM is not installed in this Python environment ({sys.executable}). "
            "Install vLLM's CPU build with `scripts/setup.sh` (see README), then retry."
        )


def router_binary() -> str:
    beside = Path(sys.executable).parent / "vllm-router"
    if beside.is_file():
        return str(beside)
    found = shutil.which("vllm-router")
    if found:
        return found
    raise UsageError(
        "vllm-router is not installed (the PD entry point). Install it with "
        "`pip install vllm-router` or run `scripts/setup.sh`, then retry."
    )


def ensure_models(plan: Plan, say: Callable[[str], None]) -> None:
    """Create the tiny models a recipe may generate; refuse any other missing directory.

    Only directories under servebook's own cache are ever created: a missing directory
    the user named is reported, never created (field notes: a check that created the
    typo'd directory turned a fast failure into a slow crash loop)."""
    cache = (servebook_home() / "models").resolve()
    for role in plan.engine_roles:
        for kind, path in (("model", role.model_path), ("draft model", role.draft_path)):
            if path is None or Path(path).is_dir():
                continue
            gen = plan.generate.get(path)
            p = Path(path)
            if gen is not None and p.resolve().is_relative_to(cache):
                from servebook.models.tiny import make_tiny_model

                say(f"creating the tiny {kind} in {p} (servebook model tiny)")
                make_tiny_model(p, draft=gen is Generate.TINY_DRAFT)
                continue
            param = "draft_dir" if kind == "draft model" else "model_dir"
            raise UsageError(
                f"{kind} directory {path} (role {role.name}) does not exist. Point "
                f"--set {param}=DIR at an existing model directory, or create one with "
                f"`servebook model tiny DIR{' --draft' if kind == 'draft model' else ''}`."
            )


# --- up / down ----------------------------------------------------------------------------


def _spawn(
    argv: list[str], env: dict[str, str], log: Path, secret_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start one role.  ``secret_env`` (an API key) reaches the process's environment only:
    not its command line, where `ps` shows it, and not the recorded state."""
    log.parent.mkdir(parents=True, exist_ok=True)
    # One log per run: verify reads it for failure signatures, and an earlier run's engine
    # death must not be reported as this one's.  The previous run's log is kept beside it.
    if log.exists():
        os.replace(log, log.with_suffix(".prev.log"))
    with open(log, "wb") as f:
        shown = redact.argv(argv)[0]
        f.write(f"# servebook: {datetime.now(UTC).isoformat()} starting: {shown}\n".encode())
        f.flush()
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env, **(secret_env or {})},
            start_new_session=True,  # own process group: down stops exactly this tree
        )


def _health(url: str, timeout: float = 2.0) -> bool:
    try:
        return http.get(url + "/health", timeout=timeout).status == 200
    except http.HTTPError:
        return False


def smoke_completion(
    url: str, model: str, timeout: float, api_key: str | None = None
) -> dict[str, Any]:
    """One real completion through the entry point; raises on anything but a valid one
    (``auth.ApiKeyError`` when the server refuses it for want of the key)."""
    body, error = completion(url, model, SMOKE_PROMPT, 8, timeout, api_key)
    if body is None:
        raise http.HTTPError(error)
    choices = body.get("choices") or []
    if not choices or not isinstance(choices[0].get("text"), str):
        raise http.HTTPError(f"no completion text in the response: {str(body)[:300]}")
    return body


def up(
    plan: Plan,
    *,
    name: str | None = None,
    timeout_s: float = 600.0,
    entry_port: int | None = None,
    say: Callable[[str], None] = lambda s: None,
) -> Deployment:
    """Start every role of the Plan and wait until the entry point completes a request."""
    name = name or plan.recipe
    check_engine_installed()
    # The key readiness sends (a deployment may be protected by VLLM_API_KEY inherited from
    # this environment, or an --api-key in its arguments) and the engines get when the
    # recipe requires one.
    api_key = auth.for_engines()
    secret_env: dict[str, dict[str, str]] = {"engine": {}, "router": {}}
    if plan.require_api_key:
        if api_key is None:
            raise UsageError(
                f"recipe {plan.recipe} requires an API key (require_api_key: true): set "
                "OPENAI_API_KEY (or VLLM_API_KEY), or pass --api-key to `servebook run`. The "
                "engines get it as VLLM_API_KEY in their environment, never on their command "
                "line."
            )
        # vLLM reads VLLM_API_KEY; vllm-router sends $OPENAI_API_KEY as the bearer token of
        # its requests to prefill and decode (it checks no key of its own).
        secret_env = {"engine": {"VLLM_API_KEY": api_key}, "router": {"OPENAI_API_KEY": api_key}}
    router = router_binary() if any(r.kind == "router" for r in plan.roles) else None
    if plan.require_api_key and router is not None:
        # Seen on vllm-router 0.1.17: a PD completion without a key went through.
        say(
            "note: vllm-router checks no client key: the engines require one, but the PD "
            "entry point completes requests without it; do not expose its port"
        )
    existing = read_state(name)
    if existing is not None:
        alive = [r for r in existing.roles if is_ours_alive(r)]
        if alive:
            raise UsageError(
                f"deployment '{name}' is already up (pids "
                + ", ".join(str(r.pid) for r in alive)
                + f"). Stop it with `servebook down {name}`, or choose another --name."
            )
    held: dict[int, socket.socket] = {}
    if entry_port is not None:
        try:
            held[entry_port] = http.hold_port(HOST, entry_port)
        except OSError:
            raise UsageError(
                f"port {entry_port} on {HOST} is already taken. Choose a free one with --port, "
                "or leave it out and servebook picks one."
            ) from None
    try:
        ensure_models(plan, say)
    except BaseException:
        for s in held.values():
            s.close()
        raise

    sdir = state_dir_for(name)
    (sdir / "logs").mkdir(parents=True, exist_ok=True)
    (sdir / STATE_FILE).unlink(missing_ok=True)
    for kv in plan.kv_storage:
        shutil.rmtree(kv, ignore_errors=True)  # stale KV from an earlier run is not evidence
        Path(kv).mkdir(parents=True, exist_ok=True)
    dep = Deployment(
        name=name,
        recipe=plan.recipe,
        state_dir=str(sdir),
        created=datetime.now(UTC).isoformat(),
        served_model_name=plan.served_model_name,
        entry_role=plan.entry_role,
        kv_storage=list(plan.kv_storage),
        plan=plan.model_dump(mode="json"),
    )
    ports: dict[str, int] = {}
    fixed = {plan.entry_role} if entry_port is not None else set()

    # Ports are held (bound, not listening) from the moment they are chosen until their role
    # starts: engines starting meanwhile take ephemeral ports of their own (ZMQ, torch) from
    # the same range, and the kernel never hands out a port that a socket is bound to.

    def pick_port() -> int:
        while True:
            s = http.hold_port(HOST, 0)
            p = int(s.getsockname()[1])
            if p not in held and p not in ports.values():
                held[p] = s
                return p
            s.close()

    def release(port: int) -> None:
        s = held.pop(port, None)
        if s is not None:
            s.close()

    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        role_name: str,
        argv: list[str],
        env: dict[str, str],
        kind: str,
        metrics_port: int | None = None,
    ) -> None:
        log = sdir / "logs" / f"{role_name}.log"
        release(ports[role_name])
        proc = _spawn(argv, env, log, secret_env[kind])
        procs[role_name] = proc
        dep.roles.append(
            RoleProcess(
                name=role_name,
                kind=kind,
                pid=proc.pid,
                start_ticks=_start_ticks(proc.pid),
                port=ports[role_name],
                url=f"http://{HOST}:{ports[role_name]}",
                log=str(log),
                argv=argv,
                env=env,
                metrics_port=metrics_port,
            )
        )
        write_state(dep)
        say(f"started {role_name} (pid {proc.pid}, port {ports[role_name]}, log {log})")

    def start_role(role_name: str) -> None:
        if role_name in fixed and entry_port is not None:
            ports[role_name] = entry_port
        else:
            ports[role_name] = pick_port()
        rr = plan.role(role_name)
        if rr.kind == "router":
            assert router is not None
            # vllm-router always binds a Prometheus port (29000 by default): give it a free
            # one so two deployments, or anything else on 29000, cannot make it panic.
            metrics_port = pick_port()
            argv = vllm.router_argv(
                router,
                prefill_url=dep.role("prefill").url,
                decode_url=dep.role("decode").url,
                host=HOST,
                port=ports[role_name],
                extra=[*rr.args, "--prometheus-host", HOST, "--prometheus-port", str(metrics_port)],
            )
            release(metrics_port)
            start(role_name, argv, rr.env, "router", metrics_port)
        else:
            argv = vllm.server_argv(sys.executable, rr.args, HOST, ports[role_name])
            start(role_name, argv, rr.env, "engine")

    def start_healthy(names: list[str]) -> None:
        """Start the roles and wait for /health; a role that lost a port servebook chose
        to another process in the moment between choosing and binding starts again."""
        for n in names:
            start_role(n)
        for attempt in range(PORT_RETRIES + 1):
            try:
                _wait_healthy(dep, procs, names, deadline, say)
                return
            except UpFailed as e:
                failed = e.role
                if attempt == PORT_RETRIES or failed is None or failed in fixed:
                    raise
                if not port_clash(e.log_tail):
                    raise
                say(f"{failed} could not bind port {ports[failed]}: starting it on another one")
                stop_process_group(dep.role(failed), grace_s=5)
                with contextlib.suppress(Exception):
                    procs[failed].wait(timeout=1)
                dep.roles = [r for r in dep.roles if r.name != failed]
                start_role(failed)

    deadline = time.monotonic() + timeout_s
    try:
        start_healthy([r.name for r in plan.engine_roles])
        if router is not None:
            start_healthy(["router"])
        dep.entry_url = dep.role(plan.entry_role).url
        write_state(dep)
        _wait_completion(dep, procs, deadline, say, api_key)
        dep.ready = True
        write_state(dep)
        return dep
    except BaseException:
        for port in list(held):
            release(port)
        # Nothing stray: whatever was started is stopped; logs stay for the post-mortem.
        for rp in reversed(dep.roles):
            stop_process_group(rp, grace_s=5)
        for child in procs.values():
            with contextlib.suppress(Exception):
                child.wait(timeout=1)
        (sdir / STATE_FILE).unlink(missing_ok=True)
        for kv in plan.kv_storage:
            shutil.rmtree(kv, ignore_errors=True)
        raise


def _check_alive(
    dep: Deployment, procs: dict[str, subprocess.Popen[bytes]], names: list[str]
) -> None:
    for n in names:
        rc = procs[n].poll()
        if rc is not None:
            rp = dep.role(n)
            tail = log_tail(rp.log)
            raise UpFailed(
                f"role '{n}' exited with code {rc} before it was ready. Last lines of "
                f"{rp.log}:\n{tail}",
                role=n,
                log_tail=tail,
            )


def _timeout(dep: Deployment, names: list[str], what: str, timeout_hint: str) -> UpFailed:
    parts = []
    for n in names:
        rp = dep.role(n)
        parts.append(
            f"--- {n} (pid {rp.pid}, {rp.url}), last lines of {rp.log}:\n{log_tail(rp.log, 15)}"
        )
    return UpFailed(
        f"timed out waiting for {what}: {', '.join(names)}. {timeout_hint}\n" + "\n".join(parts),
        role=names[0] if names else None,
    )


def _wait_healthy(
    dep: Deployment,
    procs: dict[str, subprocess.Popen[bytes]],
    names: list[str],
    deadline: float,
    say: Callable[[str], None],
) -> None:
    pending = list(names)
    t0 = time.monotonic()
    while pending:
        _check_alive(dep, procs, pending)
        for n in list(pending):
            if _health(dep.role(n).url):
                pending.remove(n)
                say(f"{n} is healthy after {time.monotonic() - t0:.0f} s")
        if not pending:
            return
        if time.monotonic() > deadline:
            raise _timeout(dep, pending, "/health", "Raise --timeout if the model is large.")
        time.sleep(0.5)


def _wait_completion(
    dep: Deployment,
    procs: dict[str, subprocess.Popen[bytes]],
    deadline: float,
    say: Callable[[str], None],
    api_key: str | None = None,
) -> None:
    last = ""
    while True:
        _check_alive(dep, procs, [r.name for r in dep.roles])
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            err = _timeout(
                dep,
                [r.name for r in dep.roles],
                f"a completion through the entry point {dep.entry_url}",
                f"Last error: {last}",
            )
            raise err
        try:
            body = smoke_completion(
                dep.entry_url, dep.served_model_name, min(60.0, remaining), api_key
            )
            say(f"entry point {dep.entry_url} completed a request: {body['choices'][0]['text']!r}")
            return
        except http.HTTPError as e:
            last = str(e)
            time.sleep(1.0)


def down(name: str | None) -> tuple[Deployment | None, dict[str, str]]:
    """Stop exactly the processes the deployment started; idempotent."""
    dep = pick_deployment(name)
    if dep is None:
        return None, {}
    result: dict[str, str] = {}
    # Router first, so no new request reaches an engine that is stopping.
    for rp in sorted(dep.roles, key=lambda r: r.kind != "router"):
        result[rp.name] = stop_process_group(rp)
    for kv in dep.kv_storage:
        shutil.rmtree(kv, ignore_errors=True)
    if all(v != "still running" for v in result.values()):
        (Path(dep.state_dir) / STATE_FILE).unlink(missing_ok=True)
    return dep, result


def status(dep: Deployment) -> dict[str, Any]:
    roles = []
    for rp in dep.roles:
        alive = is_ours_alive(rp)
        healthy = alive and _health(rp.url)
        state = "healthy" if healthy else ("alive, not healthy" if alive else "down")
        roles.append(
            {
                "name": rp.name,
                "kind": rp.kind,
                "state": state,
                "ok": alive,
                "summary": f"pid {rp.pid:>7}  {rp.url}",
                "pid": rp.pid,
                "port": rp.port,
                "url": rp.url,
                "alive": alive,
                "healthy": healthy,
                "log": rp.log,
            }
        )
    return {
        "name": dep.name,
        "backend": dep.backend,
        "recipe": dep.recipe,
        "entry": dep.entry_url,
        "entry_url": dep.entry_url,
        "served_model_name": dep.served_model_name,
        "state_dir": dep.state_dir,
        "roles": roles,
    }


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2)


# --- what verify and bench see -------------------------------------------------------------


def process_state(proc: RoleProcess) -> str:
    """A short description of the role's process for messages ("stopped (SIGSTOP)")."""
    fields = _stat_fields(proc.pid)
    if not fields or not is_ours_alive(proc):
        return f"pid {proc.pid} is not running"
    state = fields[0]
    names = {"T": "stopped (SIGSTOP)", "t": "stopped by a tracer", "D": "in uninterruptible I/O"}
    return f"pid {proc.pid} {names.get(state, 'running')}"


def view(dep: Deployment) -> DeploymentView:
    """The deployment as verify, bench and run see it: processes on this machine."""
    plan = Plan.model_validate(dep.plan)
    roles = [
        RoleView(
            name=rp.name,
            kind=rp.kind,
            api_url=rp.url,
            metrics_url=f"http://{HOST}:{rp.metrics_port}" if rp.metrics_port else rp.url,
            argv=list(rp.argv),
            env=dict(rp.env),
            alive=lambda rp=rp: is_ours_alive(rp),  # type: ignore[misc]
            describe=lambda rp=rp: process_state(rp),  # type: ignore[misc]
            log=lambda rp=rp: log_tail(rp.log, lines=4000),  # type: ignore[misc]
        )
        for rp in dep.roles
    ]
    return DeploymentView(
        name=dep.name,
        backend=dep.backend,
        recipe=dep.recipe,
        plan=plan,
        served_model_name=dep.served_model_name,
        entry_url=dep.entry_url,
        roles=roles,
        local_model_dir=plan.engine_roles[0].model_path,
        accelerators=None,  # CPU processes: per-accelerator figures are n/a
    )


def _no_namespace(namespace: str | None) -> None:
    if namespace is not None:
        raise UsageError("-n/--namespace is for --backend kubernetes (a cluster's namespace).")


class LocalBackend:
    """``Backend`` for processes on this machine (module docstring)."""

    name = "local"
    title = "the local backend"
    recipes_hint = "Use a tiny-* recipe locally (`servebook recipes`)."
    up_cost = "about a minute on a 2-core machine (vLLM's CPU build, the tiny model)"

    def recorded(self) -> list[str]:
        return [d.name for d in list_deployments()]

    def has(self, name: str) -> bool:
        return read_state(name) is not None

    def preflight(self, plan: Plan) -> list[Finding]:
        return []  # up itself refuses a missing engine, router or model at once

    def up(
        self,
        plan: Plan,
        *,
        name: str,
        timeout_s: float | None,
        say: Callable[[str], None],
        port: int | None = None,
    ) -> Ready:
        dep = up(
            plan,
            name=name,
            timeout_s=timeout_s if timeout_s is not None else 600.0,
            entry_port=port,
            say=say,
        )
        return Ready(
            dep.name,
            f"ready at {dep.entry_url} (model '{dep.served_model_name}'); state in {dep.state_dir}",
        )

    def found(self, namespace: str | None = None) -> list[Found]:
        _no_namespace(namespace)
        return [
            Found(d.name, "", d.recipe, tuple(r.name for r in d.roles)) for d in list_deployments()
        ]

    def status(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        _no_namespace(namespace)
        return status(self._require(name))

    def down(self, name: str, namespace: str | None = None) -> Down:
        _no_namespace(namespace)
        dep, result = down(name)
        return Down(
            dep.name if dep else None,
            result,
            complete=all(v != "still running" for v in result.values()),
        )

    @contextlib.contextmanager
    def open(self, name: str, namespace: str | None = None) -> Iterator[DeploymentView]:
        _no_namespace(namespace)
        yield view(self._require(name))

    def _require(self, name: str) -> Deployment:
        dep = read_state(name)
        if dep is None:
            raise UsageError(f"no local deployment named {name!r} is up.")
        return dep
