"""`servebook model`: make the models servebook's demos and tests run on."""

from __future__ import annotations

from pathlib import Path

import typer

from servebook.commands import app
from servebook.console import out

model_app = typer.Typer(
    help="\n\n".join(
        [
            "Make models for demos and tests (nothing is downloaded).",
            "Example: servebook model tiny ~/.cache/servebook/tiny",
            "Example: servebook model tiny ~/.cache/servebook/tiny-draft --draft",
        ]
    ),
    no_args_is_help=True,
)
app.add_typer(model_app, name="model")


# Typer's rich help keeps the docstring's line breaks, so the help is written one paragraph
# per string.
_TINY_HELP = "\n\n".join(
    [
        "Write a deterministic tiny random Llama for demos and tests.",
        "2 layers, hidden 128, vocab 4096, bfloat16 weights in sharded safetensors with an "
        "index, a byte-level BPE tokenizer trained on Python's own sources, and a chat "
        "template. Same seed, same bytes: the weights come from the seed, the tokenizer "
        "from fixed text. Nothing is downloaded.",
        "With --draft, write its 1-layer draft instead: same tokenizer, embedding, first "
        "layer and head, so vLLM's draft_model speculative decoding accepts most drafts.",
        "Example:",
        "    servebook model tiny ~/.cache/servebook/tiny",
        "    servebook model tiny ~/.cache/servebook/tiny-draft --draft",
    ]
)


@model_app.command("tiny", help=_TINY_HELP)
def tiny(
    out_dir: Path = typer.Argument(..., metavar="DIR", help="Directory to write the model into."),
    draft: bool = typer.Option(
        False, "--draft", help="Write the 1-layer draft model for speculative decoding."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for the random weights."),
    force: bool = typer.Option(
        False, "--force", help="Replace the model already in DIR (only a model directory)."
    ),
) -> None:
    """Write a deterministic tiny random Llama (see _TINY_HELP)."""
    from servebook.models.tiny import TINY_DRAFT_NAME, TINY_NAME, make_tiny_model

    path = make_tiny_model(out_dir, seed=seed, draft=draft, force=force)
    files = sorted(p for p in path.iterdir() if p.is_file())
    total = sum(p.stat().st_size for p in files)
    name = TINY_DRAFT_NAME if draft else TINY_NAME
    out.print(
        f"wrote {name} (seed {seed}) to {path}: {len(files)} files, {total / 1e6:.1f} MB",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    for p in files:
        out.print(
            f"  {p.name:<36} {p.stat().st_size:>10,d} bytes",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
