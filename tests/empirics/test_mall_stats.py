"""The per-seed reduction of `empirics.experiments.mall_stats` (seed means, pooling, the excess paired per point),
checked against direct computations; the interval methods themselves are tested in tests/empirics/test_intervals.py."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from empirics.experiments.mall_stats import PAPER_PAIR, pooled, ratio, seed_means, summarise, t_interval
from empirics.experiments.malleability import MalleabilityConfig
from ntkm.errors import UserInputError


def _bernoulli_seeds(rates: list[float], points: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [(rng.random((points, 3)) < p).astype(float) for p in rates]


@pytest.mark.claim("flip-mnist", "flip-cifar10")
def test_seed_means_weigh_every_seed_equally_whatever_its_points():
    rng = np.random.default_rng(3)
    seeds = [s[:n] for s, n in zip(_bernoulli_seeds([0.2, 0.3, 0.5], 50, rng), (50, 20, 7), strict=True)]
    m = seed_means(seeds)
    assert m.shape == (3, 3)
    for s, row in zip(seeds, m, strict=True):
        assert row == pytest.approx(s.mean(axis=0))
    ci = t_interval(list(m[:, 1]))
    assert ci["value"] == pytest.approx(np.mean([s[:, 1].mean() for s in seeds]))


@pytest.mark.claim("flip-mnist", "flip-cifar10")
def test_pooled_is_the_mean_over_the_attack_columns_and_the_excess_is_paired_per_point():
    noise = np.array([1, 0, 1, 0], float)
    mat = np.stack([noise, noise, 1 - noise], axis=1)  # attack 1 flips exactly the noise's points
    m = seed_means([mat, mat])
    assert pooled(m, 2) == pytest.approx([0.5, 0.5])
    assert (m[:, 1] - m[:, 0]) == pytest.approx([0.0, 0.0])
    assert np.mean(mat[:, 1] - mat[:, 0]) == m[0, 1] - m[0, 0]


def test_ratio_of_seed_means_and_per_seed():
    r = ratio([0.4, 0.2], [0.1, 0.0])
    assert r["ratio"] == pytest.approx(0.3 / 0.05) and r["per_seed"] == [pytest.approx(4.0), None]
    assert ratio([0.1], [0.0])["ratio"] is None and math.isnan(ratio([], [])["attn_mean"])


# ---- comparisons of a (treated, control) pair --------------------------------------------------------------------

_ATTACKS = ("fgsm", "pgd", "mim")


def _runs(rates: dict[str, tuple[float, float]], seeds: tuple[int, ...] = (0, 1, 2, 3), n: int = 40,
          ) -> list[dict[str, Any]]:
    """Runs in the contract of `empirics.experiments.malleability.run_malleability` (transformed intervention, eps 0.3):
    per model (attack, noise) flip probabilities, each seed with its own draws and per-network rho."""
    runs = []
    for seed in seeds:
        for model, (p_attack, p_noise) in rates.items():
            rng = np.random.default_rng([seed, len(model), 5])
            ms = []
            for a in ("random", *_ATTACKS):
                flips = rng.random(n) < (p_noise if a == "random" else p_attack * (1 + 0.1 * seed))
                ms.append({"intervention": "transformed", "attack": a, "eps": 0.3, "flip_rate": float(flips.mean()),
                           "rho_all": float(rng.uniform(0.3, 0.9)), "rho_top": 0.5, "pair_flip_rate": 0.1,
                           "examples": [{"index": i, "flipped": bool(f)} for i, f in enumerate(flips)]})
            runs.append({"training": "standard", "model": model, "seed": seed, "measurements": ms})
    return runs


def _config(models: tuple[str, ...]) -> MalleabilityConfig:
    return MalleabilityConfig(models=models, attacks=_ATTACKS, interventions=("transformed",), seeds=(0, 1, 2, 3))


def _renamed(rows: list[dict[str, Any]], old: str, new: str) -> list[dict[str, Any]]:
    """`rows` with the model `old` named `new`, in the rows' values and in their keys (`attn_mean`)."""
    return [{k.replace(f"{old}_", f"{new}_"): (new if k == "model" and v == old else v) for k, v in r.items()}
            for r in rows]


def _without_paper(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "paper_flip_pct"} for r in rows]


@pytest.mark.claim("flip-softmax-mnist", "flip-qkv-mnist")
def test_a_variant_pair_compares_as_the_record_relabelled_as_attn_did():
    """(softmax, relu) summarised with that pair equals, number for number, the route it replaces: the softmax runs
    relabelled as attn and summarised with the paper's pair."""
    runs = _runs({"relu": (0.15, 0.05), "softmax": (0.45, 0.1)})
    direct = summarise(runs, _config(("relu", "softmax")), pair=("softmax", "relu"))
    relabelled = [{**r, "model": "attn" if r["model"] == "softmax" else r["model"]} for r in runs]
    old = summarise(relabelled, _config(("relu", "attn")))
    assert direct.comparisons and direct.comparisons == old.comparisons
    assert direct.ratios and direct.ratios == _renamed(old.ratios, "attn", "softmax")
    assert direct.pooled == _renamed(old.pooled, "attn", "softmax")
    # a row's paper value is its own kind's: the paper has none for softmax (relabelled, it showed MLP-Attn's)
    assert {r["paper_flip_pct"] for r in direct.rows if r["model"] == "softmax"} == {None}
    assert _without_paper(direct.rows) == _without_paper(_renamed(old.rows, "attn", "softmax"))
    assert {"softmax_mean", "relu_mean"} <= set(direct.ratios[0]) and "attn_mean" not in direct.ratios[0]
    # the stored summary of such a unit (the paper's pair, which it does not run) has no comparisons
    stored = summarise(runs, _config(("relu", "softmax")))
    assert (stored.comparisons, stored.ratios, stored.pooled) == ([], [], direct.pooled)


def test_a_pair_not_run_has_no_comparisons_and_a_malformed_pair_is_an_error():
    runs = _runs({"relu": (0.15, 0.05), "attn": (0.45, 0.1)})
    cfg = _config(("relu", "attn"))
    paper = summarise(runs, cfg)
    assert paper.comparisons and paper == summarise(runs, cfg, pair=PAPER_PAIR)
    missing = summarise(runs, cfg, pair=("softmax", "relu"))
    assert (missing.comparisons, missing.ratios) == ([], []) and missing.rows == paper.rows
    with pytest.raises(ValueError, match="two different kinds"):
        summarise(runs, cfg, pair=("attn", "attn"))
    with pytest.raises(UserInputError, match="unknown model 'cnn'"):
        summarise(runs, cfg, pair=("cnn", "relu"))


def test_ratio_keys_its_means_by_the_pair():
    assert set(ratio([0.2], [0.1])) >= {"attn_mean", "relu_mean"}  # the paper's pair: the keys cached records hold
    r = ratio([0.2], [0.0], ("qkv", "relu"))
    assert r["qkv_mean"] == pytest.approx(0.2) and r["relu_mean"] == 0.0 and "2L-ReLU flipped no point" in r["note"]
