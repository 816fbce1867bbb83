"""Local backend: run a Plan as processes on this machine.

Each role is a process in its own process group, on its own port, logging to a file in the
deployment's state directory.  PIDs (with their kernel start times, so a recycled PID is
never mistaken for ours) and endpoints go to ``state.json`` as soon as each process starts,
so ``down`` works from another shell and after an interrupted ``up``.  Readiness means a
real completion through the entry point, within a bounded time; early death or timeout
fails with the role's last log lines and stops everything that was started.

This module is the launcher (``up`` and its waits) and the ``Deployer``; the records live in
``backends.state``, the process groups in ``backends.local.processes``, the view in
``backends.local.view``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servebook import auth, http
from servebook.backends.base import Down, Found, Ready, UpFailed
from servebook.backends.local.processes import (
    is_ours_alive,
    log_tail,
    spawn,
    start_ticks,
    stop_process_group,
)
from servebook.backends.local.view import HOST, view
from servebook.backends.state import (
    STATE_FILE,
    Deployment,
    RoleProcess,
    deployments_dir,
    list_deployments,
    pick_deployment,
    read_state,
    remove_state,
    state_dir_for,
    write_state,
)
from servebook.deployment.site import Here, LoadSite
from servebook.deployment.view import DeploymentView
from servebook.engines import vllm
from servebook.errors import UsageError
from servebook.findings import Finding
from servebook.recipe.plan import Plan
from servebook.recipe.resolve import servebook_home
from servebook.recipe.schema import Generate
from servebook.verify.smoke import completion

SMOKE_PROMPT = "The quick brown fox"
PORT_RETRIES = 3

Say = Callable[[str], None]


def port_clash(log_text: str) -> bool:
    """Whether a role's log says it died because its port was taken."""
    return "address already in use" in log_text.lower()


# --- prerequisites ------------------------------------------------------------------------


def check_engine_installed() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise UsageError(
            f"vLLM is not installed in this Python environment ({sys.executable}).",
            hint="Install vLLM's CPU build with `scripts/setup.sh` (see README), then retry.",
        )


def router_binary() -> str:
    beside = Path(sys.executable).parent / "vllm-router"
    if beside.is_file():
        return str(beside)
    found = shutil.which("vllm-router")
    if found:
        return found
    raise UsageError(
        "vllm-router is not installed (the PD entry point).",
        hint="Install it with `pip install vllm-router` or run `scripts/setup.sh`, then retry.",
    )


def ensure_models(plan: Plan, say: Say) -> None:
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
                f"{kind} directory {path} (role {role.name}) does not exist.",
                hint=f"Point --set {param}=DIR at an existing model directory, or create one "
                f"with `servebook model tiny DIR{' --draft' if kind == 'draft model' else ''}`.",
            )


CPU_BIND = "VLLM_CPU_OMP_THREADS_BIND"


def engine_cores(
    engines: list[str], env_of: Callable[[str], dict[str, str]], cores: list[int]
) -> dict[str, str]:
    """Each engine's own cores when several engines share this machine, as
    ``VLLM_CPU_OMP_THREADS_BIND`` values; the launcher also confines the engine's whole
    process tree to them (``processes.started_on``).

    vLLM's CPU build binds its OpenMP threads to every core it may use ("auto"), so prefill
    and decode each spun a thread on both cores of a 2-core machine and waited on each
    other's at every barrier (tiny-pd's c=1 tok/s ranged 25 to 49 over six repetitions).
    Binding the OpenMP threads alone was not enough: each engine's API server, engine core
    and worker processes still roamed both cores, and the engine core and worker busy-wait
    for a second after every message (vLLM's ``shm_broadcast.SpinCondition``), so the four
    spinners, the router and the load client fought for two cores and the outcome flipped
    between two regimes from one window to the next.  Measured on a quiet 2-core machine
    (tiny-pd, 512-token prompts, 64 output tokens, 15 s windows, 8 repetitions; two plain
    loops, one per core, kept their speed within 2%): OpenMP binding only, c=4 440-812 tok/s
    (the client's event loop lagging up to 600 ms in the slow windows, which read as burst
    delivery) and c=1 280-327; each engine's whole tree on its core, c=4 1046-1064 tok/s
    (cv 0.6%, engine TPOT mean cv 0.7%) and c=1 cv 0.8%.  Disjoint cores (the first engine
    the first share, the last one any remainder); nothing when one engine runs, when there
    are fewer cores than engines, or when a recipe sets the variable itself."""
    if len(engines) < 2 or len(cores) < len(engines):
        return {}
    if any(CPU_BIND in env_of(e) for e in engines):
        return {}
    per = len(cores) // len(engines)
    out = {}
    for i, name in enumerate(engines):
        mine = cores[i * per : (i + 1) * per] if i < len(engines) - 1 else cores[i * per :]
        out[name] = ",".join(str(c) for c in mine)
    return out


def engine_secrets(plan: Plan, api_key: str | None) -> dict[str, dict[str, str]]:
    """The environment each kind of role gets its API key in, when the recipe requires one
    (never on a command line)."""
    if not plan.require_api_key:
        return {"engine": {}, "router": {}}
    if api_key is None:
        raise UsageError(
            f"recipe {plan.recipe} requires an API key (require_api_key: true).",
            hint="Set OPENAI_API_KEY (or VLLM_API_KEY), or pass --api-key to `servebook run`. "
            "The engines get it as VLLM_API_KEY in their environment, never on their command "
            "line.",
        )
    # vLLM reads VLLM_API_KEY; vllm-router sends $OPENAI_API_KEY as the bearer token of its
    # requests to prefill and decode (it checks no key of its own).
    return {"engine": {"VLLM_API_KEY": api_key}, "router": {"OPENAI_API_KEY": api_key}}


def _router_for(plan: Plan, say: Say) -> str | None:
    """The vllm-router binary when the recipe has a router role, else None."""
    router = router_binary() if any(r.kind == "router" for r in plan.roles) else None
    if plan.require_api_key and router is not None:
        # Seen on vllm-router 0.1.17: a PD completion without a key went through.
        say(
            "note: vllm-router checks no client key: the engines require one, but the PD "
            "entry point completes requests without it; do not expose its port"
        )
    return router


def _refuse_running(name: str) -> None:
    existing = read_state(name)
    alive = [r for r in existing.roles if is_ours_alive(r)] if existing is not None else []
    if alive:
        raise UsageError(
            f"deployment '{name}' is already up (pids "
            + ", ".join(str(r.pid) for r in alive)
            + ").",
            hint=f"Stop it with `servebook down {name}`, or choose another --name.",
        )


def _hold_entry_port(entry_port: int | None) -> dict[int, socket.socket]:
    if entry_port is None:
        return {}
    try:
        return {entry_port: http.hold_port(HOST, entry_port)}
    except OSError:
        raise UsageError(
            f"port {entry_port} on {HOST} is already taken.",
            hint="Choose a free one with --port, or leave it out and servebook picks one.",
        ) from None


def _refuse_others_kv(name: str, plan: Plan) -> None:
    """A KV storage directory under another deployment's state directory is refused (exit
    2) before anything is emptied: up empties its KV storage and down deletes it, so two
    deployments sharing one would wipe each other's (an experiment's PD arms once all used
    ``deployments/tiny-pd/kv``, the directory of a plain `servebook up tiny-pd`)."""
    root = deployments_dir().resolve()
    mine = state_dir_for(name).resolve()
    for kv in plan.kv_storage:
        path = Path(kv).resolve()
        if path.is_relative_to(root) and not path.is_relative_to(mine):
            other = path.relative_to(root).parts[0] if path != root else str(root)
            raise UsageError(
                f"deployment {name}: the KV storage {kv} of recipe {plan.recipe} lies in "
                f"deployment {other!r}'s directory, which that deployment's up empties and "
                "its down deletes; nothing was started.",
                hint=f"Resolve the recipe for this deployment ({{state_dir}} = {mine}), as "
                "`servebook up --name NAME` does, or give shared_storage_path a directory "
                "of its own.",
            )


def _fresh_record(name: str, plan: Plan) -> Deployment:
    """The deployment's record, nothing started yet: its state directory emptied of an
    earlier record, its KV storage emptied (stale KV from an earlier run is not evidence)."""
    sdir = state_dir_for(name)
    (sdir / "logs").mkdir(parents=True, exist_ok=True)
    (sdir / STATE_FILE).unlink(missing_ok=True)
    for kv in plan.kv_storage:
        shutil.rmtree(kv, ignore_errors=True)
        Path(kv).mkdir(parents=True, exist_ok=True)
    return Deployment(
        name=name,
        recipe=plan.recipe,
        state_dir=str(sdir),
        created=datetime.now(UTC).isoformat(),
        served_model_name=plan.served_model_name,
        entry_role=plan.entry_role,
        kv_storage=list(plan.kv_storage),
        plan=plan.model_dump(mode="json"),
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


# --- up / down ----------------------------------------------------------------------------


class _Launch:
    """One ``up`` in progress: the roles it started, the ports it holds, and how to undo it.

    Ports are held (bound, not listening) from the moment they are chosen until their role
    starts: engines starting meanwhile take ephemeral ports of their own (ZMQ, torch) from
    the same range, and the kernel never hands out a port that a socket is bound to."""

    def __init__(
        self,
        plan: Plan,
        dep: Deployment,
        *,
        held: dict[int, socket.socket],
        entry_port: int | None,
        router: str | None,
        secret_env: dict[str, dict[str, str]],
        deadline: float,
        say: Say,
    ) -> None:
        self.plan = plan
        self.dep = dep
        self.held = held
        self.entry_port = entry_port
        self.router = router
        self.secret_env = secret_env
        self.deadline = deadline
        self.say = say
        self.ports: dict[str, int] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.fixed = {plan.entry_role} if entry_port is not None else set()
        engines = [r.name for r in plan.engine_roles]
        self.cores = engine_cores(
            engines, lambda n: dict(plan.role(n).env), sorted(os.sched_getaffinity(0))
        )
        if self.cores:
            say(
                "engines on their own cores ("
                + ", ".join(f"{n}: {c}" for n, c in self.cores.items())
                + f"; {CPU_BIND} and each engine's processes confined to them): one "
                "machine's engines do not compete for a core"
            )

    def pick_port(self) -> int:
        s = http.hold_free_port(HOST, avoid={*self.held, *self.ports.values()})
        p = int(s.getsockname()[1])
        self.held[p] = s
        return p

    def release(self, port: int) -> None:
        s = self.held.pop(port, None)
        if s is not None:
            s.close()

    def start(
        self,
        role_name: str,
        argv: list[str],
        env: dict[str, str],
        kind: str,
        metrics_port: int | None = None,
    ) -> None:
        port = self.ports[role_name]
        log = Path(self.dep.state_dir) / "logs" / f"{role_name}.log"
        self.release(port)
        cores = self.cores.get(role_name)
        cpus = [int(c) for c in cores.split(",")] if cores else None
        proc = spawn(argv, env, log, self.secret_env[kind], cpus=cpus)
        self.procs[role_name] = proc
        self.dep.roles.append(
            RoleProcess(
                name=role_name,
                kind=kind,
                pid=proc.pid,
                start_ticks=start_ticks(proc.pid),
                port=port,
                url=f"http://{HOST}:{port}",
                log=str(log),
                argv=argv,
                env=env,
                metrics_port=metrics_port,
            )
        )
        write_state(self.dep)
        self.say(f"started {role_name} (pid {proc.pid}, port {port}, log {log})")

    def start_role(self, role_name: str) -> None:
        if role_name in self.fixed and self.entry_port is not None:
            self.ports[role_name] = self.entry_port
        else:
            self.ports[role_name] = self.pick_port()
        rr = self.plan.role(role_name)
        if rr.kind != "router":
            argv = vllm.server_argv(sys.executable, rr.args, HOST, self.ports[role_name])
            env = dict(rr.env)
            if role_name in self.cores:
                env[CPU_BIND] = self.cores[role_name]
            self.start(role_name, argv, env, "engine")
            return
        assert self.router is not None
        # vllm-router always binds a Prometheus port (29000 by default): give it a free one
        # so two deployments, or anything else on 29000, cannot make it panic.
        metrics_port = self.pick_port()
        argv = vllm.router_argv(
            self.router,
            prefill_url=self.dep.role("prefill").url,
            decode_url=self.dep.role("decode").url,
            host=HOST,
            port=self.ports[role_name],
            extra=[*rr.args, "--prometheus-host", HOST, "--prometheus-port", str(metrics_port)],
        )
        self.release(metrics_port)
        self.start(role_name, argv, rr.env, "router", metrics_port)

    def start_healthy(self, names: list[str]) -> None:
        """Start the roles and wait for /health; a role that lost a port servebook chose
        to another process in the moment between choosing and binding starts again."""
        for n in names:
            self.start_role(n)
        for attempt in range(PORT_RETRIES + 1):
            try:
                _wait_healthy(self.dep, self.procs, names, self.deadline, self.say)
                return
            except UpFailed as e:
                failed = e.role
                if attempt == PORT_RETRIES or failed is None or failed in self.fixed:
                    raise
                if not port_clash(e.log_tail):
                    raise
                self.say(
                    f"{failed} could not bind port {self.ports[failed]}: starting it on another one"
                )
                stop_process_group(self.dep.role(failed), grace_s=5)
                with contextlib.suppress(Exception):
                    self.procs[failed].wait(timeout=1)
                self.dep.roles = [r for r in self.dep.roles if r.name != failed]
                self.start_role(failed)

    def undo(self) -> None:
        """Nothing stray: whatever was started is stopped and its record and KV storage
        removed; logs stay for the post-mortem."""
        for port in list(self.held):
            self.release(port)
        for rp in reversed(self.dep.roles):
            stop_process_group(rp, grace_s=5)
        for child in self.procs.values():
            with contextlib.suppress(Exception):
                child.wait(timeout=1)
        remove_state(self.dep)
        for kv in self.plan.kv_storage:
            shutil.rmtree(kv, ignore_errors=True)


def up(
    plan: Plan,
    *,
    name: str | None = None,
    timeout_s: float = 600.0,
    entry_port: int | None = None,
    say: Say = lambda s: None,
) -> Deployment:
    """Start every role of the Plan and wait until the entry point completes a request."""
    name = name or plan.recipe
    _refuse_others_kv(name, plan)
    check_engine_installed()
    # The key readiness sends (a deployment may be protected by VLLM_API_KEY inherited from
    # this environment, or an --api-key in its arguments) and the engines get when the
    # recipe requires one.
    api_key = auth.for_engines()
    secret_env = engine_secrets(plan, api_key)
    router = _router_for(plan, say)
    _refuse_running(name)
    held = _hold_entry_port(entry_port)
    try:
        ensure_models(plan, say)
    except BaseException:
        for s in held.values():
            s.close()
        raise
    dep = _fresh_record(name, plan)
    launch = _Launch(
        plan,
        dep,
        held=held,
        entry_port=entry_port,
        router=router,
        secret_env=secret_env,
        deadline=time.monotonic() + timeout_s,
        say=say,
    )
    try:
        launch.start_healthy([r.name for r in plan.engine_roles])
        if router is not None:
            launch.start_healthy(["router"])
        dep.entry_url = dep.role(plan.entry_role).url
        write_state(dep)
        _wait_completion(dep, launch.procs, launch.deadline, say, api_key)
        dep.ready = True
        write_state(dep)
        return dep
    except BaseException:
        launch.undo()
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


def _timeout(
    dep: Deployment, names: list[str], what: str, detail: str = "", hint: str | None = None
) -> UpFailed:
    parts = []
    for n in names:
        rp = dep.role(n)
        parts.append(
            f"--- {n} (pid {rp.pid}, {rp.url}), last lines of {rp.log}:\n{log_tail(rp.log, 15)}"
        )
    return UpFailed(
        f"timed out waiting for {what}: {', '.join(names)}.{' ' + detail if detail else ''}\n"
        + "\n".join(parts),
        role=names[0] if names else None,
        hint=hint,
    )


def _wait_healthy(
    dep: Deployment,
    procs: dict[str, subprocess.Popen[bytes]],
    names: list[str],
    deadline: float,
    say: Say,
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
            raise _timeout(dep, pending, "/health", hint="Raise --timeout if the model is large.")
        time.sleep(0.5)


def _wait_completion(
    dep: Deployment,
    procs: dict[str, subprocess.Popen[bytes]],
    deadline: float,
    say: Say,
    api_key: str | None = None,
) -> None:
    last = ""
    while True:
        _check_alive(dep, procs, [r.name for r in dep.roles])
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _timeout(
                dep,
                [r.name for r in dep.roles],
                f"a completion through the entry point {dep.entry_url}",
                f"Last error: {last}",
            )
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
        remove_state(dep)
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
                # A role that answers no /health (stopped, hung, still loading) cannot
                # serve: not ok, whether or not its process is there.
                "ok": healthy,
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


def _no_namespace(namespace: str | None) -> None:
    if namespace is not None:
        raise UsageError("-n/--namespace is for --backend kubernetes (a cluster's namespace).")


class LocalBackend:
    """The ``Deployer`` for processes on this machine (module docstring)."""

    name = "local"
    title = "the local backend"
    recipes_hint = "Use a tiny-* recipe locally (`servebook recipes`)."
    up_cost = "about a minute on a 2-core machine (vLLM's CPU build, the tiny model)"
    loads_here = True

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
        say: Say,
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

    def load_site(self, name: str, namespace: str | None = None) -> LoadSite:
        return Here()  # the processes are on this machine, reached directly

    def _require(self, name: str) -> Deployment:
        dep = read_state(name)
        if dep is None:
            raise UsageError(f"no local deployment named {name!r} is up.")
        return dep
