"""Prefill/decode symmetry: SB105 (speculative config), SB106 (KV connector), SB107
(settings both sides share) and SB112 (KV handed over by TCP).

Decisions worth knowing before changing a rule:

* Prefill/decode pairs are engines in the same namespace, one prefill and one decode,
  paired by name once role words are removed.  Roles come from names and labels first
  (``llm-d.ai/role: decode``, ``kimi-prefill``), then from ``kv_role``.
* Heterogeneous tensor parallelism: NixlConnector (and its pull/push variants) supports
  a different TP on each side (vLLM's NixlConnector compatibility matrix), so no finding;
  MooncakeConnector gained it in vLLM around March 2026 (#36869) and unknown connectors
  may or may not have it: a warning; ExampleConnector and the P2P NCCL connectors move
  KV per rank: a failure.  Block size may differ only with NixlConnector and only with
  prefill's smaller (a warning: non-hybrid models only).
* The speculative config is compared as JSON and must be identical (field notes), even
  though newer NixlConnector documents tolerating a different ``num_speculative_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from servebook.engines.cmdline import (
    EngineCommand,
    compare_speculative,
    kv_connector_problems,
    kv_role_problem,
    speculative_config,
)
from servebook.engines.fabrics import NIXL_CONNECTORS, tcp_told
from servebook.findings import Check, Finding, Severity, register
from servebook.lint.rules.images import normalize_image
from servebook.lint.rules.objects import Engine, finding_at
from servebook.lint.rules.registry import PAIR_RULES

# Connectors that move KV per rank and block and have no heterogeneous-TP path.
HOMOGENEOUS_CONNECTORS = frozenset(
    {"ExampleConnector", "SharedStorageConnector", "P2pNcclConnector", "PyNcclConnector"}
)


def pairs(all_engines: Sequence[Engine]) -> list[tuple[Engine, Engine]]:
    """Prefill/decode pairs: same namespace, and the same name once role words are removed
    (`llama-prefill` / `llama-decode`); roles whose names pair with nothing pair with
    the other role of the same file, or else (a lone prefill and a lone decode left in the
    namespace) with each other.

    An object that two files define (`vllm-disagg` in disagg_router.yaml and in
    disagg_planner.yaml) is alternatives, not one deployment: its engines pair only with
    engines of their own file."""
    files: dict[tuple[str, str | None, str], set[str]] = {}
    for e in all_engines:
        files.setdefault((e.doc.kind, e.doc.namespace, e.doc.name), set()).add(e.doc.path)

    def alternative(e: Engine) -> bool:
        return len(files[(e.doc.kind, e.doc.namespace, e.doc.name)]) > 1

    by_ns: dict[str | None, list[Engine]] = {}
    for e in all_engines:
        by_ns.setdefault(e.doc.namespace, []).append(e)
    pairs: list[tuple[Engine, Engine]] = []
    for group in by_ns.values():
        candidates = [
            (p, d)
            for p in group
            if p.role == "prefill"
            for d in group
            if d.role == "decode"
            and (p.doc.path == d.doc.path or not (alternative(p) or alternative(d)))
        ]
        matched = [(p, d) for p, d in candidates if p.stem == d.stem]
        # Roles whose names pair with nothing: those of one file pair with each other;
        # across files only a lone prefill and a lone decode are surely one deployment.
        paired = {id(e) for pair in matched for e in pair}
        rest = [(p, d) for p, d in candidates if id(p) not in paired and id(d) not in paired]
        same_file = [(p, d) for p, d in rest if p.doc.path == d.doc.path]
        pairs.extend(matched + (same_file or (rest if len(rest) == 1 else [])))
    return pairs


def _pair_subject_finding(
    check: Check, severity: Severity, p: Engine, d: Engine, message: str, **evidence: Any
) -> Finding:
    ev = {"prefill": p.where, "decode": d.where, **evidence}
    return finding_at(
        check,
        severity,
        d.doc,
        d.path,
        f"{message} (prefill: {p.where}; decode: {d.where})",
        extra=f"PD pair {p.pod.owner} -> {d.pod.owner}",
        evidence=ev,
    )


PD_SPECULATIVE = register(
    "SB105",
    "Prefill and decode roles disagree on --speculative-config",
    "With prefill/decode disaggregation the two engines must run the same speculative "
    "config. Speculation on the decode role only (the 'obvious' setup) makes decode "
    "register draft layers the prefill side never computed (`KeyError: "
    "'model.layers.N.self_attn'`, logged on decode, blaming the wrong host); once patched, "
    "the sides count KV blocks differently ('P num blocks less than D'). Both failures hang: "
    "Pods Ready, health green, no inference. servebook compares the JSON semantically (key "
    "order and formatting do not matter) and requires it identical: recent vLLM documents "
    "that NixlConnector tolerates a different num_speculative_tokens, but an unsupported "
    "difference hangs instead of failing, so lint keeps the strict rule. Draft model paths "
    "may differ between nodes; differently named draft directories are a warning.",
    "Give both roles the identical `--speculative-config` JSON (or neither).",
)


@PAIR_RULES.add(PD_SPECULATIVE)
def check_pd_speculative(p: Engine, d: Engine) -> list[Finding]:
    ps, perr = speculative_config(p.cmd)
    ds, derr = speculative_config(d.cmd)
    if perr or derr or (ps is None and ds is None):
        return []  # SB111 reports unreadable JSON
    if ps is None or ds is None:
        only = "decode" if ps is None else "prefill"
        other = "prefill" if only == "decode" else "decode"
        return [
            _pair_subject_finding(
                PD_SPECULATIVE,
                Severity.FAIL,
                p,
                d,
                f"--speculative-config is set on the {only} role only; {other} has none. "
                "Decode then expects draft-layer KV that prefill never produced, and the "
                "pair hangs with Pods Ready",
            )
        ]
    cmp = compare_speculative(ps, ds, ("prefill", "decode"))
    findings = [_pair_subject_finding(PD_SPECULATIVE, Severity.WARN, p, d, w) for w in cmp.warnings]
    if cmp.differences:
        findings.append(
            _pair_subject_finding(
                PD_SPECULATIVE,
                Severity.FAIL,
                p,
                d,
                "--speculative-config differs between prefill and decode: "
                + "; ".join(cmp.differences),
                differences=list(cmp.differences),
            )
        )
    return findings


PD_CONNECTOR = register(
    "SB106",
    "Prefill and decode roles disagree on the KV connector",
    "The KV cache moves from prefill to decode only when both engines load the same "
    "`kv_connector` and the prefill side produces while the decode side consumes. A "
    "missing or different connector does not fail loudly: the decode side recomputes the "
    "prompt ('fails open'), throughput even looks better, and the disaggregation silently "
    "does nothing; a role named prefill configured as `kv_consumer` (or decode as "
    "`kv_producer`) never hands anything over.",
    "Give both roles `--kv-transfer-config` with the same `kv_connector`; use `kv_producer` "
    "(or `kv_both`) on prefill and `kv_consumer` (or `kv_both`) on decode.",
)


@PAIR_RULES.add(PD_CONNECTOR)
def check_pd_connector(p: Engine, d: Engine) -> list[Finding]:
    # The rule is engines.cmdline's, which verify's SB310 judges by as well.
    findings: list[Finding] = []
    for e, side in ((p, "prefill"), (d, "decode")):
        problem = kv_role_problem(side, e.kv_config) if e.name_role == side else None
        if problem is not None:
            findings.append(
                finding_at(
                    PD_CONNECTOR,
                    Severity.FAIL,
                    e.doc,
                    e.path,
                    f"{e.pod.owner} is named as the {side} role but {problem}.",
                    extra=f"container {e.cname}",
                )
            )
    if p.kv_error or d.kv_error:
        return findings
    for kv in kv_connector_problems({"prefill": p.kv_config, "decode": d.kv_config}):
        findings.append(
            _pair_subject_finding(
                PD_CONNECTOR,
                Severity.FAIL,
                p,
                d,
                f"{kv.text}: no KV is handed over and decode silently recomputes every prompt",
            )
        )
    return findings


def _flag_or(cmd: EngineCommand, name: str, default: str) -> str:
    v = cmd.value(name)
    return default if v is None else v


def _repo_tag(image: str) -> tuple[str, str]:
    ref = normalize_image(image)
    return ref if ref else (image, "")


PD_SETTINGS = register(
    "SB107",
    "Prefill and decode roles disagree on settings both sides must share",
    "The KV blocks written by prefill are read by decode as raw memory: `--dtype` and "
    "`--kv-cache-dtype` must match (NixlConnector's handshake compares them and refuses; "
    "other connectors may read garbage). `--block-size` must match, except that "
    "NixlConnector supports a prefill block size smaller than decode's for non-hybrid "
    "models (a warning). `--tensor-parallel-size` may differ with NixlConnector "
    "(heterogeneous TP; hybrid/Mamba models still need equal TP, which lint cannot see), "
    "and with MooncakeConnector only in vLLM from about March 2026 (a warning); other "
    "connectors need equal TP. Both sides must serve the same model name, because the "
    "router sends one request body to both, and run the same vLLM image, because the NIXL "
    "handshake compares versions.",
    "Make these flags identical on both roles, or use a connector that supports the "
    "difference; set `--served-model-name` to the same name on both when the model "
    "directories differ between nodes.",
)


@PAIR_RULES.add(PD_SETTINGS)
def check_pd_settings(p: Engine, d: Engine) -> list[Finding]:
    findings: list[Finding] = []
    connector = str((p.kv_config or {}).get("kv_connector") or "")

    def add(severity: Severity, msg: str) -> None:
        findings.append(_pair_subject_finding(PD_SETTINGS, severity, p, d, msg))

    pn, dn = set(p.cmd.served_model_names), set(d.cmd.served_model_names)
    if pn and dn and not (pn & dn):
        add(
            Severity.FAIL,
            f"served model names differ (prefill {sorted(pn)}, decode {sorted(dn)}): the "
            "router sends one request body to both, so one side answers 404",
        )
    for flag in ("--dtype", "--kv-cache-dtype"):
        pv, dv = _flag_or(p.cmd, flag, "auto"), _flag_or(d.cmd, flag, "auto")
        if pv == dv:
            continue
        quantized = [v for v in (pv, dv) if flag == "--kv-cache-dtype" and v.startswith("fp8")]
        if "auto" in (pv, dv) and not quantized:
            add(
                Severity.WARN,
                f"{flag} is {pv} on prefill and {dv} on decode; 'auto' follows the model "
                "config, so set it explicitly and identically on both",
            )
        else:
            add(
                Severity.FAIL,
                f"{flag} differs (prefill {pv}, decode {dv}): the KV bytes prefill writes "
                "are not what decode reads",
            )
    pb, db = p.cmd.value("--block-size"), d.cmd.value("--block-size")
    if pb != db:
        if pb is None or db is None:
            add(
                Severity.WARN,
                f"--block-size is set on one role only (prefill {pb or 'default'}, decode "
                f"{db or 'default'}); the default depends on platform and model",
            )
        elif connector in NIXL_CONNECTORS and pb.isdigit() and db.isdigit():
            if int(pb) < int(db):
                add(
                    Severity.WARN,
                    f"--block-size differs (prefill {pb} < decode {db}): {connector} "
                    "remaps blocks only for non-hybrid models",
                )
            else:
                add(
                    Severity.FAIL,
                    f"--block-size differs (prefill {pb} > decode {db}): {connector} "
                    "supports only a prefill block size smaller than decode's",
                )
        else:
            add(
                Severity.FAIL,
                f"--block-size differs (prefill {pb}, decode {db}) with "
                f"{connector or 'this connector'}, which transfers whole blocks",
            )
    pt = _flag_or(p.cmd, "--tensor-parallel-size", "1")
    dt = _flag_or(d.cmd, "--tensor-parallel-size", "1")
    if pt != dt and connector not in NIXL_CONNECTORS:
        if connector in HOMOGENEOUS_CONNECTORS:
            add(
                Severity.FAIL,
                f"--tensor-parallel-size differs (prefill {pt}, decode {dt}) and "
                f"{connector} has no heterogeneous-TP support",
            )
        else:
            add(
                Severity.WARN,
                f"--tensor-parallel-size differs (prefill {pt}, decode {dt}); "
                f"{connector or 'this connector'} supports that only in recent vLLM, if at "
                "all (MooncakeConnector since about March 2026); NixlConnector supports it",
            )
    pi, di = _repo_tag(p.image or ""), _repo_tag(d.image or "")
    if p.image and d.image and pi != di:
        add(
            Severity.FAIL if pi[0] == di[0] else Severity.WARN,
            f"images differ (prefill {p.image}, decode {d.image}): both sides must run the "
            "same vLLM version (KV layouts and connector protocols change between versions; "
            "the NIXL handshake refuses a mismatch)",
        )
    return findings


def _env(e: Engine) -> dict[str, str]:
    """The container's plain environment values, each name's first entry only (one from
    ``valueFrom`` is unknown here, so absent)."""
    seen: set[str] = set()
    env: dict[str, str] = {}
    for item in e.container.get("env") or []:
        name = item.get("name") if isinstance(item, Mapping) else None
        if isinstance(name, str) and name not in seen:
            seen.add(name)
            if isinstance(item.get("value"), str):
                env[name] = item["value"]
    return env


KV_OVER_TCP = register(
    "SB112",
    "Prefill/decode KV cache handed over by TCP",
    "A PD pair whose KV connector is told to use TCP (UCX_TLS without an RDMA transport "
    "or multi-node NVLink (cuda_ipc with UCX_CUDA_IPC_ENABLE_MNNVL), libfabric's tcp or "
    "sockets provider, Mooncake's tcp protocol) moves every prompt's KV "
    "cache through host memory and sockets: the deployment works, and its time to first "
    "token is up to hundreds of times worse than over RDMA (NVIDIA Dynamo's guide measured "
    "~98 s against a few hundred ms). Fine on purpose (a test cluster); a warning so that "
    "it never happens by accident.",
    "Give the engines the cluster's RDMA fabric (servebook: the fabric parameter; by hand: "
    "the RDMA device resource, IPC_LOCK and UCX_TLS with rc/dc transports), or keep TCP "
    "knowingly.",
)


@PAIR_RULES.add(KV_OVER_TCP)
def check_pd_tcp(p: Engine, d: Engine) -> list[Finding]:
    how = {r: tcp_told(e.kv_config, _env(e)) for r, e in (("prefill", p), ("decode", d))}
    said = {r: h for r, h in how.items() if h}
    if not said:
        return []
    return [
        _pair_subject_finding(
            KV_OVER_TCP,
            Severity.WARN,
            p,
            d,
            "the KV cache crosses from prefill to decode over TCP ("
            + "; ".join(f"{r}: {h}" for r, h in said.items())
            + ")",
            transport=said,
        )
    ]
