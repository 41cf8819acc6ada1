import pydantic
import pytest

from pipelines.dedup.config import DedupConfig


def test_the_default_banding_keeps_fineweb_s_112_permutations():
    assert DedupConfig().permutations == 112


@pytest.mark.parametrize("bad, field", [
    ({"bands": 0}, "dedup.bands"),
    ({"rows": 0}, "dedup.rows"),
    ({"verify_threshold": 1.5}, "dedup.verify_threshold"),
    ({"rule": "greedy"}, "dedup.rule must be one of transitive, sequential"),
])
def test_a_bad_setting_is_refused_by_its_name(bad, field):
    with pytest.raises(ValueError, match=field):
        DedupConfig(**bad)


def test_a_misspelt_setting_in_a_recipe_is_refused_not_ignored():
    with pytest.raises(pydantic.ValidationError, match="band"):
        pydantic.TypeAdapter(DedupConfig).validate_python({"band": 8})
