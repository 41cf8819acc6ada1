"""trainer/base_config.py: what every run.json section shares, on a section of the test's own."""

import pytest

from trainer.base_config import RunConfigSection


class Section(RunConfigSection):
    steps: int = 1
    ratio: float = 0.5
    name: str = "x"

    def _check(self) -> None:
        if self.steps < 1:
            raise ValueError(f"section.steps must be >= 1, got {self.steps}")


def test_unknown_fields_are_refused_and_nothing_is_coerced():
    with pytest.raises(ValueError, match="stepz"):
        Section(stepz=2)
    for bad in ({"steps": "2"}, {"steps": 2.5}, {"steps": True}, {"name": 3}):
        with pytest.raises(ValueError):
            Section(**bad)


def test_a_whole_json_number_is_an_int_and_an_int_stays_a_float_field():
    # json.dumps(2e6) reads back as 2000000.0: an int field takes it as the int it is.
    section = Section(steps=2e6, ratio=1)
    assert section.steps == 2_000_000 and type(section.steps) is int
    assert section.ratio == 1.0 and type(section.ratio) is float


def test_the_sections_own_check_runs_and_a_section_is_frozen():
    with pytest.raises(ValueError, match=r"section\.steps must be >= 1, got 0"):
        Section(steps=0)
    with pytest.raises(ValueError):
        Section().steps = 3
