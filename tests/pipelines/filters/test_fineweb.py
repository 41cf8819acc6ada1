"""pipelines/filters/fineweb.py: datatrove's FineWeb verdicts and reasons (on every document of the demo's sources:
test_gopher.py)."""

import pytest
from datatrove.data import Document
from datatrove.pipeline.filters import FineWebQualityFilter

from pipelines.filters.fineweb import FineWebQuality

PROSE = "The committee met on Tuesday and agreed on the budget for next year.\n"


@pytest.mark.parametrize("text, reason", [
    (PROSE + "The vote was close, and the chair spoke at length about the schools.\n"
     "Next week the council will publish the final numbers for every district.", True),
    ("\n\n", "empty"),
    ("a line without an end\nanother one\n" * 3, "line_punct_ratio"),
    ("Short.\nTiny.\n" * 5 + PROSE, "short_line_ratio"),
    (PROSE * 8, "char_dup_ratio"),
])
def test_the_verdict_and_reason_are_datatroves(text, reason):
    ours = FineWebQuality().filter(Document(text=text, id="x"))
    assert ours == FineWebQualityFilter().filter(Document(text=text, id="x"))
    assert ours == (True if reason is True else (False, reason))
