"""`servebook probe`: every case is a real model directory (made by `servebook model tiny`, or
written with the safetensors package), then damaged the way the field notes saw, with the
exact verdict of every check asserted.  Mount cases use captured mountinfo files.  Every
probe run is proven read-only (paths, sizes, mtimes and modes unchanged; an absent path
stays absent) and to finish in under 2 s."""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from servebook.findings import REGISTRY, Finding
from servebook.models.tiny import make_tiny_model
from servebook.preflight import probe as P
from servebook.preflight.probe_checks import PROBE_CHECKS, probe_script_path, to_finding
from tests.conftest import CliResult

FIXTURES = Path(__file__).parent / "fixtures" / "probe"
THIS_MACHINE = FIXTURES / "this-machine-ext4-root.mountinfo"
# The captured mountinfo of this kind of machine: `/` is ext4, so every tmp dir is local.
LOCAL = P.parse_mountinfo(THIS_MACHINE.read_text())
MAX_SECONDS = 2.0

# Checks every model directory gets when nothing is skipped (SB203 only with --expect-model).
BASE = ("SB201", "SB202", "SB204", "SB205", "SB206", "SB207", "SB208", "SB209", "SB210", "SB211")

Findings = list[dict[str, Any]]


# --- real model directories ------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("src") / "tiny")


@pytest.fixture(scope="session")
def draft_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("src") / "tiny-draft", draft=True)


@pytest.fixture
def model(tmp_path: Path, tiny_src: Path) -> Path:
    """A fresh copy of the tiny model (4 safetensors shards + index + tokenizer.json)."""
    return Path(shutil.copytree(tiny_src, tmp_path / "models" / "tiny"))


def shards(d: Path) -> list[Path]:
    return sorted(d.glob("*.safetensors"))


def write_sharded_model(d: Path, n: int, tokenizer_from: Path) -> Path:
    """A real n-shard safetensors model (one layer per shard), index, config, tokenizer: the
    shape of a 96-shard checkpoint, small enough to write in a test."""
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(1, n + 1):
        name = f"model-{i:05d}-of-{n:05d}.safetensors"
        tensors = {
            f"model.layers.{i - 1}.mlp.down_proj.weight": rng.standard_normal((8, 16)).astype(
                np.float16
            ),
            f"model.layers.{i - 1}.input_layernorm.weight": np.ones(8, dtype=np.float16),
        }
        save_file(tensors, str(d / name), metadata={"format": "pt"})
        for k, v in tensors.items():
            weight_map[k] = name
            total += v.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = json.loads((tokenizer_from / "config.json").read_text())
    config.update(num_hidden_layers=n, _name_or_path="servebook-sharded-llama")
    (d / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(tokenizer_from / "tokenizer.json", d / "tokenizer.json")
    return d


def make_hf_cache(hub: Path, src: Path, repo: str = "servebook/tiny-llama") -> Path:
    """A Hugging Face cache repo for `src`: blobs named by content hash, a snapshot of
    relative links into ../../blobs, refs/main, and the lock files huggingface_hub leaves
    behind after a successful download.  Returns the snapshot directory."""
    folder = hub / ("models--" + repo.replace("/", "--"))
    rev = "0123456789abcdef0123456789abcdef01234567"
    snap = folder / "snapshots" / rev
    (folder / "blobs").mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(rev)
    snap.mkdir(parents=True)
    locks = hub / ".locks" / folder.name
    locks.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        data = f.read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (folder / "blobs" / blob).write_bytes(data)
        (snap / f.name).symlink_to(Path("..", "..", "blobs", blob))
        (locks / f"{blob}.lock").write_bytes(b"")
    return snap


def blob_of(link: Path) -> Path:
    return (link.parent / os.readlink(link)).resolve()


# --- running the probe: read-only, timed, exact verdicts --------------------------------------


def tree_state(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under root (links not followed) with size, mtime_ns and mode."""
    state: dict[str, tuple[int, int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames]:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            state[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return state


TIMINGS: dict[str, float] = {}


def run_probe(
    root: Path,
    path: Path | str,
    *,
    expect: str | None = None,
    draft: Path | None = None,
    mounts: list[P.Mount] | None = LOCAL,
    mount_error: str = "",
) -> Findings:
    """P.probe on `path`, asserting it changed nothing under `root` and took < 2 s."""
    before = tree_state(root)
    absent = [p for p in (path, draft) if p is not None and not os.path.lexists(p)]
    t0 = time.perf_counter()
    found = P.probe(str(path), expect, str(draft) if draft else None, mounts, mount_error)
    elapsed = time.perf_counter() - t0
    TIMINGS[str(path)] = elapsed
    assert elapsed < MAX_SECONDS, f"probe took {elapsed:.2f} s"
    assert tree_state(root) == before, "the probe changed the tree it checked"
    for p in absent:
        assert not os.path.lexists(p), f"the probe created {p}"
    return found


def verdicts(findings: Findings, role: str = "model") -> dict[str, str]:
    """check id -> severity ('pass+fail' when a check reported twice), for one role."""
    out: dict[str, list[str]] = {}
    for f in findings:
        if f["subject"].endswith(" (draft)") == (role == "draft"):
            out.setdefault(f["check"], []).append(f["severity"])
    return {k: "+".join(v) for k, v in out.items()}


def passing(**changes: str | None) -> dict[str, str]:
    """Every BASE check passing, with `changes` (None removes a check)."""
    v = dict.fromkeys(BASE, "pass")
    for k, s in changes.items():
        if s is None:
            v.pop(k, None)
        else:
            v[k] = s
    return v


def only(findings: Findings, check: str, role: str = "model") -> dict[str, Any]:
    hits = [
        f
        for f in findings
        if f["check"] == check and f["subject"].endswith(" (draft)") == (role == "draft")
    ]
    assert len(hits) == 1, hits
    return hits[0]


def truncate(path: Path, fraction: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


# --- intact models pass -----------------------------------------------------------------------


def test_intact_tiny_model_passes_every_check(tmp_path: Path, model: Path) -> None:
    found = run_probe(tmp_path, model, expect="LlamaForCausalLM")
    assert verdicts(found) == passing(SB203="pass")
    assert P.exit_code(found) == 0
    assert "every indexed tensor in its shard" in only(found, "SB205")["message"]
    assert only(found, "SB207")["evidence"]["tensor_bytes"] > 0


@pytest.mark.parametrize(
    "expect",
    ["LlamaForCausalLM", "llamaforcausallm", "servebook-tiny-llama", "org/SERVEBOOK-tiny-llama"],
)
def test_expect_model_matches_architecture_or_name_case_insensitively(
    tmp_path: Path, model: Path, expect: str
) -> None:
    found = run_probe(tmp_path, model, expect=expect)
    assert verdicts(found)["SB203"] == "pass"


def test_expect_model_does_not_accept_model_type_family_name(tmp_path: Path, model: Path) -> None:
    # "llama" names a family of many models: accepting it would let another Llama pass.
    found = run_probe(tmp_path, model, expect="llama")
    assert verdicts(found) == passing(SB203="fail")


def test_sharded_96_shard_model_passes(tmp_path: Path, tiny_src: Path) -> None:
    big = write_sharded_model(tmp_path / "big", 96, tiny_src)
    found = run_probe(tmp_path, big)
    assert verdicts(found) == passing()
    assert only(found, "SB204")["message"].startswith("96 weight file(s)")


def test_draft_model_checked_too(tmp_path: Path, model: Path, draft_src: Path) -> None:
    draft = Path(shutil.copytree(draft_src, tmp_path / "models" / "draft"))
    found = run_probe(tmp_path, model, draft=draft)
    assert verdicts(found) == passing()
    assert verdicts(found, "draft") == passing()
    assert P.exit_code(found) == 0


# --- the field notes' false PASSes ------------------------------------------------------------


def test_download_7_7_percent_complete_fails(tmp_path: Path, tiny_src: Path) -> None:
    # 96 shards named by the index; 7 complete, the 8th 39% written, the rest not yet there:
    # 7.39 / 96 = 7.7% of the download.
    big = write_sharded_model(tmp_path / "big", 96, tiny_src)
    all_shards = shards(big)
    truncate(all_shards[7], 0.39)
    for s in all_shards[8:]:
        s.unlink()
    found = run_probe(tmp_path, big)
    assert verdicts(found) == passing(SB205="fail", SB206="fail", SB207="info")
    assert "88 named shard(s) missing" in only(found, "SB205")["message"]
    assert "model-00008-of-00096.safetensors: truncated" in only(found, "SB206")["message"]
    assert P.exit_code(found) == 1


def test_shard_truncated_to_7_7_percent_fails(tmp_path: Path, model: Path) -> None:
    shard = shards(model)[0]
    size = shard.stat().st_size
    truncate(shard, 0.077)
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB206="fail", SB207="info")
    msg = only(found, "SB206")["message"]
    assert f"truncated: {int(size * 0.077)} of the {size} bytes" in msg and "(7.7%)" in msg


def test_92_of_96_shards_fails_naming_the_missing_ones(tmp_path: Path, tiny_src: Path) -> None:
    big = write_sharded_model(tmp_path / "big", 96, tiny_src)
    gone = [shards(big)[i] for i in (3, 40, 41, 95)]
    for s in gone:
        s.unlink()
    found = run_probe(tmp_path, big)
    assert verdicts(found) == passing(SB205="fail", SB207="info")
    f = only(found, "SB205")
    assert "4 named shard(s) missing" in f["message"]
    assert f["evidence"]["missing_shards"] == [s.name for s in gone]
    assert f["evidence"]["present_shards"] == 92 and f["evidence"]["indexed_shards"] == 96


def test_96_zero_byte_shards_fail(tmp_path: Path, tiny_src: Path) -> None:
    big = write_sharded_model(tmp_path / "big", 96, tiny_src)
    for s in shards(big):
        s.write_bytes(b"")
    found = run_probe(tmp_path, big)
    assert verdicts(found) == passing(SB204="fail", SB206="fail", SB207="info")
    assert "all empty (0 bytes)" in only(found, "SB204")["message"]
    assert "96 of 96 weight file(s) damaged" in only(found, "SB206")["message"]
    assert set(only(found, "SB206")["evidence"]["damaged"].values()) == {"empty file (0 bytes)"}


def test_no_config_json_fails(tmp_path: Path, model: Path) -> None:
    (model / "config.json").unlink()
    found = run_probe(tmp_path, model, expect="LlamaForCausalLM")
    assert verdicts(found) == passing(SB202="fail", SB203="fail")


def test_truncated_config_json_fails(tmp_path: Path, model: Path) -> None:
    truncate(model / "config.json", 0.5)
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB202="fail")
    assert "not valid JSON" in only(found, "SB202")["message"]


def test_a_deep_config_json_is_a_failing_finding_not_a_recursion_error(
    tmp_path: Path, model: Path
) -> None:
    (model / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB202="fail")
    assert "nested deeper than 100 levels" in only(found, "SB202")["message"]


QWEN_CONFIG = {
    "_name_or_path": "Qwen/Qwen2.5-7B-Instruct",
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "vocab_size": 152064,
}


@pytest.mark.parametrize("expect", ["LlamaForCausalLM", "servebook-tiny-llama"])
def test_different_models_config_fails_expect_model(
    tmp_path: Path, model: Path, expect: str
) -> None:
    (model / "config.json").write_text(json.dumps(QWEN_CONFIG, indent=2))
    found = run_probe(tmp_path, model, expect=expect)
    assert verdicts(found) == passing(SB203="fail")
    f = only(found, "SB203")
    assert "Qwen2ForCausalLM" in f["message"] and f["evidence"]["expected"] == expect


def test_empty_draft_directory_fails(tmp_path: Path, model: Path) -> None:
    # The field notes' bug: a count of "0" treated as a non-empty string.
    draft = tmp_path / "models" / "draft"
    draft.mkdir()
    found = run_probe(tmp_path, model, draft=draft)
    assert verdicts(found) == passing()
    assert verdicts(found, "draft") == {"SB201": "fail"}
    assert "empty directory (0 entries)" in only(found, "SB201", "draft")["message"]
    assert P.exit_code(found) == 1


def test_absent_draft_directory_fails_and_stays_absent(tmp_path: Path, model: Path) -> None:
    found = run_probe(tmp_path, model, draft=tmp_path / "models" / "no-such-draft")
    assert verdicts(found, "draft") == {"SB201": "fail"}


def test_draft_without_tokenizer_is_fine(tmp_path: Path, model: Path, draft_src: Path) -> None:
    # EAGLE-style drafts ship no tokenizer: the engine uses the target's.
    draft = Path(shutil.copytree(draft_src, tmp_path / "models" / "draft"))
    (draft / "tokenizer.json").unlink()
    found = run_probe(tmp_path, model, draft=draft)
    assert verdicts(found, "draft") == passing(SB210="info")
    assert P.exit_code(found) == 0


# --- damaged weights --------------------------------------------------------------------------


def test_garbage_shard_fails(tmp_path: Path, model: Path) -> None:
    shard = shards(model)[1]
    shard.write_bytes(np.random.default_rng(1).bytes(shard.stat().st_size))
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB206="fail", SB207="info")
    assert shard.name in only(found, "SB206")["evidence"]["damaged"]


def test_garbage_json_header_fails(tmp_path: Path, model: Path) -> None:
    shard = shards(model)[1]
    data = bytearray(shard.read_bytes())
    data[8:16] = b"\xff\xfe{{{{{{"
    shard.write_bytes(bytes(data))
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB206="fail", SB207="info")
    assert "header is not valid JSON" in only(found, "SB206")["message"]


def test_a_deep_json_header_fails_not_a_recursion_error(tmp_path: Path, model: Path) -> None:
    shard = shards(model)[1]
    deep = b"[" * 50_000 + b"]" * 50_000
    shard.write_bytes(len(deep).to_bytes(8, "little") + deep)
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB206="fail", SB207="info")
    assert "header is nested deeper than 100 levels" in only(found, "SB206")["message"]


def test_over_long_shard_fails(tmp_path: Path, model: Path) -> None:
    shard = shards(model)[2]
    with shard.open("ab") as f:
        f.write(b"\0" * 4096)
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB206="fail", SB207="info")
    assert "over-long: 4096 bytes beyond" in only(found, "SB206")["message"]


def hole_after_header(shard: Path) -> None:
    """The shard as an interrupted copy leaves it (issue 33, D11): its first 4 KiB (the
    header) written, its length set, the rest never written (a hole: sparse, zeros)."""
    size = shard.stat().st_size
    head = shard.read_bytes()[:4096]
    with shard.open("r+b") as f:
        f.truncate(0)
        f.write(head)
        f.truncate(size)


def test_a_shard_whose_data_is_a_hole_fails(tmp_path: Path, model: Path) -> None:
    shard = shards(model)[2]
    size = shard.stat().st_size
    hole_after_header(shard)
    assert shard.stat().st_size == size  # the right size: every size check passes
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB206="fail", SB207="info")
    msg = only(found, "SB206")["message"]
    assert f"{shard.name}: data unwritten" in msg and "all zeros" in msg
    assert P.exit_code(found) == 1


def test_a_shard_written_with_zeros_fails_and_real_data_passes(tmp_path: Path, model: Path) -> None:
    shard = shards(model)[1]
    raw = shard.read_bytes()
    n = 8 + int.from_bytes(raw[:8], "little")
    shard.write_bytes(raw[:n] + bytes(len(raw) - n))  # allocated, but zeros
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB206="fail", SB207="info")
    assert "data unwritten" in only(found, "SB206")["message"]
    shard.write_bytes(raw)
    assert verdicts(run_probe(tmp_path, model)) == passing()


def test_git_lfs_pointer_instead_of_weights_fails(tmp_path: Path, model: Path) -> None:
    shard = shards(model)[0]
    shard.write_text(
        "version https://git-lfs.github.com/spec/v1\n"
        "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
        "size 1048712\n"
    )
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB206="fail", SB207="info")
    assert "Git LFS pointer" in only(found, "SB206")["message"]


def test_index_total_size_mismatch_fails(tmp_path: Path, model: Path) -> None:
    index = model / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["metadata"]["total_size"] += 2048
    index.write_text(json.dumps(doc, indent=2))
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB207="fail")
    assert "(-2048)" in only(found, "SB207")["message"]


def test_index_naming_a_tensor_its_shard_lacks_fails(tmp_path: Path, model: Path) -> None:
    index = model / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"]["model.mtp.fc.weight"] = shards(model)[-1].name
    index.write_text(json.dumps(doc, indent=2))
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB205="fail")
    assert only(found, "SB205")["evidence"]["missing_tensors"] == [
        f"model.mtp.fc.weight (in {shards(model)[-1].name})"
    ]


def test_missing_shard_caught_by_name_even_without_index(tmp_path: Path, model: Path) -> None:
    (model / "model.safetensors.index.json").unlink()
    gone = shards(model)[2]
    gone.unlink()
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB205="fail", SB207=None)
    assert only(found, "SB205")["evidence"]["missing_shards"] == [gone.name]


def test_no_weights_at_all_fails(tmp_path: Path, model: Path) -> None:
    for s in shards(model):
        s.unlink()
    (model / "model.safetensors.index.json").unlink()
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB204="fail", SB205=None, SB206=None, SB207=None)


def test_truncated_pytorch_bin_checkpoint_fails(tmp_path: Path, model: Path) -> None:
    import zipfile

    for s in shards(model):
        s.unlink()
    (model / "model.safetensors.index.json").unlink()
    # torch.save writes a zip archive: <name>/data.pkl, <name>/data/0, ...
    with zipfile.ZipFile(model / "pytorch_model.bin", "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/data/0", np.zeros(4096, dtype=np.float32).tobytes())
        z.writestr("archive/version", b"3\n")
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB205=None, SB207=None)
    truncate(model / "pytorch_model.bin", 0.5)
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB205=None, SB206="fail", SB207=None)
    assert "damaged zip archive" in only(found, "SB206")["message"]


# --- leftovers, links, Hugging Face cache -----------------------------------------------------


@pytest.mark.parametrize(
    "leftover",
    [
        "model-00002-of-00004.safetensors.incomplete",
        "model-00002-of-00004.safetensors.part",
        "tmpab12cd.tmp",
        "model-00002-of-00004.safetensors.lock",
        ".cache/huggingface/download/model-00002-of-00004.safetensors.incomplete",
    ],
)
def test_leftover_of_unfinished_download_fails(tmp_path: Path, model: Path, leftover: str) -> None:
    (model / leftover).parent.mkdir(parents=True, exist_ok=True)
    (model / leftover).write_bytes(b"\0" * 100)
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB208="fail")
    assert only(found, "SB208")["evidence"]["leftovers"] == [leftover]


def test_lock_files_huggingface_keeps_after_download_are_not_leftovers(
    tmp_path: Path, model: Path
) -> None:
    locks = model / ".cache" / "huggingface" / "download"
    locks.mkdir(parents=True)
    (locks / "config.json.lock").write_bytes(b"")
    (locks / "config.json.metadata").write_text("abc\n123\n")
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing()


def test_dangling_symlink_fails(tmp_path: Path, model: Path) -> None:
    (model / "generation_config.json").unlink()
    (model / "generation_config.json").symlink_to(tmp_path / "elsewhere" / "gen.json")
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB209="fail")
    assert only(found, "SB209")["evidence"]["dangling"] == [
        {"link": "generation_config.json", "target": str(tmp_path / "elsewhere" / "gen.json")}
    ]


def test_hf_cache_snapshot_passes_and_names_its_repo(tmp_path: Path, tiny_src: Path) -> None:
    snap = make_hf_cache(tmp_path / "hub", tiny_src)
    found = run_probe(tmp_path, snap, expect="servebook/tiny-llama")
    assert verdicts(found) == passing(SB203="pass")
    assert "Hugging Face cache snapshot of servebook/tiny-llama" in only(found, "SB209")["message"]
    assert only(found, "SB209")["evidence"]["links"] == len(list(tiny_src.iterdir()))


def test_hf_cache_snapshot_with_missing_blob_fails(tmp_path: Path, tiny_src: Path) -> None:
    snap = make_hf_cache(tmp_path / "hub", tiny_src)
    shard_link = shards(snap)[1]
    blob_of(shard_link).unlink()
    found = run_probe(tmp_path, snap)
    assert verdicts(found) == passing(SB205="fail", SB207="info", SB209="fail")
    assert only(found, "SB205")["evidence"]["missing_shards"] == [shard_link.name]
    assert only(found, "SB209")["evidence"]["dangling"][0]["link"] == shard_link.name


def test_hf_cache_blob_still_downloading_fails(tmp_path: Path, tiny_src: Path) -> None:
    snap = make_hf_cache(tmp_path / "hub", tiny_src)
    blobs = snap.parent.parent / "blobs"
    (blobs / ("f" * 64 + ".incomplete")).write_bytes(b"\0" * 1000)
    found = run_probe(tmp_path, snap)
    assert verdicts(found) == passing(SB208="fail")


def test_hf_cache_repo_folder_instead_of_snapshot_says_where_the_model_is(
    tmp_path: Path, tiny_src: Path
) -> None:
    snap = make_hf_cache(tmp_path / "hub", tiny_src)
    found = run_probe(tmp_path, snap.parent.parent)
    assert verdicts(found)["SB202"] == "fail"
    assert "snapshots/<rev>" in only(found, "SB202")["message"]


# --- tokenizer ---------------------------------------------------------------------------------


def test_no_tokenizer_fails(tmp_path: Path, model: Path) -> None:
    (model / "tokenizer.json").unlink()
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB210="fail")


def test_truncated_tokenizer_json_fails(tmp_path: Path, model: Path) -> None:
    truncate(model / "tokenizer.json", 0.3)
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB210="fail")


def test_a_fifo_tokenizer_is_named_as_what_it_is(tmp_path: Path, model: Path) -> None:
    (model / "tokenizer.json").unlink()
    os.mkfifo(model / "tokenizer.json")
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing(SB210="fail")
    message = only(found, "SB210")["message"]
    assert "tokenizer.json (not a regular file)" in message
    assert "dangling" not in message


def test_vocab_plus_merges_is_a_tokenizer(tmp_path: Path, model: Path) -> None:
    (model / "tokenizer.json").unlink()
    (model / "vocab.json").write_text('{"a": 0, "b": 1}')
    (model / "merges.txt").write_text("#version: 0.2\na b\n")
    found = run_probe(tmp_path, model)
    assert verdicts(found) == passing()


# --- the directory itself ----------------------------------------------------------------------


def test_dir_that_is_a_file_fails_alone(tmp_path: Path, model: Path) -> None:
    found = run_probe(tmp_path, model / "config.json")
    assert verdicts(found) == {"SB201": "fail"}
    assert "is a file, not a directory" in found[0]["message"]


def test_absent_dir_fails_stays_absent_and_suggests_the_typo_fix(
    tmp_path: Path, model: Path
) -> None:
    typo = model.parent / "tinny"
    found = run_probe(tmp_path, typo)
    assert verdicts(found) == {"SB201": "fail"}
    assert f"did you mean {model}?" in found[0]["message"]
    assert not typo.exists()


def test_absent_dir_under_absent_parents_creates_nothing(tmp_path: Path) -> None:
    deep = tmp_path / "mnt" / "modles" / "llama"
    found = run_probe(tmp_path, deep)
    assert verdicts(found) == {"SB201": "fail"}
    assert not (tmp_path / "mnt").exists()


def test_symlinked_dir_is_resolved(tmp_path: Path, model: Path) -> None:
    link = tmp_path / "current"
    link.symlink_to(model)
    found = run_probe(tmp_path, link)
    assert verdicts(found) == passing()
    assert only(found, "SB201")["evidence"]["real_path"] == str(model)


def test_empty_model_dir_fails(tmp_path: Path) -> None:
    empty = tmp_path / "models" / "empty"
    empty.mkdir(parents=True)
    found = run_probe(tmp_path, empty)
    assert verdicts(found) == {"SB201": "fail"}


# --- mounts: pure parsing and lookup on captured mountinfo files --------------------------------


def mounts_of(name: str) -> list[P.Mount]:
    return P.parse_mountinfo((FIXTURES / name).read_text())


def fstype_at(mounts: list[P.Mount], path: str) -> str:
    m = P.mount_for(path, mounts)
    assert m is not None
    return m.fstype


def verdict_for(mountinfo: str, path: str) -> tuple[str, str, str, str]:
    m = P.mount_for(path, mounts_of(mountinfo))
    assert m is not None
    return m.mount_point, m.fstype, m.source, P.classify_fs(m.fstype, m.source)[0]


K8S = "k8s-gpu-node-nfs-models.mountinfo"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        # Weights on their own NFS mount below a local parent: the field notes' false PASS.
        (
            "/mnt/models/llama-3.1-8b",
            ("/mnt/models", "nfs4", "10.0.0.5:/export/models", "fail"),
        ),
        ("/mnt/models", ("/mnt/models", "nfs4", "10.0.0.5:/export/models", "fail")),
        ("/mnt", ("/", "ext4", "/dev/nvme0n1p2", "pass")),
        # Component-wise: /mnt/models does not contain /mnt/models2, /data not /data2.
        ("/mnt/models2/llama", ("/", "ext4", "/dev/nvme0n1p2", "pass")),
        ("/data2/llama", ("/", "ext4", "/dev/nvme0n1p2", "pass")),
        ("/data/llama", ("/data", "nfs", "10.0.0.6:/srv/data", "fail")),
        ("/mnt/local-nvme/llama", ("/mnt/local-nvme", "xfs", "/dev/nvme1n1", "pass")),
        ("/var/lib/kubelet/models", ("/var/lib/kubelet", "ext4", "/dev/nvme0n1p2", "pass")),
    ],
)
def test_own_mount_on_a_k8s_gpu_node(path: str, expected: tuple[str, str, str, str]) -> None:
    assert verdict_for(K8S, path) == expected


def test_only_local_path_on_a_node_with_root_mounted_passes() -> None:
    # The field notes' false FAIL: `/` is the only local mount and the model is under it.
    assert verdict_for("node-root-only.mountinfo", "/opt/models/llama") == (
        "/",
        "ext4",
        "/dev/sda1",
        "pass",
    )
    assert verdict_for("node-root-only.mountinfo", "/home/me/llama")[3] == "fail"


@pytest.mark.parametrize(
    ("path", "fstype", "severity"),
    [
        ("/mnt/s3-models/llama", "fuse.s3fs", "fail"),
        ("/mnt/gcs/llama", "fuse.gcsfuse", "fail"),
        ("/mnt/rclone/llama", "fuse.rclone", "fail"),
        ("/jfs/llama", "fuse.juicefs", "fail"),
        ("/mnt/mountpoint-s3/llama", "fuse", "fail"),
        ("/mnt/sshfs/llama", "fuse.sshfs", "fail"),
        ("/mnt/cifs/llama", "cifs", "fail"),
        ("/mnt/cephfs/llama", "ceph", "fail"),
        ("/mnt/lustre/llama", "lustre", "fail"),
        ("/mnt/host/llama", "9p", "fail"),
        ("/var/lib/lxcfs/proc", "fuse.lxcfs", "pass"),
        ("/mnt/mystery/llama", "fuse.mysteryfs", "warn"),
        ("/opt/llama", "ext4", "pass"),
    ],
)
def test_network_and_object_store_mounts_fail(path: str, fstype: str, severity: str) -> None:
    _, got_type, _, got = verdict_for("node-fuse-object-stores.mountinfo", path)
    assert (got_type, got) == (fstype, severity)


def test_octal_escaped_mount_points_are_unescaped() -> None:
    mi = "node-octal-escaped-mountpoint.mountinfo"
    assert verdict_for(mi, "/mnt/model store/llama") == (
        "/mnt/model store",
        "nfs4",
        "filer1:/vol/model store",
        "fail",
    )
    assert verdict_for(mi, "/mnt/model/llama")[:2] == ("/mnt/model", "ext4")
    assert verdict_for(mi, "/mnt/tab\tdir/llama")[:2] == ("/mnt/tab\tdir", "xfs")


@pytest.mark.parametrize(
    ("mountinfo", "fstype", "severity"),
    [
        ("pod-probe-hostpath-nfs.mountinfo", "nfs4", "fail"),
        ("pod-probe-hostpath-local.mountinfo", "xfs", "pass"),
    ],
)
def test_probe_pod_sees_the_hostpath_mounts_filesystem(
    mountinfo: str, fstype: str, severity: str
) -> None:
    m = P.mount_for("/models", mounts_of(mountinfo))
    assert m is not None and m.root == "/llama-3.1-8b-instruct"
    assert (m.fstype, P.classify_fs(m.fstype, m.source)[0]) == (fstype, severity)
    assert fstype_at(mounts_of(mountinfo), "/etc/hosts") == "ext4"


def test_stacked_mounts_the_last_one_listed_is_visible() -> None:
    # This machine's capture mounts /dev/shm twice (ids 25, then 30).
    m = P.mount_for("/dev/shm/x", mounts_of("this-machine-ext4-root.mountinfo"))
    assert m is not None and m.mount_id == "30"
    stacked = P.parse_mountinfo(
        "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "2 1 0:40 / /mnt/models rw - ext4 /dev/sdb1 rw\n"
        "3 2 0:41 / /mnt/models rw - nfs4 srv:/models rw\n"
    )
    assert fstype_at(stacked, "/mnt/models/a") == "nfs4"


def test_malformed_mountinfo_lines_are_skipped() -> None:
    mounts = P.parse_mountinfo("garbage\n\n1 0 8:1 / / rw shared:1 - ext4 /dev/sda1 rw\n")
    assert [(m.mount_point, m.fstype, m.line) for m in mounts] == [("/", "ext4", 3)]


# --- mounts end to end: captured node files relocated under a tmp "node root" ------------------


def _escape(path: str) -> str:
    return (
        path.replace("\\", "\\134")
        .replace(" ", "\\040")
        .replace("\t", "\\011")
        .replace("\n", "\\012")
    )


def relocated(mountinfo: str, node: Path) -> list[P.Mount]:
    """The captured node's mounts, every mount point but `/` moved under `node`, so a real
    directory at node/mnt/models/x sits on the node's /mnt/models mount."""
    lines = []
    for line in (FIXTURES / mountinfo).read_text().splitlines():
        f = line.split(" ")
        if f[4] != "/":
            f[4] = _escape(str(node)) + f[4]
        lines.append(" ".join(f))
    return P.parse_mountinfo("\n".join(lines))


def test_weights_on_own_nfs_mount_below_local_parent_fail(tmp_path: Path, tiny_src: Path) -> None:
    node = tmp_path / "node"
    model = Path(shutil.copytree(tiny_src, node / "mnt" / "models" / "llama"))
    found = run_probe(tmp_path, model, mounts=relocated(K8S, node))
    assert verdicts(found) == passing(SB211="fail")
    f = only(found, "SB211")
    assert f["evidence"]["mount_point"] == str(node / "mnt" / "models")
    assert (f["evidence"]["fstype"], f["evidence"]["source"]) == ("nfs4", "10.0.0.5:/export/models")
    assert "10x slower" in f["message"]


def test_only_local_path_under_root_passes_end_to_end(tmp_path: Path, tiny_src: Path) -> None:
    node = tmp_path / "node"
    model = Path(shutil.copytree(tiny_src, node / "opt" / "models" / "llama"))
    found = run_probe(tmp_path, model, mounts=relocated("node-root-only.mountinfo", node))
    assert verdicts(found) == passing()
    assert only(found, "SB211")["evidence"]["mount_point"] == "/"


def test_fuse_s3fs_mount_fails_end_to_end(tmp_path: Path, tiny_src: Path) -> None:
    node = tmp_path / "node"
    model = Path(shutil.copytree(tiny_src, node / "mnt" / "s3-models" / "llama"))
    found = run_probe(tmp_path, model, mounts=relocated("node-fuse-object-stores.mountinfo", node))
    assert verdicts(found) == passing(SB211="fail")
    assert "S3 object store" in only(found, "SB211")["message"]


def test_octal_escaped_mount_point_end_to_end(tmp_path: Path, tiny_src: Path) -> None:
    node = tmp_path / "node"
    mounts = relocated("node-octal-escaped-mountpoint.mountinfo", node)
    on_nfs = Path(shutil.copytree(tiny_src, node / "mnt" / "model store" / "llama"))
    on_ext4 = Path(shutil.copytree(tiny_src, node / "mnt" / "model" / "llama"))
    assert verdicts(run_probe(tmp_path, on_nfs, mounts=mounts)) == passing(SB211="fail")
    assert verdicts(run_probe(tmp_path, on_ext4, mounts=mounts)) == passing()


def test_local_symlink_into_nfs_is_judged_by_its_target(tmp_path: Path, tiny_src: Path) -> None:
    node = tmp_path / "node"
    real = Path(shutil.copytree(tiny_src, node / "mnt" / "models" / "llama"))
    (node / "opt").mkdir()
    link = node / "opt" / "llama"
    link.symlink_to(real)
    found = run_probe(tmp_path, link, mounts=relocated(K8S, node))
    assert verdicts(found) == passing(SB211="fail")


def test_hf_cache_whose_blobs_sit_on_nfs_fails(tmp_path: Path, tiny_src: Path) -> None:
    # The snapshot directory is local, but its links lead onto NFS: the engine reads there.
    node = tmp_path / "node"
    snap = make_hf_cache(node / "opt" / "hub", tiny_src)
    blobs = snap.parent.parent / "blobs"
    nfs_blobs = node / "mnt" / "models" / "blobs"
    nfs_blobs.parent.mkdir(parents=True)
    shutil.move(str(blobs), str(nfs_blobs))
    blobs.symlink_to(nfs_blobs)
    found = run_probe(tmp_path, snap, mounts=relocated(K8S, node))
    assert verdicts(found) == passing(SB211="pass+fail")
    on_nfs = next(f for f in found if f["check"] == "SB211" and f["severity"] == "fail")
    assert "resolve through links onto another mount" in on_nfs["message"]


def test_unreadable_mountinfo_is_an_error_never_a_pass(tmp_path: Path, model: Path) -> None:
    mounts, problem = P.read_mountinfo(str(tmp_path / "no-such-mountinfo"))
    assert mounts is None and "cannot read" in problem
    found = run_probe(tmp_path, model, mounts=None, mount_error=problem)
    assert verdicts(found) == passing(SB211="error")
    assert P.exit_code(found) == 2


# --- --find ------------------------------------------------------------------------------------


@pytest.fixture
def search_root(tmp_path: Path, tiny_src: Path) -> Path:
    root = tmp_path / "node-models"
    shutil.copytree(tiny_src, root / "team-a" / "tiny")
    big = write_sharded_model(root / "team-b" / "big", 96, tiny_src)
    for s in shards(big)[92:]:
        s.unlink()
    make_hf_cache(root / "hub", tiny_src)
    (root / "scratch" / "config-only").mkdir(parents=True)
    shutil.copy(tiny_src / "config.json", root / "scratch" / "config-only")
    shutil.copytree(tiny_src, root / "deep" / "a" / "b" / "c" / "tiny")
    return root


def run_find(root: Path, **kw: Any) -> P.FindResult:
    before = tree_state(root)
    t0 = time.perf_counter()
    res = P.find_models(str(root), mounts=LOCAL, **kw)
    elapsed = time.perf_counter() - t0
    TIMINGS[f"--find {root}"] = elapsed
    assert elapsed < MAX_SECONDS
    assert tree_state(root) == before
    return res


def test_find_lists_candidates_with_verdicts_and_reports_the_depth_bound(search_root: Path) -> None:
    res = run_find(search_root, max_depth=4)
    got = {
        os.path.relpath(f["subject"], search_root): f["severity"]
        for f in res.findings
        if f["check"] == "SB212"
    }
    snap = "hub/models--servebook--tiny-llama/snapshots/0123456789abcdef0123456789abcdef01234567"
    assert got == {"team-a/tiny": "pass", "team-b/big": "warn", snap: "pass"}
    complete = {os.path.relpath(c["path"], search_root): c["complete"] for c in res.candidates}
    assert complete == {"team-a/tiny": True, "team-b/big": False, snap: True}
    big = next(f for f in res.findings if f["subject"].endswith("team-b/big"))
    assert "incomplete" in big["message"] and "SB205" in big["message"]
    # deep/a/b/c/tiny is at depth 5: not entered, and the output says so.
    bound = [f for f in res.findings if f["check"] == "SB213"]
    assert len(bound) == 1 and bound[0]["severity"] == "warn"
    assert "depth bound 4 hit" in bound[0]["message"]
    assert res.search["depth_limit_hit"] and res.search["dirs_beyond_depth"] >= 1
    assert P.exit_code(res.findings) == 0


def test_find_deeper_finds_everything_and_says_the_tree_was_covered(search_root: Path) -> None:
    res = run_find(search_root, max_depth=8)
    paths = {os.path.relpath(c["path"], search_root) for c in res.candidates}
    assert "deep/a/b/c/tiny" in paths
    assert [f["severity"] for f in res.findings if f["check"] == "SB213"] == ["pass"]


def test_find_time_bound_is_reported_not_silent(search_root: Path) -> None:
    ticks = iter(range(10_000))

    def clock() -> float:  # one "second" per look at the clock
        return float(next(ticks))

    res = run_find(search_root, max_depth=8, timeout_s=4.0, clock=clock)
    assert res.search["time_limit_hit"]
    bound = next(f for f in res.findings if f["check"] == "SB213")
    assert bound["severity"] == "warn" and "time bound 4.0 s hit" in bound["message"]


def test_find_with_no_model_fails(tmp_path: Path, tiny_src: Path) -> None:
    (tmp_path / "empty" / "config-only").mkdir(parents=True)
    shutil.copy(tiny_src / "config.json", tmp_path / "empty" / "config-only")
    res = run_find(tmp_path / "empty")
    assert [(f["check"], f["severity"]) for f in res.findings] == [
        ("SB212", "fail"),
        ("SB213", "pass"),
    ]
    assert P.exit_code(res.findings) == 1


def test_find_with_absent_root_fails_and_creates_nothing(tmp_path: Path) -> None:
    res = run_find(tmp_path / "no" / "root")
    assert [(f["check"], f["severity"]) for f in res.findings] == [("SB212", "fail")]
    assert not (tmp_path / "no").exists()


# --- the registry, the JSON shape, the CLI -----------------------------------------------------


def test_probe_checks_are_registered_with_rationale_and_fix() -> None:
    ids = [c["id"] for c in P.CHECKS]
    assert ids == [f"SB2{n:02d}" for n in range(1, 14)]  # SB250+ is left to cluster checks
    for cid in ids:
        check = REGISTRY[cid]
        assert check is PROBE_CHECKS[cid]
        assert check.title and len(check.rationale) > 60 and check.fix


def test_probe_findings_have_the_shape_of_finding_to_dict(tmp_path: Path, model: Path) -> None:
    (model / "tokenizer.json").unlink()
    for d in run_probe(tmp_path, model):
        f = to_finding(d)
        assert isinstance(f, Finding)
        assert f.to_dict() == d


def test_probe_script_is_python_3_8_syntax_and_stdlib_only() -> None:
    source = probe_script_path().read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.module != "__future__" and node.level == 0
            imported.add((node.module or "").split(".")[0])
    assert imported <= sys.stdlib_module_names, imported - sys.stdlib_module_names


def _old_pythons() -> list[str]:
    found = [shutil.which(f"python3.{m}") for m in (8, 9)]
    found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.[89].*/bin/python3.[89]")))
    out: list[str] = []
    for exe in found:
        if (
            exe
            and exe not in out
            and subprocess.run([exe, "-c", "pass"], capture_output=True).returncode == 0
        ):
            out.append(exe)
    return out


def _standalone(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, str(probe_script_path()), *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("python", [sys.executable, *_old_pythons()])
def test_probe_script_runs_standalone(tmp_path: Path, model: Path, python: str) -> None:
    mi = str(THIS_MACHINE)
    t0 = time.perf_counter()
    ok = _standalone(
        python, str(model), "--expect-model", "LlamaForCausalLM", "--mountinfo", mi, "--json"
    )
    TIMINGS[f"standalone {python}"] = time.perf_counter() - t0
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["ok"] is True and doc["exit_code"] == 0
    assert {tuple(sorted(f)) for f in doc["findings"]} == {
        ("check", "evidence", "hint", "message", "severity", "subject", "title")
    }
    truncate(shards(model)[0], 0.077)
    bad = _standalone(python, str(model), "--mountinfo", mi, "--json")
    assert bad.returncode == 1
    assert [f["check"] for f in json.loads(bad.stdout)["findings"] if f["severity"] == "fail"] == [
        "SB206"
    ]
    found = _standalone(python, "--find", str(tmp_path), "--mountinfo", mi)
    assert found.returncode == 1  # the only candidate is now incomplete
    assert "incomplete" in found.stdout and "SB206" in found.stdout
    assert _standalone(python).returncode == 2


def test_cli_probe_json_and_exit_codes(
    cli: Callable[..., CliResult], tmp_path: Path, model: Path
) -> None:
    mi = str(THIS_MACHINE)
    r = cli(
        "probe", str(model), "--expect-model", "servebook-tiny-llama", "--mountinfo", mi, "--json"
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == 0
    assert [f["check"] for f in doc["findings"]] == sorted([*BASE, "SB203"])
    assert doc["findings"][0]["title"] == "Model directory exists and holds files"
    (model / "config.json").unlink()
    r = cli("probe", str(model), "--mountinfo", mi)
    assert r.returncode == 1
    assert "SB202" in r.stdout and "no config.json" in r.stdout
    r = cli("probe", "--find", str(tmp_path), "--mountinfo", mi, "--json")
    assert r.returncode == 1  # the only candidate now fails a check
    assert json.loads(r.stdout)["search"]["max_depth"] == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give a model directory DIR, or --find ROOT"),
        (("/models/x", "--find", "/models"), "not both"),
        (("--find", "/models", "--draft", "/d"), "apply to DIR"),
        (("/models/x", "--max-depth", "2"), "apply to --find only"),
        (("--find", "/models", "--timeout", "0"), "more than 0 seconds"),
        (
            ("/models/x", "--mountinfo", "/no/such/mountinfo"),
            "--mountinfo file /no/such/mountinfo does not",
        ),
    ],
)
def test_cli_unusable_arguments_exit_2(
    cli: Callable[..., CliResult], args: Iterable[str], message: str
) -> None:
    r = cli("probe", *args)
    assert r.returncode == 2
    assert message in r.stderr
    assert r.stdout == ""


def test_cli_a_path_that_is_no_directory_is_unusable_input_not_a_failing_check(
    cli: Callable[..., CliResult], tmp_path: Path, model: Path
) -> None:
    """Issue 33 (D30): `probe /nonexistent`, a file and /dev/null exited 1 as a failing
    check; typed on the command line they are unusable input: exit 2, naming the path and
    the fix (on a node the same rule is SB201's failing verdict, tested above)."""
    dangling = tmp_path / "current"
    dangling.symlink_to(tmp_path / "gone")
    for path, says in (
        (model.parent / "tinny", f"did you mean {model}?"),
        (model / "config.json", "is a file, not a directory"),
        (Path("/dev/null"), "is a device or other special file, not a directory"),
        (dangling, "which does not exist"),
    ):
        r = cli("probe", str(path), "--mountinfo", str(THIS_MACHINE))
        assert r.returncode == 2, (path, r.stdout, r.stderr)
        assert f"DIR {path} " in r.stderr and says in r.stderr, r.stderr
        assert "--find ROOT" in r.stderr and r.stdout == ""
    r = cli("probe", str(model), "--draft", "/nonexistent", "--mountinfo", str(THIS_MACHINE))
    assert r.returncode == 2 and "--draft /nonexistent does not exist" in r.stderr, r.stderr


def test_cli_help_explains_with_an_example(cli: Callable[..., CliResult]) -> None:
    r = cli("probe", "--help")
    assert r.returncode == 0
    assert "servebook probe /mnt/models" in r.stdout and "--find" in r.stdout
    assert "read-only" in r.stdout
