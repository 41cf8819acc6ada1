"""Zero-shot evaluation by log-likelihood, computed the way lm-evaluation-harness does.

    tok = Tokenizer.from_file("tokenizer.json")
    scores = zero_shot(model, tok, ["lambada", "hellaswag", "arc_easy", "piqa"], limit=500)
    # {"hellaswag": {"acc": 0.27, "acc_norm": 0.26, "n": 500, "metric": "acc_norm"}, ...}

- Multiple choice (HellaSwag, ARC, PIQA): each choice's continuation is scored by the summed log
  probability of its tokens given the context; `acc` picks the highest sum, `acc_norm` the highest
  sum per byte of the continuation (the harness's length normalisation). HellaSwag's context is
  ctx_a + " " + capitalised ctx_b with the WikiHow "[title]" markup removed, as the harness does;
  ARC and PIQA are "Question: …\\nAnswer:" followed by " choice".
- LAMBADA: accuracy that the greedy continuation is exactly the target word (every target token is
  the argmax), plus its perplexity.
- Context and continuation are encoded together and split at the context's length (the harness's
  rule, so a BPE merge across the boundary is handled the same way); long inputs keep their last
  `max_len` tokens.
The benchmark files are the ones in ../shared/data/benchmarks (field names in its README).
"""

from __future__ import annotations

import gzip
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Item:
    context: str
    continuations: list[str]
    gold: int


def _lines(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _hellaswag_clean(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _load_hellaswag(folder: Path) -> Iterator[Item]:
    for d in _lines(folder / "hellaswag_val.jsonl.gz"):
        ctx = _hellaswag_clean(d["ctx_a"] + " " + d["ctx_b"].capitalize())
        yield Item(ctx, [" " + _hellaswag_clean(e) for e in d["endings"]], int(d["label"]))


def _query_choices(filename: str) -> Callable[[Path], Iterator[Item]]:
    def load(folder: Path) -> Iterator[Item]:
        for d in _lines(folder / filename):
            question = d["query"].strip()
            if not question.startswith("Question:"):
                question = "Question: " + question
            yield Item(question + "\nAnswer:", [" " + c for c in d["choices"]], int(d["gold"]))
    return load


def _load_lambada(folder: Path) -> Iterator[Item]:
    for d in _lines(folder / "lambada_openai_test.jsonl"):
        yield Item(d["context"], [" " + d["continuation"]], 0)


TASKS: dict[str, tuple[Callable[[Path], Iterator[Item]], str]] = {  # name -> (loader, headline metric)
    "lambada": (_load_lambada, "acc"),
    "hellaswag": (_load_hellaswag, "acc_norm"),
    "arc_easy": (_query_choices("arc_easy_test.jsonl"), "acc_norm"),
    "arc_challenge": (_query_choices("arc_challenge_test.jsonl"), "acc_norm"),
    "piqa": (_query_choices("piqa_val.jsonl"), "acc_norm"),
}


def load_task(name: str, folder: str | Path, limit: int | None = None) -> list[Item]:
    if name not in TASKS:
        raise ValueError(f"unknown zero-shot task {name!r} (known: {', '.join(TASKS)})")
    items = []
    for item in TASKS[name][0](Path(folder)):
        if limit is not None and len(items) >= limit:
            break
        items.append(item)
    return items


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids): the whole string encoded once, split at the context's length."""
    whole = tokenizer.encode(context + continuation, add_special_tokens=False).ids
    n_ctx = len(tokenizer.encode(context, add_special_tokens=False).ids)
    n_ctx = min(n_ctx, len(whole) - 1)  # at least one continuation token
    return whole[:n_ctx], whole[n_ctx:]


@torch.no_grad()
def continuation_scores(model, requests: list[tuple[list[int], list[int]]], *, max_len: int,
                        batch_size: int = 16, device: torch.device | str = "cpu") -> list[tuple[float, bool]]:
    """(summed log-probability, greedy) of each continuation given its context.

    `model` maps (B, T) token ids to (B, T, V) logits (trainer.model.Transformer)."""
    out: list[tuple[float, bool]] = []
    for start in range(0, len(requests), batch_size):
        chunk = requests[start:start + batch_size]
        seqs, spans = [], []
        for ctx, cont in chunk:
            ids = (ctx + cont)[-(max_len + 1):]  # the last max_len+1 tokens: inputs are all but the last
            n_cont = min(len(cont), len(ids) - 1)
            seqs.append(ids)
            spans.append(n_cont)
        width = max(len(s) for s in seqs) - 1
        inputs = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, ids in enumerate(seqs):
            inputs[row, :len(ids) - 1] = torch.tensor(ids[:-1])  # right padding never affects earlier positions
        logprobs = F.log_softmax(model(inputs.to(device)).float(), dim=-1).cpu()
        for row, (ids, n_cont) in enumerate(zip(seqs, spans)):
            n_in = len(ids) - 1
            positions = torch.arange(n_in - n_cont, n_in)  # the logits that predict the continuation
            targets = torch.tensor(ids[-n_cont:])
            lp = logprobs[row, positions]
            total = float(lp.gather(1, targets[:, None]).sum())
            greedy = bool((lp.argmax(dim=-1) == targets).all())
            out.append((total, greedy))
    return out


def score_task(model, tokenizer, items: list[Item], *, max_len: int, batch_size: int = 16,
               device: torch.device | str = "cpu") -> dict:
    requests, owner = task_requests(tokenizer, items)
    scores = continuation_scores(model, requests, max_len=max_len, batch_size=batch_size, device=device)
    return task_result(items, requests, owner, scores)


def task_requests(tokenizer, items: list[Item]) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
    """(every choice of every item as (context ids, continuation ids), the item each belongs to)."""
    requests, owner = [], []
    for i, item in enumerate(items):
        for cont in item.continuations:
            requests.append(encode_pair(tokenizer, item.context, cont))
            owner.append(i)
    return requests, owner


def task_result(items: list[Item], requests: list[tuple[list[int], list[int]]], owner: list[int],
                scores: list[tuple[float, bool]]) -> dict:
    """The task's figures from every request's (summed log-probability, greedy)."""
    per_item: list[list[tuple[float, bool, int]]] = [[] for _ in items]
    for (total, greedy), i, (_, cont_ids) in zip(scores, owner, requests):
        per_item[i].append((total, greedy, len(cont_ids)))
    acc = acc_norm = 0
    nll = tokens = 0.0
    for item, choices in zip(items, per_item):
        if len(choices) == 1:  # LAMBADA: the target word must come out greedily
            acc += choices[0][1]
            nll -= choices[0][0]
            tokens += choices[0][2]
            continue
        lls = [c[0] for c in choices]
        per_byte = [ll / max(1, len(text.encode("utf-8"))) for ll, text in zip(lls, item.continuations)]
        acc += int(max(range(len(lls)), key=lls.__getitem__) == item.gold)
        acc_norm += int(max(range(len(per_byte)), key=per_byte.__getitem__) == item.gold)
    n = len(items)
    result = {"n": n, "acc": acc / n if n else float("nan")}
    if tokens:
        result["perplexity"] = math.exp(nll / n) if n else float("nan")  # per example, as the harness reports
    else:
        result["acc_norm"] = acc_norm / n if n else float("nan")
        result["chance"] = sum(1 / len(it.continuations) for it in items) / n if n else float("nan")
    return result


def zero_shot(model, tokenizer, tasks: list[str], folder: str | Path, *, limit: int | None = None,
              max_len: int = 2048, batch_size: int = 16, device: torch.device | str = "cpu") -> dict[str, dict]:
    results = {}
    for name in tasks:
        items = load_task(name, folder, limit)
        results[name] = {**score_task(model, tokenizer, items, max_len=max_len, batch_size=batch_size, device=device),
                         "metric": TASKS[name][1]}
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
        """{task: figures} (score_task's, with the headline metric's name) of `model` (token ids -> logits)."""
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
            results[name] = {**task_result(items, requests, owner, flat), "metric": TASKS[name][1]}
        return results


@torch.no_grad()
def canary_loss(model, tokens: torch.Tensor, *, device: torch.device | str = "cpu") -> float:
    """Mean next-token cross-entropy of a fixed canary batch (B, T+1) of token ids."""
    tokens = tokens.to(device)
    logits = model(tokens[:, :-1]).float()
    return float(F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()))


def evaluate_checkpoint(step_folder: str | Path, *, tokenizer: str | Path, benchmarks: str | Path, tasks: list[str],
                        limit: int | None, val: dict[str, str], val_sequences: int, canary: str | Path | None,
                        canary_sequences: int, batch_size: int = 8) -> dict:
    """Everything the evaluation asset reports for one checkpoint step (CPU or the first CUDA device)."""
    from tokenizers import Tokenizer

    from trainer.data import DataConfig, MixtureDataset, NoDocuments
    from trainer.model import Transformer
    from trainer.weights import checkpoint_weights, model_config

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

    results["zero_shot"] = zero_shot(model, tok, tasks, benchmarks, limit=limit, max_len=seq_len,
                                     batch_size=batch_size, device=device)
    return results


def main(argv: list[str] | None = None) -> int:
    """python -m trainer.evaluate --checkpoint STEP --tokenizer T --benchmarks DIR --out results.json ..."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m trainer.evaluate", description=main.__doc__)
    parser.add_argument("--checkpoint", required=True, help="a committed checkpoint step folder")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--benchmarks", required=True, help="the folder of benchmark files")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--limit", type=int, default=None, help="items per task")
    parser.add_argument("--val", action="append", default=[], metavar="NAME=FOLDER", help="a packed output's held-out split")
    parser.add_argument("--val-sequences", type=int, default=16)
    parser.add_argument("--canary", help="a fixed text whose loss is tracked across checkpoints")
    parser.add_argument("--canary-sequences", type=int, default=8)
    parser.add_argument("--out", required=True, help="results.json to write")
    args = parser.parse_args(argv)
    try:
        val = dict(item.split("=", 1) for item in args.val)
        results = evaluate_checkpoint(args.checkpoint, tokenizer=args.tokenizer, benchmarks=args.benchmarks,
                                      tasks=[t for t in args.tasks.split(",") if t], limit=args.limit, val=val,
                                      val_sequences=args.val_sequences, canary=args.canary,
                                      canary_sequences=args.canary_sequences)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps(results, indent=1))
    for name, r in results["zero_shot"].items():
        print(f"{name}: {r['metric']} {r.get(r['metric'], float('nan')):.3f} (n {r['n']})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
