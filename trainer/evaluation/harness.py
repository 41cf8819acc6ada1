"""lm-evaluation-harness on a checkpoint: exported as a Hugging Face Llama model, Qwen3 with QK-norm
(trainer/evaluation/export.py), and scored by lm-eval's own `simple_evaluate` (model "hf", fp32) on the benchmark files of the recipe's benchmark folder.

    results = lm_eval_checkpoint("checkpoints/step-00000100", tokenizer="tokenizer.json",
                                 benchmarks="../shared/data/benchmarks", tasks=["hellaswag", "arc_easy"], limit=50,
                                 work="scratch/eval")
    results["results"]["arc_easy"]  # {"acc,none": 0.31, "acc_stderr,none": 0.066, "acc_norm,none": ..., ...}
    print(results["table"])         # lm-eval's own markdown table

The tasks are lm-eval's: each task file written here `include`s the installed package's own YAML (output type,
metrics and their aggregation, target delimiter, HellaSwag's process_docs) and changes only where the documents come
from, `dataset_path: json` over the local file (nothing is downloaded), and, where the local file's fields are not
the Hugging Face dataset's, how the same prompt is made from them. The task files are written into `work` at run
time, with the benchmark folder's absolute paths filled in. The datasets cache goes to `hf_cache` (default: in
`work`), never to ~/.cache.

Where the local file cannot give lm-eval's prompt to the character, it says so below. trainer/evaluation/evaluate.py makes
the same prompts for the in-training evaluator (tests/trainer/evaluation/test_harness.py checks both pick the same choices).
Needs the `[eval]` extra (lm-eval[hf]); without it `lm_eval_checkpoint` raises HarnessUnavailable.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import yaml

from trainer.evaluation.tasks import TASKS as FILES  # the benchmark file of each task: one place for both evaluators

# What a launcher tells a rank (torchrun's variables; Accelerate and torch.distributed's env:// read them).
RANK_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")

# What each task changes in lm-eval's own task YAML (relative to lm_eval/tasks/) to read the local file.
LM_EVAL_TASKS: dict[str, dict] = {
    # {context, continuation}: the text without its last word, and that word (lm-eval splits `text` at the last space).
    "lambada_openai": {"include": "lambada/lambada_openai.yaml",
                       "doc_to_text": "{{context}}", "doc_to_target": "{{' ' + continuation}}"},
    # The Hugging Face layout (ctx_a, ctx_b, activity_label, endings, label): lm-eval's process_docs as it is.
    "hellaswag": {"include": "hellaswag/hellaswag.yaml"},
    # {query, choices, gold} with query "Question: {question}": lm-eval's "Question: {question}\nAnswer:".
    "arc_easy": {"include": "arc/arc_easy.yaml",
                 "doc_to_text": "{{query}}\nAnswer:", "doc_to_choice": "choices", "doc_to_target": "gold"},
    "arc_challenge": {"include": "arc/arc_challenge.yaml",
                      "doc_to_text": "{{query}}\nAnswer:", "doc_to_choice": "choices", "doc_to_target": "gold"},
    # query is "Question: {goal}\n": lm-eval's "Question: {goal}\nAnswer:" (a goal with trailing whitespace of its
    # own would differ, which the file cannot tell).
    "piqa": {"include": "piqa/piqa.yaml",
             "doc_to_text": "{{query}}Answer:", "doc_to_choice": "choices", "doc_to_target": "gold"},
    # {context_options, continuation, gold}: lm-eval's multiple-input form, the sentence up to the blank with each
    # option as the contexts (doc_to_text an index), the rest of the sentence the continuation.
    "winogrande": {"include": "winogrande/default.yaml",
                   "doc_to_text": "gold", "doc_to_choice": "context_options", "doc_to_target": "continuation"},
    # query is "Passage: {passage}\nQuestion: {question}?": lm-eval's "{passage}\nQuestion: {question}?\nAnswer:";
    # the choices are lm-eval's ["no", "yes"], which are the file's too.
    "boolq": {"include": "super_glue/boolq/default.yaml",
              "doc_to_text": "{{query.removeprefix('Passage: ')}}\nAnswer:", "doc_to_target": "gold"},
    # {question, subject, choices, answer}: the fields of lm-eval's template, one task over every subject with each
    # subject's description, as lm-eval's per-subject tasks have it. lm-eval's `mmlu` is a group of 57 tasks, so
    # its --limit takes N items of each subject; here N items of the file, which is ordered by subject. The group's
    # acc (weighted by size) over all items is this task's acc.
    "mmlu": {"include": "mmlu/default/_default_template_yaml",
             "description": "The following are multiple choice questions (with answers) about "
                            "{{subject.split('_') | join(' ')}}.\n\n"},
}


class HarnessUnavailable(RuntimeError):
    """lm-eval is not installed (the `[eval]` extra)."""


def check_known(tasks: list[str]) -> None:
    for name in tasks:
        if name not in LM_EVAL_TASKS:
            raise ValueError(f"unknown lm-eval task {name!r} (known: {', '.join(LM_EVAL_TASKS)})")


def task_config(name: str, benchmarks: str | Path, hf_cache: str | Path, lm_eval_tasks: Path) -> dict:
    """The task YAML (as a dict) of one task over the local benchmark file."""
    check_known([name])
    data = Path(benchmarks).resolve() / FILES[name].file
    if not data.is_file():
        raise ValueError(f"{name}: benchmark file {data} not found")
    spec = LM_EVAL_TASKS[name]
    return {
        **spec,
        "include": str(lm_eval_tasks / spec["include"]),
        "task": name,
        "dataset_path": "json",  # datasets' JSON-lines builder over the local file: one split, "train"
        "dataset_name": None,
        "dataset_kwargs": {"data_files": str(data), "cache_dir": str(hf_cache)},
        "training_split": None,
        "validation_split": None,
        "test_split": "train",
        "fewshot_split": None,  # zero-shot: no few-shot split to load
        "should_decontaminate": False,  # its query names fields of the Hugging Face layout
    }


def write_tasks(folder: str | Path, tasks: list[str], *, benchmarks: str | Path, hf_cache: str | Path) -> Path:
    """One `<task>.yaml` per task in `folder` (lm-eval's include_path)."""
    import lm_eval.tasks

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    installed = Path(lm_eval.tasks.__file__).parent
    for name in tasks:
        config = task_config(name, benchmarks, hf_cache, installed)
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return folder


def run_lm_eval(model_dir: str | Path, tasks: list[str], *, benchmarks: str | Path, work: str | Path,
                limit: int | None = None, hf_cache: str | Path | None = None, batch_size: int = 16,
                log_samples: bool = False, bootstrap_iters: int = 100_000) -> dict:
    """lm-eval's results for a Hugging Face model folder: its JSON (results, n-samples, configs, versions, ...;
    `samples` with log_samples), plus "table", lm-eval's markdown table of every metric with its stderr, and
    "headline", {task: the metric a summary shows}."""
    work = Path(work)
    hf_cache = Path(hf_cache) if hf_cache else work / "hf-datasets"
    # Offline, and the datasets cache in scratch space (datasets reads the variable when it is first imported; the
    # task files also pass cache_dir, for a process that imported it already).
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ.setdefault("HF_DATASETS_CACHE", str(hf_cache))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
        from lm_eval.utils import handle_non_serializable, make_table
    except ImportError as exc:
        raise HarnessUnavailable(f"lm-evaluation-harness is not installed ({exc}): pip install -c constraints.txt "
                                 "-e '.[eval]'") from None
    import torch

    check_fits(model_dir, tasks, benchmarks=benchmarks, limit=limit)
    folder = write_tasks(work / "tasks", tasks, benchmarks=benchmarks, hf_cache=hf_cache)
    with one_process():
        results = lm_eval.simple_evaluate(
            model="hf", model_args=f"pretrained={model_dir},dtype=float32", tasks=list(tasks), limit=limit,
            device="cuda" if torch.cuda.is_available() else "cpu", batch_size=batch_size, log_samples=log_samples,
            bootstrap_iters=bootstrap_iters, task_manager=TaskManager(include_path=str(folder), include_defaults=False))
    out = json.loads(json.dumps(results, default=handle_non_serializable))
    out["table"] = make_table(results)
    out["headline"] = {name: FILES[name].metrics[0] for name in tasks}  # what a summary shows of each task
    return out


@contextlib.contextmanager
def one_process():
    """lm-eval runs as one process, without a pool of its own, whatever this process's environment says; the rank variables are back after.
    A one-rank trainer run in this process leaves LOCAL_RANK set (DeepSpeed asserts it; trainer.parallel.engine), and
    a launcher's variables may be inherited: with them lm-eval's Accelerate took `pretrain eval` for one of several
    CPU ranks and failed at its env:// rendezvous ("environment variable RANK expected")."""
    from unittest import mock

    with mock.patch.dict(os.environ):  # the whole environment is put back after
        for name in RANK_VARIABLES:
            os.environ.pop(name, None)
        # lm-eval's bootstrap of a stderr forks a multiprocessing pool from this process, which has threads running
        # (torch's, the trainer's watchdog): a child forked while another thread held a lock hung the suite for 15
        # minutes in "bootstrapping for stddev: perplexity". Its serial path takes a second on our item counts.
        os.environ["DISABLE_MULTIPROC"] = "1"
        yield


def check_fits(model_dir: str | Path, tasks: list[str], *, benchmarks: str | Path, limit: int | None) -> None:
    """lm-eval refuses a continuation longer than the model's context (a bare AssertionError deep in its HF model,
    after its set-up): name the task and item first. A model trained on short sequences meets it (the demo's 128
    tokens against a PIQA answer of 138)."""
    from tokenizers import Tokenizer

    from trainer.evaluation.tasks import encode_pair, load_task

    model_dir = Path(model_dir)
    context = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for name in tasks:
        for i, item in enumerate(load_task(name, benchmarks, limit)):
            longest = max(len(encode_pair(tokenizer, ctx, cont)[1]) for ctx, cont in item.requests)
            if longest > context:
                raise ValueError(f"{name}: item {i} has a continuation of {longest} tokens, more than the model's "
                                 f"context ({context}): lm-eval cannot score it (leave {name} out, or evaluate fewer "
                                 f"than {i + 1} items: limit {i} or less)")


def lm_eval_checkpoint(step_folder: str | Path, *, tokenizer: str | Path, benchmarks: str | Path, tasks: list[str],
                       limit: int | None, work: str | Path, hf_cache: str | Path | None = None, **options) -> dict:
    """A committed checkpoint step exported to `work`/hf (config, safetensors, tokenizer), then run_lm_eval."""
    from trainer.evaluation.export import export_checkpoint

    check_known(tasks)  # before the export
    model_dir = export_checkpoint(step_folder, Path(work) / "hf", tokenizer=tokenizer)
    return run_lm_eval(model_dir, tasks, benchmarks=benchmarks, work=work, limit=limit, hf_cache=hf_cache, **options)
