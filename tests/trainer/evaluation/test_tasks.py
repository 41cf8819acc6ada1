"""trainer.evaluation.tasks: the items lm-eval's tasks make of the real benchmark files (../shared/data/benchmarks),
and the files it refuses."""

from __future__ import annotations

import pytest

from tests.conftest import SHARED_DATA
from trainer.evaluation.tasks import load_task

BENCH = SHARED_DATA / "benchmarks"


def test_hellaswag_items_are_cleaned_as_the_harness_does():
    items = load_task("hellaswag", BENCH, limit=300)
    assert not any("[title]" in ctx or "[header]" in ctx for it in items for ctx, _ in it.requests)
    assert all(cont.startswith(" ") and len(it.requests) == 4 for it in items for _, cont in it.requests)
    with pytest.raises(ValueError, match="unknown zero-shot task 'mmlu_pro'"):
        load_task("mmlu_pro", BENCH)


def test_the_first_item_of_each_task_is_the_request_lm_eval_makes():
    """lm-eval's prompts, written out (its task YAMLs; tests/trainer/evaluation/test_harness.py compares every item with lm-eval's
    own requests)."""
    first = {name: load_task(name, BENCH, limit=1)[0] for name in
             ("lambada_openai", "hellaswag", "arc_easy", "piqa", "winogrande", "boolq", "mmlu")}
    assert first["hellaswag"].requests[3] == (
        "Roof shingle removal: A man is sitting on a roof. He", " starts pulling up roofing on a roof.")
    assert first["hellaswag"].choices[3] == "starts pulling up roofing on a roof." and first["hellaswag"].gold == 3
    assert first["arc_easy"].requests[0] == (
        "Question: Which statement best explains why photosynthesis is the foundation of most food webs?\nAnswer:",
        " Sunlight is the source of energy for nearly all ecosystems.")
    assert first["piqa"].requests[0][0] == "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:"
    assert first["winogrande"].requests == [
        ("Sarah was a much better surgeon than Maria so Sarah", " always got the easier cases."),
        ("Sarah was a much better surgeon than Maria so Maria", " always got the easier cases.")]
    assert first["winogrande"].gold == 1
    context, answer = first["boolq"].requests[1]
    assert context.startswith("All biomass goes through") and answer == " yes"
    assert context.endswith("\nQuestion: does ethanol take more energy make that produces?\nAnswer:")
    assert first["mmlu"].requests[1] == (
        "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
        "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\nA. 0\nB. 4\nC. 2\nD. 6"
        "\nAnswer:", " B")
    assert first["lambada_openai"].requests[0][1] == " signs" and first["lambada_openai"].choices == []


def test_a_file_of_another_layout_is_refused_naming_the_file_line_and_field(tmp_path):
    (tmp_path / "arc_easy_test.jsonl").write_text('{"question": "Why?", "choices": ["a", "b"], "gold": 0}\n')
    with pytest.raises(ValueError, match=r"arc_easy_test.jsonl: line 1: not the arc_easy layout \(field 'query'\)"):
        load_task("arc_easy", tmp_path)
    with pytest.raises(ValueError, match="piqa: benchmark file .*piqa_val.jsonl not found"):
        load_task("piqa", tmp_path)
