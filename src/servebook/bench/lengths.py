"""Length distributions for synthetic prompts and outputs (``--input-len-dist``,
``--output-len-dist``), around the mean ``--input-len`` / ``--output-len`` gives:

* ``fixed`` (the default): every request that length;
* ``uniform:min=A,max=B``: integers uniform in [A, B] (vLLM's ``--random-range-ratio r``
  is ``min = L(1-r), max = L(1+r)``);
* ``normal:stdev=S[,min=A][,max=B]``: normal around the mean, rounded and clipped to the
  bounds (GuideLLM's ``prompt_tokens_stdev`` with ``_min``/``_max``);
* ``lognormal:stdev=S[,min=A][,max=B]``: lognormal whose own mean and standard deviation
  in tokens are the mean and S (AIPerf's lognormal shapes), rounded and clipped.

Request ``i``'s length is drawn from ``default_rng([seed, stream, i])``: the same seed gives
the same lengths in any process and any order, and the stream is not the prompt text's,
so a fixed length leaves every prompt exactly as it was before distributions existed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from servebook.errors import UsageError

KINDS = ("fixed", "uniform", "normal", "lognormal")
INPUT_STREAM = 0x1E4
OUTPUT_STREAM = 0x0E4


@dataclass(frozen=True)
class LengthDist:
    kind: str = "fixed"
    stdev: float | None = None
    low: int = 1
    high: int | None = None

    def draw(self, mean: int, seed: int, stream: int, index: int) -> int:
        if self.kind == "fixed":
            return mean
        rng = np.random.default_rng([seed, stream, index])
        high = self.high if self.high is not None else 2**31 - 1
        if self.kind == "uniform":
            return int(rng.integers(self.low, high, endpoint=True))
        sd = self.stdev or 0.0
        if self.kind == "normal":
            x = rng.normal(mean, sd)
        else:
            sigma2 = math.log(1 + (sd / mean) ** 2)
            x = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))
        return int(min(max(round(x), self.low), high))

    def upper(self, mean: int) -> int:
        """The longest length it can draw (for the model's context check)."""
        if self.kind == "fixed":
            return mean
        return self.high if self.high is not None else 2**31 - 1

    def describe(self) -> str:
        if self.kind == "fixed":
            return "fixed"
        parts = [f"stdev={self.stdev:g}"] if self.stdev is not None else []
        parts.append(f"min={self.low}")
        if self.high is not None:
            parts.append(f"max={self.high}")
        return f"{self.kind}:{','.join(parts)}"


FIXED = LengthDist()


def _number(flag: str, text: str, key: str, value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise UsageError(f"{flag} {text!r}: {key}={value!r} is not a number") from None
    if not math.isfinite(x) or x < 0:
        raise UsageError(f"{flag} {text!r}: {key} must be a number >= 0")
    return x


def parse_length_dist(text: str | None, flag: str, mean: int) -> LengthDist:
    """``normal:stdev=128,min=64,max=1024`` and the like (module docstring)."""
    if text is None or text.strip() in ("", "fixed"):
        return FIXED
    kind, _, rest = text.strip().partition(":")
    if kind not in KINDS:
        raise UsageError(
            f"{flag} {text!r}: {kind!r} is not a distribution; choose {', '.join(KINDS)}",
            hint=f"e.g. {flag} normal:stdev=128,min=64,max=1024",
        )
    given: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key not in ("stdev", "min", "max"):
            raise UsageError(f"{flag} {text!r}: {part!r}; give stdev=, min= or max=")
        given[key] = _number(flag, text, key, value)
    need = {"uniform": ("min", "max"), "normal": ("stdev",), "lognormal": ("stdev",)}
    missing = [k for k in need.get(kind, ()) if k not in given]
    if missing:
        raise UsageError(f"{flag} {text!r}: {kind} needs {' and '.join(missing)}=")
    low = max(1, int(given.get("min", 1)))
    high = int(given["max"]) if "max" in given else None
    if high is not None and high < low:
        raise UsageError(f"{flag} {text!r}: max {high} is below min {low}")
    if high is not None and not low <= mean <= high and kind != "uniform":
        raise UsageError(f"{flag} {text!r}: the mean {mean} is outside [{low}, {high}]")
    return LengthDist(kind, given.get("stdev"), low, high)
