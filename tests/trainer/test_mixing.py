"""RegMix-style mixture search: reproducible candidates, a fit that finds a known optimum."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.mixing import MixingConfig, best_mixture, candidate_mixtures, fit_mixture_regression, mixture_name

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


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="mixing.prior"):
        MixingConfig(prior={"web": -1.0})
    mixtures = candidate_mixtures(MixingConfig(prior=PRIOR, candidates=4))
    with pytest.raises(ValueError, match="diverged"):
        fit_mixture_regression(mixtures, [1.0, float("nan"), 1.0, 1.0])
    with pytest.raises(ValueError, match="one loss per mixture"):
        fit_mixture_regression(mixtures, [1.0])
