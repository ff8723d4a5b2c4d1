"""Every malleability rule driven to each of its outcomes by synthetic records (`runs` lists in the
contract of `empirics.experiments.malleability.run_malleability`, summarised by
`empirics.experiments.mall_stats.summarise`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import pytest
from fake_records import complete

from empirics.experiments.mall_stats import POOLED, summarise
from empirics.experiments.malleability import MalleabilityConfig, MalleabilityRecord
from empirics.intervals import fieller, t_interval
from ntkm import codec
from verify.claims import claim_row, evaluate_claim, units
from verify.claims.base import HOLDS, INCONCLUSIVE, NA, NOT, PARTLY, PartlyAs
from verify.claims.malleability import (
    MALLEABILITY_CLAIMS,
    adv_outcome,
    adversarial_intervention_outcome,
    combine_datasets,
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
WHERE = {"training": "standard", "intervention": "transformed", "eps": 0.3}
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


#: The quick preset's seeds (10): every rule is shown reachable at that size.
QUICK_SEEDS = tuple(range(10))


def fake_record(spec: Spec, *, dataset: str = "mnist", task: str = "10class", n: int = 50,
                seeds: tuple[int, ...] = QUICK_SEEDS, attacks: tuple[str, ...] = ATTACKS,
                interventions: tuple[str, ...] = ("transformed", "curated", "adversarial"),
                eps_sweep: tuple[float, ...] = (), adv_train: bool = False, seed_baseline: bool = True,
                rho: Callable[[str, str], float] | None = None,
                curated: Callable[[str, str], float] | None = None,
                failing: tuple[tuple[str, str, int], ...] = (), other_failing: bool = False,
                scale: Callable[[int, str], float] | None = None) -> dict[str, Any]:
    """A JSON-round-tripped malleability record whose runs follow `spec`; `failing` lists the
    (training, model, seed) networks below the gate; `rho(model, attack)` and `curated(model, removal)`
    give the per-network scalars (plus a small per-seed jitter); `scale(seed, model)` multiplies every flip
    probability of that network (between-seed variation; 1 by default)."""
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
                        k = scale(seed, model) if scale else 1.0
                        probs = {a: p if p == "=noise" else min(1.0, k * p)
                                 for a, p in spec(training, model, intervention, eps).items()}
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


STRONG = flat((0.5, 0.1), (0.12, 0.06))  # a gap: ratio of flip rates about 4.2x, of excesses 6.7x
PAPERLIKE = flat((0.5, 0.1), (0.06, 0.02))  # ratio of flip rates 8.3x: inside the paper's 6.4-8.8x
GAP2 = flat((0.5, 0.1), (0.3, 0.1))  # a gap, but a ratio of about 1.7x
LEVEL_ = flat((0.2, 0.1), (0.2, 0.1))  # the same flip rates and excess for both models


def scattered(seed: int, model: str) -> float:
    """Between-seed variation large enough that 10 seeds cannot tell 1x from the paper's factor: each network's
    rates are 0 or twice the spec's, in patterns that differ between the models."""
    return 2.0 * ((seed if model == "attn" else seed // 2) % 2)


UNINFORMATIVE = {"scale": scattered}
NOISY_GAP = flat((0.2, 0.05), (0.1, 0.02))  # with UNINFORMATIVE: a ratio interval holding 1 and 6.4-8.8x


# ---- the summary record -------------------------------------------------------------------------

@pytest.mark.claim("flip-mnist", "flip-cifar10", "flip-binary-mnist", "flip-binary-cifar10", "ratio-6-9x")
def test_summary_has_intervals_counts_method_and_per_seed_values():
    rec = fake_record(STRONG, **UNINFORMATIVE)
    s = rec.summary
    assert {"bootstrap", "rows", "pooled", "comparisons", "ratios", "curated", "curated_diff",
            "seed_baseline"} == set(s.to_dict())
    assert "Student-t" in s.bootstrap["method"] and "Fieller" in s.bootstrap["ratio_method"]
    pooled = [p for p in s.pooled if p["intervention"] == "transformed" and p["model"] == "attn"][0]
    assert pooled["n_seeds"] == 10 and pooled["n_points"] == [50] * 10
    cmp_ = [c for c in s.comparisons if c["attack"] == POOLED and c["intervention"] == "transformed"][0]
    # every interval is recomputable from the per-seed values it keeps
    per = pooled["excess_ci"]["per_seed"]
    assert pooled["excess_ci"] == t_interval(per)
    assert cmp_["ratio_ci"] == fieller(cmp_["ratio_ci"]["per_seed_num"], cmp_["ratio_ci"]["per_seed_den"])
    relu = [p for p in s.pooled if p["intervention"] == "transformed" and p["model"] == "relu"][0]
    assert cmp_["excess_diff_ci"]["per_seed"] == pytest.approx([a - b for a, b in zip(
        per, relu["excess_ci"]["per_seed"], strict=True)])
    assert cmp_["ratio_ci"]["per_seed_num"] == pytest.approx(pooled["flip_ci"]["per_seed"])
    flat_ = fake_record(STRONG).summary.find("comparisons", **WHERE, attack=POOLED)
    assert flat_["excess_diff_ci"]["value"] == pytest.approx(0.34)
    assert flat_["ratio_excess_ci"]["value"] == pytest.approx(0.4 / 0.06)
    assert flat_["ratio_ci"]["value"] == pytest.approx(0.5 / 0.12)
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
def test_flip_rule_reaches_every_verdict_at_ten_seeds():
    """The paper's factor (raw flip-rate ratio 6.4-8.8x) -> holds; a gap of another size, or Attn's attacks no
    better than its noise -> partly (each named); an interval holding 1 and the factor -> inconclusive; the
    factor excluded without a gap -> does not hold."""
    assert flip_outcome(fake_record(PAPERLIKE), "mnist", "10class").verdict == HOLDS
    o = flip_outcome(fake_record(GAP2), "mnist", "10class")
    assert o.verdict == PARTLY and "not the paper's factor" in o.condition
    assert o.partly_as is PartlyAs.FACTOR_EXCLUDED
    o = flip_outcome(fake_record(flat(("=noise", 0.5), (0.06, 0.02))), "mnist", "10class")
    assert o.verdict == PARTLY and o.partly_as is PartlyAs.NOISE and "not by more than noise" in o.condition
    # Attn beats its own noise and has the paper's factor, but ReLU's excess over noise is as large: the gap is
    # sensitivity to any perturbation, not malleability to attacks (issue 40 item 4)
    o = flip_outcome(fake_record(flat((0.5, 0.45), (0.06, 0.0))), "mnist", "10class")
    assert o.numbers["attn_beyond_noise"] and not o.numbers["gap_beyond_noise"]
    assert o.verdict == PARTLY and o.partly_as is PartlyAs.NOISE and "noise ratio" in o.ours
    o = flip_outcome(fake_record(NOISY_GAP, **UNINFORMATIVE), "mnist", "10class")
    assert o.verdict == INCONCLUSIVE and "contains both" in o.condition
    assert flip_outcome(fake_record(flat((0.12, 0.06), (0.5, 0.1))), "mnist", "10class").verdict == NOT
    assert flip_outcome(fake_record(LEVEL_), "mnist", "10class").verdict == NOT


@pytest.mark.claim("flip-mnist", "flip-cifar10", "flip-binary-mnist", "flip-centred-mnist", "flip-softmax-mnist",
                   "flip-qkv-mnist")
def test_flip_rule_excess_ratio_is_secondary():
    """ReLU's excess straddling 0 makes the ratio of excesses unbounded; the verdict reads the raw ratio."""
    o = flip_outcome(fake_record(flat((0.5, 0.1), (0.06, 0.06))), "mnist", "10class")
    assert o.numbers["ratio_excess_ci"]["bounded"] is False and o.verdict == HOLDS


@pytest.mark.claim("flip-mnist", "flip-cifar10", "flip-binary-mnist", "flip-centred-mnist", "flip-softmax-mnist",
                   "flip-qkv-mnist")
def test_flip_rule_ours_shows_excess_intervals_and_seed_baseline():
    o = flip_outcome(fake_record(STRONG), "mnist", "10class")
    assert "excess over noise +40.0 pp [" in o.ours and "seed-to-seed baseline" in o.ours
    assert "PGD: Attn 50.0 %" in o.ours and "10 seeds x 50 points" in o.ours
    assert o.gate and o.condition


@pytest.mark.claim("flip-mnist", "flip-cifar10", "flip-binary-mnist", "flip-centred-mnist", "flip-softmax-mnist",
                   "flip-qkv-mnist")
def test_gate_failure_is_not_measurable():
    o = flip_outcome(fake_record(STRONG, failing=(("standard", "attn", 1),)), "mnist", "10class")
    assert o.verdict == NA and "not measurable" in o.ours and "attn seed 1" in o.ours
    o = flip_outcome(fake_record(STRONG, other_failing=True), "mnist", "10class")
    assert o.verdict == NA and "second init" in o.ours


#: Per (model, training): analytic-NTK, trained-NTK and network test accuracy; seeds alternate +-0.01 around them.
KERNEL_ACCS = {("attn", "standard"): (0.71, 0.74, 0.80), ("relu", "standard"): (0.62, 0.83, 0.88),
               ("attn", "adversarial"): (0.71, 0.66, 0.70), ("relu", "adversarial"): (0.62, 0.75, 0.79)}


def _with_kernels(rec: MalleabilityRecord) -> MalleabilityRecord:
    """`rec` with each run's kernel-predictor and network test accuracies (`KERNEL_ACCS`) as the experiment stores
    them; the summary is left as it was (it reads none of them)."""
    def accs(r: dict[str, Any]) -> dict[str, float]:
        d = 0.01 * (-1) ** r["seed"]
        a, e, net = KERNEL_ACCS[(r["model"], r["training"])]
        return {"ntk_predictor_test_acc": a + d, "trained_ntk_predictor_test_acc": e - d, "test_acc": net + d}

    return replace(rec, runs=[{**r, **accs(r)} for r in rec.runs])


@pytest.mark.claim("flip-mnist", "flip-cifar10", "flip-binary-mnist", "flip-binary-cifar10", "adv-attn-mnist",
                   "adv-relu-mnist", "flip-qkv-mnist")
def test_rows_show_the_kernel_predictors_beside_the_network_and_keep_their_verdicts():
    head = "kernel predictor test acc (analytic NTK / the trained network's NTK; the network itself): "
    for rec, outcome in ((fake_record(STRONG), lambda r: flip_outcome(r, "mnist", "10class")),
                         (fake_record(LEVEL_, dataset="cifar10", task="binary"), no_gap_outcome),
                         (fake_record(STRONG, failing=(("standard", "attn", 1),)),
                          lambda r: flip_outcome(r, "mnist", "10class"))):
        plain, shown = outcome(rec), outcome(_with_kernels(rec))
        assert shown.verdict is plain.verdict and shown.ours == f"{plain.ours}; {head}ReLU 0.62 / 0.83 (0.88), Attn " \
            "0.71 / 0.74 (0.80)"
        per_seed = shown.numbers["kernel_predictor_test_acc"]["Attn"]
        assert per_seed["seeds"] == list(QUICK_SEEDS)
        assert per_seed["analytic_ntk"] == pytest.approx([0.71 + 0.01 * (-1) ** s for s in QUICK_SEEDS])
        assert per_seed["network"] == pytest.approx([0.80 + 0.01 * (-1) ** s for s in QUICK_SEEDS])
        assert {k: v for k, v in shown.numbers.items() if k != "kernel_predictor_test_acc"} == plain.numbers
    adv = _with_kernels(_adv((0.3, 0.1), (0.7, 0.1)))
    o = adv_outcome(adv, "relu")
    assert o.ours.endswith(f"{head}ReLU 0.62 / 0.83 (0.88), ReLU (adversarial) 0.62 / 0.75 (0.79)")
    qkv = replace(adv, runs=[{**r, "ntk_predictor_test_acc": float("nan")} for r in adv.runs])  # no analytic NTK
    assert f"{head}ReLU - / 0.83 (0.88)" in adv_outcome(qkv, "relu").ours


@pytest.mark.claim("flip-binary-mnist")
def test_flip_rule_binary_uses_its_paper_range():
    gap4 = flat((0.5, 0.1), (0.14, 0.04))  # ratio of flip rates 3.6x: inside the binary range 3.1-4.9x
    assert flip_outcome(fake_record(gap4, task="binary"), "mnist", "binary").verdict == HOLDS
    assert flip_outcome(fake_record(PAPERLIKE, task="binary"), "mnist", "binary").verdict == PARTLY

# ---- ratio rule and no gap ------------------------------------------------------------------------

def _two(mnist: Spec, cifar: Spec, **kw: Any) -> dict[str, dict[str, Any]]:
    return {"malleability:mnist:10class": fake_record(mnist, **kw),
            "malleability:cifar10:10class": fake_record(cifar, dataset="cifar10", **kw)}


@pytest.mark.claim("ratio-6-9x")
def test_ratio_rule_outcomes():
    assert ratio_outcome(_two(PAPERLIKE, PAPERLIKE)).verdict == HOLDS
    o = ratio_outcome(_two(GAP2, GAP2))  # a gap of another size: the claim is the factor, so it does not hold
    assert o.verdict == NOT and o.numbers["mnist"]["v2_verdict"] == "does not hold" and "v2" in o.ours
    assert "a gap, but the paper's factor excluded" in o.condition and "noise ratio" in o.ours
    assert ratio_outcome(_two(STRONG, STRONG)).numbers["mnist"]["v2_verdict"] == "holds"
    o = ratio_outcome(_two(PAPERLIKE, LEVEL_))  # holds on one data set only
    assert o.verdict == PARTLY and o.partly_as is PartlyAs.DATASETS_DISAGREE
    assert ratio_outcome(_two(LEVEL_, LEVEL_)).verdict == NOT
    noisy = {"malleability:mnist:10class": fake_record(NOISY_GAP, **UNINFORMATIVE),
             "malleability:cifar10:10class": fake_record(NOISY_GAP, dataset="cifar10", **UNINFORMATIVE)}
    assert ratio_outcome(noisy).verdict == INCONCLUSIVE


@pytest.mark.claim("ratio-6-9x", "curated-removal", "adversarial-intervention", "spearman-rankings")
def test_a_measured_mnist_half_is_reported_when_cifar_is_not_measurable():
    gated_out = {"failing": (("standard", "relu", 0),)}
    two = {"malleability:mnist:10class": fake_record(PAPERLIKE),
           "malleability:cifar10:10class": fake_record(PAPERLIKE, dataset="cifar10", **gated_out)}
    for rule in (ratio_outcome, curated_outcome, spearman_outcome):
        o = rule(two)
        assert o.numbers["sub_verdicts"] == {"mnist": "holds", "cifar10": "not measurable here"}
        assert o.verdict == NA and "MNIST [holds]" in o.ours and "below the adequacy gate" in o.ours
    two["malleability:mnist:10class"] = fake_record(LEVEL_)
    o = ratio_outcome(two)
    assert o.verdict == NOT and o.numbers["sub_verdicts"]["mnist"] == "does not hold"


def test_combination_of_data_sets():
    v = {"h": HOLDS, "p": PARTLY, "n": NOT, "i": INCONCLUSIVE, "x": NA}
    want = {"hh": HOLDS, "hp": PARTLY, "hn": PARTLY, "hi": INCONCLUSIVE, "hx": NA, "pp": PARTLY, "pn": NOT,
            "pi": INCONCLUSIVE, "px": NA, "nn": NOT, "ni": NOT, "nx": NOT, "ii": INCONCLUSIVE, "ix": NA, "xx": NA}
    for pair, expected in want.items():
        for a, b in (pair, pair[::-1]):
            assert combine_datasets({"mnist": v[a], "cifar10": v[b]}) == expected, pair


@pytest.mark.claim("flip-binary-cifar10")
def test_no_gap_rule_outcomes():
    same = flat((0.4, 0.1), (0.4, 0.1))
    o = no_gap_outcome(fake_record(same, dataset="cifar10", task="binary"))
    assert o.verdict == HOLDS and o.numbers["tost"]["equivalent"]
    o = no_gap_outcome(fake_record(flat((0.6, 0.1), (0.2, 0.1)), dataset="cifar10", task="binary"))
    assert o.verdict == NOT
    o = no_gap_outcome(fake_record(same, dataset="cifar10", task="binary", **UNINFORMATIVE))
    assert o.verdict == INCONCLUSIVE and not o.numbers["tost"]["equivalent"]

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
    assert adv_outcome(_adv((0.3, 0.1), (0.3, 0.1)), "relu").verdict == INCONCLUSIVE
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
    assert eps_outcome(_eps(set())).verdict == INCONCLUSIVE

    def spec(training: str, model: str, intervention: str, eps: float) -> dict[str, Any]:
        a = {"attn": 0.6, "relu": 0.2} if eps != 0.5 else {"attn": 0.2, "relu": 0.6}
        return {"random": 0.1, "pgd": a[model]}

    rec = fake_record(spec, attacks=("pgd",), interventions=("transformed",), eps_sweep=(0.1, 0.2, 0.5),
                      seed_baseline=False)
    o = eps_outcome(rec)
    assert o.verdict == NOT and "below 0 at 1" in o.condition


@pytest.mark.claim("eps-robustness")
def test_eps_rule_reads_the_baseline():
    """Attn's raw flip rate is higher at every eps, but so is its noise: the excess is level -> inconclusive."""
    def spec(training: str, model: str, intervention: str, eps: float) -> dict[str, Any]:
        return {"random": 0.5, "pgd": 0.75} if model == "attn" else {"random": 0.0, "pgd": 0.25}

    rec = fake_record(spec, attacks=("pgd",), interventions=("transformed",), eps_sweep=(0.1, 0.2, 0.5),
                      seed_baseline=False, n=40)  # rates exact in binary: the two excesses are equal, not 1e-17 apart
    assert eps_outcome(rec).verdict == INCONCLUSIVE

# ---- new rows -------------------------------------------------------------------------------------

@pytest.mark.claim("curated-removal")
def test_curated_rule_outcomes():
    assert curated_outcome(_two(STRONG, STRONG)).verdict == HOLDS
    level = {"curated": lambda m, r: 0.1}
    assert curated_outcome(_two(STRONG, STRONG, **level)).verdict == INCONCLUSIVE
    only_attn = {"curated": lambda m, r: 0.5 if (m, r) == ("attn", "removal") else 0.05}
    assert curated_outcome(_two(STRONG, STRONG, **only_attn)).verdict == PARTLY
    random_more = {"curated": lambda m, r: 0.05 if r == "removal" else 0.5}
    assert curated_outcome(_two(STRONG, STRONG, **random_more)).verdict == NOT

def _by_intervention(transformed: Spec, adversarial: Spec) -> Spec:
    def spec(training: str, model: str, intervention: str, eps: float) -> dict[str, Any]:
        return (transformed if intervention == "transformed" else adversarial)(training, model, intervention, eps)

    return spec


@pytest.mark.claim("adversarial-intervention")
def test_adversarial_intervention_rule_outcomes():
    assert adversarial_intervention_outcome(_two(LEVEL_, LEVEL_)).verdict == INCONCLUSIVE
    strong_adv = _by_intervention(LEVEL_, STRONG)
    assert adversarial_intervention_outcome(_two(strong_adv, strong_adv)).verdict == HOLDS
    assert adversarial_intervention_outcome(_two(strong_adv, LEVEL_)).verdict == INCONCLUSIVE
    at_noise = _by_intervention(LEVEL_, flat(("=noise", 0.3), (0.05, 0.4)))
    assert adversarial_intervention_outcome(_two(at_noise, at_noise)).verdict == PARTLY
    reversed_ = _by_intervention(LEVEL_, flat((0.12, 0.06), (0.5, 0.1)))
    assert adversarial_intervention_outcome(_two(reversed_, reversed_)).verdict == NOT


@pytest.mark.claim("spearman-rankings")
def test_spearman_rule_outcomes():
    assert spearman_outcome(_two(STRONG, STRONG)).verdict == HOLDS
    attn_at_noise = {"rho": lambda m, a: 0.5 if m == "attn" else (0.95 if a == "random" else 0.9)}
    assert spearman_outcome(_two(STRONG, STRONG, **attn_at_noise)).verdict == PARTLY
    reversed_ = {"rho": lambda m, a: 0.9 if m == "attn" or a == "random" else 0.4}
    assert spearman_outcome(_two(STRONG, STRONG, **reversed_)).verdict == NOT
    level = {"rho": lambda m, a: 0.9 if a == "random" else 0.5}
    assert spearman_outcome(_two(STRONG, STRONG, **level)).verdict == INCONCLUSIVE

# ---- the registry and the command share the rules ------------------------------------------------

@pytest.mark.claim("flip-mnist", "spearman-rankings")
def test_claims_are_empirical_and_evaluated_per_protocol():
    claims = {c.id: c for c in MALLEABILITY_CLAIMS}
    assert {"flip-mnist", "flip-cifar10", "ratio-6-9x", "flip-binary-mnist", "flip-binary-cifar10", "adv-relu-mnist",
            "adv-attn-cifar10", "eps-robustness", "curated-removal", "adversarial-intervention",
            "spearman-rankings"} <= set(claims)
    assert all(c.empirical and c.group == "malleability" for c in claims.values())
    good, bad = _two(PAPERLIKE, PAPERLIKE), _two(PAPERLIKE, PAPERLIKE, failing=(("standard", "relu", 0),))
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
    (PAPERLIKE, "mnist", "10class", "flip-mnist", HOLDS),
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
