"""What a filter ablation's arms say, from their runs' results: each arm's figures over its seeds, its difference
from the raw arm, and a verdict where the seeds measure the noise (assets/curation/ablation.py runs the arms).

    summary = summarize(results)   # results: one dict per (arm, seed): arm, seed, reference_loss, zero_shot, ...
    summary["arms"]["curated"]["verdict"]   # "better", "worse", "within noise" or "spread not measured"

The rule: the run-to-run spread of an arm is the range (max - min) of its reference loss over its seeds; two arms
differ beyond noise when the difference of their mean losses is larger than the larger of their two spreads. With
one seed there is no spread, and the difference is given with "spread not measured". Lower loss is better.
"""

from __future__ import annotations

from statistics import mean

RAW, CURATED = "raw", "curated"
WITHOUT = "without_"  # a leave-one-out arm's name: without_<step>
NOT_MEASURED = "spread not measured"


def summarize(results: list[dict]) -> dict:
    """{"arms": {arm: figures}, "steps": {step: verdict of keeping it}, "verdict": one line per arm}."""
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
    lines = [_line(name, figures) for name, figures in arms.items() if name != RAW and "difference" in figures]
    lines += [f"step {step}: {c['verdict']} ({_signed(c['difference'])} with it)" for step, c in steps.items()]
    return {"arms": arms, "steps": steps, "verdict": lines}


def compare(arm: dict, baseline: dict) -> dict:
    """arm against baseline: the difference of mean reference losses (negative: arm is better), the noise bound,
    the verdict and the zero-shot difference."""
    difference = arm["reference_loss"] - baseline["reference_loss"]
    spread = max(arm["spread"], baseline["spread"]) if arm["seeds"] > 1 and baseline["seeds"] > 1 else None
    if spread is None:
        verdict = NOT_MEASURED
    elif difference < -spread:
        verdict = "better"
    elif difference > spread:
        verdict = "worse"
    else:
        verdict = "within noise"
    out = {"difference": round(difference, 5), "noise": None if spread is None else round(spread, 5), "verdict": verdict}
    if arm.get("zero_shot_mean") is not None and baseline.get("zero_shot_mean") is not None:
        out["zero_shot_difference"] = round(arm["zero_shot_mean"] - baseline["zero_shot_mean"], 5)
    return out


def _figures(runs: list[dict]) -> dict:
    losses = [r["reference_loss"] for r in runs]
    domains = sorted({d for r in runs for d in r["val_loss"]})
    tasks = sorted({t for r in runs for t in r["zero_shot"]})
    zero_shot = {t: round(mean(r["zero_shot"][t] for r in runs if t in r["zero_shot"]), 5) for t in tasks}
    return {
        "seeds": len(runs),
        "reference_loss": round(mean(losses), 5),
        "spread": round(max(losses) - min(losses), 5) if len(runs) > 1 else None,
        "reference_losses": [round(x, 5) for x in losses],
        "val_loss": {d: round(mean(r["val_loss"][d] for r in runs if d in r["val_loss"]), 5) for d in domains},
        "zero_shot": zero_shot,
        "zero_shot_mean": round(mean(zero_shot.values()), 5) if zero_shot else None,
        "tokens": runs[0]["tokens"],
        "steps": runs[0]["steps"],
        "documents": runs[0].get("documents"),
        "data": runs[0]["data"],
    }


def _line(name: str, figures: dict) -> str:
    noise = f", spread {figures['noise']:.4f} over {figures['seeds']} seeds" if figures["noise"] is not None else ""
    return f"{name}: {figures['verdict']} ({_signed(figures['difference'])} reference loss against raw{noise})"


def _signed(x: float) -> str:
    return f"{x:+.4f}"


def table(summary: dict) -> str:
    """A markdown table: one row per arm (mean reference loss, spread, difference from raw, verdict, zero-shot)."""
    rows = ["| arm | seeds | documents | reference loss | spread | vs raw | verdict | zero-shot mean |",
            "|---|---|---|---|---|---|---|---|"]
    for name, f in summary["arms"].items():
        spread = "-" if f["spread"] is None else f"{f['spread']:.4f}"
        versus = "-" if "difference" not in f else _signed(f["difference"])
        zero = "-" if f["zero_shot_mean"] is None else f"{f['zero_shot_mean']:.3f}"
        rows.append(f"| {name} | {f['seeds']} | {f['documents'] if f['documents'] is not None else '-'} | "
                    f"{f['reference_loss']:.4f} | {spread} | {versus} | {f.get('verdict', 'baseline')} | {zero} |")
    for step, c in summary["steps"].items():
        rows.append(f"| step {step} (curated vs without it) | | | | {c['noise'] if c['noise'] is not None else '-'} | "
                    f"{_signed(c['difference'])} | {c['verdict']} | |")
    return "\n".join(rows)
