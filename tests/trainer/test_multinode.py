"""The trainer across nodes: two torchrun "nodes" on this machine (one process each, meeting at a rendezvous on
127.0.0.1) train exactly as one node with two processes.

Each node is its own torchrun agent with --nnodes 2 and its --node_rank, as on two hosts; so LOCAL_RANK is 0 in
both processes and LOCAL_WORLD_SIZE 1, and DeepSpeed cannot take its same-host shortcuts (its shared-memory
all-reduce): the gradients go through gloo over TCP, as between hosts. Only the shared filesystem (both write
under one output_dir, rank 0 the metrics) is what a real cluster would give by NFS or Lustre.
"""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.trainer.conftest import read_metrics, write_run
from tests.ports import free_port

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
RUN = {"train_tokens": 5 * 8 * 64, "deepspeed": {"zero_stage": 1, "bf16": False}}


def cpu_env() -> dict:
    # As tests/trainer/conftest.py's autouse fixture sets, which a module-scoped fixture runs before.
    return {**os.environ, "DS_ACCELERATOR": "cpu", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "TORCH_EXTENSIONS_DIR": str(REPO / ".venv" / "torch_extensions")}


def train_losses(run_json) -> list[float]:
    return [r["loss"] for r in read_metrics(run_json.parent / "out") if r["event"] == "train"]


def launch(args: list, log_path) -> subprocess.Popen:
    # Output to a file, not a pipe: a rank blocked on a full pipe would stall the other in a collective.
    with open(log_path, "w") as log:
        return subprocess.Popen([TORCHRUN, *args], cwd=REPO, env=cpu_env(), stdout=log,
                                stderr=subprocess.STDOUT)


def finish(procs, logs, what: str) -> None:
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, (code, log) in enumerate(zip(codes, logs)):
        assert code == 0, f"{what} [{i}] exit {code}:\n{log.read_text()[-4000:]}"


@pytest.fixture(scope="module")
def one_node_losses(tmp_path_factory) -> list[float]:
    """The reference: one torchrun, two processes on this "node"."""
    one_node = write_run(tmp_path_factory.mktemp("one-node") / "run.json", **RUN)
    log = one_node.parent / "torchrun.log"
    finish([launch(["--standalone", "--nproc_per_node", "2", "-m", "trainer", "--config", str(one_node)], log)],
           [log], "1 node x 2 processes")
    return train_losses(one_node)


@pytest.mark.slow  # ~15-20 s per rendezvous on 2 free cores (5 steps), plus the reference once
@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_two_nodes_one_process_each_match_one_node_two_processes(tmp_path, rendezvous, one_node_losses):
    two_nodes = write_run(tmp_path / "two-nodes" / "run.json", **RUN)
    port = free_port()
    if rendezvous == "static":  # rank 0's agent holds the store at --master_addr:--master_port
        meet = ["--master_addr", "127.0.0.1", "--master_port", str(port)]
    else:  # an elastic rendezvous, as a scheduler without fixed node ranks would use
        meet = ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "multinode-test"]
    logs = [two_nodes.parent / f"node{rank}.log" for rank in (0, 1)]
    nodes = [launch(["--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(rank), *meet,
                     "-m", "trainer", "--config", str(two_nodes)], logs[rank]) for rank in (0, 1)]
    finish(nodes, logs, "2 nodes x 1 process")

    reference, losses = one_node_losses, train_losses(two_nodes)
    assert len(losses) == len(reference) == 5
    # Same data order, same initial weights, and with two ranks a sum of two gradients is the same sum
    # whichever transport carried it.
    assert losses == pytest.approx(reference, abs=1e-6), (losses, reference)
