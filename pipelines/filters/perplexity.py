"""Perplexity under a reference language model, CCNet's signal: text far from the reference text (menus, lists of
links, keyword spam, shuffled words) is surprising to a model trained on it.

    step = PerplexityFilter(PerplexityConfig(max_perplexity=3000.0), reference_dir=Path("reference_lm"))
    # kept and dropped documents get metadata perplexity; drops are counted as dropped_perplexity_above (above
    # max_perplexity or the band's upper percentile) and dropped_perplexity_below (under the band's lower one)

The reference model is the trainer's own Llama-style decoder (trainer/model/transformer.py), trained by
curation/reference_lm on the recipe's `reference` text with a byte-level BPE of its own (the corpus tokenizer is
trained after curation). Its folder holds what `export` below writes:

    reference_dir/model.pt        the Transformer's weights (fp32 state dict)
    reference_dir/reference.json  its ModelConfig, seq_len, the validation loss and the percentiles 0..100 of
                                  its validation paragraphs' perplexities (the band of keep_percentiles)
    reference_dir/tokenizer.json

A document's perplexity is exp(mean negative log-likelihood per token) of its first `max_tokens` tokens, the first
predicted from EOS (the trainer puts EOS between documents), cut into windows of the model's seq_len that are
scored without context from the window before (the trainer's own evaluation does the same). A document's score
depends on its own text alone, not on the documents batched beside it: every window is padded to the full seq_len
(the model is causal, so the padding after a window's tokens changes none of their logits), so the matrices of
a forward pass differ only in their row count; the score is rounded to 2 places, and the keep/drop decision is
taken on that recorded value. Measured on 192 of the demo's pages: the same unrounded scores alone, 7 or 64 at a
time or all together, on 1 and 2 threads, natively and under AVX2 emulation; so which documents a task batches
together, and so the task count, changes no output byte (tests/pipelines/filters/test_perplexity.py).
Windows of many documents are scored together, under torch.inference_mode, on CUDA when there is one, else the
CPU; the model is loaded once per process, on the first batch, and never pickled across to the executor's tasks.

torch is imported inside functions only: the asset layer imports this module (the filter steps, the reference
text's reader) and never loads torch itself (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import zipfile
from pathlib import Path

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter

from pipelines.filters.config import PerplexityConfig

MODEL_FILE = "model.pt"
REFERENCE_FILE = "reference.json"
TOKENIZER_FILE = "tokenizer.json"
EOS = "<|endoftext|>"  # the trainer's document separator, which the reference tokenizer is trained with
_BATCH_DOCUMENTS = 64  # documents tokenized and scored together
_BATCH_WINDOWS = 64  # windows of seq_len tokens in one forward pass
_CHARS_PER_TOKEN = 8  # a bound: the text tokenized for max_tokens tokens


def read_reference_text(path: Path) -> str:
    """A reference file's text: a .zip is the text of its members in name order (NLTK's corpora ship so)."""
    if path.suffix != ".zip":
        return path.read_text(encoding="utf-8", errors="replace")
    with zipfile.ZipFile(path) as archive:
        names = sorted(n for n in archive.namelist() if not n.endswith("/"))
        return "\n".join(io.TextIOWrapper(archive.open(n), encoding="utf-8", errors="replace").read() for n in names)


def reference_paragraphs(text: str, min_words: int = 4) -> list[str]:
    """The text's lines of at least min_words words: a speech's paragraph, a corpus's sentence (one a line in the
    reference files), stripped; titles and dates are left out."""
    return [line.strip() for line in text.splitlines() if len(line.split()) >= min_words]


class ReferenceModel:
    """The exported reference model: `perplexities(texts)`, batched and without gradients."""

    def __init__(self, folder: Path, *, device: str | None = None):
        import torch
        from tokenizers import Tokenizer

        from trainer.config import from_dict
        from trainer.model.config import ModelConfig
        from trainer.model.transformer import Transformer

        folder = Path(folder)
        self.info = json.loads((folder / REFERENCE_FILE).read_text())
        self.seq_len = int(self.info["seq_len"])
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = Transformer(from_dict(ModelConfig, self.info["model"], "model"))
        self.model.load_state_dict(torch.load(folder / MODEL_FILE, map_location="cpu", weights_only=True))
        self.model.to(self.device).eval()
        self.tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        self.eos = self.tokenizer.token_to_id(EOS)

    def perplexities(self, texts: list[str], max_tokens: int = 512) -> list[float | None]:
        """exp(mean NLL per token) of each text's first max_tokens tokens; None for a text without tokens."""
        # Only the head is tokenized: 8 characters a token is more than this BPE's tokens hold on average (~4 on
        # the demo's text), and a 50,000-character page tokenized whole cost more than its scoring.
        heads = [text[:max_tokens * _CHARS_PER_TOKEN] for text in texts]
        ids = [[self.eos, *e.ids[:max_tokens]] for e in self.tokenizer.encode_batch_fast(heads)]
        nll, count = self._nll(ids)
        return [math.exp(n / c) if c else None for n, c in zip(nll, count)]

    def _nll(self, docs: list[list[int]]) -> tuple[list[float], list[int]]:
        """(summed NLL, predicted tokens) per token list, its first token the context of the rest."""
        import torch
        import torch.nn.functional as F

        T = self.seq_len
        windows = [(d, doc[s:s + T + 1]) for d, doc in enumerate(docs) for s in range(0, max(len(doc) - 1, 0), T)]
        nll, count = [0.0] * len(docs), [0] * len(docs)
        width = T  # every window padded to the full width: no shape depends on which windows share a pass
        with torch.inference_mode():
            for start in range(0, len(windows), _BATCH_WINDOWS):
                chunk = windows[start:start + _BATCH_WINDOWS]
                tokens = torch.zeros(len(chunk), width, dtype=torch.long)
                targets = torch.full((len(chunk), width), -100, dtype=torch.long)
                for row, (_, w) in enumerate(chunk):
                    tokens[row, :len(w) - 1] = torch.tensor(w[:-1])
                    targets[row, :len(w) - 1] = torch.tensor(w[1:])
                logits = self.model(tokens.to(self.device)).float()
                # (B*T, V) rows: cross_entropy over a transposed (B, V, T) view was half the time on a CPU
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.to(self.device).reshape(-1),
                                       ignore_index=-100, reduction="none").view(len(chunk), width).sum(dim=1).tolist()
                for (d, w), value in zip(chunk, loss):
                    nll[d] += value
                    count[d] += len(w) - 1
        return nll, count

    def band(self, lo: float, hi: float) -> tuple[float, float]:
        """The perplexities at the lo-th and hi-th percentiles of the validation paragraphs' (interpolated)."""
        import numpy as np

        table = self.info["val_percentiles"]
        return tuple(float(np.interp(p, range(len(table)), table)) for p in (lo, hi))


_LOADED: dict[str, ReferenceModel] = {}  # one per folder and process, whatever the number of steps and tasks


def load_reference(folder: Path) -> ReferenceModel:
    key = str(Path(folder).resolve())
    if key not in _LOADED:
        _LOADED[key] = ReferenceModel(Path(folder))
    return _LOADED[key]


class PerplexityFilter(BaseFilter):
    """Scores documents under the reference model (metadata `perplexity`, 2 places) and keeps those at most
    max_perplexity and within the keep_percentiles band; other languages pass unscored."""

    name = "📉 Perplexity (reference model)"

    def __init__(self, config: PerplexityConfig, reference_dir: Path, exclusion_writer=None):
        super().__init__(exclusion_writer, batch_size=_BATCH_DOCUMENTS)
        self.config = config
        self.languages = frozenset(config.languages)
        self.reference_dir = str(reference_dir)

    def filter(self, doc: Document):
        return self.filter_batch([doc])[0]

    def filter_batch(self, batch: list[Document]) -> list[bool | tuple[bool, str]]:
        scored = [doc for doc in batch if doc.metadata.get("language", "en") in self.languages]
        if not scored:
            return [True] * len(batch)
        model = load_reference(Path(self.reference_dir))  # loaded in the task's process, not pickled across
        low, high = 0.0, math.inf
        if self.config.keep_percentiles is not None:
            low, high = model.band(*self.config.keep_percentiles)
        if self.config.max_perplexity is not None:
            high = min(high, self.config.max_perplexity)
        scores = dict(zip(map(id, scored), model.perplexities([d.text for d in scored], self.config.max_tokens)))
        verdicts: list[bool | tuple[bool, str]] = []
        for doc in batch:
            score = scores.get(id(doc))
            if score is None:
                verdicts.append(True)
                continue
            score = doc.metadata["perplexity"] = round(score, 2)  # decided on what is recorded
            verdicts.append((False, "perplexity_above") if score > high
                            else (False, "perplexity_below") if score < low else True)
        return verdicts


def export(checkpoints: Path, tokenizer: Path, val_files: list[Path], seq_len: int, out: Path) -> dict:
    """The trainer's last committed checkpoint under `checkpoints` -> out/model.pt, reference.json and
    tokenizer.json, with the validation figures (scored as the filter scores documents); returns reference.json."""
    import shutil

    import numpy as np
    import torch

    from trainer.checkpoint.store import LocalCheckpoints
    from trainer.checkpoint.weights import checkpoint_weights, model_config

    store = LocalCheckpoints(checkpoints)
    step = store.latest()
    if step is None:
        raise ValueError(f"{checkpoints}: the reference model's run committed no checkpoint")
    state, manifest = checkpoint_weights(store.path(step))
    out.mkdir(parents=True, exist_ok=True)
    torch.save({name.removeprefix("transformer."): t for name, t in state.items()}, out / MODEL_FILE)
    shutil.copyfile(tokenizer, out / TOKENIZER_FILE)
    info = {"model": model_config(manifest).model_dump(mode="json"), "seq_len": seq_len, "step": step}
    (out / REFERENCE_FILE).write_text(json.dumps(info))
    model = ReferenceModel(out)
    paragraphs = [p for f in val_files for p in reference_paragraphs(read_reference_text(f))]
    ids = [[model.eos, *e.ids] for e in model.tokenizer.encode_batch_fast(paragraphs)]
    nll, count = model._nll(ids)
    per_paragraph = [math.exp(n / c) for n, c in zip(nll, count) if c]
    loss = sum(nll) / sum(count)
    info.update(val_paragraphs=len(per_paragraph), val_tokens=sum(count), val_loss=round(loss, 4),
                val_perplexity=round(math.exp(loss), 2),
                val_percentiles=[round(float(v), 3) for v in np.percentile(per_paragraph, range(101))])
    (out / REFERENCE_FILE).write_text(json.dumps(info, indent=1))
    return info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Export the reference model a trainer run made, with its val figures")
    parser.add_argument("--checkpoints", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--val", type=Path, action="append", required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    # Launched by curation/reference_lm, the process reports through that asset's Pipes session (a session that
    # received nothing logged "did not receive any messages" on every run), as the evaluation process does.
    from trainer.reporting.pipes import PipesReporter

    reporter = PipesReporter.open()
    try:
        info = export(args.checkpoints, args.tokenizer, args.val, args.seq_len, args.out)
        if reporter:
            reporter.log(f"reference model exported: val loss {info['val_loss']}, perplexity {info['val_perplexity']}"
                         f" on {info['val_paragraphs']} paragraphs")
    except Exception as exc:
        if reporter:
            reporter.log(f"reference model export failed: {exc}")
        raise
    finally:
        if reporter:
            reporter.close()


if __name__ == "__main__":
    main()
