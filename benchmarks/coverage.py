"""`python -m benchmarks.coverage [--json FILE] [--reps N] [--seeds S]`: simulated coverage of every interval method
the claims' rules use (`empirics.intervals`), at the quick preset's sizes, with known truth.

Each scenario draws `reps` experiments of `seeds` seeds (10 at quick) and counts how often the interval
contains the true value; the Monte Carlo error sqrt(c (1 - c) / reps) (about 0.005 at 2,000 replications) is
reported beside each rate. Every row is checked against what its method promises, its nominal rate +- 0.02
(`check`: pass or fail, per method and setting; the check is meaningful from 2,000 replications on):

- flip rates: per seed, a true rate p_s drawn from a beta distribution with mean p and a between-seed sd of 0,
  0.05 or 0.15, then `points` Bernoulli(p_s) flips (50 selected points per seed at quick: tau 0.1 of
  n_train 500; 25 for CIFAR-10). Methods: `t` on the mean flip rate, the paired per-seed difference of two
  models' rates, the per-point paired excess over noise, and `fieller` for Attn/ReLU ratios of raw flip rates
  and of excesses;
- TOST (`tost_ratio`, the no-gap rule's margin, flip rates of two models): a test, not an interval, so what it
  promises is measured: each of its one-sided tests (skewness-corrected t), with the truth on that test's margin,
  rejects with probability alpha (row `size`: 1 - the rejection rate, nominal 0.95); its interval, Fieller's at 1 -
  2 alpha, covers a truth on either margin with probability 0.90 (row `interval`, nominal 0.90). The TOST itself,
  with the truth on a margin, declares equivalence at most alpha of the time (row `level`: 1 - that rate, at least
  0.93). It is an intersection-union test: equivalence needs both one-sided tests to reject, so where the other test
  lacks power (between-seed sd 0.15: its interval is about as wide as the margin) the rate falls well below alpha
  (one minus the rate close to 1). That conservatism is inherent in TOST, not a coverage failure, and is why the
  level row has no upper bound. Its power at the ratio sqrt(lo hi) inside the margin is reported as information (row
  `power`, no check);
- slopes: per seed, log d_w = c_s + b_s log w + noise at the quick widths (16, 64, 256, 512), between-seed sd
  of b_s 0, 0.05 or 0.2; `t` on the per-seed slopes (`empirics.experiments.distance.slope_interval`).

Fieller's exact set is measured (two rays where it is unbounded but excludes a gap, `excluded`); the rules read
an unbounded set as its hull, the whole line, which only widens it.

For contrast it also measures the methods the rules used before: the percentile bootstrap over seeds of the slope
(coverage about 0.75 at 3 seeds), the hierarchical percentile bootstrap of a flip rate, and the min-max of the
per-seed values. Those rows are of kind `reference` and are not checked.
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

from empirics.intervals import ALPHA_TOST, LEVEL, fieller, loglog_slope, t_interval, tost_ratio
from verify.claims.malleability import NO_GAP_BAND

TARGET, TOLERANCE = 0.95, 0.02
#: Fewer replications leave the Monte Carlo error above 0.005 and the +- 0.02 check loses its meaning.
MIN_REPS = 2000
#: What a row's rate is checked against: "interval" and "size" within nominal +- TOLERANCE, "level" at least
#: nominal - TOLERANCE; "power" and "reference" rows are information only.
KINDS = ("interval", "size", "level", "power", "reference")
QUICK_SEEDS = 10
QUICK_POINTS = (50, 25)
QUICK_WIDTHS = (16, 64, 256, 512)
BETWEEN_FLIP = (0.0, 0.05, 0.15)
BETWEEN_SLOPE = (0.0, 0.05, 0.2)


@dataclass
class Coverage:
    """One method in one scenario: how often its interval held the truth (for a test: did not reject a true null;
    for `power`: declared equivalence) in `reps` simulated experiments, against its `nominal` rate."""

    method: str
    scenario: str
    seeds: int
    reps: int
    covered: int
    kind: str = "interval"
    nominal: float | None = TARGET  # None: a power row, nothing promised

    @property
    def reference(self) -> bool:
        return self.kind == "reference"

    @property
    def coverage(self) -> float:
        return self.covered / self.reps

    @property
    def mc_error(self) -> float:
        c = self.coverage
        return math.sqrt(max(c * (1 - c), 1e-12) / self.reps)

    def band(self, tol: float = TOLERANCE) -> tuple[float, float] | None:
        """The rates that pass (None: information only)."""
        if self.nominal is None or self.kind not in ("interval", "size", "level"):
            return None
        if self.kind in ("interval", "size"):
            return (self.nominal - tol, self.nominal + tol)
        return (self.nominal - tol, 1.0)

    def check(self, tol: float = TOLERANCE) -> str:
        """"pass", "fail", or "info" for rows without a band."""
        band = self.band(tol)
        return "info" if band is None else "pass" if band[0] <= self.coverage <= band[1] else "fail"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "coverage": self.coverage, "mc_error": self.mc_error, "band": self.band(),
                "check": self.check()}


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


@dataclass(frozen=True)
class Scenario:
    """Where a method is simulated: the scenario's `name`, `reps` experiments of `seeds` seeds drawn from `rng`."""

    name: str
    seeds: int
    reps: int
    rng: np.random.Generator


def _run(method: str, at: Scenario, trial: Callable[[np.random.Generator], bool], kind: str = "interval"
         ) -> Coverage:
    """`method`'s coverage in scenario `at`: how many of its `reps` trials (drawn in turn from its rng) held."""
    return Coverage(method, at.name, at.seeds, at.reps, sum(trial(at.rng) for _ in range(at.reps)), kind)


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

    at = Scenario(tag, seeds, reps, rng)
    out = [_run("t (flip rate)", at, mean_t),
           _run("t (paired difference of flip rates)", at, diff_t),
           _run("t (excess over noise, paired per point)", at, excess_t),
           _run("fieller (ratio of flip rates)", at, ratio_f),
           _run("fieller (ratio of excesses)", at, ratio_excess_f)]
    if references:
        out += [_run("hierarchical percentile bootstrap (old, flip rate)", at,
                     lambda g: _covers(hierarchical(draw(g)["attn"], g), pa), kind="reference"),
                _run("min-max of per-seed values (old)", at,
                     lambda g: _covers(minmax(draw(g)["attn"].mean(axis=1)), pa), kind="reference")]
    return out


def tost_methods(reps: int, seeds: int, points: int, sd: float, rng: np.random.Generator,
                 margin: tuple[float, float] = NO_GAP_BAND) -> list[Coverage]:
    """What `tost_ratio` promises, with the truth on each margin and at sqrt(lo hi) inside (ReLU-like rate 0.2)."""
    lo, hi = margin
    den, mid = 0.2, math.sqrt(lo * hi)
    tag = f"flip rates, {points} points/seed, between-seed sd {sd:g}"
    counts = np.zeros(6, int)  # upper size, lower size, ci at hi, ci at lo, TOST at hi, TOST at lo; then power
    power = 0

    def rates(g: np.random.Generator, ratio: float) -> tuple[np.ndarray, np.ndarray]:
        a = _flips(g, _rates(g, ratio * den, sd, seeds), points).mean(axis=1)
        return a, _flips(g, _rates(g, den, sd, seeds), points).mean(axis=1)

    for _ in range(reps):
        at_hi, at_lo = tost_ratio(*rates(rng, hi), lo, hi), tost_ratio(*rates(rng, lo), lo, hi)
        counts += [at_hi["p_upper"] >= at_hi["alpha"], at_lo["p_lower"] >= at_lo["alpha"],
                   at_hi["ci"][0] <= hi <= at_hi["ci"][1], at_lo["ci"][0] <= lo <= at_lo["ci"][1],
                   not at_hi["equivalent"], not at_lo["equivalent"]]
        power += tost_ratio(*rates(rng, mid), lo, hi)["equivalent"]
    name = f"tost (ratio inside {lo:g}-{hi:g})"
    one_sided = 1 - ALPHA_TOST
    return [Coverage(f"{name}: upper one-sided test, truth on the upper margin (1 - size)", tag, seeds, reps,
                     int(counts[0]), "size", one_sided),
            Coverage(f"{name}: lower one-sided test, truth on the lower margin (1 - size)", tag, seeds, reps,
                     int(counts[1]), "size", one_sided),
            Coverage(f"{name}: its interval, Fieller at 1 - 2 alpha, truth on either margin", tag, seeds, 2 * reps,
                     int(counts[2] + counts[3]), "interval", 1 - 2 * ALPHA_TOST),
            Coverage(f"{name}: 1 - rate of declaring equivalence, truth on either margin (at most alpha)", tag, seeds,
                     2 * reps, int(counts[4] + counts[5]), "level", one_sided),
            Coverage(f"{name}: power, rate of declaring equivalence at a true ratio of {mid:.3g}", tag, seeds, reps,
                     int(power), "power", None)]


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

    at = Scenario(tag, seeds, reps, rng)
    out = [_run("t (per-seed slopes)", at, lambda g: _covers(t_interval(per_seed(g)), slope))]
    if references:
        out.append(_run("percentile bootstrap over seeds (old slope_interval)", at,
                        lambda g: _covers(seed_bootstrap(per_seed(g), g), slope), kind="reference"))
    return out


def run_all(reps: int = 2000, seeds: int = QUICK_SEEDS, seed: int = 20_260_313, log: Any = print) -> list[Coverage]:
    """Every method at every scenario (the quick preset's sizes by default)."""
    rng = np.random.default_rng(seed)
    out: list[Coverage] = []
    for points in QUICK_POINTS:
        for sd in BETWEEN_FLIP:
            log(f"  flip rates: {points} points, between-seed sd {sd:g}")
            out += flip_methods(reps, seeds, points, sd, rng, references=points == QUICK_POINTS[0])
            out += tost_methods(reps, seeds, points, sd, rng)
    for sd in BETWEEN_SLOPE:
        log(f"  slopes: between-seed sd {sd:g}")
        out += slope_methods(reps, seeds, sd, rng)
    log("  the old slope interval at 3 seeds")
    out += [c for c in slope_methods(reps, 3, 0.05, rng) if c.reference]
    return out


def _table(rows: list[Coverage]) -> str:
    lines = ["| method | kind | scenario | seeds | reps | rate | MC error | band | check |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        band = r.band()
        band_txt = "-" if band is None else f"{band[0]:.2f}-{band[1]:.2f}"
        ok = r.check() if not r.reference else "reference"
        lines.append(f"| {r.method} | {r.kind} | {r.scenario} | {r.seeds} | {r.reps} | {r.coverage:.3f} | "
                     f"{r.mc_error:.3f} | {band_txt} | {ok} |")
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
    bad = [r for r in rows if r.check() == "fail"]
    checked = [r for r in rows if r.check() != "info"]
    print(f"\n{len(checked) - len(bad)} of {len(checked)} checked rows pass (nominal +- {TOLERANCE:g}); "
          f"{len(rows) - len(checked)} information rows; wall {time.perf_counter() - t0:.0f} s")
    if args.reps < MIN_REPS:
        print(f"note: {args.reps} replications (< {MIN_REPS}): the Monte Carlo error exceeds 0.005 and the check "
              "is not meaningful", file=sys.stderr)
    if args.json:
        from ntkm.io import atomic_write_text

        atomic_write_text(args.json, json.dumps({"target": TARGET, "tolerance": TOLERANCE, "reps": args.reps,
                                                 "seeds": args.seeds, "min_reps_for_check": MIN_REPS,
                                                 "passed": not bad, "rows": [r.to_dict() for r in rows]}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
