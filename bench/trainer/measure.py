"""What both sides measure, the same way: the wall time at each optimizer step's log (TRL logs
every step here, and logging reads the loss with ``.item()``, so on a GPU the time is taken
after the step's kernels finished), peak memory, and the figures derived from them."""

from __future__ import annotations

import resource
import statistics
import time
from typing import Any

# Dense bf16 tensor-core peak (NVIDIA's datasheets, without sparsity); H200 has H100's compute.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12}


class StepClock:
    """Times of the step logs, by step number, plus anything the trainer logged with them."""

    def __init__(self) -> None:
        self.times: dict[int, float] = {}
        self.cpu: dict[int, float] = {}  # this process's CPU time (all threads): steadier on a shared machine
        self.logged_tokens: dict[int, float] = {}  # TRL's cumulative num_tokens, when it logs it

    def mark(self, step: int, num_tokens: float | None = None) -> None:
        self.times[step] = time.perf_counter()
        self.cpu[step] = time.process_time()
        if num_tokens is not None:
            self.logged_tokens[step] = num_tokens

    def window(self, first: int, last: int) -> float:
        """Seconds from the log of step ``first`` to that of step ``last``: steps first+1..last."""
        missing = [s for s in (first, last) if s not in self.times]
        if missing:
            raise RuntimeError(f"no log for step(s) {missing}; logged steps: {sorted(self.times)}")
        return self.times[last] - self.times[first]


def peak_memory_bytes(device: str) -> int:
    """Over the whole process, model loading included. GPU: the most memory torch allocated on
    the device. CPU: the peak resident set (the imports both sides share included)."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name()
    return "cpu"


def peak_flops(name: str, override_tflops: float | None) -> float | None:
    if override_tflops:
        return override_tflops * 1e12
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def figures(
    clock: StepClock,
    *,
    warmup: int,
    measured: int,
    tokens_per_step: int,
    samples_per_step: int,
    matmul_params: int,
    peak_bytes: int,
    peak_flops_per_s: float | None,
) -> dict[str, Any]:
    """Throughput over steps warmup+1 .. warmup+measured (per step / the median step time),
    and MFU = 6 N tokens/s / peak."""
    seconds = clock.window(warmup, warmup + measured)
    steps = [clock.window(s - 1, s) for s in range(warmup + 1, warmup + measured + 1)]
    step_s = statistics.median(steps)
    tokens_per_s = tokens_per_step / step_s
    flops_per_s = 6 * matmul_params * tokens_per_s
    out: dict[str, Any] = {
        "seconds": round(seconds, 4),
        "step_seconds": [round(x, 4) for x in steps],
        "seconds_per_step": round(step_s, 4),  # the median: one slow step (another process) moves it little
        "mean_seconds_per_step": round(seconds / measured, 4),
        "cpu_seconds_per_step": round((clock.cpu[warmup + measured] - clock.cpu[warmup]) / measured, 4),
        "tokens_per_s": round(tokens_per_s, 1),
        "samples_per_s": round(samples_per_step / step_s, 3),
        "peak_memory_mib": round(peak_bytes / 2**20, 1),
        "model_tflops_per_s": round(flops_per_s / 1e12, 4),
        "mfu": round(flops_per_s / peak_flops_per_s, 4) if peak_flops_per_s else None,
    }
    first, last = warmup, warmup + measured
    if first in clock.logged_tokens and last in clock.logged_tokens:
        # TRL's own count (attention-mask sums): a check on tokens_per_step.
        out["trl_logged_tokens_per_step"] = round(
            (clock.logged_tokens[last] - clock.logged_tokens[first]) / measured, 1
        )
    return out
