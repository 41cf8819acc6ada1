"""The asset tests' session fixtures: one curated home for the tests that train on two small sources."""

from tests.assets.curated import curated_home, curated_template  # noqa: F401  (pytest fixtures)
