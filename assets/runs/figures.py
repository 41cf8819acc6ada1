"""What a run made, in a few words, for the line `pretrain materialize` prints when the run ends:

    pretrain: [12/41] done     curation/web/filtered in 6.1 s (run 1a2b3c4d): 363 documents of 1,171

read from the asset's materialization metadata, the figures a user looks for first: documents kept of those read,
tokens packed or trained, the final and validation loss, a classifier's ROC AUC, a tokenizer's vocabulary, an
ablation's proxy runs and its first verdict.
"""

from __future__ import annotations

# (metadata key, how it reads) of the figures a user looks for first, in the order shown; an asset shows those of
# its metadata (documents kept by the data stages, tokens packed or trained, a model's loss or quality).
# A form that starts with "of" goes on the figure before it.
FIGURES = [("documents", "{:,} documents"), ("documents_in", "of {:,}"), ("tokens_train", "{:,} tokens"),
           ("tokens", "{:,} tokens"), ("final_loss", "loss {:.3f}"), ("target_loss", "target loss {:.3f}"),
           ("predicted_target_loss", "predicted target loss {:.3f}"), ("val_loss", "val_loss {:.3f}"),
           ("canary_loss", "canary loss {:.3f}"), ("roc_auc_held_out", "held-out ROC AUC {:.2f}"),
           ("val_perplexity", "perplexity {:.0f}"),
           ("vocab_size", "vocabulary {:,}"), ("runs_trained", "{:,} proxy runs trained"), ("verdict_text", "{}")]


def key_figures(metadata: dict) -> str:
    """'2,886 documents of 2,893', '32,768 tokens, loss 7.517, val_loss 7.437 (mean of 4)': the FIGURES an asset's
    metadata has (a dict of numbers, a loss per domain, by its mean)."""
    shown: list[str] = []
    for key, form in FIGURES:
        value = metadata.get(key)
        if isinstance(value, dict) and value and all(isinstance(v, (int, float)) for v in value.values()):
            text = form.format(sum(value.values()) / len(value)) + f" (mean of {len(value)})"
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            text = form.format(value)
        elif isinstance(value, str) and value.strip():  # a verdict: its first line (an ablation's first arm)
            text = form.format(value.strip().splitlines()[0])
        else:
            continue
        if form.startswith("of") and shown:
            shown[-1] += f" {text}"
        else:
            shown.append(text)
    return ", ".join(shown)
