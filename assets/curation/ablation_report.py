"""What a filter ablation's arms say, from their runs' results: each arm's figures over its seeds, its difference
from the raw arm, and a verdict where the seeds measure the noise (assets/curation/ablation.py runs the arms).

    summary = summarize(results)   # results: one dict per (arm, seed): arm, seed, reference_loss, answer_bpb, ...
    summary["arms"]["curated"]["verdict"]   # by reference loss: "better", "worse", "within noise", "spread not measured"
    summary["arms"]["curated"]["by"]["answer_bpb"]["verdict"]   # the same by the answers' bits per byte

Two metrics, each judged on its own (METRICS), lower better for both: the loss on the reference texts, and the bits
per byte of the correct answers of the evaluation's multiple-choice tasks (`answer_bpb`, the mean over tasks of
trainer/evaluation/evaluate.py's `bpb`): DataDecide's (2025) continuous metric, which at small scale ranked 25
corpora as 1B runs did about 80% of the time, better than a loss on one text. The rule, for each: the run-to-run
spread of an arm is the range (max - min) of the metric over its seeds; two arms differ beyond noise when the
difference of their means is larger than the larger of their two spreads. With one seed there is no spread, and
the difference is given with "spread not measured". Every verdict line names the metric it judges by.
"""

from __future__ import annotations

from statistics import mean

RAW, CURATED = "raw", "curated"
WITHOUT = "without_"  # a leave-one-out arm's name: without_<step>
NOT_MEASURED = "spread not measured"
# metric key of a run's figures -> how a verdict names it
METRICS = {"reference_loss": "reference loss", "answer_bpb": "answer bits per byte"}


def summarize(results: list[dict]) -> dict:
    """{"arms": {arm: figures}, "steps": {step: verdict of keeping it}, "verdict": lines, each naming its metric}."""
    by_arm: dict[str, list[dict]] = {}
    for result in sorted(results, key=lambda r: r["seed"]):
        by_arm.setdefault(result["arm"], []).append(result)
    arms = {name: _figures(runs) for name, runs in by_arm.items()}
    raw = arms.get(RAW)
    for name, figures in arms.items():
        if raw is not None and name != RAW:
            figures.update(compare(figures, raw))
    # A step's worth: the arm with every step against the arm without it (FineWeb's leave-one-out).
    steps = {}
    if CURATED in arms:
        for name, figures in arms.items():
            if name.startswith(WITHOUT):
                steps[name[len(WITHOUT):]] = compare(arms[CURATED], figures)
    lines = [f"{name}: " + "; ".join(_judged(c, "against raw") for c in figures["by"].values())
             for name, figures in arms.items() if name != RAW and "by" in figures]
    lines += [f"step {step}: " + "; ".join(_judged(c, "with it") for c in compared["by"].values())
              for step, compared in steps.items()]
    return {"arms": arms, "steps": steps, "verdict": lines}


def compare(arm: dict, baseline: dict) -> dict:
    """arm against baseline on each metric both have ("by": {metric: difference, noise, verdict}; negative: arm
    is better); the reference loss's also at the top level; and the zero-shot accuracy difference."""
    by = {key: _compared(arm["metrics"][key], baseline["metrics"][key], METRICS[key]) for key in METRICS
          if key in arm["metrics"] and key in baseline["metrics"]}
    out = {**{k: v for k, v in by["reference_loss"].items() if k != "metric"}, "by": by}
    if arm.get("zero_shot_mean") is not None and baseline.get("zero_shot_mean") is not None:
        out["zero_shot_difference"] = round(arm["zero_shot_mean"] - baseline["zero_shot_mean"], 5)
    return out


def _compared(arm: dict, baseline: dict, metric: str) -> dict:
    difference = arm["mean"] - baseline["mean"]
    spread = max(arm["spread"], baseline["spread"]) if arm["seeds"] > 1 and baseline["seeds"] > 1 else None
    if spread is None:
        verdict = NOT_MEASURED
    elif difference < -spread:
        verdict = "better"
    elif difference > spread:
        verdict = "worse"
    else:
        verdict = "within noise"
    return {"metric": metric, "difference": round(difference, 5), "noise": None if spread is None else round(spread, 5),
            "verdict": verdict}


def _spread(values: list[float]) -> dict:
    return {"mean": round(mean(values), 5), "seeds": len(values),
            "spread": round(max(values) - min(values), 5) if len(values) > 1 else None,
            "values": [round(x, 5) for x in values]}


def _figures(runs: list[dict]) -> dict:
    losses = [r["reference_loss"] for r in runs]
    domains = sorted({d for r in runs for d in r["val_loss"]})
    tasks = sorted({t for r in runs for t in r["zero_shot"]})
    zero_shot = {t: round(mean(r["zero_shot"][t] for r in runs if t in r["zero_shot"]), 5) for t in tasks}
    bpb = [mean(r["answer_bpb"].values()) for r in runs if r.get("answer_bpb")]
    bpb_tasks = sorted({t for r in runs for t in r.get("answer_bpb") or {}})
    metrics = {"reference_loss": _spread(losses)}
    if bpb and len(bpb) == len(runs):  # every seed scored on the tasks, or the metric is left out
        metrics["answer_bpb"] = _spread(bpb)
    return {
        "seeds": len(runs),
        "reference_loss": round(mean(losses), 5),
        "spread": round(max(losses) - min(losses), 5) if len(runs) > 1 else None,
        "reference_losses": [round(x, 5) for x in losses],
        "metrics": metrics,
        "answer_bpb_per_task": {t: round(mean(r["answer_bpb"][t] for r in runs if t in (r.get("answer_bpb") or {})), 5)
                                for t in bpb_tasks},
        "val_loss": {d: round(mean(r["val_loss"][d] for r in runs if d in r["val_loss"]), 5) for d in domains},
        "zero_shot": zero_shot,
        "zero_shot_mean": round(mean(zero_shot.values()), 5) if zero_shot else None,
        "tokens": runs[0]["tokens"],
        "steps": runs[0]["steps"],
        "documents": runs[0].get("documents"),
        "data": runs[0]["data"],
    }


def _judged(compared: dict, versus: str) -> str:
    noise = f", spread {compared['noise']:.4f}" if compared["noise"] is not None else ""
    return f"{compared['verdict']} by {compared['metric']} ({_signed(compared['difference'])} {versus}{noise})"


def _signed(x: float) -> str:
    return f"{x:+.4f}"


def table(summary: dict) -> str:
    """A markdown table: one row per arm (each metric's mean and spread, its difference from raw and verdict)."""
    rows = ["| arm | seeds | documents | metric | mean | spread | vs raw | verdict | zero-shot mean |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, f in summary["arms"].items():
        zero = "-" if f["zero_shot_mean"] is None else f"{f['zero_shot_mean']:.3f}"
        first = True
        for key, metric in METRICS.items():
            figures = f["metrics"].get(key)
            if figures is None:
                continue
            spread = "-" if figures["spread"] is None else f"{figures['spread']:.4f}"
            compared = f.get("by", {}).get(key)
            versus = "-" if compared is None else _signed(compared["difference"])
            head = (f"| {name} | {f['seeds']} | {f['documents'] if f['documents'] is not None else '-'} |" if first
                    else "| | | |")
            rows.append(f"{head} {metric} | {figures['mean']:.4f} | {spread} | {versus} | "
                        f"{compared['verdict'] if compared else 'baseline'} |{' ' + zero if first else ''} |")
            first = False
    for step, c in summary["steps"].items():
        for compared in c["by"].values():
            rows.append(f"| step {step} (curated vs without it) | | | {compared['metric']} | | "
                        f"{compared['noise'] if compared['noise'] is not None else '-'} | "
                        f"{_signed(compared['difference'])} | {compared['verdict']} | |")
    return "\n".join(rows)
