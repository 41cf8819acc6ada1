"""`pretrain`, the factory's command line: a module per command group.

    command.py      the parser (every command's arguments in one place) and main(), the entry point
    factory.py      what every command needs: the recipe, its Definitions, the Dagster instance (Factory)
    materialize.py  `pretrain materialize`
    status.py       `status`, `where`, `docs`, `jobs`: what is there
    checkpoints.py  `lineage`, `export`, `eval`: a checkpoint from a terminal
    plan.py         `plan`: sizes, costs and the compute-optimal N and D
    reference.py    `schema`, and the generated reference: docs/recipe.schema.json, docs/reference/*.md

Each handler is a thin call into the asset layer or the planner. docs/cli.md is the manual;
docs/reference/cli.md lists every flag, generated from the parser.
"""

from assets.cli.command import main

__all__ = ["main"]
