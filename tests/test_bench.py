"""Every bench script still runs: each one at its `--smoke` size, to its last line `ratio: X.XX`.

No figure is asserted (a smoke run's figures mean nothing, and a shared 2-core machine makes any timing swing):
the point is that `make bench` cannot break unseen. A new script in bench/ is covered by the glob, and must
take `--smoke`. bench/scale.py has its own test below: its quick run materializes the data stages twenty times
(minutes, not seconds).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPTS = sorted((REPO / "bench").glob("*.py"))
RATIO_LINE = re.compile(r"^ratio: -?\d+\.\d\d$")
# A smoke run takes under 30 s even on an AVX2-only CPU; the margin is for a machine busy with other tests.
TIMEOUT_S = 240


def bench_params():
    for script in SCRIPTS:
        if script.name == "scale.py":
            continue  # test_scale_bench_quick
        marks = [pytest.mark.slow]  # 2-25 s each on 2 free cores
        if script.name.startswith("gpu_"):
            # gpu_*.py measure a CUDA device: they run only where one is (tests/conftest.py skips `gpu` elsewhere).
            marks.append(pytest.mark.gpu)
        yield pytest.param(script, id=script.stem, marks=marks)


def run_smoke(script, env) -> subprocess.CompletedProcess:
    """`script --smoke` in a session of its own; returncode None when it ran past TIMEOUT_S, with what it had printed.
    Then the whole session is killed:
    subprocess.run's timeout kills only the script, and the pool processes it started keep its output pipes open,
    so that the wait for its output never ended."""
    process = subprocess.Popen([sys.executable, str(script.relative_to(REPO)), "--smoke"], cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        return subprocess.CompletedProcess(process.args, None, stdout, stderr)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.parametrize("script", list(bench_params()))
def test_bench_smoke(script, pretrain_home):
    env = {
        **os.environ,
        "PRETRAIN_HOME": str(pretrain_home),
        "DAGSTER_HOME": str(pretrain_home / "dagster"),
        "DS_ACCELERATOR": "cuda" if script.name.startswith("gpu_") else "cpu",
        "HF_HUB_OFFLINE": "1",
        # DeepSpeed compiles a C++ op on its first run (~40 s); the shared cache makes later runs reuse it.
        "TORCH_EXTENSIONS_DIR": str(REPO / ".venv" / "torch_extensions"),
    }
    done = run_smoke(script, env)
    if done.returncode is None:
        # Twice in one session's suites, datatrove's own 2-worker pool (bench/ingest.py's baseline) never returned
        # after both of its tasks had completed, on a machine busy with other tests; never alone. A second hang fails.
        done = run_smoke(script, env)
    if done.returncode is None:
        pytest.fail(f"{script.name} --smoke ran past {TIMEOUT_S} s twice; stdout ends:\n{done.stdout[-2000:]}")
    assert done.returncode == 0, (f"{script.name} --smoke exited {done.returncode}; stderr ends:\n"
                                  f"{done.stderr[-4000:]}\nstdout ends:\n{done.stdout[-2000:]}")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines and RATIO_LINE.match(lines[-1]), (
        f"{script.name} --smoke: the last line of stdout should be `ratio: X.XX`, got "
        f"{lines[-1] if lines else 'no output'!r}; stdout ends:\n{done.stdout[-2000:]}")


SCALE_TIMEOUT_S = 1200  # four homes x five stages, each a `pretrain materialize` (~5 min on 2 busy cores)


@pytest.mark.slow
def test_scale_bench_quick(pretrain_home):
    """bench/scale.py --quick: a small corpus at 1x and 4x through every data stage with 1 and 2 workers, each
    stage's figures and the RSS growth printed, the smallest speed-up last."""
    env = {**os.environ, "PRETRAIN_HOME": str(pretrain_home), "DAGSTER_HOME": str(pretrain_home / "dagster"),
           "HF_HUB_OFFLINE": "1"}
    try:
        done = subprocess.run([sys.executable, "bench/scale.py", "--quick"], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=SCALE_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"scale.py --quick ran past {SCALE_TIMEOUT_S} s; stdout ends:\n"
                    f"{(exc.stdout or b'').decode(errors='replace')[-2000:]}")
    assert done.returncode == 0, f"stderr ends:\n{done.stderr[-4000:]}\nstdout ends:\n{done.stdout[-2000:]}"
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert RATIO_LINE.match(lines[-1]), f"the last line should be `ratio: X.XX`, got {lines[-1]!r}"
    for stage in ("raw ingest", "filter", "dedup", "decontamination", "tokenize+pack"):
        rows = [line for line in lines if re.match(rf"{re.escape(stage)}\s+[14]x\s+\d+", line)]
        assert len(rows) == 2, (stage, done.stdout[-3000:])  # 1x and 4x, each with both worker counts
    assert any(line.startswith("dedup cluster step:") and "bytes" in line for line in lines)
