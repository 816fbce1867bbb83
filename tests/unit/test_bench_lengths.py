"""Length distributions for synthetic prompts and outputs (``bench/lengths.py``) and the
random prompts built to them: seeded, exact as the server counts, recorded."""

from __future__ import annotations

import numpy as np
import pytest

from servebook.bench.lengths import INPUT_STREAM, parse_length_dist
from servebook.bench.tokens import HFTokenizer
from servebook.bench.workload import RandomPrompts
from servebook.errors import UsageError


@pytest.mark.parametrize(
    ("spec", "mean", "sd"),
    [("normal:stdev=128,min=64,max=1024", 512, 128), ("lognormal:stdev=200", 400, 200)],
)
def test_normal_and_lognormal_lengths_have_the_mean_and_stdev_asked(
    spec: str, mean: int, sd: int
) -> None:
    d = parse_length_dist(spec, "--input-len-dist", mean)
    xs = np.array([d.draw(mean, 7, INPUT_STREAM, i) for i in range(4000)])
    assert xs.mean() == pytest.approx(mean, rel=0.04)
    assert xs.std() == pytest.approx(sd, rel=0.1)
    assert xs.min() >= d.low and (d.high is None or xs.max() <= d.high)
    # Seeded: request i has the same length whoever draws it, in any order.
    assert [d.draw(mean, 7, INPUT_STREAM, i) for i in (9, 3)] == [xs[9], xs[3]]


def test_uniform_lengths_stay_in_their_bounds_and_bad_specs_are_refused() -> None:
    d = parse_length_dist("uniform:min=10,max=20", "--output-len-dist", 15)
    xs = {d.draw(15, 0, 1, i) for i in range(500)}
    assert xs == set(range(10, 21))
    for bad in (
        "gauss:stdev=3",
        "normal",
        "uniform:min=5",
        "normal:stdev=x",
        "uniform:min=9,max=3",
    ):
        with pytest.raises(UsageError, match="--output-len-dist"):
            parse_length_dist(bad, "--output-len-dist", 15)


def test_random_prompts_follow_the_distributions_exactly_and_record_them(
    tok: HFTokenizer,
) -> None:
    src = RandomPrompts(
        tok,
        input_len=96,
        output_len=16,
        seed=3,
        input_dist=parse_length_dist("normal:stdev=24,min=40,max=160", "--input-len-dist", 96),
        output_dist=parse_length_dist("uniform:min=4,max=32", "--output-len-dist", 16),
    )
    built = src.build_many(range(40))
    lens = [len(tok.encode(p.text, add_special_tokens=True)) for p in built]
    assert lens == [p.prompt_tokens for p in built]  # exact, as the server counts
    assert len(set(lens)) > 10 and min(lens) >= 40 and max(lens) <= 160
    assert len({p.output_len for p in built}) > 5
    assert all(4 <= p.output_len <= 32 for p in built)
    d = src.describe()
    assert d["input_len_dist"] == "normal:stdev=24,min=40,max=160"
    assert d["output_len_dist"] == "uniform:min=4,max=32"
    # A fixed length sends, and records, what it did before distributions existed.
    plain = RandomPrompts(tok, input_len=96, output_len=16, seed=3)
    fixed = RandomPrompts(
        tok, input_len=96, output_len=16, seed=3, input_dist=parse_length_dist("fixed", "x", 96)
    )
    assert [p.text for p in plain.build_many(range(8))] == [
        p.text for p in fixed.build_many(range(8))
    ]
    assert "input_len_dist" not in fixed.describe()
