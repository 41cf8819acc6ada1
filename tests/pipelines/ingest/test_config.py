import pydantic
import pytest

from pipelines.ingest.config import ReaderConfig


def test_reader_config_normalizes_and_validates():
    assert ReaderConfig(text_fields="question", include=["*.py", "*.md"]).text_fields == ("question",)
    assert ReaderConfig(include=["*.py", "*.md"]).include == ("*.py", "*.md")
    for bad in ({"text_fields": ()}, {"include": ("",)}, {"min_text_chars": -1}, {"max_document_bytes": 0},
                {"max_bad_fraction": 1.5}, {"docs_per_shard": 0}):
        with pytest.raises(ValueError, match=f"reader.{next(iter(bad))}"):
            ReaderConfig(**bad)
    with pytest.raises(TypeError, match="workers"):  # the executor's setting now, not the reader's
        ReaderConfig(workers=2)


def test_a_misspelt_setting_in_a_recipe_is_refused_not_ignored():
    with pytest.raises(pydantic.ValidationError, match="text_field"):
        pydantic.TypeAdapter(ReaderConfig).validate_python({"text_field": "question"})
