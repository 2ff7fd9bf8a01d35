"""Resources a client spends on one piece of local work: CPU utilisation, peak memory and the
torch threads it ran with.

Measured inside the ClientApp around the method's trainer, so every method is metered the same
way (FedKD-NAS's CPU and Mem columns). CPU is this process's CPU time over wall time in percent
of one core (as ``top`` shows it: 200 % is two busy cores); memory is the largest resident set
size sampled during the work. In simulation a Ray actor's resident set includes the Python
runtime, torch and the loaded data set, as a device's would. The thread count shows whether
an actor used the CPUs it was given (fedapp.apps.client_app pins it) or more.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import torch

from fedapp.wire.messages import CPU_PERCENT, PEAK_RSS_MB, TORCH_THREADS, WALL_SECONDS

SAMPLE_SECONDS = 0.05
_STATM = Path("/proc/self/statm")


def resident_bytes() -> int:
    """This process's current resident set size (peak so far where /proc is unavailable)."""
    try:
        return int(_STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if os.uname().sysname == "Darwin" else peak * 1024


@dataclass
class ResourceUse:
    cpu_percent: float
    peak_rss_mb: float
    wall_seconds: float
    torch_threads: int

    def as_metrics(self) -> dict[str, float]:
        return {
            CPU_PERCENT: self.cpu_percent,
            PEAK_RSS_MB: self.peak_rss_mb,
            WALL_SECONDS: self.wall_seconds,
            TORCH_THREADS: float(self.torch_threads),
        }


class ResourceMeter:
    """``with ResourceMeter() as meter: work()`` then ``meter.use``; samples RSS in a thread."""

    def __init__(self) -> None:
        self.use: ResourceUse | None = None
        self._peak = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self._peak = max(self._peak, resident_bytes())

    def __enter__(self) -> ResourceMeter:
        self._peak = resident_bytes()
        self._cpu, self._wall = time.process_time(), time.perf_counter()
        self._sampler.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        wall = time.perf_counter() - self._wall
        cpu = time.process_time() - self._cpu
        self._stop.set()
        self._sampler.join()
        self._peak = max(self._peak, resident_bytes())
        self.use = ResourceUse(
            100 * cpu / max(wall, 1e-9), self._peak / 2**20, wall, torch.get_num_threads()
        )
