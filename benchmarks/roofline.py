"""The floor under a stacked epoch of the engine (issue 39's target: the 100 networks of a sweep in at most 3x one
network's epoch): its matrix products at a measured GEMM rate plus its optimiser's memory traffic at a measured
bandwidth, stack by stack, summed (a roofline; the device check measures both rates, `benchmarks.gpu_check`).

A stacked optimiser step of `empirics.nets.engine` reads and writes W-sized float arrays (W, its gradient, Adam's two
moments, temporaries) a fixed number of times (`optimiser_passes`, counted from the operations each update dispatches
by `tests/benchmarks/test_roofline.py`), and the gradient's product writes one more. At the paper's widths the
stacks' W are far larger than any cache, so each pass streams from device memory. The floor leaves out everything
else (the forward activations, about batch / d of W's size per pass; launches; the loss checks), so an epoch cannot
be faster than it: where the floor alone exceeds a target, the target cannot be met by that arithmetic, however the
engine is tuned, and the record says so instead of leaving it to a measured miss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from empirics.nets.engine import flops_per_step

#: Bytes per float32 element (the engine trains in float32).
FLOAT32_BYTES = 4
#: A stack whose W is smaller than this may stay in the last-level cache between passes (an H100's and an H200's L2
#: hold 50 MiB, the 2-core EPYC's L3 32 MiB), so the floor counts no memory time for it: a floor is a lower bound.
CACHE_BYTES = 64 << 20


@dataclass(frozen=True)
class EpochShape:
    """One epoch's data: n points in batches of `batch`, inputs of dimension `d`, `out_dim` outputs."""

    n: int
    batch: int
    d: int
    out_dim: int


@dataclass(frozen=True)
class Rates:
    """A device's measured prices: float32 GEMM FLOP/s and device-memory bytes/s (read + write)."""

    gemm_flop_s: float
    bandwidth_b_s: float


def optimiser_passes(fused: bool, padded: bool, weight_decay: float, decay: str) -> int:
    """Reads plus writes of W-sized arrays in one Adam step of a stack: torch's fused kernel reads W, the gradient and
    both moments and writes W and the moments (7); the single-tensor operations (`_update`: lerp 3, moment product
    2, addcmul 3, square root 2, bias correction 2, eps 2, addcdiv 4 = 18; `_update_padded` adds the per-network
    step-size product, 2) plus weight decay (coupled: the gradient plus W, 3; decoupled: W scaled in place, 2)."""
    if fused:
        return 7
    passes = 18 + (2 if padded else 0)
    if weight_decay:
        passes += 3 if decay == "coupled" else 2
    return passes


def epoch_floor(stacks: Sequence[tuple[int, int]], shape: EpochShape, rates: Rates, passes: int) -> dict[str, Any]:
    """The floor of one epoch of `stacks` ((networks, padded width) each) of `shape`: per step, the products of every
    network at its stack's padded width at the GEMM rate, and (passes + 1) W-sized arrays (the optimiser's and the
    gradient's write) at the bandwidth for each stack whose W does not fit in `CACHE_BYTES`; seconds of each part
    and their sum."""
    steps = -(-shape.n // shape.batch)
    flops = sum(s * flops_per_step(shape.batch, m, shape.d, shape.out_dim) for s, m in stacks) * steps
    w_bytes = sum(b for s, m in stacks if (b := s * m * shape.d * FLOAT32_BYTES) >= CACHE_BYTES)
    traffic = (passes + 1) * w_bytes * steps
    gemm_s, memory_s = flops / rates.gemm_flop_s, traffic / rates.bandwidth_b_s
    return {"gemm_s": gemm_s, "memory_s": memory_s, "floor_s": gemm_s + memory_s, "flops": flops,
            "bytes": traffic, "optimiser_passes": passes, "steps": steps}
