"""What a real run feeds the recorder: the loop's monotonic clock, and device memory sampled in a thread (NVML on GPUs, host memory on CPU)."""

from __future__ import annotations

import threading
import time
from typing import Any

from vime.report.recorder import HOST, Recorder


class MonotonicClock:
    """The clock asyncio's default loop reads (so the orchestrator's phase times and samples agree)."""

    @property
    def now(self) -> float:
        return time.monotonic()


def _host_used_bytes() -> tuple[int, int]:
    """(used, total) host memory from /proc/meminfo: MemTotal − MemAvailable."""
    fields: dict[str, int] = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            fields[key] = int(rest.split()[0]) * 1024
    total = fields.get("MemTotal", 0)
    return total - fields.get("MemAvailable", total), total


class MemorySampler:
    """Every `interval_s`, each GPU's used memory (NVML: every process on it, engines and trainer alike)
    as (owner "gpu", tag "used"), or, without GPUs, host memory in use as device HOST. `capacity` gives
    each device's total for the report, and `names` the GPUs' names."""

    def __init__(self, recorder: Recorder, *, interval_s: float = 0.5) -> None:
        self.recorder = recorder
        self.interval_s = interval_s
        self.capacity: dict[int, int] = {}
        self.names: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handles: list[Any] = []
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            for h in self._handles:
                name = pynvml.nvmlDeviceGetName(h)
                self.names.append(name.decode() if isinstance(name, bytes) else str(name))
        except Exception:  # noqa: BLE001 - no NVML (CPU machine, or no driver): host memory instead
            self._nvml = None

    def sample(self) -> None:
        if self._nvml is not None:
            for i, h in enumerate(self._handles):
                info = self._nvml.nvmlDeviceGetMemoryInfo(h)
                self.capacity[i] = int(info.total)
                self.recorder.on_memory(i, "gpu", "used", int(info.used), total=int(info.used))
        else:
            used, total = _host_used_bytes()
            self.capacity[HOST] = total
            self.recorder.on_memory(HOST, "host", "used", used, total=used)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> MemorySampler:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="vime-memory-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self.sample()
