"""GPU discovery, telemetry and health for gqnode: real GPUs through NVML, fake ones from a spec, or none."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Protocol

from gq.errors import UsageError
from gq.model import Gpu, parse_gpu_spec
from gq.units import parse_size

log = logging.getLogger("gq.node.gpus")

#: Temperature fake GPUs report, in Celsius: plausible for an idle card.
FAKE_TEMP = 30
#: In gqnode's state directory: each line `INDEX MESSAGE` makes fake GPU INDEX report MESSAGE
#: (an XID error, say) as a health problem, so tests can break a GPU of a running node.
FAULT_FILE = "fake-gpu-faults"
#: In gqnode's state directory, a testing aid: each line `INDEX [used=SIZE] [temp=C] [util=PCT]`
#: makes fake GPU INDEX report those readings (VRAM held by processes not gq's, say), read at
#: every heartbeat, so tests can drive telemetry-aware placement (docs/SCHEDULING.md).
TELEMETRY_FILE = "fake-gpu-telemetry"
#: A telemetry file line's keys -> the readings they set.
_READINGS = {"used": "mem_used", "temp": "temp", "util": "util"}


class GpuSource(Protocol):
    """Where a node's GPUs come from; gqnode talks to nothing else about GPUs."""

    #: "nvml", "fake" or "none".
    kind: str

    def discover(self) -> list[Gpu]:
        """The node's GPUs, numbered as NVML (or the fake spec) numbers them."""
        ...

    def telemetry(self) -> dict[int, dict[str, int]]:
        """GPU index -> {"util": percent, "mem_used": bytes, "temp": Celsius}; unreadable values left out."""
        ...

    def health(self) -> list[str]:
        """Problems found now, one human-readable line each; empty when healthy."""
        ...

    def device_minors(self) -> dict[int, int]:
        """GPU index -> the minor number of its device file /dev/nvidiaMINOR (for the job's
        device rules); a GPU left out has its index as its minor."""
        ...

    def close(self) -> None:
        ...


class FakeGpus:
    """GPUs that exist only in a `--fake-gpus` spec, for testing without hardware."""

    kind = "fake"

    def __init__(self, spec: str, fault_file: Path | None = None,
                 telemetry_file: Path | None = None) -> None:
        self._gpus = parse_gpu_spec(spec)
        self._faults: list[str] = []
        self._fault_file = fault_file
        self._telemetry_file = telemetry_file

    def discover(self) -> list[Gpu]:
        return list(self._gpus)

    def device_minors(self) -> dict[int, int]:
        return {g.index: g.index for g in self._gpus}

    def telemetry(self) -> dict[int, dict[str, int]]:
        out = {g.index: {"util": 0, "mem_used": 0, "temp": FAKE_TEMP} for g in self._gpus}
        for index, readings in self._file_telemetry().items():
            out[index].update(readings)
        return out

    def _file_telemetry(self) -> dict[int, dict[str, int]]:
        """The readings written into the telemetry file now; a bad line is logged and skipped
        (a node must not stop heartbeating over a test's typo)."""
        if self._telemetry_file is None:
            return {}
        try:
            lines = self._telemetry_file.read_text().splitlines()
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("%s: unreadable: %s", self._telemetry_file, exc)
            return {}
        out: dict[int, dict[str, int]] = {}
        for line in filter(str.strip, lines):
            try:
                index, readings = _telemetry_line(line, len(self._gpus))
            except (ValueError, UsageError) as exc:
                log.warning("%s: bad line %r: %s", self._telemetry_file, line, exc)
                continue
            out.setdefault(index, {}).update(readings)
        return out

    def health(self) -> list[str]:
        return [*self._faults, *self._file_faults()]

    def inject_fault(self, index: int, message: str) -> None:
        """Make health() report `message` for GPU `index` from now on, as a real XID error would."""
        self._faults.append(self._fault(index, message))

    def _fault(self, index: int, message: str) -> str:
        if not 0 <= index < len(self._gpus):
            # A fault on a GPU the node does not have would test nothing; say so instead.
            raise ValueError(f"no fake GPU {index}: this node has {len(self._gpus)}")
        return f"GPU {index}: {message}"

    def _file_faults(self) -> list[str]:
        """The faults written into the fault file now (it is read at every heartbeat)."""
        if self._fault_file is None:
            return []
        try:
            lines = self._fault_file.read_text().splitlines()
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as exc:
            return [f"{self._fault_file}: unreadable: {exc}"]
        faults = []
        for line in filter(str.strip, lines):
            index, _, message = line.strip().partition(" ")
            try:
                faults.append(self._fault(int(index), message.strip() or "fault"))
            except ValueError as exc:  # a broken test setup shows, rather than testing nothing
                faults.append(f"{self._fault_file}: bad line {line!r}: {exc}")
        return faults

    def close(self) -> None:
        pass


def _telemetry_line(line: str, count: int) -> tuple[int, dict[str, int]]:
    """`INDEX used=30G temp=91 util=50` -> (INDEX, readings)."""
    first, *pairs = line.split()
    index = int(first)
    if not 0 <= index < count:
        raise ValueError(f"no fake GPU {index}: this node has {count}")
    readings = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in _READINGS or not value:
            raise ValueError(f"expected used=SIZE, temp=C or util=PCT, not {pair!r}")
        readings[_READINGS[key]] = parse_size(value) if key == "used" else int(value)
    return index, readings


class NoGpus:
    """A node without usable GPUs (no NVML); it can still run zero-GPU jobs."""

    kind = "none"

    def discover(self) -> list[Gpu]:
        return []

    def device_minors(self) -> dict[int, int]:
        return {}

    def telemetry(self) -> dict[int, dict[str, int]]:
        return {}

    def health(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


class NvmlGpus:
    """This host's GPUs through NVML; raises NVMLError (or OSError) when NVML cannot start."""

    kind = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml  # lazily: importing gq.node.gpus must not load NVML
            nvml = pynvml
        self._nvml = nvml
        nvml.nvmlInit()
        try:
            # Fixed at start: a GPU that falls off the bus later must show in health(), not vanish.
            self._count: int = nvml.nvmlDeviceGetCount()
        except BaseException:
            nvml.nvmlShutdown()
            raise
        self._open = True

    def discover(self) -> list[Gpu]:
        nv = self._nvml
        gpus = []
        for i in range(self._count):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            name = _text(nv.nvmlDeviceGetName(handle))
            gpus.append(Gpu(index=i, type=gpu_type_of(name), name=name,
                            memory=int(nv.nvmlDeviceGetMemoryInfo(handle).total),
                            uuid=_text(nv.nvmlDeviceGetUUID(handle))))
        return gpus

    def device_minors(self) -> dict[int, int]:
        # NVML numbers GPUs in PCI bus order, the driver its device files in probe order:
        # usually the same, not always.
        minors = {}
        for i in range(self._count):
            try:
                minors[i] = int(self._nvml.nvmlDeviceGetMinorNumber(
                    self._nvml.nvmlDeviceGetHandleByIndex(i)))
            except self._nvml.NVMLError:
                continue
        return minors

    def telemetry(self) -> dict[int, dict[str, int]]:
        nv = self._nvml
        readings = {
            "util": lambda h: int(nv.nvmlDeviceGetUtilizationRates(h).gpu),
            "mem_used": lambda h: int(nv.nvmlDeviceGetMemoryInfo(h).used),
            "temp": lambda h: int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        }
        out: dict[int, dict[str, int]] = {}
        for i in range(self._count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
            except nv.NVMLError:
                continue  # health() reports the lost GPU; telemetry just has nothing for it
            values = {}
            for key, read in readings.items():
                try:
                    values[key] = read(handle)
                except nv.NVMLError:
                    pass  # some GPUs lack a sensor or counter; one gap must not lose the rest
            out[i] = values
        return out

    def health(self) -> list[str]:
        problems = []
        for i in range(self._count):
            try:
                self._nvml.nvmlDeviceGetHandleByIndex(i)
            except self._nvml.NVMLError as e:
                problems.append(f"GPU {i} lost: {e}")
        return problems

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as e:
                log.debug("nvmlShutdown failed: %s", e)


def open_gpus(fake_spec: str | None, nvml: Any = None, fault_file: Path | None = None,
              telemetry_file: Path | None = None) -> GpuSource:
    """FakeGpus for a spec (faults from `fault_file`, readings from `telemetry_file`);
    otherwise NVML, or NoGpus with a warning when NVML is unavailable."""
    if fake_spec is not None:
        return FakeGpus(fake_spec, fault_file, telemetry_file)
    if nvml is None:
        try:
            import pynvml
        except ImportError as e:
            return _no_nvml(e)
        nvml = pynvml
    try:
        return NvmlGpus(nvml)
    except (nvml.NVMLError, OSError) as e:
        return _no_nvml(e)


def _no_nvml(error: BaseException) -> NoGpus:
    log.warning("NVML is unavailable (%s: %s); this node offers zero GPUs. "
                "To test without GPUs, start gqnode with --fake-gpus 8",
                type(error).__name__, error)
    return NoGpus()


def _text(value: bytes | str) -> str:
    # pynvml before 11.5 returned bytes for names and UUIDs.
    return value.decode() if isinstance(value, bytes) else str(value)


_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}
_MODEL_RE = re.compile(r"[a-z]{1,2}\d{1,4}[a-z]?")  # h100, a100, l4, a6000, l40s, a10g, gh200
_SIZE_RE = re.compile(r"\d+[gm]b")


def gpu_type_of(product_name: str) -> str:
    """The short lower-case type `--gpu-type` matches: "NVIDIA H100 80GB HBM3" -> "h100"."""
    words = [w for w in re.split(r"[\s\-_/]+", product_name.lower()) if w and w not in _VENDOR_WORDS]
    for i, word in enumerate(words):
        # "RTX 4090" names one card; but "RTX A6000" is the A6000.
        if word in ("rtx", "gtx") and i + 1 < len(words) and words[i + 1].isdigit():
            return word + words[i + 1]
        if _MODEL_RE.fullmatch(word):
            return word
    meaningful = [w for w in words if not _SIZE_RE.fullmatch(w)]
    last = re.sub(r"[^a-z0-9]", "", meaningful[-1]) if meaningful else ""
    return last or "gpu"
