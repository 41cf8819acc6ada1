"""What is there: `pretrain status` (each asset's state, restarts, rollbacks, ablation verdicts), `where` and `docs`
(an asset's output and its documents) and `jobs` (the training jobs, from their own files)."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import sys
import time

from assets.cli.factory import Factory


def status(args) -> int:
    factory = Factory(args.recipe)
    rows = []
    for key, state, cause in factory.statuses():
        rows.append((key.to_user_string(), state, cause))
        # A crawl's assets: a line per dump under the asset's own (missing or stale if any dump is).
        rows += [(f"{key.to_user_string()}[{dump}]", s, c) for dump, s, c in factory.partition_states.get(key, [])]
    width = max(len(row[0]) for row in rows)
    for name, state, cause in rows:
        print(f"{name:<{width}}  {state:<7}  {cause}")
    # Every restart of a training job and every node it left out, with the reason: read from the jobs' own files,
    # so a job still running (or one whose Dagster run died) shows them too.
    # The same three columns: key, "restart", what happened.
    for job in training_jobs():
        for r in job["restarts"]:
            left_out = f"; left out {r['excluded']} ({r['why']})" if r.get("excluded") else ""
            print(f"{'training/' + job['stage']:<{width}}  {'restart':<7}  after attempt {r['attempt']} at "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r['time']))}: {r['reason']}{left_out}")
    # Each filter ablation's verdict, one line per arm (assets/curation/ablation.py), from its latest materialization.
    ablations = [k for k in factory.keys if k.path[-1] == "ablation"]
    # Each spike-guard rollback of a training stage's latest run: where it went back to and the data it left out.
    stages = [k for k in factory.keys if k.path[0] == "training"]
    events = factory.instance.get_latest_materialization_events(ablations + stages) if ablations + stages else {}
    for key in stages:
        event = events.get(key)
        entry = event.asset_materialization.metadata.get("rollbacks") if event else None
        for r in entry.value if entry else []:
            print(f"{key.to_user_string():<{width}}  {'rollback':<7}  at step {r['step']} back to step {r['to_step']} "
                  f"({r.get('to', 'checkpoint')}), global samples [{r['skip_window'][0]}, {r['skip_window'][1]}) "
                  "left out")
    for key in ablations:
        event = events.get(key)
        entry = event.asset_materialization.metadata.get("verdict_text") if event else None
        for line in entry.value.splitlines() if entry else []:
            print(f"{key.to_user_string():<{width}}  {'verdict':<7}  {line}")
    if args.check and any(state != "fresh" for _, state, _ in rows):
        print(f"pretrain: not fresh: {', '.join(name for name, state, _ in rows if state != 'fresh')}", file=sys.stderr)
        return 1
    return 0


def training_jobs() -> list[dict]:
    """Every training job started under $PRETRAIN_HOME/work/training (trainer/job/detach.py job_summary), newest first."""
    from assets.home import pretrain_home
    from trainer.job.detach import JOB_FILE, job_summary

    jobs = [job_summary(path.parent) for path in (pretrain_home() / "work" / "training").glob(f"*/*/{JOB_FILE}")]
    return sorted(jobs, key=lambda j: -j["started_at"])


def jobs(args) -> int:
    """Every training job started under $PRETRAIN_HOME/work/training, newest first. Works without the Dagster
    webserver or instance: the jobs' own files say it all (trainer/job/detach.py job_summary)."""
    from assets.home import pretrain_home

    root = pretrain_home() / "work" / "training"
    jobs = training_jobs()
    if args.json:
        for job in jobs:
            print(json.dumps(job))
        return 0
    if not jobs:
        print(f"no training job under {root}", file=sys.stderr)
        return 0
    print(f"{'stage':<12} {'state':<12} {'job':<22} {'step':>7} {'tokens':>13} {'loss':>8} {'ETA':>9} {'resumes':>7} "
          f"{'restarts':>8}  {'excluded':<16} started")
    for j in jobs:
        eta = time.strftime("%H:%M:%S", time.gmtime(j["eta_s"])) if j["eta_s"] is not None else "-"
        loss = f"{j['loss']:.4f}" if isinstance(j["loss"], float) else "-"
        where = f"slurm:{j['slurm_job_id']}" if j["slurm_job_id"] else f"{j['host']}:{j['pid']}"
        excluded = ",".join(j["excluded_nodes"]) or "-"
        print(f"{j['stage']:<12} {j['state']:<12} {where:<22} {j['step'] or '-':>7} {j['tokens'] or '-':>13} "
              f"{loss:>8} {eta:>9} {j['resumes']:>7} {len(j['restarts']):>8}  {excluded:<16} {time.ctime(j['started_at'])}")
    return 0


def where(args) -> int:
    factory = Factory(args.recipe)
    store, outputs = factory.current_outputs(args.asset, args.source)
    if len(outputs) == 1:
        print(store.uri(outputs[0][1].prefix))
        print(json.dumps(outputs[0][1].manifest, indent=2))
        return 0
    # A crawl's asset, every dump: a line each; `where ASSET[DUMP]` prints one with its manifest.
    for dump, output in outputs:
        print(f"{dump}  {store.uri(output.prefix)}")
    return 0


def docs(args) -> int:
    factory = Factory(args.recipe)
    store, outputs = factory.current_outputs(args.asset, args.source)
    remaining = args.limit
    out = sys.stdout
    for key in (key for _, output in outputs for key in output.files("")):  # a crawl's dumps in order
        # The kept documents' parts: part-* at the top, or under each source's folder (the deduplicated asset's).
        if not (key.endswith(".jsonl.gz") and key.rsplit("/", 1)[-1].startswith("part-")):
            continue
        with contextlib.closing(store.open_read(key)) as raw, gzip.open(raw) as lines:
            for line in io.TextIOWrapper(lines, encoding="utf-8"):
                if remaining is not None and remaining <= 0:
                    return 0
                out.write(line if line.endswith("\n") else line + "\n")
                if remaining is not None:
                    remaining -= 1
    return 0
