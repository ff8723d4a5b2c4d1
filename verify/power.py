"""Power of the retrain-based flip rule, by simulation (issue 40 item 5): can "holds" be reached at a design's size?

The rule (`verify.claims.retrain_flip.FLIP_RETRAIN_RULE`) says "holds" when the lower end of the Wilson interval of
MLP-Attn's attack flip rate over its k top points lies above its baseline (the larger of the random-sign flip rate on
the same points and the seed-to-seed flip rate over k x pairs) and above 2L-ReLU's attack flip rate. `flip_power`
simulates that decision with binomial counts at a true attack flip rate against a true baseline (every baseline at
the same rate, the conservative case), and `design_points` is the smallest k on a grid whose power reaches a target:
the design of the powered study is chosen by this simulation, and every row prints its own power.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from empirics.intervals import wilson

#: The effect the study is sized for (issue 40 item 5): a true flip rate of 0.5 against a baseline of 0.3.
P_ATTACK, P_BASELINE, TARGET = 0.5, 0.3, 0.8
DRAWS = 20_000
GRID = (10, 20, 30, 40, 50, 60, 80, 100, 150, 200)


@lru_cache(maxsize=256)
def flip_power(points: int, p_attack: float = P_ATTACK, p_baseline: float = P_BASELINE, seed_pairs: int | None = None,
               draws: int = DRAWS, seed: int = 0) -> float:
    """Share of `draws` simulated rows of `points` points whose Wilson lower end of the attack flip rate exceeds the
    random-sign rate, the seed-to-seed rate (over `seed_pairs` pairs; `points` when not given) and 2L-ReLU's rate,
    all three drawn at `p_baseline`."""
    rng = np.random.default_rng(seed)
    pairs = seed_pairs or points
    x = rng.binomial(points, p_attack, draws)
    base = np.maximum.reduce([rng.binomial(points, p_baseline, draws) / points,
                              rng.binomial(pairs, p_baseline, draws) / pairs,
                              rng.binomial(points, p_baseline, draws) / points])
    lower = {int(k): wilson(k / points, points)[0] for k in np.unique(x)}
    return float(np.mean([lower[int(k)] > b for k, b in zip(x, base, strict=True)]))


@lru_cache(maxsize=64)
def design_points(target: float = TARGET, p_attack: float = P_ATTACK, p_baseline: float = P_BASELINE,
                  retrain_seeds: int = 10, grid: tuple[int, ...] = GRID) -> int | None:
    """The fewest points on `grid` whose `flip_power` (seed pairs: points x (retrain_seeds choose 2)) reaches
    `target`; None when no grid size does."""
    pairs = retrain_seeds * (retrain_seeds - 1) // 2
    for k in grid:
        if flip_power(k, p_attack, p_baseline, seed_pairs=k * pairs) >= target:
            return k
    return None
