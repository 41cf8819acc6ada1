"""key_figures: the few figures of an asset's metadata that `pretrain materialize`'s done line shows (the line itself,
on a real run: tests/assets/runs/test_parallel.py)."""

from assets.runs.figures import key_figures


def test_key_figures_read_what_a_user_looks_for_first_from_the_metadata():
    assert key_figures({"documents": 2886, "documents_in": 2893, "uri": "file:///x", "dropped": 7}) == \
        "2,886 documents of 2,893"
    assert key_figures({"tokens": 32768, "final_loss": 7.5169, "val_loss": {"c4": 7.0, "code": 8.0},
                        "steps": 17}) == "32,768 tokens, loss 7.517, val_loss 7.500 (mean of 2)"
    assert key_figures({"roc_auc_held_out": 0.8712, "accuracy": 0.74}) == "held-out ROC AUC 0.87"
    assert key_figures({"val_loss": {"c4": "nan"}, "documents": True, "candidates": {"a": {"c4": 1.0}}}) == ""


def test_an_ablations_done_line_gives_its_runs_and_its_first_verdict():
    verdicts = "curated: better (-0.142 reference loss against raw; spread 0.035)\nwithout_sample: better (-0.137 ...)"
    assert key_figures({"runs_trained": 2, "verdict_text": verdicts, "runs_reused": 4}) == \
        "2 proxy runs trained, curated: better (-0.142 reference loss against raw; spread 0.035)"
    assert key_figures({"runs_trained": 0, "verdict_text": ""}) == "0 proxy runs trained"
