import pydantic
import pytest

from pipelines.tokenization.config import PackingConfig, TokenizerConfig


@pytest.mark.parametrize("make, field", [
    (lambda: PackingConfig(val_fraction=1.0), "packing.val_fraction"),
    (lambda: PackingConfig(batch_documents=0), "packing.batch_documents"),
    (lambda: TokenizerConfig(eos="<x>", pad="<x>"), "tokenizer.eos and tokenizer.pad"),
    (lambda: TokenizerConfig(vocab_size=100), "tokenizer.vocab_size must be >= 258"),
    (lambda: TokenizerConfig(min_frequency=0), "tokenizer.min_frequency"),
    (lambda: TokenizerConfig(sample_bytes=0), "tokenizer.sample_bytes"),
])
def test_a_bad_setting_is_refused_by_its_section_and_name(make, field):
    with pytest.raises(ValueError, match=field):
        make()


@pytest.mark.parametrize("config, section", [(TokenizerConfig, {"vocab": 4096}), (PackingConfig, {"val_frac": 0.1})])
def test_a_misspelt_setting_in_a_recipe_is_refused_not_ignored(config, section):
    with pytest.raises(pydantic.ValidationError, match=next(iter(section))):
        pydantic.TypeAdapter(config).validate_python(section)
