"""pipelines/filters/language.py: lid.176 from the local wheel, never downloaded (the pipeline's runs of language ID:
test_pipeline.py)."""

from datatrove.data import Document

from pipelines.filters.config import LanguageConfig
from pipelines.filters.language import LanguageIdFilter, lid176_path


def test_lid_model_is_the_local_wheel_file():
    path = lid176_path()
    assert path.name == "lid.176.ftz" and path.stat().st_size > 500_000


def test_a_listed_language_is_kept_with_its_score_and_another_dropped():
    step = LanguageIdFilter(LanguageConfig(languages=("en",)))
    english = Document(text="The weather was fine, so we walked along the river to the old town.", id="en")
    assert step.filter(english) is True and english.metadata["language"] == "en"
    assert english.metadata["language_score"] > 0.65
    german = Document(text="Das Wetter war schön, also gingen wir am Fluss entlang in die Altstadt.", id="de")
    assert step.filter(german) == (False, "language")
