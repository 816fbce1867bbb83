"""How long servebook takes to build one exact-length benchmark prompt (issue 11's target:
a 1024-token prompt well under 1 ms), on the tiny model's tokenizer, measured the way bench
builds them before a point: `RandomPrompts.pregenerate` over batches of 256.

    .venv/bin/python benchmarks/prompt_building.py [--input-len 1024] [--batches 5]

Prints the workload and, per prompt format, the best and median time per prompt over the
batches, and the machine's load (a shared machine's figures are not clean).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from servebook.bench.tokens import load_tokenizer, server_token_count
from servebook.bench.workload import RandomPrompts
from servebook.models.tiny import make_tiny_model


def per_prompt_ms(prompts: RandomPrompts, batches: int, size: int = 256) -> list[float]:
    prompts.pregenerate(range(8))  # what is found once per tokenizer
    out = []
    for k in range(batches):
        first = 1000 + size * k
        t0 = time.perf_counter()
        prompts.pregenerate(range(first, first + size))
        out.append(1000 * (time.perf_counter() - t0) / size)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / "tiny"
        make_tiny_model(model)
        tok = load_tokenizer(model)
        print(
            f"workload: random prompts of {args.input_len} server-counted tokens, tiny model "
            f"tokenizer (vocab {tok.vocab_size}), batches of 256, load average "
            f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
        )
        for fmt in ("text", "ids"):
            prompts = RandomPrompts(
                model,
                input_len=args.input_len,
                output_len=4,
                seed=0,
                prompt_format=fmt,
            )
            ms = per_prompt_ms(prompts, args.batches)
            if fmt == "text":  # every prompt the exact length, by the tokenizer itself
                texts = [prompts.get(i).text for i in range(1000, 1256)]
                assert {server_token_count(tok, t) for t in texts} == {args.input_len}
            print(
                f"  --prompt-format {fmt:4}: best {min(ms):.3f} ms, median "
                f"{statistics.median(ms):.3f} ms per prompt over {args.batches} batches"
            )


if __name__ == "__main__":
    main()
