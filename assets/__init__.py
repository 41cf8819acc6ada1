"""The asset layer: the pretraining stages as Dagster software-defined assets, one subpackage per asset group.

An asset's key names its module: `<group>/[<source>/]<name>` is in assets/<group>/<name>.py, e.g.

    curation/web/filtered        assets/curation/filtered.py
    curation/deduplicated        assets/curation/deduplicated.py
    tokenization/code/packed     assets/tokenization/packed.py
    mixing/mix_sweep             assets/mixing/mix_sweep.py
    training/<stage>             assets/training/stage.py     (main, each long-context stage, anneal)
    evaluation/<stage>           assets/evaluation/stage.py

Each asset states what it reads and how it builds; core/factory.py turns that into the Dagster asset (version
key, reuse, scratch space, commit, manifest, standard metadata, checks, errors). Around them: the recipe
(recipe.py, stages.py), the Definitions the code location serves (definitions.py), the `pretrain` command
(cli.py) and how it runs assets (runs/), `make ui` (ui.py), metadata plots (plots.py) and where local state
lives (home.py).
"""
