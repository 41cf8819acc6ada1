"""The scaling law L(N, D) = E + A/N^α + B/D^β, fitted to measured losses by Chinchilla's approach 3.

    fit = fit_scaling_law([(n_params, tokens, loss), ...], bootstrap=200)
    fit.predict(1e9, 2e10)            # the loss the law gives a model of N parameters trained on D tokens
    fit.optimal(1.2e20)               # (N_opt, D_opt) for a compute budget C ≈ 6·N·D
    fit.exponents()                   # (a, b): N_opt ∝ C^a, D_opt ∝ C^b (Chinchilla's fit: about 0.5 each)
    held_out(points, [n == max_n for n, _, _ in points])   # the law without those points, its error on each

The objective is Hoffmann et al. 2022, appendix D.2: with a = log A, b = log B, e = log E,

    min over (a, b, e, α, β) of  Σ_i Huber_δ( LSE(a − α log N_i, b − β log D_i, e) − log L_i ),   δ = 1e-3,

minimised by L-BFGS from a grid of starts, the best end kept (Besiroglu et al. 2024, "Chinchilla scaling: a
replication attempt", fit the same objective). The Huber loss on log-loss makes one outlying run count
little. Intervals are bootstrap percentiles: the points resampled with replacement, the law fitted again.

Pure numpy and scipy: no torch, no Dagster. The asset `scaling/fit` writes `ScalingFit.to_json()` to fit.json
in its output folder; `pretrain plan --budget` reads it back with `ScalingFit.from_json()`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

# scipy and threadpoolctl are imported where a fit runs: every code-location load imports this module (training
# stages read a fit's prediction), and scipy.optimize alone took 0.4 s of it.

PARAMETERS = ("E", "A", "B", "alpha", "beta")
INTERVAL_KEYS = PARAMETERS + ("a", "b")  # a, b: the exponents of N_opt and D_opt in compute
INTERVAL_PERCENTILES = (5.0, 95.0)
MIN_POINTS = 5

# Hoffmann et al.'s grid of starts: α, β ∈ {0, 0.5, ..., 2}, e ∈ {-1, -0.5, ..., 1}, a, b ∈ {0, 5, ..., 25}.
GRID = {
    "a": np.arange(0.0, 30.0, 5.0),
    "b": np.arange(0.0, 30.0, 5.0),
    "e": np.arange(-1.0, 1.5, 0.5),
    "alpha": np.arange(0.0, 2.5, 0.5),
    "beta": np.arange(0.0, 2.5, 0.5),
}
STARTS = 16  # the best grid points by objective, each run to convergence by L-BFGS
# A resample starts from the full fit's optimum and its own best grid point (3 grid points gave the same intervals).
BOOTSTRAP_STARTS = 1
EXPONENT_BOUNDS = (0.0, 5.0)  # α, β: a law whose loss grows with N or D describes no ladder


def six_n(n_params: float) -> float:
    """Training FLOPs per token as the scaling-law papers count them: 6·N (no attention term)."""
    return 6.0 * n_params


@dataclass(frozen=True)
class ScalingFit:
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)  # bootstrap 5–95% per INTERVAL_KEYS
    points: int = 0
    rule: str = ""

    def predict(self, n_params: float, tokens: float) -> float:
        return self.E + self.A / n_params**self.alpha + self.B / tokens**self.beta

    def exponents(self) -> tuple[float, float]:
        """(a, b) with N_opt ∝ C^a and D_opt ∝ C^b under C = 6·N·D: a = β/(α+β), b = α/(α+β)."""
        total = self.alpha + self.beta
        if total <= 0:
            raise ValueError(f"scaling fit: alpha + beta must be > 0 for a compute-optimal size, got {total!r}")
        return self.beta / total, self.alpha / total

    def optimal(self, flops: float, flops_per_token: Callable[[float], float] = six_n) -> tuple[float, float]:
        """(N_opt, D_opt) that minimise the law's loss for a budget of `flops`. Under C = 6·N·D, Chinchilla's
        eq. 4 in closed form: G = (αA/(βB))^(1/(α+β)), N_opt = G·(C/6)^a, D_opt = (C/6)^b / G. Any other FLOPs
        per token (e.g. with the attention term) is minimised numerically over log N, with D = C / fpt(N)."""
        if not flops > 0 or not math.isfinite(flops):
            raise ValueError(f"budget: FLOPs must be a positive finite number, got {flops!r}")
        a, b = self.exponents()
        if self.alpha <= 0 or self.beta <= 0:
            raise ValueError(f"scaling fit: alpha and beta must be > 0 for a compute-optimal size, "
                             f"got alpha={self.alpha!r}, beta={self.beta!r}")
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        n_opt, d_opt = g * (flops / 6.0) ** a, (flops / 6.0) ** b / g
        if flops_per_token is six_n:
            return n_opt, d_opt

        def loss(log_n: float) -> float:
            n = math.exp(log_n)
            return self.predict(n, flops / flops_per_token(n))

        from scipy.optimize import minimize_scalar

        # The 6N optimum brackets the search: other per-token costs move it by far less than 100×.
        found = minimize_scalar(loss, bounds=(math.log(n_opt) - 2 * math.log(10), math.log(n_opt) + 2 * math.log(10)),
                                method="bounded", options={"xatol": 1e-10})
        n = math.exp(found.x)
        return n, flops / flops_per_token(n)

    def to_json(self) -> dict:
        exponents = None if self.alpha + self.beta <= 0 else dict(zip("ab", self.exponents()))
        return {
            "law": "L(N, D) = E + A / N^alpha + B / D^beta",
            **{name: getattr(self, name) for name in PARAMETERS},
            "intervals": {key: [lo, hi] for key, (lo, hi) in self.intervals.items()},
            "points": self.points,
            "rule": self.rule,
            "exponents": exponents,  # derived, for readers of the file; from_json ignores it
        }

    @classmethod
    def from_json(cls, data: dict, *, source: str = "scaling fit") -> "ScalingFit":
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
        values = {}
        for name in PARAMETERS:
            if name not in data:
                raise ValueError(f"{source}: {name}: missing (needed: {', '.join(PARAMETERS)})")
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{source}: {name}: must be a finite number, got {value!r}")
            values[name] = float(value)
        intervals = {}
        for key, pair in (data.get("intervals") or {}).items():
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                raise ValueError(f"{source}: intervals.{key}: must be [low, high], got {pair!r}")
            intervals[key] = (float(pair[0]), float(pair[1]))
        return cls(**values, intervals=intervals, points=int(data.get("points", 0)), rule=str(data.get("rule", "")))


def _objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_loss: np.ndarray,
               delta: float) -> tuple[float, np.ndarray]:
    """The mean Huber loss of the log-loss residuals over δ, and its gradient in (a, b, e, α, β). Dividing by δ
    leaves the minimiser where it is and keeps the values near 1, where L-BFGS's tolerances are meant to work."""
    a, b, e, alpha, beta = theta
    terms = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])
    top = terms.max(axis=0)  # logsumexp by hand: scipy's checks cost more than the sum on a few points
    predicted = top + np.log(np.exp(terms - top).sum(axis=0))
    residual = predicted - log_loss
    small = np.abs(residual) <= delta
    value = np.where(small, 0.5 * residual**2, delta * (np.abs(residual) - 0.5 * delta)) / delta
    slope = np.where(small, residual, delta * np.sign(residual)) / delta  # d Huber / d residual, over δ
    weights = np.exp(terms - predicted)  # d LSE / d term: softmax of the three terms
    grad = np.array([
        np.sum(slope * weights[0]),
        np.sum(slope * weights[1]),
        np.sum(slope * weights[2]),
        np.sum(slope * weights[0] * -log_n),
        np.sum(slope * weights[1] * -log_d),
    ]) / len(log_n)
    return float(np.mean(value)), grad


def _grid() -> np.ndarray:
    return np.array(list(itertools.product(GRID["a"], GRID["b"], GRID["e"], GRID["alpha"], GRID["beta"])))


def _grid_values(grid: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_loss: np.ndarray,
                 delta: float) -> np.ndarray:
    """The objective at every grid point at once (no gradient): the starts are the best of these."""
    from scipy.special import logsumexp

    a, b, e, alpha, beta = (grid[:, i : i + 1] for i in range(5))
    terms = np.stack([a - alpha * log_n, b - beta * log_d, np.broadcast_to(e, (len(grid), len(log_n)))])
    residual = np.abs(logsumexp(terms, axis=0) - log_loss)
    return np.mean(np.where(residual <= delta, 0.5 * residual**2, delta * (residual - 0.5 * delta)), axis=1) / delta


def _minimise(starts: np.ndarray, log_n, log_d, log_loss, delta: float) -> tuple[np.ndarray, float] | None:
    from scipy.optimize import minimize

    bounds = [(None, None)] * 3 + [EXPONENT_BOUNDS] * 2
    best = None
    for start in starts:
        result = minimize(_objective, start, args=(log_n, log_d, log_loss, delta), jac=True, method="L-BFGS-B",
                          bounds=bounds, options={"maxiter": 2000, "ftol": 1e-14, "gtol": 1e-10})
        if np.all(np.isfinite(result.x)) and math.isfinite(result.fun) and (best is None or result.fun < best[1]):
            best = (result.x, float(result.fun))
    return best


def _fit_once(log_n, log_d, log_loss, delta: float, grid: np.ndarray, starts: int,
              extra: np.ndarray | None = None) -> np.ndarray | None:
    values = _grid_values(grid, log_n, log_d, log_loss, delta)
    chosen = grid[np.argsort(values, kind="stable")[:starts]]
    if extra is not None:
        chosen = np.vstack([extra[None, :], chosen])
    found = _minimise(chosen, log_n, log_d, log_loss, delta)
    return None if found is None else found[0]


def _check_points(points: Sequence[Sequence[float]]) -> np.ndarray:
    try:
        array = np.asarray(points, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"scaling fit: points must be (N, D, loss) numbers ({exc})") from None
    if array.ndim != 2 or array.shape[1] != 3:
        raise ValueError(f"scaling fit: points must be (N, D, loss) triples, got an array of shape {array.shape}")
    for row, (n, d, loss) in enumerate(array):
        for name, value in (("N", float(n)), ("D", float(d)), ("loss", float(loss))):
            if not math.isfinite(value):
                raise ValueError(f"scaling fit: point {row}: {name} is {value!r}, not a finite number")
            if value <= 0:
                raise ValueError(f"scaling fit: point {row}: {name} must be > 0, got {value!r}")
    if len(array) < MIN_POINTS:
        raise ValueError(f"scaling fit: {len(array)} points; the five parameters need at least {MIN_POINTS}")
    for column, name in ((0, "model sizes N"), (1, "token budgets D")):
        distinct = len(np.unique(array[:, column]))
        if distinct < 2:
            raise ValueError(f"scaling fit: {distinct} distinct {name}; the law needs at least 2 to fit its exponent")
    return array


def _from_theta(theta: np.ndarray) -> dict[str, float]:
    a, b, e, alpha, beta = (float(x) for x in theta)
    return {"E": math.exp(e), "A": math.exp(a), "B": math.exp(b), "alpha": alpha, "beta": beta}


def fit_scaling_law(points: Sequence[tuple[float, float, float]], *, bootstrap: int = 200, seed: int = 0,
                    huber_delta: float = 1e-3) -> ScalingFit:
    """Fit L(N, D) = E + A/N^α + B/D^β to (N, D, loss) points; `bootstrap` resamples give the 5–95% intervals
    (none with bootstrap=0). Seeded: the same points and seed give the same fit."""
    array = _check_points(points)
    if not huber_delta > 0:
        raise ValueError(f"scaling fit: huber_delta must be > 0, got {huber_delta!r}")
    if bootstrap < 0:
        raise ValueError(f"scaling fit: bootstrap must be ≥ 0, got {bootstrap!r}")
    from threadpoolctl import threadpool_limits

    # L-BFGS-B calls BLAS on 5×5 matrices: OpenBLAS's threads only wait for each other there (14× slower on two
    # busy cores), so the fit runs on one.
    with threadpool_limits(limits=1, user_api="blas"):
        return _fit(array, bootstrap=bootstrap, seed=seed, huber_delta=huber_delta)


def _fit(array: np.ndarray, *, bootstrap: int, seed: int, huber_delta: float) -> ScalingFit:
    log_n, log_d, log_loss = (np.log(array[:, i]) for i in range(3))
    grid = _grid()
    theta = _fit_once(log_n, log_d, log_loss, huber_delta, grid, STARTS)
    if theta is None:
        raise ValueError("scaling fit: L-BFGS found no finite optimum from any start")
    values = _from_theta(theta)

    intervals: dict[str, tuple[float, float]] = {}
    if bootstrap:
        rng = np.random.default_rng(seed)
        samples = []
        for _ in range(bootstrap):
            pick = rng.integers(0, len(array), len(array))
            if len(np.unique(log_n[pick])) < 2 or len(np.unique(log_d[pick])) < 2:
                continue  # a resample that cannot fit both exponents says nothing about them
            found = _fit_once(log_n[pick], log_d[pick], log_loss[pick], huber_delta, grid, BOOTSTRAP_STARTS, theta)
            if found is None:
                continue
            sample = _from_theta(found)
            total = sample["alpha"] + sample["beta"]
            exponents = (sample["beta"] / total, sample["alpha"] / total) if total > 0 else (math.nan, math.nan)
            sample["a"], sample["b"] = exponents
            samples.append(sample)
        for key in INTERVAL_KEYS:
            column = np.array([s[key] for s in samples if math.isfinite(s[key])])
            if len(column):
                lo, hi = np.percentile(column, INTERVAL_PERCENTILES)
                intervals[key] = (float(lo), float(hi))
    lo, hi = INTERVAL_PERCENTILES
    rule = (f"Chinchilla approach 3: Huber (delta={huber_delta:g}) on log-loss, L-BFGS from the best {STARTS} of a "
            f"{len(grid)}-point grid; {bootstrap} bootstrap resamples, {lo:g}-{hi:g}% intervals")
    return ScalingFit(**values, intervals=intervals, points=len(array), rule=rule)


def held_out(points: Sequence[tuple[float, float, float]], held: Sequence[bool], *,
             huber_delta: float = 1e-3) -> tuple[ScalingFit, list[dict]]:
    """The law fitted without the held points (no bootstrap), and its prediction of each of them: an error measured
    on losses the fit never saw, e.g. a whole model size beyond the fitted ones (what a ladder is for: small models
    predicting a larger one) or a token budget beyond the fitted ones. Returns (the fit, [{"n_params", "tokens",
    "loss", "predicted", "error", "error_pct"}] in the held points' order)."""
    if len(held) != len(points):
        raise ValueError(f"held out: {len(held)} flags for {len(points)} points")
    if not any(held):
        raise ValueError("held out: no point is held out")
    fit = fit_scaling_law([p for p, h in zip(points, held) if not h], bootstrap=0, huber_delta=huber_delta)
    errors = []
    for (n, d, loss), h in zip(points, held):
        if h:
            predicted = fit.predict(n, d)
            errors.append({"n_params": n, "tokens": d, "loss": loss, "predicted": predicted,
                           "error": predicted - loss, "error_pct": 100 * abs(predicted - loss) / loss})
    return fit, errors
