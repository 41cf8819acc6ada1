"""Packed outputs of real text for the unit tests of the assets that count a source's tokens before they launch
(the training stages, the sweep: assets/mixing/budget.py): each source a different stretch of Shakespeare
(../shared/data/books/tinyshakespeare.txt) in documents of ~3,000 characters (~800 GPT-2 tokens, longer than a
long-context stage's 256), packed by the packing code and committed as the packed asset commits its output, with
a tokenizer output beside them. Same return value as tests/assets/training/test_inputs.py `packed`."""

from __future__ import annotations

from dagster import AssetKey, AssetMaterialization

from assets.core.upstream import Output
from pipelines.tokenization.packed_format import build_index, write_index
from pipelines.tokenization.config import PackingConfig, TokenizerConfig
from pipelines.tokenization.tokenizer import adopt_tokenizer, pack_documents
from storage.manifest import commit_folder
from tests.assets.training.test_inputs import committed
from tests.conftest import SHARED_DATA

DOC_CHARS = 3000
EOS = 50256  # GPT-2's <|endoftext|>


def real_packed(instance, store, tmp_path, chars: dict[str, int], tokenizer_sha="t" * 64):
    """({source: its packed Output}, the tokenizer Output): source i packs `chars[source]` characters of the text,
    after those of the sources before it."""
    text = (SHARED_DATA / "books" / "tinyshakespeare.txt").read_text()
    assert sum(chars.values()) <= len(text), "more text asked for than the file holds"
    tokenizer = adopt_tokenizer(SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json", TokenizerConfig())
    outs, start = {}, 0
    for name, size in chars.items():
        part = text[start:start + size]
        start += size
        docs = [{"id": f"{name}/{i}", "text": part[i:i + DOC_CHARS]} for i in range(0, len(part), DOC_CHARS)]
        work = tmp_path / "packing" / name
        pack_documents(docs, tokenizer, eos_id=EOS, out_dir=work, config=PackingConfig(val_fraction=0.05))
        index = build_index(work, ["part-00000"], dtype="uint16", eos_id=EOS,
                            vocab_size=tokenizer.get_vocab_size(with_added_tokens=True))
        write_index(work, index)
        key = AssetKey(["tokenization", name, "packed"])
        prefix = f"tokenization/{name}/packed/v1"
        manifest = commit_folder(store, prefix, work, {"asset": key.to_user_string(), "code_version": "packed:v1:x",
                                                       "run_id": "run-v1", "upstream": {}, "packing": index})
        instance.report_runless_asset_event(AssetMaterialization(
            asset_key=key, metadata={"prefix": prefix}, tags={"dagster/data_version": manifest["data_version"]}))
        outs[name] = Output(key, prefix, manifest)
    tok = committed(instance, store, tmp_path, AssetKey(["tokenization", "tokenizer"]), {"tokenizer.json": "{}"},
                    {"tokenizer": {"sha256": tokenizer_sha}})
    return outs, tok
