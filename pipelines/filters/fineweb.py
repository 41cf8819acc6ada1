"""FineWeb's quality rules: datatrove's FineWebQualityFilter, its settings, verdicts and reasons, on the words
shared with the other steps (words.py); tests/pipelines/filters/test_gopher.py compares both on the demo's
documents."""

from __future__ import annotations

from datatrove.data import Document
from datatrove.pipeline.filters import FineWebQualityFilter
from datatrove.pipeline.filters.gopher_repetition_filter import find_duplicates

from pipelines.filters.words import view

class FineWebQuality(FineWebQualityFilter):
    """datatrove's FineWebQualityFilter, its verdicts, on shared words."""

    name = "🍷 FineWeb quality (shared words)"

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        text = doc.text
        lines = [line for line in text.split("\n") if line.strip() != ""]
        if len(lines) == 0:
            return False, "empty"
        ratio = sum(1 for line in lines if line.endswith(self.stop_chars)) / len(lines)
        if ratio < self.line_punct_thr and not (ratio == 0 and self.line_punct_exclude_zero):
            return False, "line_punct_ratio"
        ratio = sum(1 for line in lines if len(line) <= self.short_line_length) / len(lines)
        if ratio > self.short_line_threshold:
            return False, "short_line_ratio"
        if find_duplicates(lines)[1] / len(text.replace("\n", "")) > self.char_duplicates_ratio:
            return False, "char_dup_ratio"
        if text.count("\n") / len(view(text).words) > self.new_line_ratio:
            return False, "list_ratio"
        return True
