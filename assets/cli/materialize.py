"""`pretrain materialize`: the selection, or with --stale what is stale or missing until nothing is, run side by side
(assets/runs/parallel.py), reported a line per asset (assets/runs/progress.py)."""

from __future__ import annotations

import os

from assets.cli.factory import Factory, UsageError


def start_local_helpers(args) -> None:
    """With the local executor at W > 1 workers (PRETRAIN_EXECUTOR_WORKERS, else the run's CPUs: the resource's
    default), start its W helper processes now, in the background: they take ~0.7 s to import datatrove and ~0.65 s
    to load the filter's models, which then overlaps the ~2 s of loading Dagster and the code location instead of
    the first stage's tasks. Only when
    the runs execute in this process (one job); parallel jobs' worker processes start their own as their runs begin
    (ExecutorResource.setup_for_execution). A bad variable is left to the resource, which names it when the run
    starts."""
    from pipelines.runner import LocalRunner
    from resources.executor_env import ExecutorEnvironment, local_workers

    try:
        env = ExecutorEnvironment.read(os.environ)
        jobs = args.jobs or int(os.environ.get("PRETRAIN_JOBS") or 0)
        workers = local_workers(env.workers)
    except ValueError:
        return
    if env.kind == "local" and workers > 1 and jobs == 1:
        LocalRunner(workers=workers).warm()


def materialize(args) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: expected 1 or more steps at a time")
    try:
        from assets.runs.parallel import default_jobs

        jobs = args.jobs or default_jobs()
    except ValueError as exc:  # a bad PRETRAIN_JOBS
        raise UsageError(str(exc)) from None
    from assets.runs.progress import StreamReport

    report = getattr(args, "report", None) or StreamReport()  # main() gives the command's (assets/runs/output.py)
    factory = Factory(args.recipe, say=report.say)
    report.watch(factory.instance)
    ok = materialize_selection(args, factory, jobs, report)
    report.finish(ok)
    return 0 if ok else 1


def materialize_selection(args, factory: Factory, jobs: int, report) -> bool:
    """--select's assets, or with --stale those of them stale or missing until none is; False if a run failed."""
    log = f"; the full log: {report.log}" if report.log else ""
    if not args.stale:
        keys = factory.select(args.select)
        report.say(f"pretrain: materializing {len(keys)} asset(s) of recipe {factory.recipe.name!r}{log}")
        return factory.materialize(keys, jobs, refresh=args.refresh, report=report)

    # Dagster shows staleness one step at a time (a child turns stale only after its parent is
    # re-materialized), so loop until nothing in the selection is stale or missing.
    wanted = set(factory.select(args.select))
    done: list = []
    for _ in range(len(factory.keys) + 1):
        todo = factory.stale_round(wanted)
        if not todo:
            break
        if any(key in done for key in todo):
            report.say(f"pretrain: still stale after materializing: {', '.join(k.to_user_string() for k in todo)}")
            return False
        report.say(f"pretrain: materializing {len(todo)} stale or missing asset(s): "
                   f"{', '.join(k.to_user_string() for k in todo)}{log}")
        log = ""
        if not factory.materialize(todo, jobs, refresh=args.refresh, report=report,
                                   partitions=factory.stale_partitions(todo)):
            return False
        done += todo
    if not done:
        report.say("pretrain: nothing is stale")
    return True
