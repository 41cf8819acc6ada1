"""Zero-shot evaluation by log-likelihood, computed as lm-evaluation-harness computes it (0.4.x, model "hf").

    tok = Tokenizer.from_file("tokenizer.json")
    scores = zero_shot(model, tok, ["lambada_openai", "hellaswag", "arc_easy", "piqa"], folder, limit=500)
    # {"hellaswag": {"acc": 0.27, "acc_norm": 0.26, "n": 500, "metric": "acc_norm", "chance": 0.25}, ...}

The reference is lm-eval itself (trainer/evaluation/harness.py runs it on an exported checkpoint); this evaluator exists for
cheap numbers inside the training loop (metrics.downstream_interval), with no Hugging Face model and no lm-eval
installed, and tests/trainer/evaluation/test_harness.py checks that it picks the choice lm-eval picks on every item.
What is lm-eval's here:
- the prompts of lm-eval's tasks (the task names are lm-eval's), rebuilt from the benchmark files of
  ../shared/data/benchmarks (their field layouts in its README; the lm-eval task YAMLs read the same files);
- a multiple-choice item is one request per choice, (context, " " + choice): lm-eval's target delimiter; Winogrande
  is lm-eval's multiple-input form, one context per option and the same continuation;
- `acc` picks the highest summed log-probability, `acc_norm` the highest per character of the choice (lm-eval's
  len(choice), without the delimiter); LAMBADA's `acc` is whether every target token is the greedy one, and its
  `perplexity` exp(-mean log-likelihood per item);
- context and continuation are tokenized by lm-eval's HFLM `_encode_pair`: trailing whitespace of the context moves
  to the continuation, the whole string is encoded once and split at the encoded context's length; no BOS (an
  exported model's tokenizer adds none, so lm-eval adds none); long inputs keep their last `max_len` + 1 tokens
  (a continuation longer than `max_len` lm-eval refuses; here its last `max_len` tokens are scored).
Ties go to the first choice, as numpy's argmax.

Beside lm-eval's figures each task reports `bpb`: the bits per byte of the correct answer, -log2 P(gold
continuation | its context) over the continuation's UTF-8 bytes, averaged over items (OLMES' and DataDecide's
continuous metric: at small scale it ranks data as larger runs' accuracy does more often than accuracy itself,
which sits near chance there). Lower is better.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from trainer.evaluation.tasks import TASKS, Item, encode_pair, load_task
from trainer.reporting.pipes import PipesReporter


@torch.no_grad()
def continuation_scores(model, requests: list[tuple[list[int], list[int]]], *, max_len: int,
                        batch_size: int = 16, device: torch.device | str = "cpu") -> list[tuple[float, bool]]:
    """(summed log-probability, greedy) of each continuation given its context.

    `model` maps (B, T) token ids to (B, T, V) logits (trainer.model.transformer.Transformer)."""
    out: list[tuple[float, bool]] = []
    for start in range(0, len(requests), batch_size):
        chunk = requests[start:start + batch_size]
        seqs, spans = [], []
        for ctx, cont in chunk:
            ids = (ctx + cont)[-(max_len + 1):]  # the last max_len+1 tokens: inputs are all but the last
            seqs.append(ids)
            spans.append(min(len(cont), len(ids) - 1))
        width = max(1, max(len(s) for s in seqs) - 1)
        inputs = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, ids in enumerate(seqs):
            inputs[row, :len(ids) - 1] = torch.tensor(ids[:-1])  # right padding never affects earlier positions
        logprobs = F.log_softmax(model(inputs.to(device)).float(), dim=-1).cpu()
        for row, (ids, n_cont) in enumerate(zip(seqs, spans)):
            if n_cont == 0:  # a continuation the context's tokens swallowed whole: lm-eval sums nothing too
                out.append((0.0, True))
                continue
            n_in = len(ids) - 1
            positions = torch.arange(n_in - n_cont, n_in)  # the logits that predict the continuation
            targets = torch.tensor(ids[-n_cont:])
            lp = logprobs[row, positions]
            total = float(lp.gather(1, targets[:, None]).sum())
            greedy = bool((lp.argmax(dim=-1) == targets).all())
            out.append((total, greedy))
    return out


def task_requests(tokenizer, items: list[Item]) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
    """(every request of every item as (context ids, continuation ids), the item each belongs to)."""
    requests, owner = [], []
    for i, item in enumerate(items):
        for context, continuation in item.requests:
            requests.append(encode_pair(tokenizer, context, continuation))
            owner.append(i)
    return requests, owner


def per_item(items: list[Item], owner: list[int], scores: list[tuple[float, bool]]) -> list[list[tuple[float, bool]]]:
    """Every request's (log-likelihood, greedy), grouped by item in request order."""
    grouped: list[list[tuple[float, bool]]] = [[] for _ in items]
    for score, i in zip(scores, owner):
        grouped[i].append(score)
    return grouped


def picks(item: Item, scores: list[tuple[float, bool]]) -> tuple[int, int]:
    """(the choice `acc` picks, the one `acc_norm` picks): the highest log-likelihood, and per character of the
    choice; the first of equals, as numpy's argmax."""
    lls = [ll for ll, _ in scores]
    norm = [ll / len(choice) for ll, choice in zip(lls, item.choices)]
    return max(range(len(lls)), key=lls.__getitem__), max(range(len(norm)), key=norm.__getitem__)


def task_result(name: str, items: list[Item], grouped: list[list[tuple[float, bool]]]) -> dict:
    """lm-eval's figures for the task from each item's request scores, with n, chance and the headline metric."""
    metrics = TASKS[name].metrics
    n = len(items)
    if not n:
        return {"n": 0, "metric": metrics[0], **{m: math.nan for m in metrics}}
    if "perplexity" in metrics:  # LAMBADA: the target word must come out greedily
        return {"n": n, "metric": metrics[0], "acc": sum(s[0][1] for s in grouped) / n,
                "perplexity": math.exp(-sum(s[0][0] for s in grouped) / n), "bpb": answer_bpb(items, grouped)}
    chosen = [picks(item, scores) for item, scores in zip(items, grouped)]
    result = {"n": n, "metric": metrics[0], "acc": sum(p == it.gold for (p, _), it in zip(chosen, items)) / n,
              "chance": sum(1 / len(it.requests) for it in items) / n, "bpb": answer_bpb(items, grouped)}
    if "acc_norm" in metrics:
        result["acc_norm"] = sum(p == it.gold for (_, p), it in zip(chosen, items)) / n
    return result


def answer_bpb(items: list[Item], grouped: list[list[tuple[float, bool]]]) -> float:
    """Mean over items of the gold request's bits per byte: -log-likelihood / ln 2 / UTF-8 bytes of its
    continuation (with lm-eval's leading space: the text the model was asked to produce)."""
    per_item = [-scores[item.gold][0] / math.log(2) / max(1, len(item.requests[item.gold][1].encode()))
                for item, scores in zip(items, grouped)]
    return sum(per_item) / len(per_item)


def score_items(model, tokenizer, items: list[Item], *, max_len: int, batch_size: int = 16,
                device: torch.device | str = "cpu") -> list[list[tuple[float, bool]]]:
    """Each item's requests scored: [[(log-likelihood, greedy), ...], ...]."""
    requests, owner = task_requests(tokenizer, items)
    scores = continuation_scores(model, requests, max_len=max_len, batch_size=batch_size, device=device)
    return per_item(items, owner, scores)


def zero_shot(model, tokenizer, tasks: list[str], folder: str | Path, *, limit: int | None = None,
              max_len: int = 2048, batch_size: int = 16, device: torch.device | str = "cpu") -> dict[str, dict]:
    results = {}
    for name in tasks:
        items = load_task(name, folder, limit)
        grouped = score_items(model, tokenizer, items, max_len=max_len, batch_size=batch_size, device=device)
        results[name] = task_result(name, items, grouped)
    return results


class Downstream:
    """Zero-shot tasks during training (metrics.downstream_interval): items loaded and encoded once, then at each
    pass every rank scores an equal share of the requests and all get every score (trainer.callbacks).

    The shares are padded to the same length, so every rank runs the same number of forward passes, as ZeRO-3
    needs (each forward gathers the partitioned weights from all ranks); every rank computes the same figures."""

    def __init__(self, tasks: list[str], folder: str | Path, tokenizer, *, limit: int, max_len: int,
                 batch_size: int = 16):
        self.max_len, self.batch_size = max_len, batch_size
        self.tasks = {}
        for name in tasks:
            items = load_task(name, folder, limit)
            self.tasks[name] = (items, *task_requests(tokenizer, items))

    @torch.no_grad()
    def run(self, model, *, rank: int, world_size: int, device: torch.device | str = "cpu") -> dict[str, dict]:
        """{task: figures} (task_result's) of `model` (token ids -> logits)."""
        import torch.distributed as torch_dist

        results = {}
        for name, (items, requests, owner) in self.tasks.items():
            share = math.ceil(len(requests) / world_size)
            mine = requests[rank * share:(rank + 1) * share]
            mine += requests[:share - len(mine)]  # padding (the last rank's share may be short), dropped below
            scores = continuation_scores(model, mine, max_len=self.max_len, batch_size=self.batch_size, device=device)
            everyone = [scores]
            if world_size > 1:
                everyone = [None] * world_size
                torch_dist.all_gather_object(everyone, scores)
            flat = [s for part in everyone for s in part][:len(requests)]
            results[name] = task_result(name, items, per_item(items, owner, flat))
        return results


@torch.no_grad()
def canary_loss(model, tokens: torch.Tensor, *, device: torch.device | str = "cpu") -> float:
    """Mean next-token cross-entropy of a fixed canary batch (B, T+1) of token ids."""
    tokens = tokens.to(device)
    logits = model(tokens[:, :-1]).float()
    return float(F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()))


def evaluate_checkpoint(step_folder: str | Path, *, tokenizer: str | Path, benchmarks: str | Path, tasks: list[str],
                        limit: int | None, val: dict[str, str], val_sequences: int, canary: str | Path | None,
                        canary_sequences: int, work: str | Path, hf_cache: str | Path | None = None,
                        batch_size: int = 8) -> dict:
    """Everything the evaluation asset reports for one checkpoint step (CPU or the first CUDA device): per-domain
    validation loss and the canary's loss computed here, zero-shot scores by lm-evaluation-harness on the checkpoint
    exported to `work` (trainer/evaluation/harness.py)."""
    from tokenizers import Tokenizer

    from trainer.data.mixture import DataConfig, MixtureDataset, NoDocuments
    from trainer.model.transformer import Transformer
    from trainer.checkpoint.weights import checkpoint_weights, model_config

    state, manifest = checkpoint_weights(step_folder)
    cfg = model_config(manifest)
    seq_len = manifest["config"]["batch"]["seq_len"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Transformer(cfg)
    model.load_state_dict({k.removeprefix("transformer."): v for k, v in state.items()})
    model = model.to(device).eval()
    tok = Tokenizer.from_file(str(tokenizer))
    results: dict = {"step": manifest["step"], "tokens": manifest.get("tokens"), "seq_len": seq_len}

    with torch.no_grad():
        per_domain, left_out = {}, []
        for name, folder in sorted(val.items()):
            try:
                source = MixtureDataset(DataConfig(shards={name: folder}, weights={name: 1.0}, seq_len=seq_len,
                                                   seed=0, split="val", shuffle=False))
            except NoDocuments:  # a small source may hold out no document
                left_out.append(name)
                continue
            total, n = 0.0, 0
            for start in range(0, val_sequences, batch_size):
                batch = source.batch(list(range(start, min(start + batch_size, val_sequences))))
                t = {k: torch.as_tensor(batch[k]).to(device) for k in ("tokens", "doc_ids", "positions")}
                logits = model(t["tokens"][:, :-1], doc_ids=t["doc_ids"][:, :-1], positions=t["positions"][:, :-1])
                ce = F.cross_entropy(logits.float().flatten(0, 1), t["tokens"][:, 1:].flatten())
                total += float(ce) * len(batch["indices"])
                n += len(batch["indices"])
            per_domain[name] = total / n
        results["val_loss"], results["val_left_out"] = per_domain, left_out

        if canary is not None:
            ids = tok.encode(Path(canary).read_text(encoding="utf-8"), add_special_tokens=False).ids
            width = seq_len + 1
            rows = [ids[i * width:(i + 1) * width] for i in range(min(canary_sequences, len(ids) // width))]
            if not rows:
                raise ValueError(f"{canary}: shorter than one sequence of {width} tokens")
            results["canary_loss"] = canary_loss(model, torch.tensor(rows), device=device)
    del model, state

    if tasks:
        from trainer.evaluation.harness import lm_eval_checkpoint

        results["lm_eval"] = lm_eval_checkpoint(step_folder, tokenizer=tokenizer, benchmarks=benchmarks, tasks=tasks,
                                                limit=limit, work=work, hf_cache=hf_cache)
    return results


def main(argv: list[str] | None = None) -> int:
    """python -m trainer.evaluation.evaluate --checkpoint STEP --tokenizer T --benchmarks DIR --out results.json ..."""
    import argparse
    import sys
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m trainer.evaluation.evaluate", description=main.__doc__)
    parser.add_argument("--checkpoint", required=True, help="a committed checkpoint step folder")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--benchmarks", required=True, help="the folder of benchmark files")
    parser.add_argument("--tasks", default=",".join(TASKS), help="lm-eval tasks (none: no zero-shot scores)")
    parser.add_argument("--limit", type=int, default=None, help="items per task")
    parser.add_argument("--val", action="append", default=[], metavar="NAME=FOLDER", help="a packed output's held-out split")
    parser.add_argument("--val-sequences", type=int, default=16)
    parser.add_argument("--canary", help="a fixed text whose loss is tracked across checkpoints")
    parser.add_argument("--canary-sequences", type=int, default=8)
    parser.add_argument("--work", help="where the exported model and lm-eval's task files go (default: a temp folder)")
    parser.add_argument("--hf-cache", help="the Hugging Face datasets cache (default: in --work)")
    parser.add_argument("--out", required=True, help="results.json to write")
    args = parser.parse_args(argv)
    # Launched by an evaluation asset, the process reports through that asset's Pipes session: its summary and any
    # error in the Dagster run's log (a session nobody opened logged "did not receive any messages" on every run).
    reporter = PipesReporter.open()
    try:
        val = dict(item.split("=", 1) for item in args.val)
        with tempfile.TemporaryDirectory(prefix="pretrain-evaluate-") as tmp:
            results = evaluate_checkpoint(args.checkpoint, tokenizer=args.tokenizer, benchmarks=args.benchmarks,
                                          tasks=[t for t in args.tasks.split(",") if t], limit=args.limit, val=val,
                                          val_sequences=args.val_sequences, canary=args.canary,
                                          canary_sequences=args.canary_sequences, work=args.work or tmp,
                                          hf_cache=args.hf_cache)
        Path(args.out).write_text(json.dumps(results, indent=1))
        if reporter:
            reporter.log(summary(results))
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        if reporter:
            reporter.log(f"evaluation failed: {exc}")
        return 2
    finally:
        if reporter:
            reporter.close()
    if "lm_eval" in results:
        print(results["lm_eval"]["table"], flush=True)
    return 0


def summary(results: dict) -> str:
    """One line of what an evaluation measured: 'step 17: val_loss c4 7.5060 | code 7.5008; canary_loss 7.1234'."""
    line = f"step {results['step']}: val_loss " + " | ".join(
        f"{name} {loss:.4f}" for name, loss in sorted(results.get("val_loss", {}).items()))
    if "canary_loss" in results:
        line += f"; canary_loss {results['canary_loss']:.4f}"
    return line


if __name__ == "__main__":
    raise SystemExit(main())
