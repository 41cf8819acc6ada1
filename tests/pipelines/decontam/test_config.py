import pydantic
import pytest

from pipelines.decontam.config import DecontamConfig


def test_one_benchmark_path_is_taken_as_a_list_of_one():
    assert DecontamConfig(benchmarks="bench/gsm8k.jsonl").benchmarks == ("bench/gsm8k.jsonl",)


@pytest.mark.parametrize("bad, field", [
    ({"action": "hide"}, "decontamination.action"),
    ({"ngram": 0}, "decontamination.ngram"),
    ({"min_letter_words": 1.5}, "decontamination.min_letter_words"),
    ({"benchmarks": ["ok.jsonl", ""]}, "decontamination.benchmarks"),
])
def test_a_bad_setting_is_refused_by_its_name(bad, field):
    with pytest.raises(ValueError, match=field):
        DecontamConfig(**bad)


def test_a_misspelt_setting_in_a_recipe_is_refused_not_ignored():
    with pytest.raises(pydantic.ValidationError, match="ngrams"):
        pydantic.TypeAdapter(DecontamConfig).validate_python({"ngrams": 8})
