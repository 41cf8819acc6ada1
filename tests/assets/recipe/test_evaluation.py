"""assets/recipe/evaluation.py: the recipe's `evaluation` section."""

import pytest
from pydantic import ValidationError

from assets.recipe.evaluation import EvaluationSection


def test_the_defaults_measure_four_tasks_on_200_items_and_the_canary():
    section = EvaluationSection()
    assert section.tasks == ["lambada_openai", "hellaswag", "arc_easy", "piqa"]
    assert (section.limit, section.canary) == (200, "benchmarks/wikitext-2-test.txt")


@pytest.mark.parametrize("fields, field", [({"tasks": ["squad"]}, "tasks.0"), ({"limit": 0}, "limit"),
                                           ({"val_sequences": 0}, "val_sequences"), ({"task": ["piqa"]}, "task")])
def test_a_bad_evaluation_section_is_refused_naming_the_field(fields, field):
    with pytest.raises(ValidationError) as error:
        EvaluationSection(**fields)
    assert ".".join(str(part) for part in error.value.errors()[0]["loc"]) == field
