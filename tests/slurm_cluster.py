"""A real Slurm cluster on this machine for tests (fixtures registered in tests/conftest.py).

- `slurm_cluster` (session): munged, slurmctld and two slurmd (Debian's slurm-wlm and munge, `make
  system-deps`) started as this test session's own processes, with their key, sockets, state and logs
  under a temporary folder and their ports free on loopback; torn down at the end. The two nodes,
  `<host>-0` and `<host>-1`, are both this host (NodeHostname, NodeAddr 127.0.0.1), each with half its
  CPUs (at least one): a job over both is a real two-node Slurm step. No cgroups (proctrack/linuxproc,
  task/none), no accounting.
- `slurm` (per test): SLURM_CONF pointing at that cluster, and no SLURM_* variable inherited from a job
  that may be running pytest, so `srun` here allocates on the test cluster.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ports import free_port

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sinfo", "scontrol")


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    nodes: list[str]
    partition: str
    processes: dict  # name -> Popen

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *args: str) -> str:
        out = subprocess.run(list(args), env={**_clean_env(), **self.env}, capture_output=True, text=True,
                             timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({out.returncode}): {out.stderr}")
        return out.stdout

    def jobs(self) -> list[dict]:
        """Every job slurmctld still remembers (finished ones for MinJobAge), as `scontrol show job` fields."""
        text = self.run("scontrol", "show", "job", "--oneliner")
        if "No jobs in the system" in text:
            return []
        return [dict(field.split("=", 1) for field in line.split() if "=" in field)
                for line in text.splitlines() if line.strip()]

    def logs(self) -> str:
        parts = []
        for name in ("munged.log", "slurmctld.log", *(f"slurmd-{node}.log" for node in self.nodes)):
            path = self.root / name
            if path.exists():
                parts.append(f"--- {name} (last lines)\n" + "\n".join(path.read_text().splitlines()[-30:]))
        return "\n".join(parts)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}


def _write_conf(root: Path, host: str, nodes: list[str], munge_socket: Path) -> Path:
    user = getpass.getuser()
    # slurmd drains a node configured with more CPUs than the host has: the nodes share them.
    cpus = max(1, (os.cpu_count() or 1) // len(nodes))
    # Memory too (Slurm's default is 1 MB a node, and a job that asks for memory, as datatrove's --mem-per-cpu
    # does, would be refused); it is not a consumable resource here (CR_Core), only a ceiling.
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 // len(nodes)
    node_lines = "".join(f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs={cpus} "
                         f"RealMemory={memory_mb} State=UNKNOWN\n" for node in nodes)
    conf = root / "slurm.conf"
    conf.write_text(f"""\
ClusterName=pretraintest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=600
{node_lines}PartitionName=test Nodes={",".join(nodes)} Default=YES MaxTime=INFINITE State=UP
""")
    return conf


def _stop(processes: dict) -> None:
    for proc in reversed(list(processes.values())):  # the slurmds, slurmctld, then munged
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    missing = [name for name in SLURM_BINARIES if shutil.which(name) is None
               and not Path("/usr/sbin", name).is_file()]
    if missing:
        pytest.fail(f"Slurm is not installed ({', '.join(missing)} missing): `make system-deps` installs "
                    "slurm-wlm and munge")
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool", "munge-key", "munge-run"):
        (root / sub).mkdir()
    # munged refuses a key or socket folder others can write to; clients need to reach the socket.
    (root / "munge-key").chmod(0o700)
    (root / "munge-run").chmod(0o755)
    key = root / "munge-key" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munge_socket = root / "munge-run" / "munge.socket"
    host = socket.gethostname().split(".")[0]
    nodes = [f"{host}-0", f"{host}-1"]
    conf = _write_conf(root, host, nodes, munge_socket)
    env = {**_clean_env(), "SLURM_CONF": str(conf)}
    sbin = lambda name: shutil.which(name) or f"/usr/sbin/{name}"  # noqa: E731  (not on a user's PATH)
    processes: dict[str, subprocess.Popen] = {}
    cluster = SlurmCluster(root=root, conf=conf, nodes=nodes, partition="test", processes=processes)
    try:
        # --force: munged refuses to run as root otherwise; -F / -D: foreground, so these are our children.
        processes["munged"] = subprocess.Popen(
            [sbin("munged"), "-F", "--force", f"--socket={munge_socket}", f"--key-file={key}",
             f"--log-file={root}/munged.log", f"--pid-file={root}/munged.pid", f"--seed-file={root}/munged.seed"],
            stdout=open(root / "munged.out", "w"), stderr=subprocess.STDOUT)
        wait_until(lambda: munge_socket.exists(), 20, "munged's socket", cluster)
        processes["slurmctld"] = subprocess.Popen([sbin("slurmctld"), "-D", "-i"], env=env,
                                                  stdout=open(root / "slurmctld.out", "w"), stderr=subprocess.STDOUT)
        for node in nodes:
            processes[f"slurmd {node}"] = subprocess.Popen([sbin("slurmd"), "-D", "-N", node], env=env,
                                                           stdout=open(root / f"slurmd-{node}.out", "w"),
                                                           stderr=subprocess.STDOUT)

        def idle() -> bool:
            for name, proc in processes.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}\n{cluster.logs()}")
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True)
            return out.returncode == 0 and sorted(out.stdout.splitlines()) == [f"{node} idle" for node in nodes]

        wait_until(idle, 60, f"sinfo to show nodes {', '.join(nodes)} idle", cluster)
        yield cluster
    finally:
        if "slurmctld" in processes and processes["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--partition", "test"], env=env, capture_output=True)
        _stop(processes)


def wait_until(ready, seconds: float, what: str, cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {seconds:.0f} s for {what}\n{cluster.logs()}")
        time.sleep(0.5)


@pytest.fixture
def slurm(slurm_cluster, monkeypatch) -> SlurmCluster:
    for name in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    return slurm_cluster
