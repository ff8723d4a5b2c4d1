"""Every malleability rule driven to each of its outcomes by synthetic records (`runs` lists in the
contract of `empirics.malleability.run_malleability`, summarised by `empirics.mall_stats.summarise`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np
import pytest
from fake_records import complete

from empirics.mall_stats import POOLED, summarise
from empirics.malleability import MalleabilityConfig, MalleabilityRecord
from ntkm import codec
from verify.claims import claim_row, evaluate_claim, units
from verify.claims.base import HOLDS, NA, NOT, PARTLY
from verify.claims.malleability import (
    MALLEABILITY_CLAIMS,
    adv_outcome,
    adversarial_intervention_outcome,
    curated_outcome,
    eps_outcome,
    experiment_outcomes,
    flip_outcome,
    malleability_unit_configs,
    no_gap_outcome,
    ratio_outcome,
    spearman_outcome,
)

ATTACKS = ("fgsm", "pgd", "mim")
#: Probability spec: (training, model, intervention, eps) -> {"random": p, attack: p or "=noise"}.
Spec = Callable[[str, str, str, float], dict[str, Any]]


def flat(attn: tuple[float, float], relu: tuple[float, float]) -> Spec:
    """Attack / noise flip fractions per model, the same for every attack, eps and intervention."""
    def spec(training: str, model: str, intervention: str, eps: float) -> dict[str, Any]:
        a, n = attn if model == "attn" else relu
        return {"random": n, **{k: a for k in ATTACKS}}

    return spec


def _flips(p: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Exactly round(p n) flipped points, at random positions."""
    out = np.zeros(n, bool)
    out[: int(round(p * n))] = True
    return rng.permutation(out)


def _measurement(intervention: str, attack: str, eps: float, flips: np.ndarray, rho: float) -> dict[str, Any]:
    return {"intervention": intervention, "attack": attack, "eps": eps, "flip_rate": float(flips.mean()),
            "rho_all": rho, "rho_top": rho, "pair_flip_rate": float(flips.mean()), "n_selected": len(flips),
            "examples": [{"index": i, "old": 1.0, "new": -1.0 if f else 1.0, "flipped": bool(f)}
                         for i, f in enumerate(flips)]}


def fake_record(spec: Spec, *, dataset: str = "mnist", task: str = "10class", n: int = 50,
                seeds: tuple[int, ...] = (0, 1, 2), attacks: tuple[str, ...] = ATTACKS,
                interventions: tuple[str, ...] = ("transformed", "curated", "adversarial"),
                eps_sweep: tuple[float, ...] = (), adv_train: bool = False, seed_baseline: bool = True,
                rho: Callable[[str, str], float] | None = None,
                curated: Callable[[str, str], float] | None = None,
                failing: tuple[tuple[str, str, int], ...] = (), other_failing: bool = False) -> dict[str, Any]:
    """A JSON-round-tripped malleability record whose runs follow `spec`; `failing` lists the
    (training, model, seed) networks below the gate; `rho(model, attack)` and `curated(model, removal)`
    give the per-network scalars (plus a small per-seed jitter)."""
    cfg = MalleabilityConfig(dataset=dataset, task=task, attacks=attacks, interventions=interventions,
                             seeds=seeds, eps_sweep=eps_sweep, adv_train=adv_train, seed_baseline=seed_baseline,
                             n_train=10 * n)
    rho = rho or (lambda m, a: 0.9 if a == "random" else (0.4 if m == "attn" else 0.85))
    curated = curated or (lambda m, removal: 0.5 if removal == "removal" else 0.05)
    runs = []
    for seed in seeds:
        for training in ["standard"] + (["adversarial"] if adv_train else []):
            for model in cfg.models:
                rng = np.random.default_rng([seed, len(model), len(training), 17])
                jitter = 0.01 * (seed - 1)
                ms = []
                for eps in cfg.eps_values:
                    for intervention in ("transformed", "adversarial"):
                        if intervention not in interventions:
                            continue
                        probs = spec(training, model, intervention, eps)
                        noise = _flips(probs["random"], n, rng)
                        ms.append(_measurement(intervention, "random", eps, noise, rho(model, "random") + jitter))
                        for a in attacks:
                            f = noise.copy() if probs[a] == "=noise" else _flips(probs[a], n, rng)
                            ms.append(_measurement(intervention, a, eps, f, rho(model, a) + jitter))
                if "curated" in interventions:
                    for name in ("removal", "random"):
                        ms.append({"intervention": "curated", "attack": name, "eps": None, "removed": [],
                                   "test_loss_change": curated(model, name) + jitter, "test_acc_change": 0.0,
                                   "rho_remaining": 0.8 + jitter, "flip_rate_remaining": 0.1})
                passed = (training, model, seed) not in failing
                run: dict[str, Any] = {
                    "training": training, "model": model, "seed": seed, "measurements": ms,
                    "selected": list(range(n)), "n_selected": n,
                    "gate": {"passed": passed, "reason": "ok" if passed else "train accuracy 0.10 below 0.55"}}
                if seed_baseline and training == "standard":
                    run["seed_baseline"] = {"flip_rate": 0.1, "flipped": _flips(0.1, n, rng).tolist(),
                                            "rho_all": 0.7 + jitter, "other_init_seed": seed + 10_000,
                                            "other_gate": {"passed": not other_failing, "reason": "x"}}
                runs.append(run)
    return complete(MalleabilityRecord, {"config": asdict(cfg), "eps_values": list(cfg.eps_values),
                                         "data": {"label": dataset}, "runs": runs, "summary": summarise(runs, cfg)})


STRONG = flat((0.5, 0.1), (0.12, 0.06))  # Attn excess 0.40, ReLU 0.06: ratio of excesses about 6.7x
GAP2 = flat((0.5, 0.1), (0.3, 0.1))  # a gap, but a ratio of about 2x
LEVEL_ = flat((0.2, 0.1), (0.2, 0.1))  # the same excess for both models


# ---- the summary record -------------------------------------------------------------------------

@pytest.mark.claim("flip-mnist", "flip-cifar10", "flip-binary-mnist", "flip-binary-cifar10", "ratio-6-9x")
def test_summary_has_intervals_counts_and_method():
    rec = fake_record(STRONG)
    s = rec.summary
    assert {"bootstrap", "rows", "pooled", "comparisons", "ratios", "curated", "curated_diff",
            "seed_baseline"} == set(s.to_dict())
    assert s.bootstrap["n_boot"] == 2000 and "hierarchical" in s.bootstrap["method"]
    pooled = [p for p in s.pooled if p["intervention"] == "transformed" and p["model"] == "attn"][0]
    assert pooled["n_seeds"] == 3 and pooled["n_points"] == [50, 50, 50]
    assert pooled["excess_ci"]["value"] == pytest.approx(0.4)
    assert pooled["excess_ci"]["lo"] < 0.4 < pooled["excess_ci"]["hi"]
    cmp_ = [c for c in s.comparisons if c["attack"] == POOLED and c["intervention"] == "transformed"][0]
    assert cmp_["excess_diff_ci"]["value"] == pytest.approx(0.34)
    assert cmp_["ratio_excess_ci"]["value"] == pytest.approx(0.4 / 0.06)
    assert cmp_["ratio_ci"]["value"] == pytest.approx(0.5 / 0.12)
    assert {b["model"] for b in s.seed_baseline} == {"relu", "attn"}
    assert s.seed_baseline[0]["flip_ci"]["value"] == pytest.approx(0.1)


@pytest.mark.claim("flip-mnist", "flip-cifar10", "flip-binary-mnist")
def test_excess_is_paired_per_point():
    """Attacks that flip exactly the noise's points have an excess of exactly 0, interval [0, 0]."""
    rec = fake_record(flat(("=noise", 0.5), (0.12, 0.06)))
    row = [r for r in rec.summary.rows if r["model"] == "attn" and r["intervention"] == "transformed"][0]
    assert row["excess_ci"]["value"] == row["excess_ci"]["lo"] == row["excess_ci"]["hi"] == 0.0


# ---- flip rule ----------------------------------------------------------------------------------

@pytest.mark.claim("flip-mnist", "flip-cifar10", "flip-binary-mnist", "flip-centred-mnist", "flip-softmax-mnist",
                   "flip-qkv-mnist")
def test_flip_rule_holds_partly_and_not():
    assert flip_outcome(fake_record(STRONG), "mnist", "10class").verdict == HOLDS
    o = flip_outcome(fake_record(GAP2), "mnist", "10class")
    assert o.verdict == PARTLY and "overlaps paper" in o.condition and ": no" in o.condition
    reversed_ = flat((0.12, 0.06), (0.5, 0.1))
    o = flip_outcome(fake_record(reversed_), "mnist", "10class")
    assert o.verdict == NOT and "ReLU more malleable" in o.condition
    o = flip_outcome(fake_record(LEVEL_), "mnist", "10class")
    assert o.verdict == NOT and "no evidence" in o.condition


@pytest.mark.claim("flip-mnist", "flip-cifar10", "flip-binary-mnist", "flip-centred-mnist", "flip-softmax-mnist",
                   "flip-qkv-mnist")
def test_flip_rule_does_not_hold_when_attn_attacks_equal_its_noise():
    o = flip_outcome(fake_record(flat(("=noise", 0.5), (0.12, 0.06))), "mnist", "10class")
    assert o.verdict == NOT
    # even when ReLU's attacks flip fewer points than its noise, so that the difference is positive
    o = flip_outcome(fake_record(flat(("=noise", 0.3), (0.05, 0.4))), "mnist", "10class")
    assert o.verdict == PARTLY and "Attn excess" in o.condition


@pytest.mark.claim("flip-mnist", "flip-cifar10", "flip-binary-mnist", "flip-centred-mnist", "flip-softmax-mnist",
                   "flip-qkv-mnist")
def test_flip_rule_ours_shows_excess_intervals_and_seed_baseline():
    o = flip_outcome(fake_record(STRONG), "mnist", "10class")
    assert "excess over noise +40.0 pp [" in o.ours and "seed-to-seed baseline" in o.ours
    assert "PGD: Attn 50.0 %" in o.ours and "3 seeds x 50 points" in o.ours
    assert o.gate and o.condition


@pytest.mark.claim("flip-mnist", "flip-cifar10", "flip-binary-mnist", "flip-centred-mnist", "flip-softmax-mnist",
                   "flip-qkv-mnist")
def test_gate_failure_is_not_measurable():
    o = flip_outcome(fake_record(STRONG, failing=(("standard", "attn", 1),)), "mnist", "10class")
    assert o.verdict == NA and "not measurable" in o.ours and "attn seed 1" in o.ours
    o = flip_outcome(fake_record(STRONG, other_failing=True), "mnist", "10class")
    assert o.verdict == NA and "second init" in o.ours


@pytest.mark.claim("flip-binary-mnist")
def test_flip_rule_binary_uses_its_paper_range():
    gap4 = flat((0.5, 0.1), (0.2, 0.1))  # ratio of excesses 4x: inside the binary range 3.1-4.9x, not 6.4-8.8x
    assert flip_outcome(fake_record(gap4, task="binary"), "mnist", "binary").verdict == HOLDS
    assert flip_outcome(fake_record(GAP2, task="binary"), "mnist", "binary").verdict == PARTLY


# ---- ratio rule and no gap ------------------------------------------------------------------------

def _two(mnist: Spec, cifar: Spec, **kw: Any) -> dict[str, dict[str, Any]]:
    return {"malleability:mnist:10class": fake_record(mnist, **kw),
            "malleability:cifar10:10class": fake_record(cifar, dataset="cifar10", **kw)}


@pytest.mark.claim("ratio-6-9x")
def test_ratio_rule_outcomes():
    assert ratio_outcome(_two(STRONG, STRONG)).verdict == HOLDS
    assert ratio_outcome(_two(STRONG, LEVEL_)).verdict == PARTLY
    o = ratio_outcome(_two(LEVEL_, LEVEL_))
    assert o.verdict == NOT and "v2" in o.ours
    assert ratio_outcome(_two(GAP2, GAP2)).numbers["v2_verdict"] == "holds"


@pytest.mark.claim("flip-binary-cifar10")
def test_no_gap_rule_outcomes():
    same = flat((0.4, 0.1), (0.4, 0.1))
    assert no_gap_outcome(fake_record(same, dataset="cifar10", task="binary", n=200)).verdict == HOLDS
    o = no_gap_outcome(fake_record(flat((0.6, 0.1), (0.2, 0.1)), dataset="cifar10", task="binary"))
    assert o.verdict == NOT
    assert no_gap_outcome(fake_record(flat((0.4, 0.1), (0.3, 0.1)), dataset="cifar10", task="binary")).verdict \
        == PARTLY


# ---- adversarial training -------------------------------------------------------------------------

def _adv(standard: tuple[float, float], adversarial: tuple[float, float], **kw: Any) -> dict[str, Any]:
    def spec(training: str, model: str, intervention: str, eps: float) -> dict[str, Any]:
        a, n = standard if training == "standard" else adversarial
        return {"random": n, "pgd": a}

    return fake_record(spec, attacks=("pgd",), interventions=("transformed",), adv_train=True,
                       seed_baseline=False, **kw)


@pytest.mark.claim("adv-relu-mnist", "adv-attn-mnist", "adv-relu-cifar10", "adv-attn-cifar10")
def test_adv_rule_outcomes():
    assert adv_outcome(_adv((0.3, 0.1), (0.7, 0.1)), "relu").verdict == HOLDS
    assert adv_outcome(_adv((0.7, 0.1), (0.3, 0.1)), "relu").verdict == NOT
    assert adv_outcome(_adv((0.3, 0.1), (0.3, 0.1)), "relu").verdict == PARTLY
    # the raw rate rises but only because noise flips as much more: partly, not holds
    assert adv_outcome(_adv((0.3, 0.1), (0.7, 0.5)), "attn").verdict == PARTLY


@pytest.mark.claim("adv-relu-mnist", "adv-attn-mnist", "adv-relu-cifar10", "adv-attn-cifar10")
def test_adv_rule_gates_the_model_it_judges():
    rec = _adv((0.3, 0.1), (0.7, 0.1), failing=(("adversarial", "relu", 0),))
    o = adv_outcome(rec, "relu")
    assert o.verdict == NA and "relu (adversarially trained) seed 0" in o.ours
    assert adv_outcome(rec, "attn").verdict == HOLDS
    assert flip_outcome(rec, "mnist", "10class").verdict != NA  # reads the standard networks only


# ---- eps ----------------------------------------------------------------------------------------

def _eps(winning: set[float]) -> dict[str, Any]:
    def spec(training: str, model: str, intervention: str, eps: float) -> dict[str, Any]:
        a = 0.6 if model == "attn" and eps in winning else 0.2
        return {"random": 0.1, "pgd": a}

    return fake_record(spec, attacks=("pgd",), interventions=("transformed",), eps_sweep=(0.1, 0.2, 0.5),
                       seed_baseline=False)


@pytest.mark.claim("eps-robustness")
def test_eps_rule_outcomes():
    assert eps_outcome(_eps({0.1, 0.2, 0.3, 0.5})).verdict == HOLDS
    o = eps_outcome(_eps({0.3}))
    assert o.verdict == PARTLY and "1 of 4" in o.condition
    assert eps_outcome(_eps(set())).verdict == NOT


@pytest.mark.claim("eps-robustness")
def test_eps_rule_reads_the_baseline():
    """Attn's raw flip rate is higher at every eps, but so is its noise: the excess is level -> not."""
    def spec(training: str, model: str, intervention: str, eps: float) -> dict[str, Any]:
        return {"random": 0.5, "pgd": 0.6} if model == "attn" else {"random": 0.0, "pgd": 0.1}

    rec = fake_record(spec, attacks=("pgd",), interventions=("transformed",), eps_sweep=(0.1, 0.2, 0.5),
                      seed_baseline=False)
    assert eps_outcome(rec).verdict == NOT


# ---- new rows -------------------------------------------------------------------------------------

@pytest.mark.claim("curated-removal")
def test_curated_rule_outcomes():
    assert curated_outcome(_two(STRONG, STRONG)).verdict == HOLDS
    level = {"curated": lambda m, r: 0.1}
    assert curated_outcome(_two(STRONG, STRONG, **level)).verdict == NOT
    only_attn = {"curated": lambda m, r: 0.5 if (m, r) == ("attn", "removal") else 0.05}
    assert curated_outcome(_two(STRONG, STRONG, **only_attn)).verdict == PARTLY


def _by_intervention(transformed: Spec, adversarial: Spec) -> Spec:
    def spec(training: str, model: str, intervention: str, eps: float) -> dict[str, Any]:
        return (transformed if intervention == "transformed" else adversarial)(training, model, intervention, eps)

    return spec


@pytest.mark.claim("adversarial-intervention")
def test_adversarial_intervention_rule_outcomes():
    assert adversarial_intervention_outcome(_two(LEVEL_, LEVEL_)).verdict == NOT
    strong_adv = _by_intervention(LEVEL_, STRONG)
    assert adversarial_intervention_outcome(_two(strong_adv, strong_adv)).verdict == HOLDS
    assert adversarial_intervention_outcome(_two(strong_adv, LEVEL_)).verdict == PARTLY
    at_noise = _by_intervention(LEVEL_, flat(("=noise", 0.3), (0.05, 0.4)))
    assert adversarial_intervention_outcome(_two(at_noise, at_noise)).verdict == PARTLY


@pytest.mark.claim("spearman-rankings")
def test_spearman_rule_outcomes():
    assert spearman_outcome(_two(STRONG, STRONG)).verdict == HOLDS
    attn_at_noise = {"rho": lambda m, a: 0.5 if m == "attn" else (0.95 if a == "random" else 0.9)}
    assert spearman_outcome(_two(STRONG, STRONG, **attn_at_noise)).verdict == PARTLY
    reversed_ = {"rho": lambda m, a: 0.9 if m == "attn" or a == "random" else 0.4}
    assert spearman_outcome(_two(STRONG, STRONG, **reversed_)).verdict == NOT


# ---- the registry and the command share the rules ------------------------------------------------

@pytest.mark.claim("flip-mnist", "spearman-rankings")
def test_claims_are_empirical_and_evaluated_per_protocol():
    claims = {c.id: c for c in MALLEABILITY_CLAIMS}
    assert {"flip-mnist", "flip-cifar10", "ratio-6-9x", "flip-binary-mnist", "flip-binary-cifar10", "adv-relu-mnist",
            "adv-attn-cifar10", "eps-robustness", "curated-removal", "adversarial-intervention",
            "spearman-rankings"} <= set(claims)
    assert all(c.empirical and c.group == "malleability" for c in claims.values())
    good, bad = _two(STRONG, STRONG), _two(STRONG, STRONG, failing=(("standard", "relu", 0),))
    results = {**{f"{k}@proper": v for k, v in good.items()}, **{f"{k}@paper": v for k, v in bad.items()}}
    row = claim_row(claims["flip-mnist"], results)
    assert row["by_protocol"]["proper"]["verdict"] == "holds"
    assert row["by_protocol"]["paper"]["verdict"] == "not measurable here"
    assert evaluate_claim(claims["spearman-rankings"], results, "proper").verdict == HOLDS


@pytest.mark.claim("flip-mnist", "eps-robustness", "flip-binary-cifar10")
def test_command_verdict_is_the_claim_rule():
    rec = fake_record(GAP2)
    (name, o), = experiment_outcomes(rec)
    assert o == flip_outcome(rec, "mnist", "10class") and o.verdict == PARTLY
    names = [n for n, _ in experiment_outcomes(_eps({0.3}))]
    assert names == ["Attn more malleable", "ranking over eps"]
    assert [n for n, _ in experiment_outcomes(fake_record(LEVEL_, dataset="cifar10", task="binary"))] == ["no gap"]


@pytest.mark.claim("flip-mnist", "flip-cifar10", "flip-binary-mnist", "flip-binary-cifar10")
@pytest.mark.parametrize(("spec", "dataset", "task", "claim_id", "expected"), [
    (STRONG, "mnist", "10class", "flip-mnist", HOLDS),
    (GAP2, "cifar10", "10class", "flip-cifar10", PARTLY),
    (LEVEL_, "mnist", "binary", "flip-binary-mnist", NOT),
    (flat((0.6, 0.1), (0.2, 0.1)), "cifar10", "binary", "flip-binary-cifar10", NOT),
])
def test_command_and_registry_give_one_verdict_on_one_record(spec, dataset, task, claim_id, expected):
    """`verify malleability` (`experiment_outcomes`) and `verify claims` (the registry row, through the cache's
    JSON) judge one record alike, for records whose verdicts differ."""
    rec = fake_record(spec, dataset=dataset, task=task)
    (_, command), = experiment_outcomes(rec)
    claim = {c.id: c for c in MALLEABILITY_CLAIMS}[claim_id]
    unit = units.malleability(dataset, task)
    stored = MalleabilityRecord.from_dict(codec.loads(codec.dumps(rec)))
    row = claim_row(claim, {units.at(unit, p): stored for p in ("paper", "proper")})
    assert command.verdict == expected
    assert row["by_protocol"]["proper"]["verdict"] == row["by_protocol"]["paper"]["verdict"] == expected.value
    assert row["by_protocol"]["proper"]["ours"] == command.ours


def test_unit_configs():
    p = {"mall_width": 64, "mall_n_train": 100, "mall_n_test": 20, "seeds": [0, 1], "attack_steps": 3}
    cfgs = malleability_unit_configs(p, None)
    assert cfgs["malleability:mnist:10class"]["seed_baseline"] is True
    assert cfgs["malleability-adv:cifar10"]["adv_max_epochs"] == 100
    assert all("train" not in c for c in cfgs.values())
    for c in cfgs.values():
        MalleabilityConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in c.items()})


def test_rule_texts_name_the_gate_and_intervals():
    for c in MALLEABILITY_CLAIMS:
        assert "adequacy gate" in c.rule and "95 %" in c.rule, c.id
