"""GPU memory in use, sampled every few milliseconds while something runs.

NVML (the driver's own libnvidia-ml) through ctypes: no CUDA context of our
own, so the samples are what other processes hold, and one read takes well
under a millisecond (nvidia-smi takes ~50 ms, too coarse to time a hand-back).

    with VramSampler(gpu=0, period_s=0.005) as s:
        do_checkpoint()
    s.first_at_or_below(mib)   # seconds from the start to the first such sample

Where NVML cannot be opened, the sampler takes no samples (`error` says why) and
what it wraps runs as without it.
"""

from __future__ import annotations

import ctypes
import threading
import time


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class VramSampler:
    def __init__(self, gpu: int = 0, period_s: float = 0.005):
        self.period_s = period_s
        self.samples: list[tuple[float, int]] = []  # (seconds from start, MiB used)
        self.error = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        try:
            self.nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if self.nvml.nvmlInit_v2() != 0:
                raise RuntimeError("nvmlInit failed")
            self.dev = ctypes.c_void_p()
            if self.nvml.nvmlDeviceGetHandleByIndex_v2(gpu, ctypes.byref(self.dev)) != 0:
                raise RuntimeError(f"no GPU {gpu} in NVML")
            self.used_mib()
        except (OSError, RuntimeError) as e:
            self.error = str(e)

    def used_mib(self) -> int:
        m = _Memory()
        if self.nvml.nvmlDeviceGetMemoryInfo(self.dev, ctypes.byref(m)) != 0:
            raise RuntimeError("nvmlDeviceGetMemoryInfo failed")
        return m.used // 2**20

    def _run(self):
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - self.t0, self.used_mib()))
            time.sleep(self.period_s)

    def __enter__(self):
        self.t0 = time.monotonic()
        if self.error is None:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.error is None:
            self._stop.set()
            self._thread.join()
            self.samples.append((time.monotonic() - self.t0, self.used_mib()))
        return False

    def first_at_or_below(self, mib: float) -> float | None:
        return next((t for t, used in self.samples if used <= mib), None)

    def lowest(self) -> int | None:
        return min((used for _, used in self.samples), default=None)
