"""`mixing/mix_candidates`: the sweep's candidate mixtures, drawn around the recipe's prior (trainer/mixing.py);
registers one dynamic partition of mix_sweep per candidate (partition key = the mixture's name)."""

from pathlib import Path

from dagster import MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output
from assets.mixing.section import (
    CANDIDATES,
    MIXING_IMPLEMENTATION,
    candidates_key,
    draw_section,
    read_result,
    write_result,
)
from assets.recipe import Recipe
from trainer.mixing import candidate_mixtures, mixture_name


def mix_candidates_asset(recipe: Recipe):
    cfg = recipe.mixing.engine_config()
    sources = sorted(recipe.mixing.prior)

    def build(inputs: Inputs, out_dir: Path) -> dict:
        write_result(out_dir, {"candidates": {mixture_name(m): m for m in candidate_mixtures(cfg)}})
        return {}

    def metadata(inputs: Inputs, output: Output) -> dict:
        candidates = read_result(inputs.store, output.prefix)["candidates"]
        instance = inputs.context.instance
        known = set(instance.get_dynamic_partitions(CANDIDATES.name))
        new = [name for name in candidates if name not in known]
        if new:
            instance.add_dynamic_partitions(CANDIDATES.name, new)
        return {"candidates": MetadataValue.json(candidates), "new_partitions": len(new)}

    return output_asset(OutputSpec(
        key=candidates_key(), group="mixing", stage="mix_candidates", implementation=MIXING_IMPLEMENTATION,
        section=draw_section(recipe),
        description=(f"{cfg.candidates} candidate mixtures of {', '.join(sources)} drawn from a Dirichlet around "
                     "the prior (the prior itself first); one mix_sweep partition each. Driven by the recipe's "
                     "`mixing` section."),
        build=build, metadata=metadata,
    ))
