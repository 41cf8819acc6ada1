"""Zero-shot scoring by log-likelihood on the real benchmark files (../shared/data/benchmarks)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from tests.conftest import SHARED_DATA
from trainer.model.config import ModelConfig
from trainer.evaluation.evaluate import canary_loss, continuation_scores, score_items, task_result, zero_shot
from trainer.evaluation.tasks import encode_pair, load_task
from trainer.model.transformer import Transformer

BENCH = SHARED_DATA / "benchmarks"
TOK = Tokenizer.from_file(str(SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json"))
VOCAB = 50304


def score_task(name, model, items, **options) -> dict:
    return task_result(name, items, score_items(model, TOK, items, **options))


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


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_scores_are_the_log_probabilities_at_the_continuation_positions():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=2)).eval()
    items = load_task("arc_easy", BENCH, limit=6)
    requests = [encode_pair(TOK, ctx, cont) for it in items for ctx, cont in it.requests]
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
    # A context's trailing whitespace goes to the continuation (lm-eval's _encode_pair): " four" stays one token.
    assert encode_pair(TOK, "Answer: ", "four") == encode_pair(TOK, "Answer:", " four")


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_accuracy_follows_the_model_preference_on_real_multiple_choice_items():
    items = load_task("arc_easy", BENCH, limit=30)
    assert len(items) == 30 and all(len(it.requests) >= 3 for it in items)
    knows = Bigram(["".join(it.requests[it.gold]) for it in items])
    wrong = Bigram(["".join(r) for it in items for i, r in enumerate(it.requests) if i != it.gold])
    good = score_task("arc_easy", knows, items, max_len=512, batch_size=4)
    bad = score_task("arc_easy", wrong, items, max_len=512, batch_size=4)
    # A bigram table is a weak model, but one counted from the gold answers beats chance (~0.27) by far
    # and one counted from the wrong answers falls far below it: the scores follow the model.
    assert good["acc"] >= 0.6 and good["acc_norm"] >= 0.55
    assert bad["acc"] <= 0.15 and bad["acc_norm"] <= 0.15
    assert 0.2 < good["chance"] < 0.35  # ARC has 3-5 choices
    # Bits per byte of the gold answer: lower for the model that learned the gold answers; by hand, each gold
    # request scored alone, -log2 P over the UTF-8 bytes of " " + the answer.
    assert good["bpb"] < bad["bpb"]
    by_hand = []
    for item in items:
        context, continuation = item.requests[item.gold]
        [(ll, _)] = continuation_scores(knows, [encode_pair(TOK, context, continuation)], max_len=512)
        by_hand.append(-ll / math.log(2) / len(continuation.encode()))
    assert good["bpb"] == pytest.approx(sum(by_hand) / len(by_hand))


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_random_weights_score_near_chance_on_hellaswag():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=2)).eval()
    result = zero_shot(model, TOK, ["hellaswag"], BENCH, limit=40, max_len=128, batch_size=8)["hellaswag"]
    assert result["n"] == 40 and result["metric"] == "acc_norm" and result["chance"] == 0.25
    assert 0.1 < result["acc_norm"] < 0.45


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_lambada_counts_only_an_exact_greedy_target_word():
    items = load_task("lambada_openai", BENCH, limit=20)
    knows = Bigram(["".join(it.requests[0]) for it in items[:10]])
    result = score_task("lambada_openai", knows, items, max_len=512)
    assert set(result) >= {"acc", "perplexity", "n"} and result["n"] == 20
    # The bigram table learned the first ten endings; the other ten it has never seen whole.
    firsts = score_task("lambada_openai", knows, items[:10], max_len=512)["acc"]
    assert firsts > score_task("lambada_openai", knows, items[10:], max_len=512)["acc"]


def test_canary_loss_is_the_mean_cross_entropy():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2)).eval()
    tokens = torch.randint(0, 64, (2, 17))
    with torch.no_grad():
        expected = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    assert canary_loss(model, tokens) == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_a_checkpoint_is_evaluated_by_the_module_entry_point(tmp_path):
    """Train a few steps on real packed math, checkpoint, then `python -m trainer.evaluation.evaluate`'s main()."""
    import json
    import os

    from pipelines.tokenization.config import PackingConfig, TokenizerConfig
    from pipelines.tokenization.tokenizer import adopt_tokenizer, pack_documents
    from storage.manifest import commit_folder
    from storage.factory import open_store
    from trainer.config import RunConfig, from_dict
    from trainer.evaluation.evaluate import main
    from trainer.train import Trainer

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    lines = (SHARED_DATA / "math" / "gsm8k_train.jsonl").read_text().splitlines()[:400]
    docs = [{"id": f"m{i}", "text": f"{d['question']}\n\n{d['answer']}"} for i, d in enumerate(map(json.loads, lines))]
    tokenizer = adopt_tokenizer(SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json", TokenizerConfig())
    stats = pack_documents(docs, tokenizer, eos_id=50256, out_dir=tmp_path / "work",
                           config=PackingConfig(val_fraction=0.1))
    commit_folder(open_store(tmp_path / "store"), "math", tmp_path / "work",
                  {"asset": "tokenization/math/packed", "packing": stats.manifest_section()})
    shards = {"math": str(tmp_path / "store" / "math")}
    cfg = from_dict(RunConfig, {
        "data": {"shards": shards}, "train_tokens": 4 * 8 * 64, "output_dir": str(tmp_path / "out"),
        "model": {"vocab_size": VOCAB, "d_model": 32, "n_layers": 1, "n_heads": 2},
        "batch": {"global_batch": 8, "micro_batch": 8, "seq_len": 64},
        "metrics": {"log_interval": 2, "eval_batches": 1, "tensorboard": False}})
    summary = Trainer(cfg).fit()
    out = tmp_path / "results.json"
    assert main(["--checkpoint", str(tmp_path / "out" / "checkpoints" / "step-00000004"),
                 "--tokenizer", str(SHARED_DATA / "tokenizers" / "gpt2" / "tokenizer.json"),
                 "--benchmarks", str(BENCH), "--tasks", "arc_easy,lambada_openai", "--limit", "6", "--val-sequences", "8",
                 "--val", f"math={shards['math']}", "--canary", str(BENCH / "wikitext-2-test.txt"),
                 "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["step"] == 4 and results["seq_len"] == 64
    # The trainer's own held-out loss and the evaluator's come from the same model, data and split.
    assert results["val_loss"]["math"] == pytest.approx(summary["val_loss"]["math"], abs=0.05)
    assert 0 < results["canary_loss"] < 12
    # Zero-shot scores are lm-eval's, on the checkpoint exported to Hugging Face format: every metric with its stderr.
    lm_eval = results["lm_eval"]
    assert lm_eval["n-samples"]["arc_easy"]["effective"] == 6 and lm_eval["n-samples"]["lambada_openai"]["effective"] == 6
    assert {"acc,none", "acc_stderr,none", "acc_norm,none", "acc_norm_stderr,none"} <= set(lm_eval["results"]["arc_easy"])
    assert {"perplexity,none", "perplexity_stderr,none"} <= set(lm_eval["results"]["lambada_openai"])
    assert lm_eval["headline"] == {"arc_easy": "acc_norm", "lambada_openai": "acc"} and "arc_easy" in lm_eval["table"]
    assert main(["--checkpoint", str(tmp_path / "nothing" / "step-00000001"), "--tokenizer", "x",
                 "--benchmarks", str(BENCH), "--out", str(out)]) == 2
