"""pipelines/decontam/items.py on the real benchmark files: item ids (the file's own id field, else the line
number) and the texts of multiple-choice items (one by one, and all choices together)."""

import gzip
import json

from pipelines.decontam.items import benchmark_items, benchmark_name, benchmark_texts
from tests.conftest import SHARED_DATA

BENCH = SHARED_DATA / "benchmarks"


def first_items(name: str, n: int = 3) -> list[tuple[str, list[tuple[str, ...]]]]:
    found = []
    for item in benchmark_items(BENCH / name):
        found.append(item)
        if len(found) == n:
            return found


def test_item_ids_are_the_files_own_id_else_the_line_number():
    assert [i for i, _ in first_items("HumanEval.jsonl.gz")] == ["task_id=HumanEval/0", "task_id=HumanEval/1", "task_id=HumanEval/2"]
    hellaswag = [json.loads(line)["ind"] for line in gzip.open(BENCH / "hellaswag_val.jsonl.gz").readlines()[:3]]
    assert [i for i, _ in first_items("hellaswag_val.jsonl.gz")] == [f"ind={n}" for n in hellaswag]
    assert [i for i, _ in first_items("mmlu_test.jsonl.gz")] == ["line=1", "line=2", "line=3"]
    assert [i for i, _ in first_items("wikitext-2-test.txt")][0].startswith("line=")  # blank lines are skipped, not renumbered
    assert benchmark_name(BENCH / "mmlu_test.jsonl.gz") == "mmlu_test"


def test_multiple_choice_items_give_each_choice_and_all_choices_together():
    item = json.loads(gzip.open(BENCH / "mmlu_test.jsonl.gz").readline())
    (_, texts), = first_items("mmlu_test.jsonl.gz", 1)
    q, c = item["question"], item["choices"]
    assert texts == [(q, c[0]), (q, c[1]), (q, c[2]), (q, c[3]), (q, *c),
                     (q, "A.", c[0], "B.", c[1], "C.", c[2], "D.", c[3])]
    (_, hs), = first_items("hellaswag_val.jsonl.gz", 1)
    assert len(hs) == 6 and hs[4][1:] == tuple(json.loads(gzip.open(BENCH / "hellaswag_val.jsonl.gz").readline())["endings"])
    # Other layouts are as they were: one text per continuation.
    assert next(benchmark_texts(BENCH / "gsm8k_test.jsonl")).startswith("Janet")
