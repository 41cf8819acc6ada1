"""`pretrain plan`: parameters, FLOPs, GPU-hours and memory of the recipe's stages, a cost table by N and D, or the
compute-optimal N and D for a budget (trainer/planner/)."""

from __future__ import annotations

import json
import sys

from assets.cli.factory import Factory, UsageError


def plan(args) -> int:
    # Arithmetic: no Dagster instance, but for --budget's scaling fit. A layout that will not fit warns but is no
    # error (exit 0).
    from assets.recipe import RecipeError, load_recipe
    from trainer.planner import plan as planner

    try:
        if args.fit is not None and args.budget is None:
            raise UsageError("--fit: goes with --budget (the compute-optimal N and D by that fit)")
        if args.budget is not None:
            flops = planner.parse_tokens(args.budget)
            fit, source, no_fit = scaling_fit(args)
            planner.budget_report(flops, fit, fit_source=source, no_fit=no_fit, out=sys.stdout)
            return 0
        if args.params is not None:
            params = [planner.parse_tokens(p) for p in args.params.split(",")]
            budgets = [planner.parse_tokens(t) for t in (args.tokens or "").split(",") if t.strip()]
            if len(budgets) != len(params):
                raise UsageError(f"--tokens: give one token count per --params entry ({len(params)}), comma-separated")
            planner.cost_table(list(zip(params, budgets)), flops_per_s=args.tflops * 1e12, price_per_gpu_hour=args.price,
                               out=sys.stdout)
            return 0
        stage_options: dict = {}
        if args.model:
            name, shape, tokens = planner.load_stage(args.model, seq_len=args.seq_len)
            if args.tokens is not None:
                tokens = planner.parse_tokens(args.tokens)
            if tokens is None:
                raise UsageError("--tokens: required unless --model is a run config with train_tokens (e.g. --tokens 2e12)")
            stages = [(name, shape, tokens)]
        else:
            recipe = load_recipe(args.recipe)
            stages, stage_options = training_stages(recipe)
            if not stages:
                raise UsageError(f"recipe {recipe.name!r} has no training section; give --model JSON_OR_PATH and --tokens N")
        if (args.checkpoint_minutes is None) != (args.mtbf_hours is None):
            raise UsageError("--checkpoint-minutes and --mtbf-hours go together (Young's interval needs both)")
        layout = planner.Layout(tp=args.tp, pp=args.pp, dp=args.dp, zero=args.zero, micro_batches=args.micro_batches)
        chosen = {"micro_batch": args.micro_batch, "recompute": args.recompute, "sequence_parallel": args.sequence_parallel}
        planner.report(
            stages, layout=layout, device=args.device, mfu=args.mfu, out=sys.stdout, err=sys.stderr,
            checkpoint_seconds=None if args.checkpoint_minutes is None else args.checkpoint_minutes * 60,
            mtbf_seconds=None if args.mtbf_hours is None else args.mtbf_hours * 3600,
            stage_options=stage_options, price_per_gpu_hour=args.price, attention=not args.no_attention,
            **{k: v for k, v in chosen.items() if v is not None},
        )
    except (RecipeError, UsageError):
        raise
    except ValueError as exc:  # the planner's messages name the field
        raise UsageError(str(exc)) from None
    return 0


def scaling_fit(args) -> tuple:
    """(fit, where it came from, why there is none) for `plan --budget`: --fit's file or folder, else the latest
    scaling/fit output of the recipe's ladder in this instance, else none (the recipe has no ladder, or its fit
    was never materialized)."""
    from assets.recipe import load_recipe, recipe_path
    from assets.scaling.section import FIT_FILE, fit_key
    from storage.factory import open_store
    from storage.objects import ObjectNotFoundError
    from trainer.planner.scaling_law import ScalingFit

    if args.fit is not None:
        uri = args.fit.rstrip("/")
        parent, name = uri.rpartition("/")[::2] if uri.endswith(".json") else (uri, FIT_FILE)
        try:
            data = open_store(parent or ".").get_bytes(name)
        except ObjectNotFoundError:
            raise UsageError(f"--fit: no {name} at {parent or '.'} (give a fit.json or the scaling/fit output "
                             "folder)") from None
        source = f"{parent}/{name}" if parent else name
    else:
        if args.recipe is None and not recipe_path(None).is_file():  # outside a checkout: a budget needs no recipe
            return None, "", f"no recipe at {recipe_path(None)}; give --fit PATH_OR_URI"
        recipe = load_recipe(args.recipe)
        if recipe.scaling is None:
            return None, "", f"recipe {recipe.name!r} has no scaling section; give --fit PATH_OR_URI"
        factory = Factory(args.recipe)
        try:
            store, [(_, output)] = factory.current_outputs(fit_key().to_user_string(), None)
        except UsageError as exc:  # never materialized
            return None, "", str(exc)
        source = store.uri(f"{output.prefix}/{FIT_FILE}")
        data = store.get_bytes(f"{output.prefix}/{FIT_FILE}")
    try:
        return ScalingFit.from_json(json.loads(data), source=source), source, ""
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source}: not valid JSON ({exc})") from None


def training_stages(recipe) -> tuple[list[tuple], dict[str, dict]]:
    """([(stage name, ModelShape, tokens)], {stage name: its micro-batch and recomputation}) of the recipe's
    training stages, for `pretrain plan`."""
    from trainer.planner.plan import ModelShape

    if recipe.training is None:
        return [], {}
    configs = recipe.training.run_configs()
    stages = [(name, ModelShape.from_model_config(cfg.model, seq_len=cfg.batch.seq_len), float(cfg.train_tokens))
              for name, cfg in configs]
    return stages, {name: {"micro_batch": cfg.batch.micro_batch, "recompute": cfg.model.activation_checkpointing,
                           "sequence_parallel": cfg.batch.sequence_parallel} for name, cfg in configs}
