"""GPU state from NVML (nvidia-ml-py), else from `nvidia-smi --query-gpu`; nothing at all without GPUs.

Kept free of torch: the health gate runs it on every node before the ranks start.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurmkit import trust
from slurmkit.jsontypes import JsonObject

SMI_FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total", "power.draw", "temperature.gpu",
              "ecc.errors.uncorrected.volatile.total")
SMI_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class GpuState:
    index: int
    name: str
    util_pct: float | None
    mem_used_mb: float | None
    mem_total_mb: float | None
    power_w: float | None
    temp_c: float | None
    ecc_uncorrected: int | None
    """Volatile uncorrectable ECC errors since the driver loaded; None where the GPU does not report them."""

    def as_dict(self) -> JsonObject:
        return asdict(self)


def _number(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]", "[Unknown Error]"


def parse_smi(csv: str) -> list[GpuState]:
    """Parse `nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits`."""
    gpus = []
    for line in csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(SMI_FIELDS) or not parts[0].isdigit():
            continue
        ecc = _number(parts[7])
        gpus.append(GpuState(int(parts[0]), parts[1], _number(parts[2]), _number(parts[3]), _number(parts[4]),
                             _number(parts[5]), _number(parts[6]), int(ecc) if ecc is not None else None))
    return gpus


def query_smi(exe: str = "nvidia-smi") -> list[GpuState] | None:
    """None when nvidia-smi is missing or fails (no GPU, no driver)."""
    path = shutil.which(exe)
    if path is None:
        return None
    try:
        proc = subprocess.run([path, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_smi(proc.stdout) if proc.returncode == 0 else None


def query_nvml() -> list[GpuState] | None:
    """None when nvidia-ml-py is not installed or NVML cannot start."""
    try:
        import pynvml  # nvidia-ml-py, optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            power = _nvml(pynvml.nvmlDeviceGetPowerUsage, h)
            gpus.append(GpuState(
                i, str(pynvml.nvmlDeviceGetName(h)), float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                mem.used / 2**20, mem.total / 2**20, power / 1000.0 if power is not None else None,
                _nvml(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
                _nvml(pynvml.nvmlDeviceGetTotalEccErrors, h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                      pynvml.NVML_VOLATILE_ECC)))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _nvml(read: Any, *args: Any) -> Any:
    try:
        return read(*args)
    except Exception:  # NVMLError_NotSupported and friends: the GPU does not report it
        return None


def query() -> tuple[list[GpuState], str]:
    """(the GPUs, their source): NVML first, then nvidia-smi; ([], "none") on a machine without GPUs."""
    for source, fn in (("nvml", query_nvml), ("nvidia-smi", query_smi)):
        gpus = fn()
        if gpus is not None:
            return gpus, source
    return [], "none"


class GpuSampler:
    """Samples in a daemon thread every interval_s and appends a JSON line per sample; silent without GPUs."""

    def __init__(self, path: Path, interval_s: float) -> None:
        self.path, self.interval_s = path, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """False (and no thread) when this node has no GPU to sample."""
        gpus, _ = query()
        if not gpus or self.interval_s <= 0:
            return False
        self._thread = threading.Thread(target=self._loop, name="slurmkit-gpu-sampler", daemon=True)
        self._thread.start()
        return True

    def _loop(self) -> None:
        host = os.uname().nodename
        with os.fdopen(trust.open_append(self.path), "a", buffering=1) as f:
            while not self._stop.is_set():
                gpus, source = query()
                f.write(json.dumps({"time": round(time.time(), 3), "kind": "gpu", "host": host, "source": source,
                                    "gpus": [g.as_dict() for g in gpus]}) + "\n")
                self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=SMI_TIMEOUT_S)
