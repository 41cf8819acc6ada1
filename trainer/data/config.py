"""The recipe's `mixing` section as the mixture search takes it (MixingConfig: the prior, the sweep's candidates,
the search for the best mixture).

Kept apart from the search (mixture_search.py) so that reading a recipe and loading the code location (the
recipe's mixing section, assets/recipe/, checks itself with it) do not import numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class MixingConfig:
    prior: dict[str, float]  # source -> prior weight (normalised here)
    candidates: int = 16  # proxy runs in a sweep
    concentration: float = 10.0  # Dirichlet α = concentration × prior: higher = closer to the prior
    seed: int = 0
    search_samples: int = 100_000  # mixtures scored by the fitted regression when picking the best
    # The best mixture is the mean of the top_k scored mixtures (RegMix): the single best sample sits where the
    # fit extrapolates furthest (with the linear fallback, at the edge of the search), their mean is steadier.
    top_k: int = 100
    ridge: float = 1e-3
    min_weight: float = 0.0  # a source below this weight in the best mixture is set to it (then renormalised)

    def __post_init__(self):
        if not self.prior:
            raise ValueError("mixing.prior: give at least one source and its weight")
        bad = {k: v for k, v in self.prior.items() if not math.isfinite(v) or v < 0}
        if bad or sum(self.prior.values()) <= 0:
            raise ValueError(f"mixing.prior: weights must be finite, >= 0 and not all zero, got {self.prior}")
        if self.top_k < 1:
            raise ValueError(f"mixing.top_k must be >= 1, got {self.top_k}")
        if self.candidates < 2:
            raise ValueError(f"mixing.candidates must be >= 2, got {self.candidates}")
        if self.concentration <= 0:
            raise ValueError(f"mixing.concentration must be > 0, got {self.concentration}")
        if not 0 <= self.min_weight < 1 / len(self.prior):
            raise ValueError(f"mixing.min_weight must be in [0, 1/{len(self.prior)}), got {self.min_weight}")

    @property
    def sources(self) -> list[str]:
        return sorted(self.prior)
