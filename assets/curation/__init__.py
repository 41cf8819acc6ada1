"""The curation group: every source from its input files to decontaminated documents.

    curation/<source>/inputs          raw_crawl.py        the input files, observed (a source asset)
    curation/<source>/raw_crawl       raw_crawl.py        inputs normalized to documents
    curation/quality_classifier       quality_classifier.py  (when the recipe has one)
    curation/reference_lm             reference_lm.py     the perplexity filter's model (the `reference` section)
    curation/<source>/filtered        filtered.py         the source's filter steps
    curation/deduplicated             deduplicated.py     across all sources (those without dumps)
    curation/<source>/deduplicated    deduplicated.py     a crawl's dump against all kept before it
    curation/<source>/decontaminated  decontaminated.py   benchmark n-grams removed
    curation/<source>/ablation        ablation.py         proxy runs on its raw and curated text (the `ablation` section)
    (asset checks)                    checks.py           documents_valid, no_benchmark_ngrams
    (shared)                          ablation_report.py  an ablation's differences and verdicts
"""

from assets.curation.ablation import ablation_asset
from assets.curation.decontaminated import decontaminated_asset, decontaminated_key
from assets.curation.deduplicated import deduplicated_asset, dump_deduplicated_asset
from assets.curation.filtered import filtered_asset, filtered_key
from assets.curation.quality_classifier import quality_classifier_asset
from assets.curation.raw_crawl import raw_crawl_asset, source_inputs_asset
from assets.curation.reference_lm import reference_lm_asset
from assets.recipe import Recipe


def curation_assets(recipe: Recipe) -> list:
    """raw_crawl -> filtered (with the quality classifier, the reference LM) -> deduplicated -> decontaminated; the
    ablations of the sources the recipe names."""
    assets = [source_inputs_asset(recipe, source) for source in recipe.sources if not source.has_dumps]
    assets += [raw_crawl_asset(recipe, source) for source in recipe.sources]
    if recipe.quality_classifier:
        assets.append(quality_classifier_asset(recipe, recipe.quality_classifier))
    if recipe.reference:
        assets.append(reference_lm_asset(recipe, recipe.reference))
    assets += [filtered_asset(recipe, source) for source in recipe.sources]
    if any(not source.has_dumps for source in recipe.sources):
        assets.append(deduplicated_asset(recipe, upstream_key=filtered_key))
    # A crawl's dumps, each against the index of what was kept before it (the global output, earlier dumps).
    assets += [dump_deduplicated_asset(recipe, source, upstream_key=filtered_key)
               for source in recipe.sources if source.has_dumps]
    assets += [decontaminated_asset(recipe, source) for source in recipe.sources]
    if recipe.ablation:
        assets += [ablation_asset(recipe, recipe.source(name)) for name in recipe.ablation.sources]
    return assets

