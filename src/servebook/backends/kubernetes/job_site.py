"""`servebook bench NAME` on a Kubernetes deployment, in the cluster (the default): the
bench machine creates the load Job and its objects (``kube/load_job.py``, which says why
the coordinator runs in Pod 0), waits for its Pods, fetches the results Pod 0 serves
through one port-forward, writes ``DIR/results.json`` (and ``DIR/requests/``), and deletes
every object it created, on success, on failure and on Ctrl-C alike.

Bounded: every Pod must be Running within ``start_s`` (else the scheduler's or the
kubelet's words for why not: ``0/3 nodes are available: ...``, ``ErrImagePull``); a Pod
that fails (an agent killed, out of memory, its Job's deadline) ends the bench at once with
exit 1 and its last log lines; the sweep itself is bounded by the Job's
``activeDeadlineSeconds``.  Logs are read only to explain a failure, never for results.

The deployment is read as the cluster has it (``kubernetes.view``'s Ready Pods of each role):
the entry Service's DNS name, each engine Pod's IP for its counters, the command lines and
environment as applied; no port-forward is opened to an engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servebook import http
from servebook.backends.kubernetes.record import KubeDeployment
from servebook.backends.kubernetes.view import cluster_record, ready_pods, recorded_deployment
from servebook.bench.sweep import BenchArgs
from servebook.deployment.reach import IN_CLUSTER, Address, Reach, build
from servebook.deployment.site import LoadSite
from servebook.errors import ServebookError, UsageError
from servebook.files import write_atomic
from servebook.kube import client as kube_client
from servebook.kube import load_job as lj
from servebook.kube import names
from servebook.kube.engine_pod import api_key_env
from servebook.kube.objects import condition, is_ready
from servebook.kube.resources import apply, list_objects, request, where_of
from servebook.preflight.admission import load_access
from servebook.preflight.live import require_access
from servebook.recipe.plan import Plan
from servebook.results.provenance import source_commit
from servebook.results.schema import RESULTS_NAME, Results
from servebook.results.store import load_results

Obj = dict[str, Any]
Say = Callable[[str], None]
START_S = 600.0  # every Pod Running within this (an image pull of a vLLM image included)
POLL_S = 1.0
END_S = 15.0  # after the results were read: the Pods end on their own within this
# Waiting reasons the kubelet does not recover from by waiting.
_STUCK = {"InvalidImageName", "CreateContainerConfigError", "ErrImageNeverPull"}


class BenchFailed(ServebookError):
    """The in-cluster load failed (a Pod failed, or the sweep did): exit 1."""

    exit_code = 1
    label = "bench failed"


@dataclasses.dataclass
class Prepared:
    job: lj.LoadJob
    objects: list[Obj]
    namespace: str


def pod_url(pod: Obj, port: int, role: str, scheme: str = "http") -> str:
    """The Pod's address on the cluster network at ``port``."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        raise UsageError(
            f"role {role}: Pod {pod['metadata']['name']} has no IP yet (status.podIP): its "
            "counters cannot be read in the cluster. Run `servebook status`, then bench again."
        )
    host = f"[{ip}]" if ":" in str(ip) else str(ip)
    return f"{scheme}://{host}:{port}"


def cluster_view(api: Any, dep: KubeDeployment, plan: Plan) -> Obj:
    """The deployment as the cluster reaches it (``bench/in_cluster`` rebuilds it with
    ``DeploymentView.from_doc``): the entry Service's DNS name, each Pod at its IP."""
    pods = {r.name: ready_pods(api, dep, r) for r in plan.roles}
    replicas = {}
    for r in plan.roles:
        router = r.kind == "router"
        api_port = names.ROUTER_PORT if router else names.ENGINE_PORT
        first, *others = pods[r.name]
        replicas[r.name] = [
            Address(
                pod_url(first, api_port, r.name),
                pod_url(first, names.ROUTER_METRICS_PORT if router else api_port, r.name),
            ),
            *(Address(pod_url(p, names.ENGINE_PORT, r.name)) for p in others if not router),
        ]
    entry_service = dep.entry_service or names.role_object_name(dep.name, plan.entry_role)
    entry_port = dep.entry_port or names.ENGINE_PORT
    reach = Reach(
        route="cluster-service",
        replicas=replicas,
        entry_url=f"http://{entry_service}.{dep.namespace}.svc:{entry_port}",
        detail=IN_CLUSTER,
    )
    return build(cluster_record(dep, plan, pods), reach).to_doc()


def refuse_unsupported(a: BenchArgs, *, tokenizer: str | None, resume: bool) -> None:
    """What the in-cluster path cannot take from this machine (exit 2, nothing created)."""
    why = None
    if a.dataset is not None:
        why = f"--dataset {a.dataset} is a file on this machine"
    elif tokenizer is not None:
        why = (
            f"--tokenizer {tokenizer} is a directory on this machine (the Pods tokenize "
            "on the server)"
        )
    elif resume:
        why = "--resume continues a results file on this machine"
    if why:
        raise UsageError(
            f"{why}, which the in-cluster load agents cannot read; nothing was created.",
            hint="Benchmark through port-forwards instead (--via port-forward), or leave it out.",
        )


@dataclasses.dataclass
class Source:
    """What the load Job needs of the deployment it benchmarks, as the cluster has it:
    servebook's own (``own_source``) or an attached one (``attached.cluster.cluster_source``)."""

    api: Any
    name: str
    namespace: str
    view: Obj  # ``bench/in_cluster``'s view: every role at its cluster address
    engine_image: str | None  # the default image of the load agents
    api_key_env: list[Obj] = dataclasses.field(default_factory=list)  # the engines' own
    tolerations: list[Obj] = dataclasses.field(default_factory=list)
    image_pull_secrets: list[str] = dataclasses.field(default_factory=list)


def own_source(name: str, namespace: str | None) -> Source:
    """A deployment servebook brought up: its recipe says the image, the API key's Secret,
    the tolerations and the pull secrets."""
    conn, dep, plan = recorded_deployment(name, namespace)
    k8s = names.settings(plan)
    return Source(
        api=conn,
        name=name,
        namespace=dep.namespace,
        view=cluster_view(conn, dep, plan),
        engine_image=next((r.image for r in plan.engine_roles if r.image), None),
        api_key_env=api_key_env("VLLM_API_KEY", k8s),
        tolerations=list(k8s.tolerations),
        image_pull_secrets=list(k8s.pod.image_pull_secrets or []),
    )


@dataclasses.dataclass(frozen=True)
class JobSite:
    """``deployment.site.LoadSite``: an Indexed Job of load agents beside the engines,
    reaching them by the entry Service's and the Pods' cluster addresses.  ``source``
    reads the deployment as the cluster has it (servebook's own: ``own_source``; attached:
    ``attached.cluster.cluster_source``), only when the Job is made."""

    source: Callable[[], Source]
    here: bool = False
    route: str = "cluster-service"


def source_of(site: LoadSite) -> Source:
    """The deployment as the load Job reaches it, from the site a place offered."""
    if not isinstance(site, JobSite):
        raise TypeError(f"{site!r} runs no load Job")
    return site.source()


def prepare(
    source: Source,
    a: BenchArgs,
    *,
    agents: int,
    image: str | None,
    api_key: str | None = None,
) -> Prepared:
    """The objects of one in-cluster bench of ``source``, checked (schema, names, size),
    not created.  ``api_key`` (given on this machine) travels in the Job's own Secret and
    wins over the engines' own; "" leaves that Secret's entry empty (``--dry-run``, which
    writes no key into a file)."""
    from servebook.kube.validate import check_schema

    chosen = image or source.engine_image
    if not chosen:
        raise UsageError(
            f"deployment {source.name}: its engines name no image to run the load agents in.",
            hint="Give one with --load-image IMAGE (Python 3.11+ with numpy and pydantic).",
        )
    bench = {f.name: getattr(a, f.name) for f in dataclasses.fields(BenchArgs)}
    bench["dataset"] = None
    bench["agents"] = agents
    bench["workers"] = None
    run = secrets.token_hex(3)[:5]
    import servebook

    settings = {
        # The Pod imports servebook from a zip, which carries no version of its own.
        "servebook_version": servebook.__version__,
        "deployment": source.name,
        "namespace": source.namespace,
        "job": "",
        "service": "",
        "agents": agents,
        "agent_port": lj.AGENT_PORT,
        "results_port": lj.RESULTS_PORT,
        "view": source.view,
        "bench": bench,
    }
    job = lj.LoadJob(
        deployment=source.name,
        namespace=source.namespace,
        run=run,
        image=chosen,
        agents=agents,
        settings=settings,
        token=secrets.token_hex(16),
        api_key=api_key,
        api_key_env=list(source.api_key_env),
        tolerations=list(source.tolerations),
        image_pull_secrets=list(source.image_pull_secrets),
    )
    settings["job"], settings["service"] = job.name, job.service
    objects = lj.load_objects(job, lj.code_archive())
    check_schema(objects)
    return Prepared(job, objects, source.namespace)


def dry_run_files(p: Prepared) -> dict[str, str]:
    """File name -> YAML text, in the order the objects are created."""
    import yaml

    header = (
        f"# The in-cluster load of `servebook bench {p.job.deployment}` (written by --dry-run; "
        "nothing was applied).\n# `kubectl apply -f DIR` runs it; the results are served by "
        f"Pod {p.job.name}-0 on port {lj.RESULTS_PORT}.\n"
    )
    if p.job.api_key == "":
        header += (
            f"# The Secret's {lj.API_KEY_KEY} is left empty (servebook writes no API key into "
            "a file): fill it in before applying.\n"
        )
    files = {}
    for i, obj in enumerate(p.objects):
        text = yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=4096)
        files[f"{i * 10:02d}-{obj['kind'].lower()}.yaml"] = header + "---\n" + text
    return files


_DRY_FILE = re.compile(r"^\d{2}-[a-z]+\.yaml$")
_DRY_HEADER = "# The in-cluster load of `servebook bench "


def check_dry_run_dir(path: Path) -> None:
    """Refuse a ``-o DIR`` that holds anything but an earlier ``bench --dry-run``."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise UsageError(f"-o {path}: exists and is not a directory. Choose another -o.")
    if not path.is_dir():
        return
    for e in path.iterdir():
        ok = e.is_file() and not e.is_symlink() and _DRY_FILE.match(e.name)
        if not ok or not e.read_text(encoding="utf-8", errors="replace").startswith(_DRY_HEADER):
            raise UsageError(
                f"-o {path}: the directory holds {e.name}, which `servebook bench --dry-run` "
                "did not write; it replaces only its own output. Choose a new directory."
            )


# --- running it ---------------------------------------------------------------------------


def _pods(api: Any, p: Prepared) -> dict[int, Obj]:
    pods = list_objects(api, "Pod", p.namespace, p.job.selector())
    out: dict[int, Obj] = {}
    for pod in pods:
        idx = ((pod.get("metadata") or {}).get("annotations") or {}).get(lj.INDEX_ANNOTATION)
        if idx is not None and str(idx).isdigit():
            out[int(idx)] = pod
    return out


def _why_not_running(pod: Obj) -> str:
    """The scheduler's or the kubelet's words for a Pod that does not run."""
    status = pod.get("status") or {}
    words = []
    sched = condition(pod, "PodScheduled")
    if sched is not None and sched.get("status") == "False":
        words.append(f"not scheduled: {sched.get('reason', '')} {sched.get('message', '')}".strip())
    for cs in status.get("containerStatuses") or ():
        state = cs.get("state") or {}
        for kind in ("waiting", "terminated"):
            s = state.get(kind)
            if s:
                words.append(
                    f"container {cs.get('name')} {kind}: {s.get('reason', '')}"
                    + (f" ({s['message']})" if s.get("message") else "")
                    + (f", exit code {s['exitCode']}" if "exitCode" in s else "")
                )
    if status.get("reason") or status.get("message"):
        words.append(f"{status.get('reason', '')}: {status.get('message', '')}".strip(": "))
    return "; ".join(words) or f"phase {status.get('phase', 'unknown')}"


def _log_tail(api: Any, namespace: str, pod: str, lines: int = 20) -> str:
    try:
        got = kube_client.send(
            api,
            "GET",
            f"/api/v1/namespaces/{namespace}/pods/{pod}/log",
            f"reading the log of Pod {pod}",
            params={"tailLines": str(lines)},
        )
        text = got.text.strip()
    except Exception as e:  # the log is evidence, not a requirement
        return f"(its log could not be read: {type(e).__name__}: {e})"
    return "\n".join("  | " + ln for ln in text.splitlines()[-lines:]) or "  (its log is empty)"


def _failed(api: Any, p: Prepared, index: int, pod: Obj, what: str) -> BenchFailed:
    name = pod["metadata"]["name"]
    node = (pod.get("spec") or {}).get("nodeName") or "no node"
    return BenchFailed(
        f"{what}: load agent {index}, Pod {name} (on {node}) in namespace {p.namespace}: "
        f"{_why_not_running(pod)}. Its last log lines:\n{_log_tail(api, p.namespace, name)}",
        hint=f"The Job and its objects were deleted; `servebook bench {p.job.deployment} "
        "--via port-forward` measures through forwards instead.",
    )


def _refusal(api: Any, p: Prepared) -> str | None:
    """The Job controller's latest ``FailedCreate`` words on the bench's Job (Pod Security
    admission, a quota, a webhook refused its Pods); None when it recorded none.  The Job's
    name is new to each bench, so no earlier bench's events are read as this one's."""
    try:
        listed = list_objects(api, "Event", p.namespace)
    except ServebookError:  # evidence, not a requirement (no right to list Events)
        return None
    events = [
        e
        for e in listed
        if e.get("reason") == "FailedCreate"
        and (e.get("involvedObject") or {}).get("kind") == "Job"
        and (e.get("involvedObject") or {}).get("name") == p.job.name
    ]
    events.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return str(events[-1].get("message", "")) if events else None


def wait_for_results(
    api: Any, p: Prepared, say: Say, *, start_s: float = START_S, poll_s: float = POLL_S
) -> dict[int, Obj]:
    """Until Pod 0 serves its results (it is Ready); the Pods by index."""
    t0 = time.monotonic()
    running_said = False
    while True:
        pods = _pods(api, p)
        _raise_if_a_pod_failed(api, p, pods)
        _raise_if_the_job_failed(api, p)
        if len(pods) < p.job.agents:
            _raise_if_pods_refused(api, p)
        running = [
            i
            for i, pod in pods.items()
            if (pod.get("status") or {}).get("phase") in ("Running", "Succeeded")
        ]
        if len(running) == p.job.agents and not running_said:
            nodes = sorted({str((pods[i].get("spec") or {}).get("nodeName")) for i in running})
            say(
                f"{p.job.agents} load agent(s) running on node(s) {', '.join(nodes)}; the sweep "
                f"runs in Pod {pods[0]['metadata']['name']} (`kubectl logs -f -n {p.namespace} "
                f"{pods[0]['metadata']['name']}` follows it)"
            )
            running_said = True
        if 0 in pods and is_ready(pods[0]):
            return pods
        if not running_said and time.monotonic() - t0 > start_s:
            late = [i for i in range(p.job.agents) if i not in running]
            detail = "; ".join(
                f"agent {i}: "
                + (_why_not_running(pods[i]) if i in pods else "no Pod created by the Job")
                for i in late
            )
            raise BenchFailed(
                f"the load agents' Pods were not all running within {start_s:g} s in "
                f"namespace {p.namespace}: {detail}"
            )
        time.sleep(poll_s)


def _raise_if_a_pod_failed(api: Any, p: Prepared, pods: dict[int, Obj]) -> None:
    """A load agent's Pod that failed, a coordinator that ended early or a Pod stuck before
    it starts ends the wait, naming the Pod."""
    for i, pod in sorted(pods.items()):
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Failed":
            raise _failed(api, p, i, pod, "a load agent's Pod failed")
        if i == 0 and phase == "Succeeded":
            raise _failed(api, p, i, pod, "the coordinator ended before serving its results")
        for cs in (pod.get("status") or {}).get("containerStatuses") or ():
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _STUCK:
                raise _failed(api, p, i, pod, "a load agent's Pod cannot start")


def _raise_if_the_job_failed(api: Any, p: Prepared) -> None:
    job = (
        request(
            api,
            "GET",
            where_of("batch/v1", "Job", p.namespace, p.job.name),
            f"reading Job/{p.job.name}",
            missing_ok=True,
        )
        or {}
    )
    for cond in (job.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            # The Job failed between the Pods' read and its own: the Pod that failed it
            # is the evidence, named as above when it is still there.
            for i, pod in sorted(_pods(api, p).items()):
                if (pod.get("status") or {}).get("phase") == "Failed":
                    raise _failed(api, p, i, pod, "a load agent's Pod failed")
            raise BenchFailed(
                f"Job/{p.job.name} in namespace {p.namespace} failed: "
                f"{cond.get('reason', '')}: {cond.get('message', '')}"
            )


def _raise_if_pods_refused(api: Any, p: Prepared) -> None:
    refused = _refusal(api, p)
    if refused:
        raise BenchFailed(
            f"the cluster refused to create the load agents' Pods of Job/{p.job.name} "
            f"in namespace {p.namespace}: {refused}",
            hint="Let the namespace admit them (its pod-security.kubernetes.io/enforce "
            "level), or measure through forwards: --via port-forward.",
        )


def fetch_results(api: Any, p: Prepared, pod: str, into: Path) -> Obj:
    """Every file Pod 0 serves, through one port-forward, into ``into``; its status."""
    from servebook.kube.kr8s_dialer import Kr8sDialer, kr8s_pod_identity
    from servebook.kube.portforward import Forwards

    with Forwards(Kr8sDialer(api), pod_identity=kr8s_pod_identity(api), timeout_s=10.0) as fw:
        base = fw.open(
            role="load-agents", pod=pod, namespace=p.namespace, remote_port=lj.RESULTS_PORT
        )
        auth = {"Authorization": f"Bearer {p.job.token}"}
        got = http.get(f"{base}/files", timeout=30, headers=auth)
        if got.status != 200:
            raise BenchFailed(f"Pod {pod} did not list its results (HTTP {got.status})")
        for rel in got.json():
            r = http.get(f"{base}/f/{rel}", timeout=120, headers=auth)
            if r.status != 200:
                raise BenchFailed(f"Pod {pod} did not serve {rel} (HTTP {r.status})")
            dest = into / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(r.body)
        with contextlib.suppress(http.HTTPError):
            http.post_json(f"{base}/done", {}, timeout=10, headers=auth)
    status_path = into / "status.json"
    if not status_path.is_file():
        raise BenchFailed(f"Pod {pod} served no status.json: its sweep did not end cleanly")
    return dict(json.loads(status_path.read_text(encoding="utf-8")))


def delete(api: Any, p: Prepared, say: Say) -> None:
    """Delete every object of the bench (the Job's Pods with it), missing ones too; say
    what could not be deleted, and how to, rather than claim it was."""
    left = []
    for obj in reversed(p.objects):
        meta = obj["metadata"]
        try:
            request(
                api,
                "DELETE",
                where_of(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]),
                f"deleting {obj['kind']}/{meta['name']}",
                body={
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "propagationPolicy": "Background",
                },
                missing_ok=True,
            )
        except ServebookError as e:
            left.append(f"{obj['kind']}/{meta['name']} ({e})")
    if left:
        say(
            f"could not delete {'; '.join(left)} in namespace {p.namespace}: delete them with "
            f"`kubectl delete job,secret,configmap,service -n {p.namespace} -l "
            f"{lj.RUN_LABEL}={p.job.run}` (the Job also ends itself within "
            f"{lj.ACTIVE_DEADLINE_S // 3600} h)"
        )
        return
    say(f"deleted Job/{p.job.name} and its objects in namespace {p.namespace}")


def _finish(fetched: Path, out_dir: Path, nodes: list[str]) -> tuple[Results, Path] | None:
    """Move the fetched files into ``out_dir``: results.json with the agents' nodes in its
    provenance (Pod 0 could not know them), requests/ as they came."""
    src = fetched / RESULTS_NAME
    if not src.is_file():
        return None
    results = load_results(src)
    # The agents ran this process's own source, shipped in a ConfigMap, where git cannot
    # say its commit: this checkout can.
    if results.provenance.servebook_commit is None:
        results.provenance.servebook_commit = source_commit()
    load = results.provenance.load
    if load is not None:
        load.where = (
            f"{load.agents} agent(s) in namespace {load.namespace} on node(s) "
            f"{', '.join(nodes)}" + (f" (Job {load.job})" if load.job else "")
        )
        load.nodes = nodes
    out_dir.mkdir(parents=True, exist_ok=True)
    req = fetched / "requests"
    if req.is_dir():
        shutil.copytree(req, out_dir / "requests", dirs_exist_ok=True)
    path = out_dir / RESULTS_NAME
    write_atomic(path, results.to_json())
    return results, path


def _let_end(api: Any, p: Prepared, wait_s: float = END_S, poll_s: float = 0.25) -> None:
    """Give the Pods a moment to end on their own once their results were read (the Job
    then completes, as a Job should) before they are deleted."""
    t = time.monotonic() + wait_s
    while time.monotonic() < t:
        phases = [(q.get("status") or {}).get("phase") for q in _pods(api, p).values()]
        if all(ph in ("Succeeded", "Failed") for ph in phases):
            return
        time.sleep(poll_s)


def run_in_cluster(
    source: Source, p: Prepared, out_dir: Path, *, say: Say, start_s: float = START_S
) -> tuple[Results, Path]:
    """Create, wait, fetch, delete (module docstring)."""
    if (out_dir / RESULTS_NAME).exists():
        raise UsageError(
            f"{out_dir / RESULTS_NAME} already exists; choose another -o DIR (an in-cluster "
            "run starts a new results file)"
        )
    try:
        return _run(source.api, p, out_dir, say, start_s)
    except KeyboardInterrupt:
        from servebook.bench.sweep import Interrupted

        raise Interrupted(
            f"stopped the in-cluster bench of {source.name} (the Job's Pods were deleted with "
            "it, their sweep with them); nothing was written.",
            path=None,
            points=0,
        ) from None


def _run(api: Any, p: Prepared, out_dir: Path, say: Say, start_s: float) -> tuple[Results, Path]:
    # Before the try: refused, nothing was created, and nothing is to be deleted.
    require_access(
        api,
        lambda minor: load_access(p.objects, p.namespace, minor),
        p.namespace,
        f"bench of {p.job.deployment} in the cluster (its load Job)",
    )
    try:
        apply(api, p.objects, say)
        pods = wait_for_results(api, p, say, start_s=start_s)
        nodes = sorted(
            {str((pod.get("spec") or {}).get("nodeName") or "?") for pod in pods.values()}
        )
        with tempfile.TemporaryDirectory(prefix="servebook-bench-") as tmp:
            status = fetch_results(api, p, str(pods[0]["metadata"]["name"]), Path(tmp))
            done = _finish(Path(tmp), out_dir, nodes)
        _let_end(api, p)
        if not status.get("ok"):
            saved = f" Finished points are in {done[1]}." if done and done[0].points else ""
            err = BenchFailed(
                f"the sweep in Pod {pods[0]['metadata']['name']} failed: "
                f"{status.get('message')}{saved}",
                hint=status.get("hint"),
            )
            err.exit_code = int(status.get("exit_code") or 1)
            raise err
        if done is None:
            raise BenchFailed("the coordinator served no results.json")
        return done
    finally:
        delete(api, p, say)
