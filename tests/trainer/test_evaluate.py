"""Zero-shot scoring by log-likelihood on the real benchmark files (../shared/data/benchmarks)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from tests.conftest import SHARED_DATA
from trainer.config import ModelConfig
from trainer.evaluate import canary_loss, continuation_scores, encode_pair, load_task, score_task, zero_shot
from trainer.model import Transformer

BENCH = SHARED_DATA / "benchmarks"
TOK = Tokenizer.from_file(str(SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json"))
VOCAB = 50304


class Bigram(torch.nn.Module):
    """logits[t] = counts of what followed token t in the texts it is given: a bigram model."""

    def __init__(self, texts: list[str]):
        super().__init__()
        self.follow: dict[int, dict[int, float]] = {}
        for text in texts:
            ids = TOK.encode(text, add_special_tokens=False).ids
            for a, b in zip(ids, ids[1:]):
                self.follow.setdefault(a, {}).setdefault(b, 0.0)
                self.follow[a][b] += 10.0

    def forward(self, tokens):
        logits = torch.full((*tokens.shape, VOCAB), -5.0)
        for (i, j), a in zip(torch.cartesian_prod(*map(torch.arange, tokens.shape)).tolist(), tokens.flatten().tolist()):
            for b, value in self.follow.get(a, {}).items():
                logits[i, j, b] += value
        return logits


def test_scores_are_the_log_probabilities_at_the_continuation_positions():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=2)).eval()
    items = load_task("arc_easy", BENCH, limit=6)
    requests = [encode_pair(TOK, it.context, c) for it in items for c in it.continuations]
    batched = continuation_scores(model, requests, max_len=512, batch_size=8)
    for (ctx, cont), (total, _) in zip(requests, batched):
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            lp = F.log_softmax(model(ids[:, :-1]).float(), dim=-1)[0]
        manual = sum(float(lp[len(ctx) - 1 + k, t]) for k, t in enumerate(cont))
        assert total == pytest.approx(manual, abs=1e-3)  # right padding in a batch changes nothing
    # The split follows the harness: the whole string encoded once, cut at the context's length.
    ctx, cont = encode_pair(TOK, "Question: What is 2+2?\nAnswer:", " four")
    assert TOK.decode(ctx + cont) == "Question: What is 2+2?\nAnswer: four" and TOK.decode(cont) == " four"


def test_accuracy_follows_the_model_preference_on_real_multiple_choice_items():
    items = load_task("arc_easy", BENCH, limit=30)
    assert len(items) == 30 and all(len(it.continuations) >= 3 for it in items)
    knows = Bigram([it.context + it.continuations[it.gold] for it in items])
    wrong = Bigram([it.context + c for it in items for i, c in enumerate(it.continuations) if i != it.gold])
    good, bad = score_task(knows, TOK, items, max_len=512, batch_size=4), score_task(wrong, TOK, items, max_len=512, batch_size=4)
    # A bigram table is a weak model, but one counted from the gold answers beats chance (~0.27) by far
    # and one counted from the wrong answers falls far below it: the scores follow the model.
    assert good["acc"] >= 0.6 and good["acc_norm"] >= 0.55
    assert bad["acc"] <= 0.15 and bad["acc_norm"] <= 0.15
    assert 0.2 < good["chance"] < 0.35  # ARC has 3-5 choices


def test_random_weights_score_near_chance_on_hellaswag():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=2)).eval()
    result = zero_shot(model, TOK, ["hellaswag"], BENCH, limit=40, max_len=128, batch_size=8)["hellaswag"]
    assert result["n"] == 40 and result["metric"] == "acc_norm" and result["chance"] == 0.25
    assert 0.1 < result["acc_norm"] < 0.45


def test_lambada_counts_only_an_exact_greedy_target_word():
    items = load_task("lambada", BENCH, limit=20)
    knows = Bigram([it.context + it.continuations[0] for it in items[:10]])
    result = score_task(knows, TOK, items, max_len=512)
    assert set(result) >= {"acc", "perplexity", "n"} and result["n"] == 20
    # The bigram table learned the first ten endings; the other ten it has never seen whole.
    firsts = score_task(knows, TOK, items[:10], max_len=512)["acc"]
    assert firsts > score_task(knows, TOK, items[10:], max_len=512)["acc"]


def test_hellaswag_items_are_cleaned_as_the_harness_does():
    items = load_task("hellaswag", BENCH, limit=300)
    assert not any("[title]" in it.context or "[header]" in it.context for it in items)
    assert all(c.startswith(" ") and len(it.continuations) == 4 for it in items for c in it.continuations)
    with pytest.raises(ValueError, match="unknown zero-shot task 'mmlu_pro'"):
        load_task("mmlu_pro", BENCH)


def test_canary_loss_is_the_mean_cross_entropy():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2)).eval()
    tokens = torch.randint(0, 64, (2, 17))
    with torch.no_grad():
        expected = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    assert canary_loss(model, tokens) == pytest.approx(float(expected), rel=1e-5)
