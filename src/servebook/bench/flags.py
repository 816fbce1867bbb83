"""The benchmark protocol's flags, parsed: durations, warm-up, load levels, precision
(``bench.protocol`` holds what they set)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from servebook.errors import UsageError
from servebook.values import parse_share

# --- parsing the protocol flags ---------------------------------------------------------------

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str, flag: str = "--duration") -> float:
    """``"60s"``, ``"2m"``, ``"500ms"``, ``"90"`` (seconds) -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise UsageError(f"{flag} {text!r}: not a duration (examples: 60s, 2m, 500ms)")
    return float(m.group(1)) * _UNIT_S[m.group(2) or "s"]


@dataclass(frozen=True)
class Warmup:
    """Discarded warm-up: the window opens once *both* bounds are met (``None``: no bound)."""

    duration_s: float | None
    requests: int | None

    def describe(self) -> str:
        parts = []
        if self.duration_s:
            parts.append(f"{self.duration_s:g}s")
        if self.requests:
            parts.append(f"{self.requests}r")
        return ",".join(parts) or "0"


NO_WARMUP = Warmup(None, None)


def parse_warmup(text: str) -> Warmup:
    """``"10s"``, ``"200r"``, ``"10s,200r"`` (both), ``"0"`` or ``"none"`` (no warm-up)."""
    t = text.strip().lower()
    if t in ("0", "none", "off", "0s", "0r"):
        return NO_WARMUP
    duration: float | None = None
    requests: int | None = None
    for part in re.split(r"[,+]", t):
        part = part.strip()
        if m := re.fullmatch(r"(\d+)\s*r(?:eq(?:uests)?)?", part):
            requests = int(m.group(1))
        elif _DURATION.match(part):
            duration = parse_duration(part, "--warmup")
        else:
            raise UsageError(
                f"--warmup {text!r}: {part!r} is neither a duration (10s) nor a request "
                "count (200r); combine both with a comma: 10s,200r"
            )
    return Warmup(duration, requests)


def parse_levels(text: str, flag: str = "--concurrency") -> tuple[int, ...]:
    """``"1,4,16"`` -> ``(1, 4, 16)``: positive integers, no duplicates."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise UsageError(f"{flag} {text!r}: {part!r} is not a positive integer")
        if int(part) in out:
            raise UsageError(f"{flag} {text!r}: {part} appears twice")
        out.append(int(part))
    if not out:
        raise UsageError(f"{flag} {text!r}: no level given")
    return tuple(out)


def parse_rates(text: str) -> tuple[float, ...]:
    out: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            r = float(part)
        except ValueError:
            raise UsageError(f"--rate {text!r}: {part!r} is not a number") from None
        if not r > 0 or not math.isfinite(r):
            raise UsageError(f"--rate {text!r}: rates must be positive requests per second")
        out.append(r)
    if not out:
        raise UsageError(f"--rate {text!r}: no rate given")
    return tuple(out)


def parse_precision(text: str) -> float | None:
    """``"5%"`` or ``"0.05"`` -> 0.05; ``"off"``/``"none"``/``"0"`` -> ``None`` (no target)."""
    if text.strip().lower() in ("off", "none", "0", "0%"):
        return None
    return parse_share(
        text,
        flag="--precision",
        what="the largest 95% half-width as a share of the mean",
        also="off",
    )
