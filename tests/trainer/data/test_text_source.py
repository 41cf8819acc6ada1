"""trainer.data.text_source: packed windows cut from one text file, indexed by the global sample index alone."""

import pytest

from tests.trainer.conftest import TOKENIZER
from trainer.data.text_source import TextSource, TextSourceConfig


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("\n\n".join(f"paragraph {i} says something about item {i % 7}." for i in range(60)))
    return path


def test_windows_are_packed_documents_with_their_positions(text):
    src = TextSource(TextSourceConfig(path=str(text), tokenizer=str(TOKENIZER), seq_len=16, top_tokens=64))
    b = src.batch([0, 1, 2])
    assert b["tokens"].shape == b["doc_ids"].shape == b["positions"].shape == (3, 17)
    assert int(b["tokens"].max()) < 64 == src.vocab_size
    row_docs, row_pos = b["doc_ids"][0], b["positions"][0]
    for t in range(1, 17):  # a position restarts exactly where a new document begins
        assert (row_pos[t] == 0) == (row_docs[t] != row_docs[t - 1]) or row_pos[t] == row_pos[t - 1] + 1


def test_the_same_index_gives_the_same_window_and_val_is_held_out(text):
    cfg = dict(path=str(text), tokenizer=str(TOKENIZER), seq_len=8, seed=3)
    a, b = TextSource(TextSourceConfig(**cfg)), TextSource(TextSourceConfig(**cfg))
    assert a.batch([5])["tokens"].equal(b.batch([5])["tokens"])
    val = TextSource(TextSourceConfig(**cfg, split="val", val_fraction=0.2))
    assert len(val.tokens) < len(a.tokens)
    with pytest.raises(ValueError, match="split"):
        TextSourceConfig(**cfg, split="test")
