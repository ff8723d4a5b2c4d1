"""Multiplicity and power beside every verdict (issue 40 item 6).

A rule decides on several 95 % intervals (a slope and its co-primary twin, a ratio against 1 and two excesses against
0), and the table holds about thirty empirical claims. Each interval a rule compares with a point is recorded as a
*deciding test* (`point_test`): the point, whether the interval excludes it, and the two-sided p-value of the test the
interval inverts, computed from the interval's own per-seed values with scipy (a Student-t interval over seeds is the
one-sample t test of its per-seed values; Fieller's interval for a ratio of paired means excludes r0 exactly when the
paired t test of num - r0 den rejects). Then:

- **Holm** within each claim's deciding tests (family-wise error 0.05 over the intervals one verdict rests on);
- **Benjamini-Hochberg** across the headline verdicts of the claims judged on sampled intervals (the empirical
  claims, over seeds, or over removed points for the influence rows, whose Spearman intervals are tested by Fisher's
  z and sign shares by the exact binomial test; and binary-cifar-kappa; false discovery rate 0.05), each claim's
  p-value the largest Holm-adjusted p of the tests its verdict needed to reject (a verdict needs all of them).
  thm4.7-premise is a deterministic computation on fixed images (no sampling): it has no test to adjust.

Both are printed beside the unadjusted verdict ("survives" or "does not survive"); the verdict itself is the
pre-registered one. A claim whose verdict rests on no rejection (inconclusive, not measurable) has nothing to adjust.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from scipy import stats

ALPHA = 0.05
#: Verdicts that rest on no rejection, with nothing to adjust.
UNADJUSTED = ("inconclusive", "not measurable here", "underdetermined")
METHOD = ("two-sided p of each deciding interval's own test (t over seeds; Fieller as the paired t test of num - r0 "
          f"den), Holm within each claim's deciding tests, Benjamini-Hochberg (scipy) across the headline verdicts "
          f"of the claims judged on seed intervals, both at {ALPHA:g}")


def _t_p(values: Sequence[float], point: float) -> float:
    v = np.asarray([x for x in values if x is not None and math.isfinite(float(x))], float)
    if v.size < 2:
        return math.nan
    sd = float(v.std(ddof=1))
    if sd == 0.0:
        return 0.0 if v[0] != point else 1.0
    t = (float(v.mean()) - point) / (sd / math.sqrt(v.size))
    return float(2 * stats.t.sf(abs(t), v.size - 1))


def interval_p(ci: dict[str, Any], point: float) -> float:
    """Two-sided p-value of the test that `ci` (an `empirics.intervals` interval, or a slope interval) inverts, at
    `point`: the one-sample t test of its per-seed values, or for Fieller's ratio the paired t test of num - point
    den. NaN where the interval keeps no per-seed values."""
    if "per_seed_num" in ci:
        num, den = np.asarray(ci["per_seed_num"], float), np.asarray(ci["per_seed_den"], float)
        ok = np.isfinite(num) & np.isfinite(den)
        return _t_p(list(num[ok] - point * den[ok]), 0.0)
    if "per_seed" in ci:
        return _t_p(ci["per_seed"], point)
    return math.nan


def _ends(ci: dict[str, Any]) -> tuple[float, float]:
    if "ci" in ci:
        return float(ci["ci"][0]), float(ci["ci"][1])
    return float(ci["lo"]), float(ci["hi"])


def point_test(name: str, ci: dict[str, Any] | None, point: float) -> dict[str, Any] | None:
    """One deciding test of a rule: `ci` compared with `point` (`interval_p`); None where there is no interval."""
    if ci is None:
        return None
    lo, hi = _ends(ci)
    return {"name": name, "point": point, "rejected": bool(lo > point or hi < point), "p": interval_p(ci, point),
            **_shown(ci.get("value"), lo, hi)}


def _shown(value: Any, lo: float, hi: float) -> dict[str, Any]:
    """The tested estimate and its interval, for the report's bottom line (the number the verdict rests on)."""
    est = float(value) if isinstance(value, (int, float)) and math.isfinite(float(value)) else None
    return {"estimate": est, "interval": [lo, hi]}


def rank_test(name: str, rho: dict[str, Any], n: int, point: float) -> dict[str, Any] | None:
    """A deciding test on a Spearman correlation over `n` points (the influence rows' bootstrap interval `rho["ci"]`
    against `point`): rejected where the interval excludes the point, as the rule decides; its p-value from the
    Fisher z-transform with the Spearman standard error sqrt(1.06 / (n - 3)) (Fieller, Hartley and Pearson 1957), the
    closed-form test the bootstrap interval approximates. None without an interval or with n < 5."""
    value, ci = rho.get("value"), rho.get("ci")
    if ci is None or value is None or not math.isfinite(float(value)) or n < 5:
        return None
    r = min(max(float(value), -0.999999), 0.999999)
    z = (math.atanh(r) - math.atanh(min(max(point, -0.999999), 0.999999))) / math.sqrt(1.06 / (n - 3))
    lo, hi = float(ci[0]), float(ci[1])
    return {"name": name, "point": point, "rejected": bool(lo > point or hi < point),
            "p": float(2 * stats.norm.sf(abs(z))), **_shown(value, lo, hi)}


def share_test(name: str, k: int, n: int, point: float, ci: Sequence[float]) -> dict[str, Any] | None:
    """A deciding test on a share of `k` in `n` (its Wilson interval `ci`) against `point`: rejected where the interval
    excludes it; the exact binomial test's p-value (scipy). None with no points."""
    if n < 1:
        return None
    lo, hi = float(ci[0]), float(ci[1])
    return {"name": name, "point": point, "rejected": bool(lo > point or hi < point),
            "p": float(stats.binomtest(int(k), int(n), point).pvalue), **_shown(k / n, lo, hi)}


def tests_of(*tests: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The deciding tests given, without the absent ones."""
    return [t for t in tests if t is not None]


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (in the input order): the k-th smallest p times (m - k + 1), made
    monotone and capped at 1."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    out, running = [0.0] * m, 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * p[i]))
        out[i] = running
    return out


def within_claim(tests: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """Holm over a verdict's deciding tests: each test's adjusted p, whether every test that rejected still rejects,
    and the claim's p (the largest adjusted p among the rejected tests); None without tests with a p-value."""
    ts = [t for t in tests if math.isfinite(t.get("p", math.nan))]
    if not ts:
        return None
    adj = holm([t["p"] for t in ts])
    rejected = [a for t, a in zip(ts, adj, strict=True) if t["rejected"]]
    return {"tests": [{**t, "p_holm": a} for t, a in zip(ts, adj, strict=True)],
            "survives_holm": all(a <= ALPHA for a in rejected) if rejected else None,
            "claim_p": max(rejected) if rejected else None}


def across_claims(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per claim id, its Holm block (`within_claim` on the headline condition's tests) with the Benjamini-Hochberg
    adjusted p across every claim whose verdict rests on a rejection of a seed interval (`bh_q`, `survives_bh`): the
    empirical claims and the data claims judged over seeds (binary-cifar-kappa)."""
    blocks = {r["id"]: within_claim(r.get("tests") or []) for r in rows
              if r.get("tests") and r["verdict"] not in UNADJUSTED}
    ids = [i for i, b in blocks.items() if b is not None and b["claim_p"] is not None]
    q = stats.false_discovery_control([blocks[i]["claim_p"] for i in ids], method="bh") if ids else []
    for i, qi in zip(ids, q, strict=True):
        blocks[i] = {**blocks[i], "bh_q": float(qi), "survives_bh": bool(qi <= ALPHA)}
    return {i: {**b, "text": cell(b)} for i, b in blocks.items() if b is not None}


def cell(block: dict[str, Any] | None) -> str:
    """The multiplicity column of a row: 'survives' / 'does not survive' Holm and BH, or '-' with nothing to adjust."""
    if not block or block.get("claim_p") is None:
        return "-"
    holm_txt = "survives" if block["survives_holm"] else "does not survive"
    bh = block.get("bh_q")
    return (f"Holm {holm_txt} (p {block['claim_p']:.2g}); BH q {bh:.2g}: "
            f"{'survives' if block['survives_bh'] else 'does not survive'}" if bh is not None else
            f"Holm {holm_txt} (p {block['claim_p']:.2g})")


#: Simulated draws of `tost_power`.
POWER_DRAWS = 2000


def _one_sided_p_many(d: np.ndarray, greater: bool) -> np.ndarray:
    """`empirics.intervals._one_sided_p` (Hall's monotone skewness-corrected t) for every row of `d` at once."""
    n = d.shape[1]
    m = d.mean(axis=1)
    sd = d.std(axis=1, ddof=1)
    safe = np.where(sd > 0, sd, 1.0)
    t = m / (safe / math.sqrt(n))
    if n >= 3:
        g = n / ((n - 1) * (n - 2)) * ((d - m[:, None]) ** 3).sum(axis=1) / safe ** 3
        a = g / (3 * math.sqrt(n))
        t = t + a * t ** 2 + a * a * t ** 3 / 3 + g / (6 * math.sqrt(n))
    p = stats.t.sf(t, n - 1) if greater else stats.t.cdf(t, n - 1)
    flat = np.where((m > 0) if greater else (m < 0), 0.0, 1.0)
    return np.where(sd > 0, p, flat)


def tost_power(num: Sequence[float], den: Sequence[float], margin: tuple[float, float], ratio: float = 1.0,
               draws: int = POWER_DRAWS, seed: int = 0) -> float:
    """The power of the equivalence test `empirics.intervals.tost_ratio` at the observed spread: the share of
    `draws` simulated runs of as many seeds, paired (num, den) normal with the observed covariance and den's observed
    mean, the true ratio `ratio` (1: no gap at all), that declare equivalence within `margin` = [lo, hi] (both
    one-sided tests reject at its alpha; computed for all draws at once, checked against `tost_ratio` in the tests).
    NaN with fewer than two seeds."""
    from empirics.intervals import ALPHA_TOST

    lo, hi = margin
    x, y = np.asarray(num, float), np.asarray(den, float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size < 2:
        return math.nan
    cov = np.cov(np.vstack([x, y]))
    mean = np.array([ratio * y.mean(), y.mean()])
    sims = np.random.default_rng(seed).multivariate_normal(mean, cov, size=(draws, x.size), method="svd")
    sx, sy = sims[..., 0], sims[..., 1]
    p = np.maximum(_one_sided_p_many(sx - lo * sy, True), _one_sided_p_many(sx - hi * sy, False))
    return float(np.mean(p < ALPHA_TOST))
