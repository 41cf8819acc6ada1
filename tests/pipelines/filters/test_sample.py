"""pipelines/filters/sample.py: a seeded share of the documents, chosen by id (the pipeline's run of it:
test_pipeline.py's test_sample_keeps_a_seeded_share_by_document_id_whatever_the_order)."""

from datatrove.data import Document

from pipelines.filters.config import SampleConfig
from pipelines.filters.sample import SampleFilter


def test_the_verdict_is_the_documents_ids_and_the_seeds():
    docs = [Document(text=f"text {i}", id=f"doc-{i}") for i in range(1000)]
    kept = {d.id for d in docs if SampleFilter(SampleConfig(rate=0.3, seed=1)).filter(d) is True}
    assert 0.25 < len(kept) / 1000 < 0.35
    assert kept == {d.id for d in reversed(docs) if SampleFilter(SampleConfig(rate=0.3, seed=1)).filter(d) is True}
    assert SampleFilter(SampleConfig(rate=0.3, seed=1)).filter(Document(text="other text", id="doc-999")) == \
        SampleFilter(SampleConfig(rate=0.3, seed=1)).filter(docs[999])  # the id decides, not the text
    dropped = next(d for d in docs if d.id not in kept)
    assert SampleFilter(SampleConfig(rate=0.3, seed=1)).filter(dropped) == (False, "sample")
    assert kept != {d.id for d in docs if SampleFilter(SampleConfig(rate=0.3, seed=2)).filter(d) is True}
