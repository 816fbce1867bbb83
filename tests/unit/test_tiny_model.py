"""The tiny model generator: deterministic bytes, a consistent sharded checkpoint, a draft
that shares what it claims to share, and the CLI's refusal to overwrite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from servebook.errors import UsageError
from servebook.models import tiny
from servebook.models.tiny import TINY_DRAFT_NAME, TINY_NAME, make_tiny_model
from tests.unit.cli_inprocess import run_cli

# --- helpers: read what was written with the stdlib and numpy only ------------------------


def read_header(path: Path) -> tuple[dict[str, dict], int]:
    """(tensor entries, start of the data section) of one safetensors file."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    return header, 8 + n


def load_tensors(model_dir: Path) -> dict[str, np.ndarray]:
    """float32 tensors of a model directory, read through its index."""
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    out: dict[str, np.ndarray] = {}
    for fname in sorted(set(index["weight_map"].values())):
        header, start = read_header(model_dir / fname)
        raw = (model_dir / fname).read_bytes()
        for name, entry in header.items():
            assert entry["dtype"] == "BF16"
            a, b = entry["data_offsets"]
            bits = np.frombuffer(raw[start + a : start + b], dtype="<u2")
            out[name] = tiny.from_bf16_bits(bits).reshape(entry["shape"])
    return out


def raw_tensor_bytes(model_dir: Path) -> dict[str, bytes]:
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    out: dict[str, bytes] = {}
    for name, fname in index["weight_map"].items():
        header, start = read_header(model_dir / fname)
        a, b = header[name]["data_offsets"]
        out[name] = (model_dir / fname).read_bytes()[start + a : start + b]
    return out


def dir_bytes(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return (
        make_tiny_model(root / "target", seed=0),
        make_tiny_model(root / "draft", seed=0, draft=True),
    )


# --- determinism -----------------------------------------------------------------------------


def test_same_seed_gives_identical_bytes_in_another_process(
    models: tuple[Path, Path], tmp_path: Path
) -> None:
    # A second process trains the tokenizer afresh (with its own hash seeds): every file of
    # both the target and the draft must still match byte for byte.
    target, draft = models
    for src, extra in ((target, []), (draft, ["--draft"])):
        again = tmp_path / src.name
        subprocess.run(
            [sys.executable, "-m", "servebook", "model", "tiny", str(again), "--seed", "0", *extra],
            check=True,
            capture_output=True,
        )
        assert dir_bytes(again) == dir_bytes(src)


def test_tokenizer_training_is_deterministic() -> None:
    assert tiny._train_tokenizer() == tiny._train_tokenizer()


def test_different_seed_changes_weights_but_not_tokenizer(
    models: tuple[Path, Path], tmp_path: Path
) -> None:
    target, _ = models
    other = make_tiny_model(tmp_path / "seed1", seed=1)
    a, b = dir_bytes(target), dir_bytes(other)
    for name in a:
        if name.endswith(".safetensors"):
            assert a[name] != b[name], name
        elif name.startswith(("tokenizer", "special_tokens")) or name.endswith("config.json"):
            assert a[name] == b[name], name
    assert json.loads(b["servebook.json"])["seed"] == 1


# --- checkpoint consistency -------------------------------------------------------------------


@pytest.mark.parametrize("which", [0, 1], ids=["target", "draft"])
def test_index_maps_every_tensor_to_an_existing_shard_and_totals_match(
    models: tuple[Path, Path], which: int
) -> None:
    model_dir = models[which]
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in model_dir.glob("*.safetensors"))
    assert len(shards) >= 3
    assert set(index["weight_map"].values()) == set(shards)

    seen: dict[str, str] = {}
    tensor_bytes = 0
    for fname in shards:
        header, start = read_header(model_dir / fname)
        end = 0
        for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
            a, b = entry["data_offsets"]
            assert a == end, f"{fname}: gap or overlap before {name}"
            assert b - a == 2 * int(np.prod(entry["shape"]))
            end = b
            seen[name] = fname
            tensor_bytes += b - a
        assert start % 8 == 0
        assert (model_dir / fname).stat().st_size == start + end
    assert seen == index["weight_map"]
    assert index["metadata"]["total_size"] == tensor_bytes


@pytest.mark.parametrize("which", [0, 1], ids=["target", "draft"])
def test_config_vocab_and_shapes_agree_with_tokenizer_and_weights(
    models: tuple[Path, Path], which: int
) -> None:
    model_dir = models[which]
    config = json.loads((model_dir / "config.json").read_text())
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    tensors = load_tensors(model_dir)

    assert config["vocab_size"] == tok.get_vocab_size() == 4096
    assert tensors["model.embed_tokens.weight"].shape == (4096, config["hidden_size"])
    assert tensors["lm_head.weight"].shape == (4096, config["hidden_size"])
    assert config["bos_token_id"] == tok.token_to_id(tok_config["bos_token"])
    assert config["eos_token_id"] == tok.token_to_id(tok_config["eos_token"])
    assert config["tie_word_embeddings"] is False
    assert config["torch_dtype"] == "bfloat16"
    assert config["max_position_embeddings"] >= 2048
    layers = {int(k.split(".")[2]) for k in tensors if k.startswith("model.layers.")}
    assert layers == set(range(config["num_hidden_layers"]))
    assert config["_name_or_path"] == (TINY_DRAFT_NAME if which else TINY_NAME)


def test_tokenizer_adds_bos_and_round_trips_text(models: tuple[Path, Path]) -> None:
    target, _ = models
    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    tok_config = json.loads((target / "tokenizer_config.json").read_text())
    ids = tok.encode("def main():\n    return 0\n").ids
    assert ids[0] == tok.token_to_id("<s>")
    assert tok.decode(ids) == "def main():\n    return 0\n"
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_chat_template_renders_turns_with_single_token_role_markers(
    models: tuple[Path, Path],
) -> None:
    jinja2 = pytest.importorskip("jinja2")
    target, _ = models
    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    tok_config = json.loads((target / "tokenizer_config.json").read_text())
    text = jinja2.Template(tok_config["chat_template"]).render(
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
        bos_token=tok_config["bos_token"],
        eos_token=tok_config["eos_token"],
    )
    assert text == "<s><|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n"
    ids = tok.encode(text, add_special_tokens=False).ids
    for marker in ("<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"):
        assert tok.token_to_id(marker) in ids, marker


def test_special_tokens_have_zero_logits_so_greedy_never_stops_early(
    models: tuple[Path, Path],
) -> None:
    target, _ = models
    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    lm_head = load_tensors(target)["lm_head.weight"]
    for t in tiny.SPECIAL_TOKENS:
        assert not lm_head[tok.token_to_id(t)].any(), t
    assert np.count_nonzero(np.abs(lm_head).sum(axis=1)) == 4096 - len(tiny.SPECIAL_TOKENS)


def test_bf16_conversion_rounds_to_nearest_even() -> None:
    x = np.array([1.0, -2.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 0.0], dtype=np.float32)
    bits = tiny.to_bf16_bits(x)
    assert bits.tolist() == [0x3F80, 0xC000, 0x3F80, 0x3F82, 0x0000]
    assert tiny.from_bf16_bits(bits)[:2].tolist() == [1.0, -2.0]


# --- the draft --------------------------------------------------------------------------------


def test_draft_shares_tokenizer_files_and_tensors_byte_for_byte(
    models: tuple[Path, Path],
) -> None:
    target, draft = models
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (target / name).read_bytes() == (draft / name).read_bytes(), name
    t_raw, d_raw = raw_tensor_bytes(target), raw_tensor_bytes(draft)
    assert set(d_raw) == {k for k in t_raw if not k.startswith("model.layers.1.")}
    for name, data in d_raw.items():
        assert data == t_raw[name], name
    assert json.loads((draft / "config.json").read_text())["num_hidden_layers"] == 1


def _forward_argmax(tensors: dict[str, np.ndarray], config: dict, ids: list[int]) -> np.ndarray:
    """Greedy next token at every position: a float32 numpy Llama (HF's rotate-half RoPE)."""
    hd, nh, nkv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    eps = config["rms_norm_eps"]

    def rms(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    n = len(ids)
    inv = 1.0 / config["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    ang = np.concatenate([np.outer(np.arange(n), inv)] * 2, axis=-1)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x: np.ndarray) -> np.ndarray:
        rot = np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], axis=-1)
        return x * cos + rot * sin

    h = tensors["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms(h, tensors[p + "input_layernorm.weight"])
        q = rope((x @ tensors[p + "self_attn.q_proj.weight"].T).reshape(n, nh, hd))
        k = rope((x @ tensors[p + "self_attn.k_proj.weight"].T).reshape(n, nkv, hd))
        v = (x @ tensors[p + "self_attn.v_proj.weight"].T).reshape(n, nkv, hd)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        att = np.einsum("hqk,khd->qhd", w, v).reshape(n, nh * hd)
        h = h + att @ tensors[p + "self_attn.o_proj.weight"].T
        x = rms(h, tensors[p + "post_attention_layernorm.weight"])
        g = x @ tensors[p + "mlp.gate_proj.weight"].T
        u = x @ tensors[p + "mlp.up_proj.weight"].T
        h = h + (g / (1 + np.exp(-g)) * u) @ tensors[p + "mlp.down_proj.weight"].T
    logits = rms(h, tensors["model.norm.weight"]) @ tensors["lm_head.weight"].T
    return logits.argmax(-1)


def test_target_generates_varied_text_and_draft_mostly_agrees_with_it(
    models: tuple[Path, Path],
) -> None:
    # The reason the draft exists: vLLM accepts a drafted token when it equals the target's
    # (greedy) choice.  Both must also produce varied tokens, or acceptance says nothing.
    target, draft = models
    t_conf = json.loads((target / "config.json").read_text())
    d_conf = json.loads((draft / "config.json").read_text())
    t_w, d_w = load_tensors(target), load_tensors(draft)
    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    ids = tok.encode("import os\nimport sys\n").ids
    prompt_len = len(ids)
    for _ in range(24):
        ids.append(int(_forward_argmax(t_w, t_conf, ids)[-1]))
    generated = ids[prompt_len:]
    assert len(set(generated)) >= 12, generated

    target_next = _forward_argmax(t_w, t_conf, ids)[prompt_len - 1 : -1]
    draft_next = _forward_argmax(d_w, d_conf, ids)[prompt_len - 1 : -1]
    assert (target_next == np.array(generated)).all()
    agreement = float((target_next == draft_next).mean())
    # Mostly, not always: a deployment should exercise the reject path too.
    assert 0.5 <= agreement < 1.0, agreement


# --- writing safely -----------------------------------------------------------------------------


def test_refuses_non_empty_directory_without_force(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match=r"not empty.*--force"):
        make_tiny_model(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_force_replaces_a_model_but_never_a_directory_that_is_not_one(tmp_path: Path) -> None:
    target = make_tiny_model(tmp_path / "m", seed=0)
    make_tiny_model(target, seed=1, force=True)
    assert json.loads((target / "servebook.json").read_text())["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temp dirs left

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError, match="does not look like a model directory"):
        make_tiny_model(other, force=True)
    assert (other / "notes.txt").read_text() == "keep me"


def test_writes_into_an_existing_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert (make_tiny_model(tmp_path / "empty") / "config.json").is_file()


def test_crash_while_writing_leaves_no_partial_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = Path.write_bytes
    calls = 0

    def failing_write(self: Path, data: bytes) -> int:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise OSError(28, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", failing_write)
    with pytest.raises(OSError, match="No space left"):
        make_tiny_model(tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


# --- the command line -----------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``servebook model tiny ARGS`` in this process (``cli_inprocess``), as a child runs it."""
    return run_cli(("model", "tiny", *args), {"COLUMNS": "200"})


def test_cli_exits_2_naming_the_directory_and_the_fix_when_it_is_not_empty(
    tmp_path: Path,
) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    r = _cli(str(tmp_path))
    assert r.returncode == 2
    assert str(tmp_path) in r.stderr and "--force" in r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_cli_exits_2_when_the_path_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "model"
    f.write_text("")
    r = _cli(str(f))
    assert r.returncode == 2
    assert "is a file" in r.stderr


def test_cli_reports_what_it_wrote(tmp_path: Path) -> None:
    r = _cli(str(tmp_path / "d"), "--draft", "--seed", "7")
    assert r.returncode == 0, r.stderr
    assert TINY_DRAFT_NAME in r.stdout and "seed 7" in r.stdout
    for name in ("config.json", "tokenizer.json", "model.safetensors.index.json"):
        assert name in r.stdout
