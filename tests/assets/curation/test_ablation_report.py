"""assets/curation/ablation_report.py: the differences from the raw arm, the spread over seeds and the verdicts by
each metric (reference loss, the answers' bits per byte), on figures made up for each case."""

import pytest

from assets.curation.ablation_report import NOT_MEASURED, summarize, table


def runs(arm: str, losses: list[float], zero_shot: float | None = None, bpb: list[float] | None = None) -> list[dict]:
    return [{"arm": arm, "seed": seed, "reference_loss": loss, "val_loss": {"reference_x": loss},
             "zero_shot": {} if zero_shot is None else {"arc_easy": zero_shot},
             "answer_bpb": {} if bpb is None else {"arc_easy": bpb[seed], "hellaswag": bpb[seed] + 0.2},
             "tokens": 4096, "steps": 8, "documents": 10, "data": {}} for seed, loss in enumerate(losses)]


@pytest.mark.parametrize("curated, verdict", [
    ([5.0, 5.1, 5.05], "better"),  # 0.95 lower, the spread 0.1
    ([6.0, 6.3, 6.1], "within noise"),  # 0.1 higher, the raw spread 0.2: within it
    ([7.0, 7.05, 7.1], "worse"),
])
def test_a_difference_beyond_the_larger_spread_is_a_verdict(curated, verdict):
    summary = summarize(runs("raw", [6.1, 6.0, 5.9]) + runs("curated", curated))
    arm = summary["arms"]["curated"]
    assert arm["verdict"] == verdict and arm["seeds"] == 3
    assert arm["difference"] == pytest.approx(sum(curated) / 3 - 6.0, abs=1e-5)  # rounded to 5 places
    assert arm["noise"] == pytest.approx(max(0.2, max(curated) - min(curated)), abs=1e-6)
    assert summary["verdict"][0].startswith(f"curated: {verdict} by reference loss (")
    assert set(arm["by"]) == {"reference_loss"}  # no tasks scored: no bits-per-byte verdict


def test_one_seed_gives_the_difference_with_spread_not_measured():
    summary = summarize(runs("raw", [6.0], 0.30) + runs("curated", [5.5], 0.34))
    arm = summary["arms"]["curated"]
    assert arm["verdict"] == NOT_MEASURED and arm["noise"] is None and arm["spread"] is None
    assert arm["difference"] == pytest.approx(-0.5) and arm["zero_shot_difference"] == pytest.approx(0.04)
    assert summary["verdict"] == ["curated: spread not measured by reference loss (-0.5000 against raw)"]
    assert "| curated | 1 | 10 | reference loss | 5.5000 | - | -0.5000 | spread not measured | 0.340 |" in table(summary)


def test_each_metric_has_its_own_verdict_and_names_itself():
    """The curated arm is better by the answers' bits per byte (mean over tasks; 0.1 lower, spread 0.02) while its
    reference loss is within noise (0.05 lower, spread 0.2)."""
    summary = summarize(runs("raw", [6.1, 6.0, 5.9], bpb=[1.50, 1.51, 1.52])
                        + runs("curated", [6.05, 5.95, 5.85], bpb=[1.40, 1.41, 1.42]))
    arm = summary["arms"]["curated"]
    assert arm["metrics"]["answer_bpb"]["mean"] == pytest.approx(1.51)  # mean of arc_easy and hellaswag (+0.2)
    assert arm["answer_bpb_per_task"] == {"arc_easy": pytest.approx(1.41), "hellaswag": pytest.approx(1.61)}
    bpb = arm["by"]["answer_bpb"]
    assert bpb["verdict"] == "better" and bpb["difference"] == pytest.approx(-0.1) and bpb["noise"] == pytest.approx(0.02)
    assert arm["by"]["reference_loss"]["verdict"] == arm["verdict"] == "within noise"
    assert summary["verdict"] == ["curated: within noise by reference loss (-0.0500 against raw, spread 0.2000); "
                                  "better by answer bits per byte (-0.1000 against raw, spread 0.0200)"]
    rows = table(summary)
    assert "| | | | answer bits per byte | 1.5100 | 0.0200 | -0.1000 | better | |" in rows
    assert "| raw | 3 | 10 | reference loss | 6.0000 | 0.2000 | - | baseline | - |" in rows


def test_a_left_out_step_is_judged_by_the_curated_arm_against_the_arm_without_it():
    summary = summarize(runs("raw", [6.0, 6.1]) + runs("curated", [5.0, 5.1]) + runs("without_sample", [5.02, 5.12])
                        + runs("without_c4", [5.6, 5.65]))
    assert summary["steps"]["sample"]["verdict"] == "within noise"
    assert summary["steps"]["c4"]["verdict"] == "better"  # with c4 the loss is lower: the step helps
    assert summary["steps"]["c4"]["difference"] == pytest.approx(5.05 - 5.625)
    assert "step c4: better by reference loss (-0.5750 with it, spread 0.1000)" in summary["verdict"]
