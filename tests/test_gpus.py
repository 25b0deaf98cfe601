"""GPU discovery, telemetry and health (gq.node.gpus) against a stand-in NVML module."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gq.node.gpus import FakeGpus, NoGpus, NvmlGpus, gpu_type_of, open_gpus

GiB = 1024**3


class StandInNvml:
    """Answers exactly the pynvml calls gq uses; `fail[call] = {i, ...}` makes a call raise for GPUs i."""

    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    class Handle:
        def __init__(self, index: int) -> None:
            self.index = index

    def __init__(self, devices: list[dict[str, Any]]) -> None:
        self.devices = devices
        self.fail: dict[str, set[int]] = {}
        self.init_error: BaseException | None = None
        self.calls: list[str] = []

    def _check(self, call: str, index: int = -1) -> None:
        self.calls.append(call)
        if index in self.fail.get(call, ()):
            raise self.NVMLError(f"{call} failed on GPU {index}")

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> StandInNvml.Handle:
        self._check("nvmlDeviceGetHandleByIndex", index)
        return self.Handle(index)

    def nvmlDeviceGetName(self, h: Handle) -> bytes | str:
        self._check("nvmlDeviceGetName", h.index)
        return self.devices[h.index]["name"]

    def nvmlDeviceGetUUID(self, h: Handle) -> bytes | str:
        self._check("nvmlDeviceGetUUID", h.index)
        return self.devices[h.index]["uuid"]

    def nvmlDeviceGetMemoryInfo(self, h: Handle) -> SimpleNamespace:
        self._check("nvmlDeviceGetMemoryInfo", h.index)
        d = self.devices[h.index]
        return SimpleNamespace(total=d["total"], used=d["used"], free=d["total"] - d["used"])

    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> SimpleNamespace:
        self._check("nvmlDeviceGetUtilizationRates", h.index)
        return SimpleNamespace(gpu=self.devices[h.index]["util"], memory=0)

    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature", h.index)
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self.devices[h.index]["temp"]


def two_h100s() -> StandInNvml:
    # Device 0 answers bytes, as pynvml before 11.5 did; device 1 answers str.
    return StandInNvml([
        {"name": b"NVIDIA H100 80GB HBM3", "uuid": b"GPU-aaaa", "total": 80 * GiB,
         "used": 3 * GiB, "util": 57, "temp": 61},
        {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-bbbb", "total": 80 * GiB,
         "used": 0, "util": 0, "temp": 34},
    ])


def test_discovery_through_nvml() -> None:
    gpus = NvmlGpus(two_h100s()).discover()
    assert [g.index for g in gpus] == [0, 1]
    assert [g.type for g in gpus] == ["h100", "h100"]
    assert [g.memory for g in gpus] == [80 * GiB, 80 * GiB]
    assert [g.uuid for g in gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert gpus[0].name == "NVIDIA H100 80GB HBM3"  # decoded from bytes, not "b'...'"


def test_telemetry_values() -> None:
    assert NvmlGpus(two_h100s()).telemetry() == {
        0: {"util": 57, "mem_used": 3 * GiB, "temp": 61},
        1: {"util": 0, "mem_used": 0, "temp": 34},
    }


def test_failing_telemetry_call_omits_only_that_value() -> None:
    nvml = two_h100s()
    nvml.fail["nvmlDeviceGetUtilizationRates"] = {1}
    nvml.fail["nvmlDeviceGetTemperature"] = {0}
    telemetry = NvmlGpus(nvml).telemetry()
    assert telemetry == {0: {"util": 57, "mem_used": 3 * GiB},
                         1: {"mem_used": 0, "temp": 34}}


def test_health_reports_a_lost_gpu() -> None:
    nvml = two_h100s()
    source = NvmlGpus(nvml)
    assert source.health() == []
    nvml.fail["nvmlDeviceGetHandleByIndex"] = {1}
    problems = source.health()
    assert len(problems) == 1
    assert problems[0].startswith("GPU 1 lost: ")
    assert "nvmlDeviceGetHandleByIndex failed on GPU 1" in problems[0]
    assert 1 not in source.telemetry() and 0 in source.telemetry()


def test_close_shuts_nvml_down_once() -> None:
    nvml = two_h100s()
    source = NvmlGpus(nvml)
    source.close()
    source.close()
    assert nvml.calls.count("nvmlShutdown") == 1


def test_open_gpus_uses_nvml_when_it_works() -> None:
    source = open_gpus(None, nvml=two_h100s())
    assert source.kind == "nvml"
    assert len(source.discover()) == 2


@pytest.mark.parametrize("error", [StandInNvml.NVMLError("NVML Shared Library Not Found"),
                                   OSError("libnvidia-ml.so.1: cannot open shared object file")])
def test_open_gpus_without_nvml_offers_zero_gpus_and_warns(
        error: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    nvml = two_h100s()
    nvml.init_error = error
    with caplog.at_level(logging.WARNING, logger="gq.node.gpus"):
        source = open_gpus(None, nvml=nvml)
    assert isinstance(source, NoGpus) and source.kind == "none"
    assert source.discover() == [] and source.telemetry() == {} and source.health() == []
    [record] = [r for r in caplog.records if r.name == "gq.node.gpus"]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "NVML is unavailable" in message and str(error) in message
    assert "zero GPUs" in message and "--fake-gpus 8" in message


def test_open_gpus_with_the_real_pynvml_never_raises() -> None:
    # Whatever this host has: NVML with GPUs, or no driver and a NoGpus fallback.
    source = open_gpus(None)
    try:
        assert source.kind in ("nvml", "none")
        assert set(source.telemetry()) <= {g.index for g in source.discover()}
    finally:
        source.close()


def test_nvml_gpus_defaults_to_pynvml() -> None:
    import pynvml
    try:
        NvmlGpus().close()
    except pynvml.NVMLError:
        pass  # no driver on this host: the point is that pynvml itself was asked


def test_importing_the_module_does_not_load_pynvml() -> None:
    root = Path(__file__).resolve().parent.parent
    code = "import sys, gq.node.gpus; sys.exit('pynvml' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=root).returncode == 0


def test_open_gpus_with_a_spec_is_fake() -> None:
    source = open_gpus("4xa100:40G,4xl4:24G", nvml=SimpleNamespace())  # NVML is never touched
    assert isinstance(source, FakeGpus) and source.kind == "fake"


def test_fake_gpus_from_spec() -> None:
    source = FakeGpus("4xa100:40G,4xl4:24G")
    gpus = source.discover()
    assert [g.index for g in gpus] == list(range(8))
    assert [g.type for g in gpus] == ["a100"] * 4 + ["l4"] * 4
    assert [g.memory for g in gpus] == [40 * GiB] * 4 + [24 * GiB] * 4
    assert len({g.uuid for g in gpus}) == 8
    assert source.telemetry() == {i: {"util": 0, "mem_used": 0, "temp": 30} for i in range(8)}
    assert source.health() == []


def test_inject_fault_shows_in_health() -> None:
    source = FakeGpus("2")
    source.inject_fault(1, "XID 79: GPU has fallen off the bus")
    assert source.health() == ["GPU 1: XID 79: GPU has fallen off the bus"]
    with pytest.raises(ValueError):
        source.inject_fault(2, "no such GPU")


def test_fault_file_is_read_at_every_health_check(tmp_path: Path) -> None:
    faults = tmp_path / "fake-gpu-faults"
    source = open_gpus("2", fault_file=faults)
    assert source.health() == []
    faults.write_text("1 Xid 79: GPU has fallen off the bus\n\n")
    assert source.health() == ["GPU 1: Xid 79: GPU has fallen off the bus"]
    faults.write_text("7 Xid 48\n")  # a GPU the node lacks: the mistake shows, never silence
    (problem,) = source.health()
    assert "bad line '7 Xid 48'" in problem and "no fake GPU 7" in problem
    faults.unlink()
    assert source.health() == []


@pytest.mark.parametrize("product, expected", [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA A100-SXM4-40GB", "a100"),
    ("Tesla V100-SXM2-16GB", "v100"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA RTX A6000", "a6000"),
    ("Tesla T4", "t4"),
    ("NVIDIA A100 80GB PCIe", "a100"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA TITAN Xp", "xp"),  # no model number: the last meaningful word
])
def test_gpu_type_of(product: str, expected: str) -> None:
    assert gpu_type_of(product) == expected
