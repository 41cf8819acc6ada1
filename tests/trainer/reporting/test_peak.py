"""trainer.reporting.peak: GPU table by dtype, override, the per-machine cache under PRETRAIN_HOME, raise_to, the timing loop."""

from __future__ import annotations

import json

import pytest
import torch

from trainer.reporting import peak as peak_module
from trainer.reporting.peak import Peak, cache_path, device_peak, machine_key, measure_matmul_peak

CPU = torch.device("cpu")
GPU = torch.device("cuda", 0)  # only a name here: nothing runs on it


@pytest.fixture
def measured(monkeypatch):
    """measure_matmul_peak replaced by a recorder returning 2e9 FLOP/s: no real timing in these tests."""
    calls = []

    def fake(device, dtype=torch.bfloat16, **kw):
        calls.append((device, dtype))
        return 2e9

    monkeypatch.setattr(peak_module, "measure_matmul_peak", fake)
    return calls


def gpu_named(monkeypatch, name: str):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


# --- table and override -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, dtype, flops, label", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989e12, "H100 bf16 peak"),
    ("NVIDIA H100 80GB HBM3", "fp32", 67e12, "H100 fp32 peak"),
    ("NVIDIA H200", "bf16", 989e12, "H200 bf16 peak"),
    ("NVIDIA A100-SXM4-40GB", "bf16", 312e12, "A100 bf16 peak"),
    ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12, "A100 fp32 peak"),
])
def test_a_known_gpu_takes_its_dense_peak_for_the_dtype_from_the_table(monkeypatch, measured, name, dtype, flops,
                                                                       label):
    gpu_named(monkeypatch, name)
    peak = device_peak(GPU, dtype)
    assert (peak.flops, peak.label, peak.cache, peak.key) == (flops, label, None, None)
    assert measured == [] and not cache_path().exists()  # nothing measured, nothing cached


def test_a_table_peak_is_never_raised(monkeypatch):
    gpu_named(monkeypatch, "NVIDIA H100 PCIe")
    peak = device_peak(GPU, "bf16")
    peak.raise_to(2e15)
    assert peak.flops == 989e12 and not cache_path().exists()


def test_an_unknown_gpu_is_measured_once_and_cached_under_its_name(monkeypatch, measured):
    gpu_named(monkeypatch, "Tesla T4")
    peak = device_peak(GPU, "fp32")
    assert measured == [(GPU, torch.float32)]
    assert (peak.flops, peak.label, peak.key) == (2e9, "Tesla T4 fp32 matmul peak, measured", "Tesla T4 | fp32")
    assert json.loads(cache_path().read_text()) == {"Tesla T4 | fp32": 2e9}
    assert device_peak(GPU, "fp32").flops == 2e9 and len(measured) == 1


def test_a_configured_peak_wins_over_table_and_measurement(monkeypatch, measured):
    gpu_named(monkeypatch, "NVIDIA H100")
    for device in (GPU, CPU):
        peak = device_peak(device, "bf16", override=123e12)
        assert (peak.flops, peak.label, peak.cache) == (123e12, "configured peak", None)
        peak.raise_to(1e18)
        assert peak.flops == 123e12
    assert measured == [] and not cache_path().exists()


# --- the cache --------------------------------------------------------------------------------------------------


def test_the_cache_lives_under_pretrain_home(pretrain_home, monkeypatch):
    assert cache_path() == pretrain_home / "cache" / "peak_flops.json"
    monkeypatch.setenv("PRETRAIN_HOME", "~/elsewhere")
    assert cache_path() == (peak_module.Path.home() / "elsewhere" / "cache" / "peak_flops.json")
    monkeypatch.delenv("PRETRAIN_HOME")
    assert cache_path() == peak_module.Path(".pretrain") / "cache" / "peak_flops.json"


def test_the_cpu_key_names_processor_kernels_dtype_and_threads():
    key = machine_key(CPU, "bf16")
    parts = key.split(" | ")
    assert parts[0] == peak_module._cpu_model() and parts[0]
    assert parts[1] == f"kernels {torch.backends.cpu.get_cpu_capability()}"
    assert parts[2:] == ["bf16", f"{torch.get_num_threads()} threads"]
    assert machine_key(CPU, "fp32") != key


def test_each_dtype_of_the_cpu_is_measured_once_and_kept_side_by_side(measured):
    bf16 = device_peak(CPU, "bf16")
    fp32 = device_peak(CPU, "fp32")
    assert [dtype for _, dtype in measured] == [torch.bfloat16, torch.float32]
    assert bf16.label == "CPU bf16 matmul peak, measured" and bf16.cache == cache_path()
    assert json.loads(cache_path().read_text()) == {machine_key(CPU, "bf16"): 2e9, machine_key(CPU, "fp32"): 2e9}
    device_peak(CPU, "bf16"), device_peak(CPU, "fp32")
    assert len(measured) == 2  # both read back from the cache
    assert fp32.key == machine_key(CPU, "fp32")


def test_a_cached_figure_is_used_as_it_is(measured):
    cache_path().parent.mkdir(parents=True)
    cache_path().write_text(json.dumps({machine_key(CPU, "fp32"): 7.5e10, "another machine | fp32": 1.0}))
    assert device_peak(CPU, "fp32").flops == 7.5e10 and measured == []


@pytest.mark.parametrize("content", ["{not json", "[1, 2, 3]", ""])
def test_an_unreadable_cache_means_measure_again_and_rewrite_it(measured, content):
    cache_path().parent.mkdir(parents=True)
    cache_path().write_text(content)
    assert device_peak(CPU, "fp32").flops == 2e9 and len(measured) == 1
    assert json.loads(cache_path().read_text()) == {machine_key(CPU, "fp32"): 2e9}


def test_a_home_that_cannot_be_written_just_goes_uncached(pretrain_home, measured):
    pretrain_home.parent.mkdir(parents=True, exist_ok=True)
    pretrain_home.write_text("a file where the home folder should be")  # mkdir of cache/ fails
    assert device_peak(CPU, "fp32").flops == 2e9
    assert device_peak(CPU, "fp32").flops == 2e9 and len(measured) == 2  # nothing cached: measured each time
    assert list(pretrain_home.parent.iterdir()) == [pretrain_home]  # no temporary file left behind


# --- raise_to ---------------------------------------------------------------------------------------------------


def test_raise_to_keeps_the_higher_figure_here_and_in_the_cache(tmp_path):
    cache = tmp_path / "c" / "peak.json"
    cache.parent.mkdir()
    cache.write_text(json.dumps({"other": 3.0, "me": 10.0}))
    peak = Peak(10.0, "measured", cache=cache, key="me")
    for lower in (9.0, 10.0, float("nan")):
        peak.raise_to(lower)
        assert peak.flops == 10.0 and json.loads(cache.read_text()) == {"other": 3.0, "me": 10.0}
    peak.raise_to(12.5)
    assert peak.flops == 12.5 and json.loads(cache.read_text()) == {"other": 3.0, "me": 12.5}
    assert [p.name for p in cache.parent.iterdir()] == ["peak.json"]  # written via a temporary file, renamed


def test_a_raised_cpu_peak_is_what_the_next_start_reads(measured):
    device_peak(CPU, "fp32").raise_to(3e9)
    again = device_peak(CPU, "fp32")
    assert again.flops == 3e9 and len(measured) == 1


# --- the measurement --------------------------------------------------------------------------------------------


class FakeClock:
    """perf_counter advancing `step` seconds a call: every timed matmul takes exactly `step`."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now


def test_the_best_rate_over_the_sizes_is_2n3_over_the_fastest_time(monkeypatch):
    monkeypatch.setattr(peak_module, "time", FakeClock(0.01))
    flops = measure_matmul_peak(CPU, torch.float32, sizes=(8, 16), budget_s=0.05)
    assert flops == pytest.approx(2 * 16**3 / 0.01)  # fast enough: the larger size is tried and is best


def test_a_slow_path_stops_before_the_larger_sizes(monkeypatch):
    monkeypatch.setattr(peak_module, "time", FakeClock(0.1))  # one matmul > budget / 3
    shapes = []
    real_randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *shape, **kw: shapes.append(shape) or real_randn(*shape, **kw))
    flops = measure_matmul_peak(CPU, torch.float32, sizes=(8, 16, 32), budget_s=0.15)
    assert flops == pytest.approx(2 * 8**3 / 0.1)
    assert shapes == [(8, 8), (8, 8)]  # only the first size was built


def test_a_real_tiny_measurement_is_a_positive_finite_rate():
    flops = measure_matmul_peak(CPU, torch.float32, sizes=(16, 32), budget_s=0.005)
    assert 0 < flops < 1e15  # far above any CPU: a broken timer, not a fast machine
