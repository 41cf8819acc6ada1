"""The zero-shot tasks both evaluators read: each task's benchmark file and how one of its lines becomes the item
lm-evaluation-harness builds (0.4.x prompts, choices, gold), and lm-eval's HFLM split of a request into context and
continuation tokens. trainer.evaluation.evaluate scores the items inside training; trainer.evaluation.harness
writes lm-eval's task YAMLs over the same files and checks that its inputs fit; both take the tasks from here.

    items = load_task("hellaswag", "../shared/data/benchmarks", limit=100)
    context_ids, continuation_ids = encode_pair(tokenizer, items[0].requests[0][0], items[0].requests[0][1])
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator


@dataclass(frozen=True)
class Item:
    """One benchmark item as lm-eval's task builds it: a (context, continuation) request per choice (one for
    LAMBADA), the choice texts lm-eval's acc_norm divides by, and the gold choice."""

    requests: list[tuple[str, str]]
    choices: list[str]
    gold: int


@dataclass(frozen=True)
class Task:
    file: str  # in the benchmark folder
    item: Callable[[dict], Item]  # one line of the file -> the item lm-eval's task makes of it
    metrics: tuple[str, ...]  # what lm-eval's task reports, the headline first


def _choices(context: str, choices: list[str], gold) -> Item:
    return Item([(context, " " + c) for c in choices], list(choices), int(gold))


def _hellaswag_preprocess(text: str) -> str:
    # lm_eval/tasks/hellaswag/utils.py preprocess, to the character (the WikiHow "[title]" markup).
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def _hellaswag(d: dict) -> Item:
    # lm-eval's process_docs: the activity label first, then ctx_a and the capitalised ctx_b.
    ctx = d["ctx_a"] + " " + d["ctx_b"].capitalize()
    query = _hellaswag_preprocess(d["activity_label"] + ": " + ctx)
    return _choices(query, [_hellaswag_preprocess(e) for e in d["endings"]], d["label"])


def _arc(d: dict) -> Item:
    return _choices(d["query"] + "\nAnswer:", d["choices"], d["gold"])  # query is "Question: {question}"


def _piqa(d: dict) -> Item:
    return _choices(d["query"] + "Answer:", d["choices"], d["gold"])  # query is "Question: {goal}\n"


def _boolq(d: dict) -> Item:
    # The file's query is "Passage: {passage}\nQuestion: {question}?"; lm-eval's prompt has no "Passage: ".
    query = d["query"]
    if not query.startswith("Passage: "):
        raise KeyError("query (starting with 'Passage: ')")
    return _choices(query.removeprefix("Passage: ") + "\nAnswer:", d["choices"], d["gold"])


def _winogrande(d: dict) -> Item:
    # lm-eval's multiple-input form: the sentence up to the blank with each option is a context, the rest after it
    # the one continuation; acc_norm would divide by the options, as lm-eval's (it reports only acc).
    options = list(d["context_options"])
    return Item([(o, " " + d["continuation"]) for o in options], options, int(d["gold"]))


def _mmlu(d: dict) -> Item:
    # lm-eval's mmlu default template and each subject's description, zero-shot.
    subject = " ".join(d["subject"].split("_"))
    c = d["choices"]
    context = (f"The following are multiple choice questions (with answers) about {subject}.\n\n"
               f"{d['question'].strip()}\nA. {c[0]}\nB. {c[1]}\nC. {c[2]}\nD. {c[3]}\nAnswer:")
    return _choices(context, ["A", "B", "C", "D"], d["answer"])


def _lambada(d: dict) -> Item:
    return Item([(d["context"], " " + d["continuation"])], [], 0)


TASKS: dict[str, Task] = {
    "lambada_openai": Task("lambada_openai_test.jsonl", _lambada, ("acc", "perplexity")),
    "hellaswag": Task("hellaswag_val.jsonl.gz", _hellaswag, ("acc_norm", "acc")),
    "arc_easy": Task("arc_easy_test.jsonl", _arc, ("acc_norm", "acc")),
    "arc_challenge": Task("arc_challenge_test.jsonl", _arc, ("acc_norm", "acc")),
    "piqa": Task("piqa_val.jsonl", _piqa, ("acc_norm", "acc")),
    "winogrande": Task("winogrande_dev.jsonl", _winogrande, ("acc",)),
    "boolq": Task("boolq_val.jsonl", _boolq, ("acc",)),
    "mmlu": Task("mmlu_test.jsonl.gz", _mmlu, ("acc",)),
}


def _lines(path: Path) -> Iterator[tuple[int, dict]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                yield number, json.loads(line)


def load_task(name: str, folder: str | Path, limit: int | None = None) -> list[Item]:
    """The first `limit` items of the task's file (lm-eval's --limit takes the first ones too)."""
    if name not in TASKS:
        raise ValueError(f"unknown zero-shot task {name!r} (known: {', '.join(TASKS)})")
    task = TASKS[name]
    path = Path(folder) / task.file
    if not path.exists():
        raise ValueError(f"{name}: benchmark file {path} not found")
    items = []
    for number, d in _lines(path):
        if limit is not None and len(items) >= limit:
            break
        try:
            items.append(task.item(d))
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"{path}: line {number}: not the {name} layout (field {exc})") from None
    return items


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval's HFLM._encode_pair makes them: the context's trailing whitespace
    moved to the continuation, the whole string encoded once and cut at the encoded context's length."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = tokenizer.encode(context + continuation, add_special_tokens=False).ids
    n_ctx = len(tokenizer.encode(context, add_special_tokens=False).ids)
    return whole[:n_ctx], whole[n_ctx:]
