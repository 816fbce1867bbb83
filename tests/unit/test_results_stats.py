"""Statistics of benchmark figures, pinned against hand-computed answers and printed
t tables."""

from __future__ import annotations

import math

import pytest

from servebook.results import stats


def test_percentile_is_numpy_linear_type7_on_a_known_sample() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]  # sorted 1 2 3 4; rank h = 3 q / 100
    assert stats.percentile(xs, 50) == pytest.approx(2.5)
    assert stats.percentile(xs, 90) == pytest.approx(3.7)  # h = 2.7: 3 + 0.7 * (4 - 3)
    assert stats.percentile(xs, 99) == pytest.approx(3.97)
    assert stats.percentile(xs, 0) == 1.0
    assert stats.percentile(xs, 100) == 4.0


def test_percentile_of_an_empty_sample_is_none_not_zero() -> None:
    assert stats.percentile([], 50) is None
    assert stats.mean([]) is None
    s = stats.summarize([])
    assert s.n == 0 and s.p50 is None and s.mean is None


def test_percentile_rejects_out_of_range_q() -> None:
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)


def test_summarize_scales_units_and_reports_every_figure() -> None:
    s = stats.summarize([1_000_000, 2_000_000, 3_000_000, 4_000_000, 10_000_000], scale=1e-6)
    assert s.n == 5
    assert s.mean == pytest.approx(4.0)
    assert s.p50 == pytest.approx(3.0)
    assert s.p90 == pytest.approx(7.6)  # h = 3.6: 4 + 0.6 * 6
    assert s.p99 == pytest.approx(9.76)  # h = 3.96: 4 + 0.96 * 6
    assert (s.min, s.max) == (1.0, 10.0)


@pytest.mark.parametrize(
    ("df", "table"),
    [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (9, 2.2622), (29, 2.0452), (120, 1.9799)],
)
def test_t_quantile_matches_printed_two_sided_95_table(df: int, table: float) -> None:
    assert stats.t_quantile(0.975, df) == pytest.approx(table, abs=1e-4)


def test_t_quantile_is_symmetric_and_inverts_the_cdf() -> None:
    assert stats.t_quantile(0.025, 5) == pytest.approx(-stats.t_quantile(0.975, 5))
    assert stats.t_cdf(stats.t_quantile(0.9, 7), 7) == pytest.approx(0.9, abs=1e-10)
    assert stats.t_quantile(0.5, 3) == 0.0


def test_mean_ci_of_one_to_five_is_the_hand_computed_t_interval() -> None:
    # mean 3, s = sqrt(2.5), half width = t(0.975, 4) * s / sqrt(5) = 2.776445 * 0.707107
    ci = stats.mean_ci([1, 2, 3, 4, 5])
    assert ci.mean == pytest.approx(3.0)
    assert ci.half_width == pytest.approx(1.963243, abs=1e-6)
    assert (ci.low, ci.high) == (
        pytest.approx(1.036757, abs=1e-6),
        pytest.approx(4.963243, abs=1e-6),
    )
    assert ci.n == 5


def test_mean_ci_of_three_repetitions() -> None:
    # 10, 12, 14: mean 12, s = 2, half = 4.302653 * 2 / sqrt(3) = 4.968275
    ci = stats.mean_ci([10.0, 12.0, 14.0])
    assert ci.half_width == pytest.approx(4.968275, abs=1e-5)


def test_mean_ci_with_one_value_has_no_interval_never_a_zero_width_one() -> None:
    ci = stats.mean_ci([42.0])
    assert ci.mean == 42.0
    assert ci.low is None and ci.high is None and ci.half_width is None


def test_mean_ci_skips_missing_repetitions_and_says_how_many_counted() -> None:
    ci = stats.mean_ci([1.0, None, 3.0, math.nan])
    assert ci.n == 2 and ci.mean == 2.0
    assert stats.mean_ci([None]).mean is None


def test_identical_repetitions_give_a_zero_width_interval_honestly() -> None:
    ci = stats.mean_ci([5.0, 5.0, 5.0])
    assert (ci.low, ci.high) == (5.0, 5.0)


# --- the precision target's stopping rule ----------------------------------------------------


def _repeat_until_decided(
    series: dict[str, list[float]], *, target: float, minimum: int, cap: int
) -> stats.PrecisionDecision:
    """Feed the values one repetition at a time, as a sweep does, until the rule stops."""
    n = 0
    while True:
        n += 1
        d = stats.precision_decision(
            {k: v[:n] for k, v in series.items()},
            target=target,
            repetitions=n,
            min_repetitions=minimum,
            max_repetitions=cap,
        )
        if d.status != "continue":
            return d


def test_a_series_that_converges_stops_as_soon_as_its_interval_is_tight() -> None:
    # Noisy first repetitions, then steady ones: the 95% half-width of tok/s over the mean
    # goes 21%, 11%, 7.8%, 5.9%, then 4.8% at the 7th, well before the cap of 20.
    tok = [100.0, 112.0, 95.0, 101.0, 99.0, 100.0, 100.0] + [100.0] * 13
    tpot = [20.0, 21.0, 20.5, 20.2, 20.1] + [20.2] * 15
    d = _repeat_until_decided(
        {"output_tokens_per_s": tok, "tpot_ms.p50": tpot}, target=0.05, minimum=3, cap=20
    )
    assert d.status == "precise"
    assert d.repetitions == 7
    rel = d.relative["output_tokens_per_s"]
    assert rel == pytest.approx(0.0479, abs=1e-4)
    # and not one repetition earlier: at 6 the interval was still wider than 5%
    early = stats.precision_decision(
        {"output_tokens_per_s": tok[:6], "tpot_ms.p50": tpot[:6]},
        target=0.05,
        repetitions=6,
        min_repetitions=3,
        max_repetitions=20,
    )
    assert early.status == "continue"
    assert (early.relative["output_tokens_per_s"] or 0) > 0.05


def test_a_noisy_series_stops_at_the_cap_and_is_imprecise_with_the_interval_it_reached() -> None:
    tok = [60.0, 140.0] * 10  # +-40% around 100 for ever
    tpot = [20.0] * 20
    d = _repeat_until_decided(
        {"output_tokens_per_s": tok, "tpot_ms.p50": tpot}, target=0.05, minimum=3, cap=8
    )
    assert d.status == "imprecise"
    assert d.repetitions == 8
    iv = d.intervals["output_tokens_per_s"]
    assert iv.n == 8 and iv.mean == pytest.approx(100.0)
    # s = 42.76 (ddof 1), t(0.975, 7) = 2.3646: half-width 35.7 = 35.7% of the mean
    assert d.relative["output_tokens_per_s"] == pytest.approx(0.3575, abs=1e-3)
    assert iv.low is not None and iv.high is not None and iv.low < 70 < 130 < iv.high
    assert d.relative["tpot_ms.p50"] == 0.0  # TPOT was tight; throughput was not


def test_the_minimum_is_run_even_when_the_first_repetitions_agree_exactly() -> None:
    d = stats.precision_decision(
        {"output_tokens_per_s": [100.0, 100.0]},
        target=0.05,
        repetitions=2,
        min_repetitions=3,
        max_repetitions=10,
    )
    assert d.status == "continue"


def test_invalid_repetitions_use_up_the_budget_without_narrowing_the_interval() -> None:
    # 6 repetitions run, only 1 valid: no interval, and at the cap that is imprecise.
    d = stats.precision_decision(
        {"output_tokens_per_s": [100.0], "tpot_ms.p50": [20.0]},
        target=0.05,
        repetitions=6,
        min_repetitions=3,
        max_repetitions=6,
    )
    assert d.status == "imprecise" and d.relative["output_tokens_per_s"] is None


def test_a_figure_never_measured_is_not_judged_but_one_figure_must_be() -> None:
    def decide(series: dict[str, list[float]]) -> str:
        return stats.precision_decision(
            series, target=0.05, repetitions=3, min_repetitions=3, max_repetitions=3
        ).status

    assert decide({"output_tokens_per_s": [100.0, 100.5, 99.5], "tpot_ms.p50": []}) == "precise"
    assert decide({"output_tokens_per_s": [], "tpot_ms.p50": []}) == "imprecise"


def test_a_mean_of_zero_is_never_precise() -> None:
    d = stats.precision_decision(
        {"x": [0.0, 0.0, 0.0]}, target=0.05, repetitions=3, min_repetitions=2, max_repetitions=5
    )
    assert d.status == "continue" and d.relative["x"] is None


@pytest.mark.parametrize(
    ("target", "minimum", "cap"), [(0.0, 2, 3), (1.0, 2, 3), (0.05, 1, 3), (0.05, 4, 3)]
)
def test_the_stopping_rule_refuses_settings_it_cannot_honour(
    target: float, minimum: int, cap: int
) -> None:
    with pytest.raises(ValueError):
        stats.precision_decision(
            {"x": [1.0]},
            target=target,
            repetitions=1,
            min_repetitions=minimum,
            max_repetitions=cap,
        )
