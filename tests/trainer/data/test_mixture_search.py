"""RegMix-style mixture search: reproducible candidates, a fit that finds a known optimum."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.data.config import MixingConfig
from trainer.data.mixture_search import best_mixture, candidate_mixtures, fit_mixture_regression, mixture_name, spearman

PRIOR = {"web": 0.5, "code": 0.2, "books": 0.2, "math": 0.1}
OPTIMUM = np.array([0.15, 0.25, 0.35, 0.25])  # books, code, math, web (sorted source order)


def synthetic_loss(m: dict[str, float], noise: float, rng) -> float:
    """A smooth bowl with its minimum at OPTIMUM, plus evaluation noise like a proxy run's."""
    w = np.array([m[s] for s in sorted(m)])
    return float(3.0 + 4.0 * np.sum((w - OPTIMUM) ** 2) + rng.normal(0, noise))


def test_candidates_are_reproducible_mixtures_around_the_prior():
    cfg = MixingConfig(prior=PRIOR, candidates=12, seed=3)
    a, b = candidate_mixtures(cfg), candidate_mixtures(cfg)
    assert a == b and len(a) == 12
    assert a[0] == pytest.approx(PRIOR)  # the prior itself is the first candidate: the baseline
    for m in a:
        assert set(m) == set(PRIOR) and sum(m.values()) == pytest.approx(1.0) and min(m.values()) >= 0
    assert len({mixture_name(m) for m in a}) == 12
    assert candidate_mixtures(MixingConfig(prior=PRIOR, candidates=12, seed=4))[1:] != a[1:]
    # A source with prior weight 0 is never mixed in.
    assert all(m["math"] == 0 for m in candidate_mixtures(MixingConfig(prior={**PRIOR, "math": 0.0})))


def test_the_fit_finds_a_known_optimum_from_noisy_proxy_losses():
    rng = np.random.default_rng(0)
    cfg = MixingConfig(prior=PRIOR, candidates=24, concentration=6.0, seed=0)
    mixtures = candidate_mixtures(cfg)
    fit = fit_mixture_regression(mixtures, [synthetic_loss(m, 0.005, rng) for m in mixtures])
    assert fit.r2 > 0.9 and fit.loo_rmse < 0.05
    best, predicted = best_mixture(fit, cfg)
    chosen = np.array([best[s] for s in sorted(best)])
    assert np.abs(chosen - OPTIMUM).max() < 0.08, best
    true_best = synthetic_loss(best, 0.0, rng)
    assert true_best < min(synthetic_loss(m, 0.0, rng) for m in mixtures)  # better than every proxy run
    assert predicted == pytest.approx(true_best, abs=0.05)


def test_the_fit_states_its_error_on_runs_it_has_not_seen():
    """Leave-one-out: each run predicted by a fit over the others, computed here by refitting without it. On a
    smooth bowl the fit beats predicting the mean of the others and orders the runs rightly; on pure noise it
    orders them no better than chance."""
    rng = np.random.default_rng(1)
    cfg = MixingConfig(prior=PRIOR, candidates=24, concentration=6.0, seed=0)
    mixtures = candidate_mixtures(cfg)
    losses = [synthetic_loss(m, 0.002, rng) for m in mixtures]
    fit = fit_mixture_regression(mixtures, losses)
    for i in (0, 7, 23):
        without = fit_mixture_regression(mixtures[:i] + mixtures[i + 1:], losses[:i] + losses[i + 1:])
        w = np.array([[mixtures[i][s] for s in fit.sources]])
        assert fit.loo_predictions[i] == pytest.approx(without.predict(w)[0])
    errors = np.array(losses) - np.array(fit.loo_predictions)
    assert fit.loo_rmse == pytest.approx(float(np.sqrt(np.mean(errors ** 2))))
    others = [(sum(losses) - v) / (len(losses) - 1) for v in losses]
    assert fit.loo_baseline_rmse == pytest.approx(float(np.sqrt(np.mean((np.array(losses) - others) ** 2))))
    assert fit.loo_rmse < 0.5 * fit.loo_baseline_rmse and fit.loo_rank_correlation > 0.8
    noise = fit_mixture_regression(mixtures, list(rng.normal(3.0, 0.01, len(mixtures))))
    assert noise.loo_rmse > noise.loo_baseline_rmse and abs(noise.loo_rank_correlation) < 0.5


def test_spearman_is_the_correlation_of_ranks_ties_averaged():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1.0, 5.0, 2.0]) == pytest.approx(0.5)  # ranks 1 2 3 against 1 3 2
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(np.sqrt(3) / 2)  # ranks 1.5 1.5 3
    assert spearman([2, 2, 2], [1, 2, 3]) is None


def test_bad_inputs_name_the_problem():
    mixtures = candidate_mixtures(MixingConfig(prior=PRIOR, candidates=4))
    with pytest.raises(ValueError, match="diverged"):
        fit_mixture_regression(mixtures, [1.0, float("nan"), 1.0, 1.0])
    with pytest.raises(ValueError, match="one loss per mixture"):
        fit_mixture_regression(mixtures, [1.0])


def test_each_tick_draws_its_own_candidates_and_the_same_tick_the_same_ones():
    cfg = MixingConfig(prior=PRIOR, candidates=6, seed=3)
    base = {mixture_name(m) for m in candidate_mixtures(cfg)}
    first, again = candidate_mixtures(cfg, tick=1_765_000_800), candidate_mixtures(cfg, tick=1_765_000_800)
    second = candidate_mixtures(cfg, tick=1_765_605_600)  # a week later
    assert first == again and len(first) == len(second) == 6
    names = [{mixture_name(m) for m in draw} for draw in (first, second)]
    assert len(names[0]) == len(names[1]) == 6  # no two alike within a tick
    assert not names[0] & names[1] and not (names[0] | names[1]) & base  # every tick adds new mixtures
    for m in first + second:
        assert set(m) == set(PRIOR) and sum(m.values()) == pytest.approx(1.0) and min(m.values()) >= 0
    assert PRIOR not in [pytest.approx(m) for m in first]  # the prior is the base sweep's, run once
    assert candidate_mixtures(MixingConfig(prior=PRIOR, candidates=6, seed=4), tick=1_765_000_800) != first
    with pytest.raises(ValueError, match="tick"):
        candidate_mixtures(cfg, tick=-1)


def test_fewer_runs_than_features_fit_the_linear_model_and_say_why():
    sources = {"books": 0.15, "c4": 0.2, "code": 0.15, "math": 0.15, "web": 0.35}  # the demo's five
    cfg = MixingConfig(prior=sources, candidates=4, concentration=8.0)
    mixtures = candidate_mixtures(cfg)  # the demo's base sweep: 4 runs, 21 quadratic features
    slope = {"books": 0.2, "c4": -0.3, "code": 0.5, "math": 0.1, "web": -0.4}

    def loss(m):  # linear in the weights: what a linear model can get right
        return 3.0 + sum(slope[s] * m[s] for s in m)

    fit = fit_mixture_regression(mixtures, [loss(m) for m in mixtures])
    assert (fit.model, fit.features) == ("linear", 5)
    assert "4 proxy runs < 21 features of the quadratic model over 5 sources" in fit.warning
    assert "still fewer than its 5 features" in fit.warning
    # Two more ticks: 4 + 8 runs, enough for the linear model, which then finds the true losses.
    ticks = candidate_mixtures(cfg, tick=100) + candidate_mixtures(cfg, tick=200)
    fit = fit_mixture_regression(mixtures + ticks, [loss(m) for m in mixtures + ticks], ridge=1e-9)
    assert fit.model == "linear" and "still fewer" not in fit.warning and "12 proxy runs < 21" in fit.warning
    unseen = candidate_mixtures(cfg, tick=300)
    assert fit.predict(np.array([[m[s] for s in sorted(m)] for m in unseen])) == pytest.approx(
        [loss(m) for m in unseen], abs=1e-4)
    # Runs from enough ticks together support the quadratic model: no warning.
    many = mixtures + [m for t in range(1, 6) for m in candidate_mixtures(cfg, tick=t)]
    fit = fit_mixture_regression(many, [loss(m) for m in many])
    assert (fit.model, fit.features, fit.warning) == ("quadratic", 21, None) and len(many) == 24


def test_the_best_mixture_is_the_mean_of_the_top_k_so_a_linear_fit_is_not_followed_to_the_edge():
    """Four runs for five sources: the linear fallback's single best sample is the most extreme one drawn; the
    mean of its top 100 stays nearer the prior, and with top_k 1 the search returns that single sample."""
    rng = np.random.default_rng(1)
    cfg = MixingConfig(prior=PRIOR, candidates=4, concentration=6.0, seed=0, search_samples=20_000)
    mixtures = candidate_mixtures(cfg)
    fit = fit_mixture_regression(mixtures, [synthetic_loss(m, 0.005, rng) for m in mixtures])
    assert fit.model == "linear"
    single, single_loss = best_mixture(fit, MixingConfig(**{**cfg.__dict__, "top_k": 1}))
    mean, mean_loss = best_mixture(fit, cfg)
    prior = np.array([PRIOR[s] for s in sorted(PRIOR)]) / sum(PRIOR.values())
    distance = {name: np.abs(np.array([m[s] for s in sorted(m)]) - prior).sum() for name, m in
                (("single", single), ("mean", mean))}
    assert distance["mean"] < distance["single"]
    assert sum(mean.values()) == pytest.approx(1.0) and min(mean.values()) >= 0
    assert single_loss <= mean_loss  # the single sample is the fit's own minimum; the mean gives some of it up


def test_the_best_mixture_stays_in_the_box_of_weights_the_runs_tried():
    """The demo's case: four proxy runs, five sources, a linear fit whose slope says "more code" without end.
    Unbounded, the search followed it to the edge of the draw (85% code in the demo); kept to the runs' box, each
    weight of the choice lies between the least and greatest weight any run gave that source."""
    sources = {"books": 0.15, "c4": 0.2, "code": 0.15, "math": 0.15, "web": 0.35}
    cfg = MixingConfig(prior=sources, candidates=4, concentration=8.0)
    mixtures = candidate_mixtures(cfg)
    fit = fit_mixture_regression(mixtures, [3.0 - 2.0 * m["code"] for m in mixtures])
    best, predicted = best_mixture(fit, cfg)
    for s in sources:
        tried = [m[s] for m in mixtures]
        assert min(tried) - 1e-9 <= best[s] <= max(tried) + 1e-9, (s, best[s], tried)
    assert best["code"] > sources["code"]  # it still follows the fit, as far as the runs went
    assert sum(best.values()) == pytest.approx(1.0) and np.isfinite(predicted)
