"""A deterministic tiny random Llama (and a 1-layer draft for it) for demos and tests.

Nothing is downloaded: the weights come from ``numpy.random.default_rng(seed)`` and the
byte-level BPE tokenizer is trained on a fixed, sorted list of Python standard-library
sources (text that ships with every Python).  Same seed and same Python minor version ->
the same bytes in every file, so a Results file's model config hash means something.

Layout written into ``out_dir`` (what ``vllm serve DIR`` and ``transformers`` expect)::

    config.json  generation_config.json
    model-0000N-of-0000M.safetensors ...  model.safetensors.index.json
    tokenizer.json  tokenizer_config.json  special_tokens_map.json

Weights are bfloat16.  numpy has no bfloat16, so the safetensors files are written by hand
(8-byte little-endian header length, JSON header, raw bytes): bfloat16 is the top 16 bits
of a float32, rounded to nearest even.  That keeps this module importable without torch.

The module is also a standalone script (numpy, tokenizers and the standard library only):
on Kubernetes it is shipped in a ConfigMap and run in each engine Pod by an init container
of the vLLM image (``python3 tiny_model.py DIR [--draft]``), so a cluster makes the same
model without servebook installed and without a download (``servebook.kube.manifests``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

try:
    from servebook.errors import UsageError
except ImportError:  # run as a lone script in a cluster's engine image: no servebook there

    class UsageError(Exception):  # type: ignore[no-redef]
        """A problem the user must fix (servebook's UsageError when servebook is there)."""


TINY_NAME = "servebook-tiny-llama"
TINY_DRAFT_NAME = "servebook-tiny-llama-draft"

# Bump when the generator's output changes for a given seed (recorded in servebook.json).
GENERATOR_VERSION = 1

VOCAB_SIZE = 4096
HIDDEN = 128
INTERMEDIATE = 256
N_HEADS = 4
N_KV_HEADS = 2
HEAD_DIM = HIDDEN // N_HEADS
TARGET_LAYERS = 2
DRAFT_LAYERS = 1
MAX_POSITIONS = 4096
INIT_STD = 0.02

# The target's layer 1 writes to the residual stream only through o_proj and down_proj.
# Scaling both near zero makes that layer close to the identity, so the target computes
# almost what the 1-layer draft (same embedding, layer 0, norm and lm_head) computes: the
# draft's guesses are mostly accepted, yet not all of them, so a deployment exercises both
# the accept and the reject path of speculative decoding.
LAYER1_OUT_SCALE = 0.05

BOS = "<s>"
EOS = "</s>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (BOS, EOS, *ROLE_TOKENS)

# One role marker per turn, each turn closed by EOS; the prompt ends with the assistant
# marker so the model continues as the assistant.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# Standard-library sources the tokenizer is trained on: fixed and sorted, so training sees
# the same text in the same order.  Files missing from a given Python are skipped (that
# Python then gets its own, equally deterministic, tokenizer).
CORPUS_FILES = (
    "argparse.py",
    "calendar.py",
    "dataclasses.py",
    "difflib.py",
    "fractions.py",
    "heapq.py",
    "shutil.py",
    "statistics.py",
    "string.py",
    "textwrap.py",
)


def make_tiny_model(
    out_dir: Path, *, seed: int = 0, draft: bool = False, force: bool = False
) -> Path:
    """Write the tiny target model (or, with ``draft``, its 1-layer draft) into ``out_dir``.

    The directory is built next to ``out_dir`` and renamed into place, so a crash never
    leaves a half-written model.  An existing non-empty ``out_dir`` is replaced only with
    ``force``, and only when it holds a model (a ``config.json``).
    """
    out_dir = Path(out_dir).absolute()
    _check_target(out_dir, force=force, draft=draft)
    model = build_tiny_model(seed=seed, draft=draft)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        os.chmod(tmp, 0o755)
        for name, data in model.items():
            (tmp / name).write_bytes(data)
        _replace_dir(tmp, out_dir, force=force, draft=draft)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def build_tiny_model(*, seed: int = 0, draft: bool = False) -> dict[str, bytes]:
    """Every file of the tiny model (or its draft) as bytes by file name, in memory.
    Deterministic: same seed and same Python -> same bytes."""
    tok_files = tokenizer_files()
    tok_doc = json.loads(tok_files["tokenizer.json"])
    vocab_size = len(tok_doc["model"]["vocab"])
    specials = {t["content"]: int(t["id"]) for t in tok_doc["added_tokens"]}
    tensors = _target_tensors(seed=seed, vocab_size=vocab_size, special_ids=specials.values())
    if draft:
        tensors = _draft_tensors(tensors)
    n_layers = DRAFT_LAYERS if draft else TARGET_LAYERS
    name = TINY_DRAFT_NAME if draft else TINY_NAME

    files: dict[str, bytes] = {}
    shards = _shard_plan(n_layers)
    weight_map: dict[str, str] = {}
    total_size = 0
    for i, prefixes in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        part = {k: v for k, v in tensors.items() if k.startswith(prefixes)}
        files[fname] = safetensors_bytes(part)
        for k, v in part.items():
            weight_map[k] = fname
            total_size += 2 * v.size  # bfloat16 on disk
    if set(weight_map) != set(tensors):
        raise AssertionError(f"tensors left out of every shard: {set(tensors) - set(weight_map)}")
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    files["model.safetensors.index.json"] = _json_bytes(index)

    config = {
        "_name_or_path": name,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": specials[BOS],
        "eos_token_id": specials[EOS],
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": INIT_STD,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": MAX_POSITIONS,
        "mlp_bias": False,
        "num_attention_heads": N_HEADS,
        "num_hidden_layers": n_layers,
        "num_key_value_heads": N_KV_HEADS,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-5,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    files["config.json"] = _json_bytes(config)
    files["generation_config.json"] = _json_bytes(
        {"bos_token_id": specials[BOS], "eos_token_id": specials[EOS]}
    )
    files.update(tok_files)
    files["servebook.json"] = _json_bytes(
        {
            "generator": "servebook model tiny",
            "generator_version": GENERATOR_VERSION,
            "name": name,
            "seed": seed,
            "draft": draft,
            "tokenizer_corpus_sha256": _corpus_digest(),
        }
    )
    return dict(sorted(files.items()))


# --- weights -----------------------------------------------------------------------------


def _target_tensors(
    *, seed: int, vocab_size: int, special_ids: Iterable[int]
) -> dict[str, np.ndarray]:
    """float32 weights of the 2-layer target, drawn in a fixed order from one generator."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(0.0, INIT_STD, size=shape).astype(np.float32)

    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(vocab_size, HIDDEN)}
    for i in range(TARGET_LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        t[p + "self_attn.q_proj.weight"] = normal(N_HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.k_proj.weight"] = normal(N_KV_HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.v_proj.weight"] = normal(N_KV_HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.o_proj.weight"] = normal(HIDDEN, N_HEADS * HEAD_DIM)
        t[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        t[p + "mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        t[p + "mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        t[p + "mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
    t["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    lm_head = normal(vocab_size, HIDDEN)
    # A zero row gives a logit of exactly 0 while thousands of random logits straddle 0, so
    # greedy decoding never picks a special token: a random model would otherwise stop at
    # EOS or print chat markers at arbitrary points, and benchmarks want the output length
    # they asked for.
    for token_id in special_ids:
        lm_head[token_id] = 0.0
    t["lm_head.weight"] = lm_head
    for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
        t[f"model.layers.1.{name}"] *= LAYER1_OUT_SCALE
    return t


def _draft_tensors(target: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The draft shares everything with the target except the target's (near-identity)
    last layer; see LAYER1_OUT_SCALE."""
    return {k: v for k, v in target.items() if not k.startswith("model.layers.1.")}


def _shard_plan(n_layers: int) -> list[tuple[str, ...]]:
    """Tensor-name prefixes per shard: embedding first, one shard per layer, head last."""
    plan: list[tuple[str, ...]] = [("model.embed_tokens.",)]
    plan += [(f"model.layers.{i}.",) for i in range(n_layers)]
    plan.append(("model.norm.", "lm_head."))
    return plan


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def safetensors_bytes(tensors: Mapping[str, np.ndarray]) -> bytes:
    """One safetensors file holding ``tensors`` as bfloat16, tensors in name order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        data = to_bf16_bits(tensors[name]).astype("<u2").tobytes()
        header[name] = {
            "dtype": "BF16",
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data section starts 8-byte aligned
    return len(head).to_bytes(8, "little") + head + b"".join(chunks)


# --- tokenizer ---------------------------------------------------------------------------


def _corpus_paths() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [stdlib / f for f in CORPUS_FILES if (stdlib / f).is_file()]


def _corpus_digest() -> str:
    h = hashlib.sha256()
    for p in _corpus_paths():
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


_TOKENIZER_CACHE: dict[str, dict[str, bytes]] = {}


def tokenizer_files() -> dict[str, bytes]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json as bytes.

    The tokenizer does not depend on the seed, so target and draft share it byte for byte
    (speculative decoding needs one vocabulary).  Trained once per process.
    """
    key = _corpus_digest()
    if key not in _TOKENIZER_CACHE:
        _TOKENIZER_CACHE[key] = _train_tokenizer()
    return dict(_TOKENIZER_CACHE[key])


def _train_tokenizer() -> dict[str, bytes]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    paths = _corpus_paths()
    if not paths:
        raise UsageError(
            f"no tokenizer training text found under {sysconfig.get_paths()['stdlib']} "
            f"(looked for {', '.join(CORPUS_FILES)}); this Python ships without its "
            "standard-library sources: install them (e.g. the python3.X-dev / -lib package)"
        )
    text = [p.read_text(encoding="utf-8") for p in paths]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(text, trainer=trainer, length=len(text))
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise AssertionError(
            f"tokenizer trained to {tok.get_vocab_size()} tokens, expected {VOCAB_SIZE}: "
            "the corpus is too small"
        )
    bos_id = tok.token_to_id(BOS)
    # Llama-style: a plain encode starts with BOS (the chat template adds its own BOS and
    # vLLM encodes chat prompts without special tokens).
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )

    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    tokenizer_config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "model_max_length": MAX_POSITIONS,
        "pad_token": EOS,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    special_map = {"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}
    return {
        "tokenizer.json": tok.to_str(pretty=True).encode() + b"\n",
        "tokenizer_config.json": _json_bytes(tokenizer_config),
        "special_tokens_map.json": _json_bytes(special_map),
    }


# --- files -------------------------------------------------------------------------------


def _json_bytes(doc: object) -> bytes:
    return (json.dumps(doc, indent=2) + "\n").encode()


def _check_target(out_dir: Path, *, force: bool, draft: bool) -> None:
    what = "draft model" if draft else "tiny model"
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(
            f"{out_dir} is a file, not a directory; choose a new directory for the {what}"
        )
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if not force:
        raise UsageError(
            f"{out_dir} already exists and is not empty; choose a new directory, or pass "
            f"--force (force=True) to replace the {what} in it"
        )
    if not (out_dir / "config.json").is_file():
        raise UsageError(
            f"{out_dir} is not empty and holds no config.json, so it does not look like a "
            f"model directory; --force only replaces a model: choose a new directory for "
            f"the {what}"
        )


def _replace_dir(tmp: Path, out_dir: Path, *, force: bool, draft: bool) -> None:
    """Move the finished ``tmp`` to ``out_dir``; the old model, if any, is removed only
    after the new one is in place."""
    if out_dir.is_dir() and not any(out_dir.iterdir()):
        out_dir.rmdir()
    old: Path | None = None
    if out_dir.exists() and force:
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.replace(out_dir, old / out_dir.name)
    try:
        os.rename(tmp, out_dir)
    except OSError as e:
        if old is not None:
            os.replace(old / out_dir.name, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        if out_dir.exists():
            # Someone else wrote there between our check and the rename.
            _check_target(out_dir, force=False, draft=draft)
        raise UsageError(f"could not move the new model into {out_dir}: {e}") from e
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# --- as a script -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python3 tiny.py DIR [--draft] [--seed N]``: what an engine Pod's init container
    runs.  An existing model in DIR (a restarted Pod's emptyDir) is replaced, so the Pod
    always serves exactly what this generator makes."""
    parser = argparse.ArgumentParser(description="Write servebook's deterministic tiny model.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--draft", action="store_true", help="the 1-layer draft model")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        out = make_tiny_model(args.out_dir, seed=args.seed, draft=args.draft, force=True)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {TINY_DRAFT_NAME if args.draft else TINY_NAME} (seed {args.seed}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
