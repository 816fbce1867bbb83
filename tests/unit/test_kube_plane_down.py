"""`scripts/kube-plane down DIR` runs only the binary `up` recorded, by its digest (issue
44, point 7; hostile probe D11 of ``shared/reference/hostile-probe-2026-12-07.md``: it ran
any executable named ``DIR/kube-plane``, as root, and exited 0 saying nothing).  The Go
side (``up`` records ``binary`` and ``binarySHA256`` in plane.json, and owns only what it
made in DIR: D3) is tested by ``plane/cmd/kube-plane/plane_dir_test.go``."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "kube-plane"


def executable(path: Path, ran: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "$@" > {ran}\n')
    path.chmod(0o755)
    return path


def down(plane: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SERVEBOOK_PLANE_CACHE": str(cache)}
    return subprocess.run(
        [str(SCRIPT), "down", str(plane)], env=env, capture_output=True, text=True, timeout=30
    )


def record(plane: Path, binary: Path, digest: str) -> None:
    doc = {"version": "v1", "layout": {"dir": str(plane)}, "processes": [],
           "binary": str(binary), "binarySHA256": f"sha256:{digest}"}  # fmt: skip
    (plane / "plane.json").write_text(json.dumps(doc, indent=2) + "\n")  # as Go's MarshalIndent


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_d11_down_never_runs_an_executable_planted_in_dir(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    plane = tmp_path / "p"
    planted = executable(plane / "kube-plane", ran)
    cache = tmp_path / "cache"
    r = down(plane, cache)  # a DIR no `up` used: no plane.json
    assert r.returncode == 0 and "no plane recorded" in r.stdout, (r.stdout, r.stderr)
    assert not ran.exists()
    # a record naming it (with its true digest): not a binary of the plane cache
    record(plane, planted, sha(planted))
    r = down(plane, cache)
    assert r.returncode == 2 and "not one of the plane cache" in r.stderr, (r.stdout, r.stderr)
    assert "nothing was run" in r.stderr and not ran.exists()
    # a link in the cache pointing out of it is judged by where it points
    (cache / "0123456789abcdef").mkdir(parents=True)
    (cache / "0123456789abcdef" / "kube-plane").symlink_to(planted)
    record(plane, cache / "0123456789abcdef" / "kube-plane", sha(planted))
    r = down(plane, cache)
    assert r.returncode == 2 and not ran.exists(), (r.stdout, r.stderr)


def test_down_runs_the_recorded_binary_only_while_its_digest_is_the_recorded_one(
    tmp_path: Path,
) -> None:
    ran = tmp_path / "ran"
    plane = tmp_path / "p"
    plane.mkdir()
    cache = tmp_path / "cache"
    binary = executable(cache / "fedcba9876543210" / "kube-plane", ran)
    record(plane, binary, sha(binary))
    r = down(plane, cache)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert ran.read_text().split() == ["down", str(plane)]
    ran.unlink()
    binary.write_text(binary.read_text() + "# changed after up\n")
    r = down(plane, cache)
    assert r.returncode == 2 and "its sha256 differs" in r.stderr, (r.stdout, r.stderr)
    assert not ran.exists()
