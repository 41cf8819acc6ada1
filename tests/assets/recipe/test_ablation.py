"""assets/recipe/ablation.py: the recipe's `ablation` section (what it needs from the rest of the recipe:
tests/assets/test_recipe.py)."""

import pytest
from pydantic import ValidationError

from assets.recipe.ablation import AblationSection, ThresholdSweep


def test_a_sweep_names_a_filter_step_and_one_of_its_fields():
    assert ThresholdSweep(setting="quality_model.threshold", values=[0.3, 0.5]).values == [0.3, 0.5]
    with pytest.raises(ValidationError, match="give a filter step and one of its fields"):
        ThresholdSweep(setting="threshold", values=[0.3])
    with pytest.raises(ValidationError, match="values"):
        ThresholdSweep(setting="quality_model.threshold", values=[])


def test_the_defaults_and_a_bad_proxy_launch():
    section = AblationSection(sources=["web"])
    assert (section.tokens, section.repeats, section.leave_one_out, section.sweep) == (65536, 1, False, None)
    with pytest.raises(ValidationError, match="ablation.proxy.launch.cores: not a launch field"):
        AblationSection(sources=["web"], proxy={"launch": {"cores": 2}})
    with pytest.raises(ValidationError, match="sources"):
        AblationSection(sources=[])
