"""What every section of a run.json shares (RunConfigSection): frozen, unknown keys refused, values taken as JSON gives
them. Its own module so that each part's settings (trainer/model/config.py, health/config.py, ...) can build on it
while trainer/config.py composes them into RunConfig, with no import circle."""

from __future__ import annotations

import typing

from pydantic import BaseModel, ConfigDict, field_validator, model_validator


class RunConfigSection(BaseModel):
    """What every section shares: frozen, unknown keys refused, values taken as JSON gives them."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _whole_numbers(cls, value, info):
        # JSON has one number type: json.dumps(2e6) reads back as 2000000.0, which an int field takes.
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(value, float) and value.is_integer() and int in (typing.get_args(annotation) or (annotation,)):
            return int(value)
        return value

    @model_validator(mode="after")
    def _checked(self):
        self._check()
        return self

    def _check(self) -> None:
        """A section's own rules, beyond the types; a ValueError names the field by its path in run.json."""
