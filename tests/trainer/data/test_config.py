import pytest

from trainer.data.config import MixingConfig

PRIOR = {"web": 0.6, "code": 0.4}


def test_sources_are_the_prior_s_in_a_fixed_order():
    assert MixingConfig(prior={"web": 0.6, "code": 0.2, "books": 0.2}).sources == ["books", "code", "web"]


@pytest.mark.parametrize("bad, field", [
    ({"prior": {}}, "mixing.prior"),
    ({"prior": {"web": -1.0}}, "mixing.prior"),
    ({"prior": {"web": float("nan")}}, "mixing.prior"),
    ({"prior": {"web": 0.0, "code": 0.0}}, "mixing.prior"),
    ({"prior": PRIOR, "top_k": 0}, "mixing.top_k"),
    ({"prior": PRIOR, "candidates": 1}, "mixing.candidates"),
    ({"prior": PRIOR, "concentration": 0.0}, "mixing.concentration"),
    ({"prior": PRIOR, "min_weight": 0.5}, r"mixing.min_weight must be in \[0, 1/2\)"),
])
def test_a_bad_setting_is_refused_by_its_name(bad, field):
    with pytest.raises(ValueError, match=field):
        MixingConfig(**bad)
