"""Column-wise Spearman correlations of bootstrap resamples without re-sorting (the validity panel's bootstrap).

The validity panel's interval (`verify.audit.validity.score_estimators`) resamples subsets (rows) with replacement, and
each draw needs the rank of every row among the drawn ones, per test point (column). Ranking the resampled matrix
anew (`scipy.stats.rankdata`) sorts m x t values per matrix and per draw: at 1,047 subsets, 200 test points and a
dozen estimators that was about 3 minutes per look of the adaptive panel on 2 cores. A row drawn w times is w tied
copies, so its average rank among the drawn rows is the weight of the rows strictly below it plus (w + 1) / 2
(and a tie group of several rows shares the group's average); with each column's order sorted once (`Ranked`), a draw
costs a gather and a cumulative sum (`weighted_ranks`). The Spearman correlation of the drawn rows is then the
Pearson correlation of those ranks with the rows weighted by their draw counts (`weighted_spearman`), exactly what
ranking the expanded matrix gives (tests/verify/test_audit_ranks.py checks it against `rankdata` on resampled
matrices, ties included).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Ranked:
    """One matrix (rows: subsets, columns: test points) sorted once per column: `order` the rows in ascending order,
    `back` the flat index that returns a sorted-order array to row order, and for tied values the first and last
    sorted position of each position's tie group (`start`, `end`; None when no column has ties)."""

    order: np.ndarray
    back: np.ndarray
    start: np.ndarray | None
    end: np.ndarray | None


def ranked(a: np.ndarray) -> Ranked:
    """`a` (m x t, finite) sorted once per column, with its tie groups."""
    m, t = a.shape
    order = np.argsort(a, axis=0, kind="stable")
    s = np.take_along_axis(a, order, axis=0)
    inv = np.empty_like(order)
    np.put_along_axis(inv, order, np.broadcast_to(np.arange(m)[:, None], (m, t)), axis=0)
    back = (inv * t + np.arange(t)).ravel()
    tie = np.zeros((m, t), dtype=bool)
    tie[1:] = s[1:] == s[:-1]
    if not tie.any():
        return Ranked(order, back, None, None)
    idx = np.broadcast_to(np.arange(m)[:, None], (m, t))
    start = np.maximum.accumulate(np.where(tie, 0, idx), axis=0)
    last = np.ones((m, t), dtype=bool)
    last[:-1] = ~tie[1:]
    end = np.minimum.accumulate(np.where(last, idx, m - 1)[::-1], axis=0)[::-1]
    return Ranked(order, back, np.ascontiguousarray(start), np.ascontiguousarray(end))


def weighted_ranks(r: Ranked, w: np.ndarray) -> np.ndarray:
    """The average rank of every row among the drawn rows, per column, where row i was drawn `w[i]` times (rows not
    drawn get a rank too; their weight 0 keeps it out of every sum)."""
    ws = w[r.order]
    c = np.cumsum(ws, axis=0)
    if r.start is None:
        rs = c - (ws - 1) / 2
    else:
        below = np.take_along_axis(c, r.start, axis=0) - np.take_along_axis(ws, r.start, axis=0)
        total = np.take_along_axis(c, r.end, axis=0) - below
        rs = below + (total + 1) / 2
    return rs.ravel()[r.back].reshape(rs.shape)


def weighted_spearman(ra: np.ndarray, rb: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per column, the Pearson correlation of the ranks `ra` and `rb` over rows weighted by `w` (the Spearman
    correlation of the drawn rows); NaN where a column is constant among them."""
    total = w.sum()
    mid = (total + 1) / 2  # the mean rank of `total` drawn rows
    da, db = ra - mid, rb - mid
    num = w @ (da * db)
    den = np.sqrt((w @ (da * da)) * (w @ (db * db)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def weighted_nanmean(values: np.ndarray, v: np.ndarray) -> float:
    """The mean over the last axis of `values` with column weights `v` (a column drawn v times counts v times),
    over every leading row too, leaving out NaN; NaN when nothing is finite."""
    vals = np.atleast_2d(values)
    wts = np.broadcast_to(v, vals.shape)
    ok = np.isfinite(vals) & (wts > 0)
    if not ok.any():
        return float("nan")
    return float((np.where(ok, vals, 0.0) * wts).sum() / wts[ok].sum())
