"""assets/recipe/mixing.py: the recipe's `mixing` section, checked by the engine's own rules and its proxy's launch."""

import pytest
from pydantic import ValidationError

from assets.recipe.mixing import MixingSection


def test_the_section_gives_the_engine_its_sweep():
    section = MixingSection(prior={"web": 0.75, "code": 0.25}, candidates=4, concentration=5.0, seed=3)
    config = section.engine_config()
    assert (config.prior, config.candidates, config.concentration, config.seed) == (
        {"web": 0.75, "code": 0.25}, 4, 5.0, 3)
    assert section.target == "average" and section.max_epochs == 4.0 and section.status == "stopped"


@pytest.mark.parametrize("fields, message", [
    ({"target": "books"}, "target must be 'average' or one of \\['code', 'web'\\], got 'books'"),
    ({"candidates": 1}, "mixing.candidates must be >= 2"),
    ({"prior": {"web": 0.0, "code": 0.0}}, "mixing.prior: weights must be finite"),
    ({"proxy": {"launch": {"launcher": "python", "nproc_per_node": 2}}},
     "mixing.proxy.launch.nproc_per_node: launcher 'python' runs one process"),
    ({"max_epochs": 0}, "max_epochs\\n  Input should be greater than 0"),
])
def test_a_bad_mixing_section_is_refused_naming_the_field(fields, message):
    with pytest.raises((ValidationError, ValueError), match=message):
        MixingSection(**{"prior": {"web": 0.5, "code": 0.5}, **fields})
