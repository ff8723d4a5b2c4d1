"""`python -m benchmarks.coverage [--json FILE] [--reps N] [--seeds S]`: simulated coverage of every interval method
the claims' rules use (`empirics.intervals`), at the quick preset's sizes, with known truth.

Each scenario draws `reps` experiments of `seeds` seeds (10 at quick) and counts how often the 95 % interval
contains the true value; the Monte Carlo error is sqrt(c (1 - c) / reps). Target: 0.95 +- 0.02. Scenarios:

- flip rates: per seed, a true rate p_s drawn from a beta distribution with mean p and a between-seed sd of 0,
  0.05 or 0.15, then `points` Bernoulli(p_s) flips (50 selected points per seed at quick: tau 0.1 of
  n_train 500; 25 for CIFAR-10). Methods: `t` on the mean flip rate, the paired per-seed difference of two
  models' rates, the per-point paired excess over noise, and `fieller` for Attn/ReLU ratios of raw flip rates
  and of excesses;
- TOST: the rejection rate of `tost_ratio` when the true ratio sits on the margin (its size; "coverage" is
  1 - size, which must be at least 0.93: a test may be conservative, and TOST is when the seeds vary a lot);
- slopes: per seed, log d_w = c_s + b_s log w + noise at the quick widths (16, 64, 256, 512), between-seed sd
  of b_s 0, 0.05 or 0.2; `t` on the per-seed slopes (`empirics.distance.slope_interval`).

Fieller's exact set is measured (two rays where it is unbounded but excludes a gap, `excluded`); the rules read
an unbounded set as its hull, the whole line, which only widens it.

For contrast it also measures the methods the rules used before: the percentile bootstrap over seeds of the slope
(coverage about 0.75 at 3 seeds), the hierarchical percentile bootstrap of a flip rate, and the min-max of the
per-seed values. Those rows are marked `reference: true` and are not held to the target.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from empirics.intervals import LEVEL, fieller, loglog_slope, t_interval, tost_ratio

TARGET, TOLERANCE = 0.95, 0.02
QUICK_SEEDS = 10
QUICK_POINTS = (50, 25)
QUICK_WIDTHS = (16, 64, 256, 512)
BETWEEN_FLIP = (0.0, 0.05, 0.15)
BETWEEN_SLOPE = (0.0, 0.05, 0.2)


@dataclass
class Coverage:
    """One method in one scenario: how often its interval held the truth in `reps` simulated experiments."""

    method: str
    scenario: str
    seeds: int
    reps: int
    covered: int
    reference: bool = False
    test: bool = False  # a test's size: only too small a "coverage" (too large a size) misses the target

    @property
    def coverage(self) -> float:
        return self.covered / self.reps

    @property
    def mc_error(self) -> float:
        c = self.coverage
        return math.sqrt(max(c * (1 - c), 1e-12) / self.reps)

    def within(self, tol: float = TOLERANCE) -> bool:
        return self.coverage >= TARGET - tol if self.test else abs(self.coverage - TARGET) <= tol

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "coverage": self.coverage, "mc_error": self.mc_error, "within_target": self.within()}


def _rates(rng: np.random.Generator, mean: float, sd: float, seeds: int) -> np.ndarray:
    """Per-seed true rates from a beta distribution with this mean and sd (all equal to the mean when sd is 0)."""
    if sd == 0:
        return np.full(seeds, mean)
    k = mean * (1 - mean) / sd ** 2 - 1
    if k <= 0:
        raise ValueError(f"a between-seed sd of {sd} is impossible for a rate of mean {mean}")
    return rng.beta(mean * k, (1 - mean) * k, seeds)


def _flips(rng: np.random.Generator, rates: np.ndarray, points: int) -> np.ndarray:
    """`(seeds, points)` Bernoulli flips, one row per seed."""
    return (rng.random((rates.size, points)) < rates[:, None]).astype(float)


def _covers(ci: dict[str, Any], truth: float) -> bool:
    gap = ci.get("excluded")
    return bool(ci["lo"] <= truth <= ci["hi"]) and not (gap and gap[0] < truth < gap[1])


def minmax(values: np.ndarray) -> dict[str, Any]:
    """The old-style interval: the range of the per-seed values (what a percentile bootstrap over 3 seeds becomes)."""
    return {"lo": float(np.min(values)), "hi": float(np.max(values))}


def seed_bootstrap(values: np.ndarray, rng: np.random.Generator, n_boot: int = 400) -> dict[str, Any]:
    """The old percentile bootstrap over seeds of a per-seed mean."""
    boots = values[rng.integers(0, values.size, (n_boot, values.size))].mean(axis=1)
    lo, hi = np.quantile(boots, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return {"lo": float(lo), "hi": float(hi)}


def hierarchical(flips: np.ndarray, rng: np.random.Generator, n_boot: int = 400) -> dict[str, Any]:
    """The old hierarchical percentile bootstrap: seeds resampled, then the points within each drawn seed."""
    s, p = flips.shape
    rows = rng.integers(0, s, (n_boot, s))
    cols = rng.integers(0, p, (n_boot, s, p))
    boots = flips[rows[..., None], cols].mean(axis=(1, 2))
    lo, hi = np.quantile(boots, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return {"lo": float(lo), "hi": float(hi)}


def _run(method: str, scenario: str, seeds: int, reps: int, rng: np.random.Generator,
         trial: Callable[[np.random.Generator], bool], reference: bool = False, test: bool = False) -> Coverage:
    return Coverage(method, scenario, seeds, reps, sum(trial(rng) for _ in range(reps)), reference, test)


def flip_methods(reps: int, seeds: int, points: int, sd: float, rng: np.random.Generator,
                 references: bool = True) -> list[Coverage]:
    """The flip-rate methods at one between-seed sd (Attn 0.45, noise 0.25; ReLU 0.14, noise 0.06)."""
    tag = f"flip rates, {points} points/seed, between-seed sd {sd:g}"
    pa, qa, pr, qr = 0.45, 0.25, 0.14, 0.06
    sd_r = min(sd, 0.1)  # a beta of mean 0.06 cannot have sd 0.15

    def draw(g: np.random.Generator) -> dict[str, np.ndarray]:
        return {"attn": _flips(g, _rates(g, pa, sd, seeds), points), "attn_noise": _flips(g, _rates(g, qa, sd, seeds),
                                                                                          points),
                "relu": _flips(g, _rates(g, pr, sd_r, seeds), points),
                "relu_noise": _flips(g, _rates(g, qr, sd_r / 2, seeds), points)}

    def mean_t(g: np.random.Generator) -> bool:
        return _covers(t_interval(draw(g)["attn"].mean(axis=1)), pa)

    def diff_t(g: np.random.Generator) -> bool:
        d = draw(g)
        return _covers(t_interval(d["attn"].mean(axis=1) - d["relu"].mean(axis=1)), pa - pr)

    def excess_t(g: np.random.Generator) -> bool:
        d = draw(g)
        return _covers(t_interval((d["attn"] - d["attn_noise"]).mean(axis=1)), pa - qa)

    def ratio_f(g: np.random.Generator) -> bool:
        d = draw(g)
        return _covers(fieller(d["attn"].mean(axis=1), d["relu"].mean(axis=1)), pa / pr)

    def ratio_excess_f(g: np.random.Generator) -> bool:
        d = draw(g)
        xa, xr = (d["attn"] - d["attn_noise"]).mean(axis=1), (d["relu"] - d["relu_noise"]).mean(axis=1)
        return _covers(fieller(xa, xr), (pa - qa) / (pr - qr))

    out = [_run("t (flip rate)", tag, seeds, reps, rng, mean_t),
           _run("t (paired difference of flip rates)", tag, seeds, reps, rng, diff_t),
           _run("t (excess over noise, paired per point)", tag, seeds, reps, rng, excess_t),
           _run("fieller (ratio of flip rates)", tag, seeds, reps, rng, ratio_f),
           _run("fieller (ratio of excesses)", tag, seeds, reps, rng, ratio_excess_f)]
    if references:
        out += [_run("hierarchical percentile bootstrap (old, flip rate)", tag, seeds, reps, rng,
                     lambda g: _covers(hierarchical(draw(g)["attn"], g), pa), reference=True),
                _run("min-max of per-seed values (old)", tag, seeds, reps, rng,
                     lambda g: _covers(minmax(draw(g)["attn"].mean(axis=1)), pa), reference=True)]
    return out


def tost_size(reps: int, seeds: int, points: int, sd: float, rng: np.random.Generator,
              margin: tuple[float, float] = (0.67, 1.5)) -> Coverage:
    """1 - the rate at which TOST declares equivalence when the true ratio is the upper margin (its size)."""
    den = 0.2
    num = margin[1] * den

    def trial(g: np.random.Generator) -> bool:
        a = _flips(g, _rates(g, num, sd, seeds), points).mean(axis=1)
        b = _flips(g, _rates(g, den, sd, seeds), points).mean(axis=1)
        return not tost_ratio(a, b, *margin)["equivalent"]

    return _run(f"tost (ratio inside {margin[0]:g}-{margin[1]:g}; 1 - size at the margin)",
                f"flip rates, {points} points/seed, between-seed sd {sd:g}", seeds, reps, rng, trial, test=True)


def slope_methods(reps: int, seeds: int, sd: float, rng: np.random.Generator, references: bool = True,
                  widths: tuple[int, ...] = QUICK_WIDTHS) -> list[Coverage]:
    """Per-seed log-log slopes (true mean slope 0.1, per-width noise sd 0.15 on the log scale)."""
    logw = np.log(np.asarray(widths, float))
    tag = f"log-log slope, widths {list(widths)}, between-seed sd {sd:g}"
    slope = 0.1

    def per_seed(g: np.random.Generator) -> np.ndarray:
        b = slope + sd * g.standard_normal(seeds)
        c = 1.0 + 0.3 * g.standard_normal(seeds)
        d = np.exp(c[:, None] + b[:, None] * logw[None, :] + 0.15 * g.standard_normal((seeds, logw.size)))
        return np.array([loglog_slope(widths, row) for row in d])

    out = [_run("t (per-seed slopes)", tag, seeds, reps, rng, lambda g: _covers(t_interval(per_seed(g)), slope))]
    if references:
        out.append(_run("percentile bootstrap over seeds (old slope_interval)", tag, seeds, reps, rng,
                        lambda g: _covers(seed_bootstrap(per_seed(g), g), slope), reference=True))
    return out


def run_all(reps: int = 2000, seeds: int = QUICK_SEEDS, seed: int = 20_260_313, log: Any = print) -> list[Coverage]:
    """Every method at every scenario (the quick preset's sizes by default)."""
    rng = np.random.default_rng(seed)
    out: list[Coverage] = []
    for points in QUICK_POINTS:
        for sd in BETWEEN_FLIP:
            log(f"  flip rates: {points} points, between-seed sd {sd:g}")
            out += flip_methods(reps, seeds, points, sd, rng, references=points == QUICK_POINTS[0])
            out.append(tost_size(reps, seeds, points, sd, rng))
    for sd in BETWEEN_SLOPE:
        log(f"  slopes: between-seed sd {sd:g}")
        out += slope_methods(reps, seeds, sd, rng)
    log("  the old slope interval at 3 seeds")
    out += [c for c in slope_methods(reps, 3, 0.05, rng) if c.reference]
    return out


def _table(rows: list[Coverage]) -> str:
    lines = ["| method | scenario | seeds | coverage | MC error | within 0.95 +- 0.02 |", "|---|---|---|---|---|---|"]
    for r in rows:
        ok = "reference" if r.reference else ("yes" if r.within() else "NO")
        lines.append(f"| {r.method} | {r.scenario} | {r.seeds} | {r.coverage:.3f} | {r.mc_error:.3f} | {ok} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.coverage", description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="FILE", help="write the rows as JSON to FILE")
    ap.add_argument("--reps", type=int, default=2000, help="replications per method and scenario (default 2000)")
    ap.add_argument("--seeds", type=int, default=QUICK_SEEDS, help="seeds per simulated experiment (quick: 10)")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.seeds < 2:
        print("error: --reps must be >= 1 and --seeds >= 2 (an interval over seeds needs two)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows = run_all(args.reps, args.seeds, log=lambda m: print(m, file=sys.stderr))
    print(_table(rows))
    bad = [r for r in rows if not r.reference and not r.within()]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} rows within target or reference; wall "
          f"{time.perf_counter() - t0:.0f} s")
    if args.json:
        from ntkm.io import atomic_write_text

        atomic_write_text(args.json, json.dumps({"target": TARGET, "tolerance": TOLERANCE, "reps": args.reps,
                                                 "seeds": args.seeds, "rows": [r.to_dict() for r in rows]}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
