"""Data-mixture search in the RegMix style: sample candidate mixtures, fit loss ~ weights, pick the best.

    cfg = MixingConfig(prior={"web": 0.6, "code": 0.2, "books": 0.2}, candidates=16)
    mixtures = candidate_mixtures(cfg)                 # one proxy run per mixture (a Dagster partition)
    later = candidate_mixtures(cfg, tick=1733454000)   # a scheduled tick's own draws (seeded by the tick)
    fit = fit_mixture_regression(mixtures, losses)     # losses[i]: the target loss of mixtures[i]
    best = best_mixture(fit, cfg)                      # argmin of the fitted loss over many mixtures

Candidates are drawn from a Dirichlet centred on the prior (concentration × prior), seeded, so a
sweep is reproducible and its partitions keep their names when re-run. A scheduled sweep draws new
candidates at each tick, seeded by (seed, tick): the same tick draws the same mixtures, the next one
others, so every tick adds evidence and the fit is over the runs of all ticks together.

The regression is ridge regression on the weights and their pairwise products (RegMix finds mixture
effects smooth enough for a low-order model). That quadratic model has 1 + k + k(k+1)/2 features for k
sources (21 for 5): with fewer runs than that it would interpolate noise, so the fit falls back to the
linear model (an intercept and k-1 weights, the last being implied by the sum to 1) and says why
(`MixtureFit.model`, `.warning`). The best mixture is searched among many fresh Dirichlet samples, kept to
the box of weights the proxy runs spanned (each source between its least and greatest weight in a run), so
it stays where the runs gave evidence rather than at a corner the regression extrapolates to: with a few
runs the box is small and the choice modest; with RegMix's hundreds it covers the whole draw. A data budget
(`max_weights`, from mixing.max_epochs: assets/mixing/budget.py) discards the scored mixtures that would give a
source more weight than the main run can draw from it without repeating it more than that many times.
Pure numpy: no torch, no Dagster.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from trainer.data.config import MixingConfig


def _prior(cfg: MixingConfig) -> np.ndarray:
    w = np.array([cfg.prior[s] for s in cfg.sources], dtype=np.float64)
    return w / w.sum()


# Random streams of one seed: the base sweep's draws, the best-mixture search pool, each tick's draws.
SWEEP_STREAM, SEARCH_STREAM, TICK_STREAM = 0, 1, 2


def _dirichlet(cfg: MixingConfig, n: int, *stream: int) -> np.ndarray:
    # A zero prior weight would give a degenerate Dirichlet: such a source is simply never mixed in.
    alpha = cfg.concentration * _prior(cfg)
    live = alpha > 0
    out = np.zeros((n, len(alpha)))
    out[:, live] = np.random.default_rng([cfg.seed, *stream]).dirichlet(alpha[live], size=n)
    return out


def mixture_name(weights: dict[str, float]) -> str:
    """A stable short name for a mixture (a partition key): the digest of its rounded weights."""
    text = json.dumps({k: round(v, 6) for k, v in sorted(weights.items())})
    return "mix-" + hashlib.sha256(text.encode()).hexdigest()[:10]


def candidate_mixtures(cfg: MixingConfig, tick: int | None = None) -> list[dict[str, float]]:
    """The base sweep (no tick): the prior itself first (a baseline the fit must beat), then Dirichlet draws.
    A scheduled tick (a whole number, e.g. its time in epoch seconds): `candidates` fresh draws seeded by
    (seed, tick), none of them the prior, which the base sweep has run."""
    if tick is None:
        rows = np.vstack([_prior(cfg)[None], _dirichlet(cfg, cfg.candidates - 1, SWEEP_STREAM)])
    else:
        if tick < 0:
            raise ValueError(f"a tick seeds the draw and must be >= 0, got {tick}")
        rows = _dirichlet(cfg, cfg.candidates, TICK_STREAM, tick)
    return [{s: float(w) for s, w in zip(cfg.sources, row)} for row in rows]


def feature_count(model: str, sources: int) -> int:
    """Columns of the design matrix: quadratic 1 + k + k(k+1)/2 (21 for 5 sources), linear k."""
    return {"quadratic": 1 + sources + sources * (sources + 1) // 2, "linear": sources}[model]


def _features(w: np.ndarray, model: str) -> np.ndarray:
    n, k = w.shape
    if model == "linear":  # the weights sum to 1: the last one is implied by the intercept and the others
        return np.column_stack([np.ones(n), w[:, :k - 1]])
    pairs = [w[:, i] * w[:, j] for i in range(k) for j in range(i, k)]
    return np.column_stack([np.ones(n), w, *pairs])


def choose_model(runs: int, sources: int) -> tuple[str, str | None]:
    """(model, warning): the quadratic model when there are at least as many runs as its features, else the
    linear one and a warning that says why (and whether even that is under-determined)."""
    if runs >= feature_count("quadratic", sources):
        return "quadratic", None
    quadratic, linear = feature_count("quadratic", sources), feature_count("linear", sources)
    warning = (f"{runs} proxy runs < {quadratic} features of the quadratic model over {sources} sources: fitted "
               f"the linear model ({linear} features, no interaction terms) instead")
    if runs < linear:
        warning += (f"; {runs} runs are still fewer than its {linear} features, so the ridge penalty decides what "
                    "the runs cannot (the slopes shrink towards no effect): let the schedule run more ticks")
    return "linear", warning


@dataclass(frozen=True)
class MixtureFit:
    sources: list[str]
    coef: np.ndarray
    r2: float  # on the training points
    loo_rmse: float  # leave-one-out error: how far to trust the fit
    # Each run's loss as the fit over the other runs predicts it (the runs' order): what the fit says of a mixture
    # it has not seen. Their rank correlation with the real losses says whether it orders mixtures rightly, which is
    # what choosing one needs; the baseline is the same error for predicting the mean of the others (no fit at all).
    loo_predictions: tuple[float, ...] = ()
    loo_rank_correlation: float | None = None  # Spearman; None when the losses (or predictions) are all equal
    loo_baseline_rmse: float | None = None
    observed: list[tuple[dict[str, float], float]] = field(default_factory=list)
    model: str = "quadratic"  # or "linear" (choose_model)
    warning: str | None = None  # why a simpler model than the quadratic one was fitted

    @property
    def features(self) -> int:
        return len(self.coef)

    def predict(self, weights: np.ndarray) -> np.ndarray:
        return _features(np.atleast_2d(weights), self.model) @ self.coef


def _ridge(x: np.ndarray, y: np.ndarray, ridge: float) -> np.ndarray:
    penalty = ridge * np.eye(x.shape[1])
    penalty[0, 0] = 0.0  # never shrink the intercept
    return np.linalg.solve(x.T @ x + penalty, x.T @ y)


def fit_mixture_regression(mixtures: list[dict[str, float]], losses: list[float], *,
                           ridge: float = 1e-3) -> MixtureFit:
    """Ridge fit of the target loss on the mixture weights, with the richest model the runs support
    (choose_model); the fit's `model` and `warning` say which one and why."""
    if len(mixtures) != len(losses) or len(mixtures) < 2:
        raise ValueError(f"need one loss per mixture and at least 2 of them, got {len(mixtures)} and {len(losses)}")
    sources = sorted(mixtures[0])
    for i, m in enumerate(mixtures):
        if sorted(m) != sources:
            raise ValueError(f"mixture {i} has sources {sorted(m)}, expected {sources}")
    y = np.asarray(losses, dtype=np.float64)
    if not np.all(np.isfinite(y)):
        bad = [mixture_name(m) for m, v in zip(mixtures, y) if not np.isfinite(v)]
        raise ValueError(f"non-finite target loss for {bad}: a proxy run diverged; rerun or drop it")
    w = np.array([[m[s] for s in sources] for m in mixtures])
    model, warning = choose_model(len(y), len(sources))
    x = _features(w, model)
    coef = _ridge(x, y, ridge)
    residual = y - x @ coef
    r2 = 1.0 - float(residual @ residual) / max(float(((y - y.mean()) ** 2).sum()), 1e-300)
    held_out = np.array([x[i] @ _ridge(np.delete(x, i, 0), np.delete(y, i), ridge) for i in range(len(y))])
    mean_of_others = (y.sum() - y) / (len(y) - 1)
    return MixtureFit(sources=sources, coef=coef, r2=r2, loo_rmse=_rmse(y - held_out),
                      observed=list(zip(mixtures, [float(v) for v in y])), model=model, warning=warning,
                      loo_predictions=tuple(float(v) for v in held_out),
                      loo_rank_correlation=spearman(held_out, y), loo_baseline_rmse=_rmse(y - mean_of_others))


def _rmse(errors: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(errors))))


def _ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a, b) -> float | None:
    """Spearman's rank correlation (the Pearson correlation of the average ranks); None when either side is
    constant."""
    ra, rb = _ranks(np.asarray(a, dtype=np.float64)), _ranks(np.asarray(b, dtype=np.float64))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    scale = float(np.sqrt((ra @ ra) * (rb @ rb)))
    return float(ra @ rb) / scale if scale > 0 else None


@dataclass(frozen=True)
class MixtureChoice:
    """The search's answer; it unpacks as (weights, predicted) like a pair."""

    weights: dict[str, float]
    predicted: float  # the fit's prediction for `weights`
    scored: int  # mixtures scored: the runs and the draws inside their box
    discarded: int  # of those, left out for a weight above max_weights (the data budget)

    def __iter__(self):
        return iter((self.weights, self.predicted))


def best_mixture(fit: MixtureFit, cfg: MixingConfig, max_weights: dict[str, float] | None = None) -> MixtureChoice:
    """The mean of the top_k mixtures of lowest fitted loss among fresh samples around the prior (and the runs
    themselves) that lie in the box the runs spanned, and the fit's prediction for that mean. With max_weights
    (source -> greatest weight), a mixture above it for any source is discarded before scoring; the mean of
    mixtures within those caps is within them too. ValueError when every one is discarded, naming the source."""
    if fit.sources != cfg.sources:
        raise ValueError(f"the fit is over sources {fit.sources}, the config over {cfg.sources}")
    runs = np.array([[m[s] for s in fit.sources] for m, _ in fit.observed])
    drawn = _dirichlet(cfg, cfg.search_samples, SEARCH_STREAM)
    # A fit over a handful of runs is a guess outside the weights they tried (a linear one is steepest at the
    # edge of the draw), so only mixtures inside their box are scored; the runs themselves always are.
    inside = np.all((drawn >= runs.min(axis=0)) & (drawn <= runs.max(axis=0)), axis=1)
    pool = np.vstack([runs, drawn[inside]])
    if cfg.min_weight > 0:
        live = _prior(cfg) > 0
        pool[:, live] = np.maximum(pool[:, live], cfg.min_weight)
        pool /= pool.sum(axis=1, keepdims=True)
    scored = len(pool)
    if max_weights is not None:
        caps = np.array([max_weights.get(s, np.inf) for s in fit.sources])
        above = pool > caps  # (mixtures, sources)
        if above.any(axis=1).all():
            worst = fit.sources[int(np.argmax(above.sum(axis=0)))]
            raise ValueError(f"all {scored} mixtures scored give {worst} more weight than its budget allows "
                             f"({max_weights[worst]:.4f})")
        pool = pool[~above.any(axis=1)]
    predicted = fit.predict(pool)
    top = np.argsort(predicted, kind="stable")[:cfg.top_k]
    best = pool[top].mean(axis=0)
    return MixtureChoice(weights={s: float(w) for s, w in zip(fit.sources, best)},
                         predicted=float(fit.predict(best[None])[0]), scored=scored, discarded=scored - len(pool))
