"""Benchmark items as the texts a web page would contain, each with the item's id, for the n-gram index.

    for item_id, texts in benchmark_items(Path("benchmarks/mmlu_test.jsonl.gz")):
        ...   # ("line=1", [(question, choice A), ..., (question, A, B, C, D), (question, "A.", A, "B.", B, ...)])

A benchmark is named after its file (`benchmark_name`: mmlu_test.jsonl.gz -> mmlu_test). An item's id is the
file's own id field where the layout has one (HumanEval's `task_id`, HellaSwag's `ind`: "task_id=HumanEval/5",
"ind=24"), else its 1-based line number in the file ("line=1234"), so a report line leads back to the item.

Multiple-choice items (MMLU, HellaSwag, ARC, PIQA, OBQA, ...) give the question with each choice (one by one, as
a page that quotes the answer has it) and the question followed by all choices together, twice: plain (choices
each on its own line) and lettered ("A. ... B. ..."; "(A)" and "A)" normalize to the same words), so a pasted span
that runs across several choices is found too.
"""

from __future__ import annotations

import gzip
import string
from pathlib import Path
from typing import Callable, Iterator

import orjson

ID_FIELDS = ("id", "task_id", "ind", "idx")  # the first one an item has is its id; none: its line number


Text = tuple[str, ...]  # a text as its pieces, joined by spaces: the index normalizes each piece of an item once


def _join(*parts) -> Text:
    return tuple(str(p) for p in parts if p)


def _choices(question: str, choices: list) -> list[Text]:
    """The question with each choice, then with all of them: plain, and lettered as a page lists them."""
    one_by_one = [_join(question, c) for c in choices]
    plain = _join(question, *choices)
    lettered = _join(question, *(p for letter, c in zip(string.ascii_uppercase, choices) for p in (f"{letter}.", c)))
    return one_by_one + [plain, lettered]


# Benchmark layouts (../shared/data/README.md), recognized by their fields: item -> the texts to index.
ITEM_TEXTS: list[tuple[frozenset, Callable[[dict], list[Text]]]] = [
    (frozenset({"ctx", "endings"}), lambda r: _choices(r["ctx"], r["endings"])),  # HellaSwag
    (frozenset({"context_options", "continuation"}), lambda r: [_join(o, r["continuation"]) for o in r["context_options"]]),  # Winogrande
    (frozenset({"query", "choices"}), lambda r: _choices(r["query"], r["choices"])),  # ARC, PIQA, OBQA, SIQA, CSQA, BoolQ
    (frozenset({"question", "choices"}), lambda r: _choices(r["question"], r["choices"])),  # MMLU
    (frozenset({"prompt", "canonical_solution"}), lambda r: [(r["prompt"] + r["canonical_solution"],)]),  # HumanEval
    (frozenset({"context", "continuation"}), lambda r: [_join(r["context"], r["continuation"])]),  # LAMBADA
    (frozenset({"question", "answer"}), lambda r: [_join(r["question"], r["answer"])]),  # GSM8K
    (frozenset({"context", "answer"}), lambda r: [_join(r["context"], r.get("chain_of_thought"), r["answer"])]),  # MATH
]


def benchmark_name(path: Path) -> str:
    name = Path(path).name
    for suffix in (".gz", ".jsonl", ".json", ".txt"):
        name = name.removesuffix(suffix)
    return name


def item_id(record: dict, line: int) -> str:
    """'task_id=HumanEval/5' from the item's own id field, else 'line=<its 1-based line in the file>'."""
    for name in ID_FIELDS:
        if record.get(name) is not None:
            return f"{name}={record[name]}"
    return f"line={line}"


def benchmark_items(path: Path) -> Iterator[tuple[str, list[Text]]]:
    """(item id, the item's texts to index) of one benchmark file, in file order. Plain text (.txt): one item
    per non-blank line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"decontamination: benchmark file {path} does not exist")
    opener = gzip.open if path.name.endswith(".gz") else open
    plain = path.name.removesuffix(".gz").endswith(".txt")
    with opener(path, "rb") as f:
        if plain:
            for number, line in enumerate(f, 1):
                if line.strip():
                    yield f"line={number}", [(line.decode("utf-8", errors="replace"),)]
            return
        extract = None
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"decontamination: {path} line {number} is not JSON: {exc}") from None
            if extract is None:
                extract = next((fn for keys, fn in ITEM_TEXTS if keys <= record.keys()), None)
                if extract is None:
                    raise ValueError(
                        f"decontamination: {path}: unknown benchmark layout, fields {sorted(record)}; known layouts "
                        f"have fields {[sorted(keys) for keys, _ in ITEM_TEXTS]}"
                    )
            yield item_id(record, number), extract(record)


def benchmark_texts(path: Path) -> Iterator[str]:
    """Every text of one benchmark file to index, items in file order."""
    for _, texts in benchmark_items(path):
        yield from (" ".join(text) for text in texts)
