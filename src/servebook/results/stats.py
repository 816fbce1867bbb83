"""Statistics for benchmark figures: percentiles, means, and confidence intervals.

Methods, stated once so a reader of a results file knows what a number is:

* **Percentiles** are numpy's default ``linear`` method (Hyndman & Fan type 7, the one
  ``vllm bench serve`` and spreadsheets use): for sorted ``x[0..n-1]`` the q-th percentile
  sits at rank ``h = (n - 1) * q / 100`` and is ``x[floor(h)] + (h - floor(h)) *
  (x[floor(h) + 1] - x[floor(h)])``.  An empty sample has no percentile: ``None``, never 0.
* **Confidence intervals over repetitions** use Student's t: for the per-repetition values
  ``v_1..v_n`` (e.g. each repetition's p50 TTFT) the 95% interval is ``mean +- t(0.975,
  n-1) * s / sqrt(n)`` with ``s`` the sample standard deviation (ddof=1).  Repetitions are
  few (default 3) and each one's figure is itself an average of many requests, so the
  normal-theory t interval is the standard choice; a bootstrap over 3 values would
  pretend to a precision it cannot have.  With ``n < 2`` there is no interval: ``None``,
  never a zero-width interval that reads as certainty.

* **A precision target** (``bench --precision 5%``) repeats a load level until the 95%
  interval of each judged figure has a half-width of at most that share of its mean, up
  to a cap (:func:`precision_decision`, the stopping rule).  Stopping on the interval
  tightens it a little optimistically (the rule peeks at the data), which is why it asks
  for a minimum number of repetitions first and why a level that never gets there is
  reported *imprecise* with the interval it reached rather than dropped.

* **Comparing two runs** (``servebook compare``) uses Welch's two-sided t-test over the
  per-repetition values of each side (:func:`welch`): a repetition is the unit that was
  actually replicated, and Welch's test does not assume the two sides vary alike.  Its
  95% interval of the difference is the same t machinery as every interval above.

The t quantile is computed here (the regularized incomplete beta function by continued
fraction, then bisection on the CDF) because scipy is not a dependency; the unit tests pin
it against printed t tables.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    """The q-th percentile (0..100) by numpy's ``linear`` method; ``None`` when empty."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return None
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside 0..100")
    return float(np.percentile(arr, q, method="linear"))


def mean(values: Sequence[float] | np.ndarray) -> float | None:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return None
    return float(arr.mean())


@dataclass(frozen=True)
class Summary:
    """Distribution of one latency metric over the requests of one point."""

    n: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    min: float | None
    max: float | None


def summarize(values: Sequence[float] | np.ndarray, scale: float = 1.0) -> Summary:
    """p50/p90/p99/mean/min/max of ``values * scale`` (scale converts units, e.g. ns->ms)."""
    arr = np.asarray(values, dtype=np.float64) * scale
    if arr.size == 0:
        return Summary(0, None, None, None, None, None, None)
    p50, p90, p99 = (float(x) for x in np.percentile(arr, DEFAULT_PERCENTILES))
    return Summary(
        n=int(arr.size),
        mean=float(arr.mean()),
        p50=p50,
        p90=p90,
        p99=p99,
        min=float(arr.min()),
        max=float(arr.max()),
    )


# --- Student's t ---------------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta did not converge (a={a}, b={b}, x={x})")


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(ln_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t (bisection on the CDF to 1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"quantile probability must be in (0, 1), got {p}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Interval:
    """A mean with its confidence interval; ``low``/``high`` are ``None`` when undefined."""

    mean: float | None
    low: float | None
    high: float | None
    n: int
    level: float = 0.95

    @property
    def half_width(self) -> float | None:
        if self.low is None or self.high is None or self.mean is None:
            return None
        return self.high - self.mean

    def within(self, lowest: float | None = 0.0, highest: float | None = None) -> Interval:
        """The interval cut to what its metric can take (a latency or a throughput is not
        negative, a share not above 1): the t interval is symmetric by construction and
        reaches past the bounds with few, spread repetitions; what lies past them is not a
        possible value.  The half-width of a cut interval is no longer its extent below the
        mean (``fmt_interval`` shows both ends then)."""
        lo, hi = self.low, self.high
        if lo is not None and lowest is not None:
            lo = max(lo, lowest)
        if hi is not None and highest is not None:
            hi = min(hi, highest)
        return Interval(self.mean, lo, hi, self.n, self.level)


def mean_ci(values: Iterable[float | None], level: float = 0.95) -> Interval:
    """Mean of per-repetition values with a two-sided t interval.

    ``None`` values (a repetition that had no figure, e.g. no successful request) are left
    out and the interval is over the rest; the returned ``n`` says how many counted.  With
    fewer than two values the interval is undefined (``low = high = None``)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return Interval(None, None, None, 0, level)
    m = math.fsum(xs) / n
    if n < 2:
        return Interval(m, None, None, n, level)
    s = math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (n - 1))
    half = t_quantile(0.5 + level / 2.0, n - 1) * s / math.sqrt(n)
    return Interval(m, m - half, m + half, n, level)


# --- Welch's test: two runs ----------------------------------------------------------------


@dataclass(frozen=True)
class Welch:
    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    diff: float  # mean_b - mean_a
    se: float
    df: float | None  # None when both samples have zero variance
    t: float | None
    p: float
    low: float  # 95% interval of the difference
    high: float


def welch(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Welch | None:
    """Welch's two-sided t-test of mean(b) - mean(a); ``None`` with fewer than two values
    on a side (no variance estimate: no test)."""
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        return None
    ma, mb = math.fsum(a) / na, math.fsum(b) / nb
    va = math.fsum((x - ma) ** 2 for x in a) / (na - 1)
    vb = math.fsum((x - mb) ** 2 for x in b) / (nb - 1)
    qa, qb = va / na, vb / nb
    se = math.sqrt(qa + qb)
    diff = mb - ma
    if se == 0.0:
        # Identical repetitions on both sides: the difference is exact (p 1 when there is
        # none, else 0); real measurements essentially never land here.
        p = 1.0 if diff == 0 else 0.0
        return Welch(na, nb, ma, mb, diff, 0.0, None, None, p, diff, diff)
    df = (qa + qb) ** 2 / (qa**2 / (na - 1) + qb**2 / (nb - 1))
    t = diff / se
    p = min(1.0, 2.0 * t_cdf(-abs(t), df))
    half = t_quantile(0.5 + level / 2.0, df) * se
    return Welch(na, nb, ma, mb, diff, se, df, t, p, diff - half, diff + half)


# --- the precision target: when to stop repeating a point --------------------------------

PrecisionStatus = Literal["continue", "precise", "imprecise"]


def relative_half_width(iv: Interval) -> float | None:
    """The interval's half-width as a share of its mean; ``None`` without an interval or
    with a mean of 0 (no share of nothing is precise)."""
    h = iv.half_width
    if h is None or iv.mean is None or iv.mean == 0:
        return None
    return h / abs(iv.mean)


@dataclass(frozen=True)
class PrecisionDecision:
    """What :func:`precision_decision` found: ``status`` and, per figure, the interval
    reached and its half-width as a share of the mean (``None``: no interval yet)."""

    status: PrecisionStatus
    target: float
    repetitions: int  # repetitions run so far (valid or not)
    intervals: Mapping[str, Interval]
    relative: Mapping[str, float | None]


def precision_decision(
    series: Mapping[str, Sequence[float]],
    *,
    target: float,
    repetitions: int,
    min_repetitions: int,
    max_repetitions: int,
    level: float = 0.95,
) -> PrecisionDecision:
    """The stopping rule of a precision target, on one load level.

    ``series`` maps each judged figure (output tokens/s, TPOT p50) to its per-repetition
    values over the level's *valid* repetitions so far; ``repetitions`` counts every
    repetition run, valid or not (an invalid one uses up the budget too).

    * ``precise``: at least ``min_repetitions`` were run and every figure's 95% interval
      (Student t, :func:`mean_ci`) has a half-width of at most ``target`` x its mean.  A
      figure no valid repetition measured at all (TPOT of one-token outputs) is not
      judged, but at least one figure must be;
    * ``imprecise``: not precise after ``max_repetitions``: stop, and say so;
    * ``continue``: run one more repetition.

    Pure and deterministic, so a resumed run takes the same decisions as the interrupted
    one, from the same points."""
    if not 0 < target < 1:
        raise ValueError(f"precision target must be a share in (0, 1), got {target}")
    if not 2 <= min_repetitions <= max_repetitions:
        raise ValueError(
            f"need 2 <= min_repetitions ({min_repetitions}) <= max_repetitions "
            f"({max_repetitions}): an interval needs two repetitions"
        )
    intervals = {k: mean_ci(v, level) for k, v in series.items()}
    relative = {k: relative_half_width(iv) for k, iv in intervals.items()}
    judged = [k for k, iv in intervals.items() if iv.n > 0]
    tight = bool(judged) and all((r := relative[k]) is not None and r <= target for k in judged)
    status: PrecisionStatus
    if repetitions >= min_repetitions and tight:
        status = "precise"
    elif repetitions >= max_repetitions:
        status = "imprecise"
    else:
        status = "continue"
    return PrecisionDecision(status, target, repetitions, intervals, relative)
