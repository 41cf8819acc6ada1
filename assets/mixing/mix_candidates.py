"""`mixing/mix_candidates`: every candidate mixture the sweep has drawn so far under the recipe's draw settings,
drawn around the prior (trainer/data/mixture_search.py); registers one dynamic partition of mix_sweep per new candidate
(partition key = the mixture's name).

Each materialization adds one draw to those before it: the scheduled tick named by the run's TICK_TAG (the
schedule sets it; its candidates are seeded by the tick), or, without the tag, the recipe's base sweep (the
prior first), which is always in the set. The output lists every draw and its candidates, so a sweep partition
of an earlier tick still finds its weights and mixture_weights fits the runs of every tick together. The draws
are recomputed from their names: the same set of draws is the same version key, reused, and a changed draw
setting (prior, seed, ...) starts the set again from the base sweep.
"""

from pathlib import Path

from dagster import Failure, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output, OutputNotFound
from assets.mixing.section import (
    BASE_DRAW,
    CANDIDATES,
    TICK_TAG,
    candidates_key,
    draw_section,
    read_result,
    tick_seed,
    write_result,
)
from assets.recipe import Recipe


def mix_candidates_asset(recipe: Recipe):
    cfg = recipe.mixing.engine_config()
    sources = sorted(recipe.mixing.prior)

    def prepare(inputs: Inputs) -> Inputs:
        draw = inputs.context.run.tags.get(TICK_TAG, BASE_DRAW)
        try:
            tick_seed(draw)
        except ValueError as exc:
            raise Failure(description=str(exc)) from None
        draws = sorted({BASE_DRAW, draw, *_earlier_draws(inputs, spec.code_version)})
        return inputs.but(fingerprints=draws, extra={"draw": draw, "draws": draws})

    def build(inputs: Inputs, out_dir: Path) -> dict:
        from trainer.data.mixture_search import candidate_mixtures, mixture_name
        draws, candidates = {}, {}
        for draw in inputs.extra["draws"]:
            mixtures = {mixture_name(m): m for m in candidate_mixtures(cfg, tick=tick_seed(draw))}
            draws[draw] = sorted(mixtures)
            candidates.update(mixtures)
        write_result(out_dir, {"draws": draws, "candidates": candidates})
        return {}

    def metadata(inputs: Inputs, output: Output) -> dict:
        payload = read_result(inputs.store, output.prefix)
        instance = inputs.context.instance
        known = set(instance.get_dynamic_partitions(CANDIDATES.name))
        new = [name for name in payload["candidates"] if name not in known]
        if new:
            instance.add_dynamic_partitions(CANDIDATES.name, new)
        return {"candidates": MetadataValue.json(payload["candidates"]), "new_partitions": len(new),
                "draw": inputs.extra["draw"], "draws": MetadataValue.json(payload["draws"])}

    spec = OutputSpec(
        key=candidates_key(), group="mixing", stage="mix_candidates",
        section=draw_section(recipe),
        description=(f"Candidate mixtures of {', '.join(sources)} drawn from a Dirichlet around the prior: the "
                     f"base sweep ({cfg.candidates}, the prior first), then {cfg.candidates} new ones at each "
                     "scheduled tick (seeded by the tick), all kept; one mix_sweep partition each. Driven by the "
                     "recipe's `mixing` section."),
        prepare=prepare, build=build, metadata=metadata,
    )
    return output_asset(spec)


def _earlier_draws(inputs: Inputs, code_version: str) -> list[str]:
    """The draws of the latest output, if it was drawn with the same settings (else the set starts again)."""
    try:
        latest = inputs.read(candidates_key())
    except OutputNotFound:
        return []
    if latest.manifest.get("code_version") != code_version:
        return []
    return list(read_result(inputs.store, latest.prefix).get("draws", {}))
