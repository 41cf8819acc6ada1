"""The scaling-law fit recovers a known law from noisy losses, predicts a point it did not see, refuses bad points."""

import json
import math

import numpy as np
import pytest

from trainer.planner.scaling_law import ScalingFit, fit_scaling_law, held_out

CHINCHILLA = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}  # Hoffmann et al. 2022, eq. 10
EPOCH = {"E": 1.8172, "A": 482.01, "B": 2085.43, "alpha": 0.3478, "beta": 0.3658}  # Besiroglu et al. 2024's refit

SIZES = (1e6, 1e7, 1e8, 1e9, 1e10)  # four decades of N: a narrower ladder confuses α with A at this noise
TOKENS_PER_PARAMETER = (5, 20, 80)
EXTRA = ((3e7, 40), (3e8, 40), (3e9, 10))  # points off the grid, as a ladder's rungs seldom line up
NOISE = 0.005  # multiplicative, on the loss: about the seed-to-seed spread of a proxy run


def law(p: dict, n: float, d: float) -> float:
    return p["E"] + p["A"] / n ** p["alpha"] + p["B"] / d ** p["beta"]


def ladder(p: dict, seed: int) -> list[tuple[float, float, float]]:
    rng = np.random.default_rng(seed)
    pairs = [(n, n * k) for n in SIZES for k in TOKENS_PER_PARAMETER] + [(n, n * k) for n, k in EXTRA]
    return [(n, d, law(p, n, d) * math.exp(rng.normal(0, NOISE))) for n, d in pairs]


@pytest.mark.parametrize("truth", [CHINCHILLA, EPOCH], ids=["chinchilla", "epoch"])
def test_the_fit_recovers_the_exponents_and_predicts_a_held_out_point(truth):
    points = ladder(truth, seed=0)
    fit = fit_scaling_law(points, bootstrap=8, seed=0)
    assert fit.points == len(points) and "approach 3" in fit.rule
    assert fit.alpha == pytest.approx(truth["alpha"], rel=0.05)
    assert fit.beta == pytest.approx(truth["beta"], rel=0.05)
    total = truth["alpha"] + truth["beta"]
    a, b = fit.exponents()
    assert (a, b) == pytest.approx((truth["beta"] / total, truth["alpha"] / total), rel=0.05)
    assert a + b == pytest.approx(1.0)
    # A model 3× the largest rung on 30 tokens per parameter: no point is near it.
    n, d = 3e10, 9e11
    assert fit.predict(n, d) == pytest.approx(law(truth, n, d), rel=0.015)
    for key in ("E", "A", "B", "alpha", "beta", "a", "b"):
        lo, hi = fit.intervals[key]
        assert lo <= hi
    assert fit.intervals["alpha"][0] < fit.alpha < fit.intervals["alpha"][1]


def test_the_compute_optimal_size_is_chinchillas_closed_form_and_spends_the_budget():
    truth = ScalingFit(**CHINCHILLA)
    flops = 5.76e23  # Chinchilla's own budget
    n, d = truth.optimal(flops)
    assert 6 * n * d == pytest.approx(flops)
    # Off the optimum, along the same budget, the law's loss only rises.
    for factor in (0.8, 1.25):
        assert truth.predict(n * factor, d / factor) > truth.predict(n, d)
    # Doubling the budget scales N by 2^a and D by 2^b.
    a, b = truth.exponents()
    n2, d2 = truth.optimal(2 * flops)
    assert (n2 / n, d2 / d) == pytest.approx((2**a, 2**b))
    # The same optimum found numerically, as for any other FLOPs per token.
    assert truth.optimal(flops, flops_per_token=lambda p: 6 * p) == pytest.approx((n, d), rel=1e-4)
    # The attention term (Chinchilla 70B's 12·L·T·d) is a cost per token that does not grow with N: tokens cost
    # more relative to parameters, so the optimum moves to a larger model on fewer tokens, still on budget.
    attention = 12 * 80 * 2048 * 8192
    n_attn, d_attn = truth.optimal(flops, flops_per_token=lambda p: 6 * p + attention)
    assert n_attn > n and d_attn < d and (6 * n_attn + attention) * d_attn == pytest.approx(flops)


def test_to_json_round_trips_through_a_file(tmp_path):
    fit = fit_scaling_law(ladder(CHINCHILLA, seed=1), bootstrap=2, seed=3)
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(fit.to_json()))
    data = json.loads(path.read_text())
    assert ScalingFit.from_json(data) == fit
    assert data["exponents"] == pytest.approx(dict(zip("ab", fit.exponents())))
    assert fit_scaling_law(ladder(CHINCHILLA, seed=1), bootstrap=2, seed=3) == fit  # seeded: the same fit again


@pytest.mark.parametrize(
    "points,message",
    [
        ([(1e6, 1e8, 3.0)] * 4, "4 points; the five parameters need at least 5"),
        ([(1e6, d, 3.0) for d in (1e7, 1e8, 1e9, 1e10, 1e11)], "1 distinct model sizes N"),
        ([(n, 1e9, 3.0) for n in (1e5, 1e6, 1e7, 1e8, 1e9)], "1 distinct token budgets D"),
        ([(1e6, 1e8, 3.0)] * 4 + [(1e7, 1e9, -1.0)], "point 4: loss must be > 0"),
        ([(1e6, 1e8, 3.0)] * 4 + [(0, 1e9, 2.0)], "point 4: N must be > 0"),
        ([(1e6, 1e8, 3.0)] * 4 + [(1e7, float("nan"), 2.0)], "point 4: D is nan"),
        ([(1e6, 1e8)] * 5, "(N, D, loss) triples"),
    ],
)
def test_bad_points_are_refused_by_name(points, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        fit_scaling_law(points, bootstrap=0)


def test_a_fit_file_without_a_parameter_is_refused_by_name():
    data = ScalingFit(**CHINCHILLA).to_json()
    del data["beta"]
    with pytest.raises(ValueError, match="fit.json: beta: missing"):
        ScalingFit.from_json(data, source="fit.json")


@pytest.mark.parametrize("truth", [CHINCHILLA, EPOCH], ids=["chinchilla", "epoch"])
def test_a_held_out_size_is_predicted_by_the_smaller_ones(truth):
    """scaling/fit's check: the law fitted without every point of the largest size (10× the next) predicts each of
    them within 1% of the true law (0.4% seen); a fit without each size's largest budget (4× the next; a size with
    one point loses it) predicts those within 1.5% (1.04% seen: their exponent rests on two budgets)."""
    points = ladder(truth, seed=0)
    top = max(n for n, _, _ in points)
    fit, errors = held_out(points, [n == top for n, _, _ in points])
    assert fit.points == len(points) - len(TOKENS_PER_PARAMETER) and not fit.intervals  # no bootstrap
    assert [(e["n_params"], e["tokens"]) for e in errors] == [(n, d) for n, d, _ in points if n == top]
    for e in errors:
        assert e["predicted"] == pytest.approx(law(truth, e["n_params"], e["tokens"]), rel=0.01)
        assert e["error_pct"] == pytest.approx(100 * abs(e["predicted"] - e["loss"]) / e["loss"])
    most = {n: max(d for m, d, _ in points if m == n) for n, _, _ in points}
    _, errors = held_out(points, [d == most[n] for n, d, _ in points])
    assert len(errors) == len(SIZES) + len(EXTRA)
    for e in errors:
        assert e["predicted"] == pytest.approx(law(truth, e["n_params"], e["tokens"]), rel=0.015)
    with pytest.raises(ValueError, match="no point is held out"):
        held_out(points, [False] * len(points))
