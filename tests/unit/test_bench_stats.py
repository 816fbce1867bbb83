"""Statistics of benchmark figures, pinned against hand-computed answers and printed
t tables."""

from __future__ import annotations

import math

import pytest

from servebook.bench import stats


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
