"""Retrain-based flip rates (`empirics.experiments.retrain_flip`): does the attack flip what the trained network
actually relies on, measured by retraining, rather than what its kernel machine's leave-one-out formula says? The rule
is fixed here before the first run (D24), one row per data set and task (MNIST 10 classes, D24; binary MNIST and
CIFAR-10, D25). A preset runs the rows it names (`retrain_flip_sets`; MNIST 10 classes alone unless it says otherwise);
the others are "not measurable here", saying that they were not run at that preset
(`verify.experiments.not_run_units`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from empirics.experiments.retrain_flip import RetrainFlipRecord
from empirics.nets.protocols import GATE_TEXT, GD_MSE
from empirics.vocab import PAPER_PAIR, model_name
from ntkm.errors import UserInputError
from verify.claims import units
from verify.claims.base import HOLDS, INCONCLUSIVE, NA, NOT, PARTLY, Claim, Outcome, PartlyAs, Results
from verify.power import P_ATTACK, P_BASELINE, TARGET, design_points, flip_power
from verify.presets import PresetSizes

MODELS = PAPER_PAIR.paper_order
#: The data sets and tasks (`DATASET:TASK`) with a retrain-based flip row, in the table's order.
RETRAIN_FLIP_SETS = ("mnist:10class", "mnist:binary", "cifar10:10class")
#: The rows a preset runs when it does not name them (`verify.presets.PresetSizes.retrain_flip_sets`).
DEFAULT_RETRAIN_FLIP_SETS = ("mnist:10class",)
#: How the rule and the protocol text name each set.
SET_LABELS = {"mnist:10class": "MNIST (10 classes)", "mnist:binary": "MNIST 3-vs-8 (binary)",
              "cifar10:10class": "CIFAR-10 (10 classes)"}


def split_set(key: str) -> tuple[str, str]:
    """'cifar10:10class' -> ('cifar10', '10class')."""
    ds, task = key.split(":")
    return ds, task


def set_units(key: str) -> tuple[str, ...]:
    """The retrain-based flip units of one set, one per paper model (resolved per condition like every empirical
    unit)."""
    return tuple(units.flip_retrain(m, *split_set(key)) for m in MODELS)


#: The retrain-based flip units of MNIST 10 classes, one per paper model (the row every preset runs).
FLIP_RETRAIN_UNITS = set_units("mnist:10class")


def retrain_flip_sets(p: PresetSizes) -> tuple[str, ...]:
    """The sets whose retrain-based flip rows preset `p` runs (`retrain_flip_sets`, else MNIST 10 classes), in the
    order of `RETRAIN_FLIP_SETS`."""
    wanted = p.get("retrain_flip_sets", DEFAULT_RETRAIN_FLIP_SETS)
    return tuple(k for k in RETRAIN_FLIP_SETS if k in wanted)


@dataclass(frozen=True)
class RetrainFlipDesign:
    """The size of a preset's retrain-based flip study (`retrain_flip_design`). `powered`: sized by the power
    simulation (`verify.power.design_points`: the fewest top points whose chance to reach "holds" at a true flip rate
    0.5 against baselines of 0.3 is at least 0.8, with `POWERED_SEEDS` retrain seeds) at the malleability units' n,
    and run with its two companions, the fixed-context ablation and the gd-mse positive control (issue 40 item 5)."""

    name: str
    powered: bool

    def sizes(self, p: PresetSizes) -> dict[str, Any]:
        """n_train, n_test, tau and the retrain seeds of this design at preset `p`."""
        if self.powered:
            k = design_points(retrain_seeds=POWERED_SEEDS)
            if k is None:
                raise UserInputError("no grid size of verify.power reaches the target power; widen verify.power.GRID")
            return {"n_train": POWERED_N, "n_test": POWERED_N_TEST, "tau": k / POWERED_N,
                    "seeds": list(range(POWERED_SEEDS))}
        small = p["n_train"] <= 100
        return {"n_train": 40 if small else 100, "n_test": 40 if small else 100, "tau": 0.1,
                "seeds": list(range(p.get("retrain_seeds", 3)))}


#: The powered design's training points (the malleability units' n at quick), test points and retrain seeds.
POWERED_N, POWERED_N_TEST, POWERED_SEEDS = 500, 200, 10
#: The designs a preset names (`retrain_flip_design`): `small` (n = 100, the top 10 %, the preset's retrain seeds;
#: its power is printed in the row) and `powered`.
DESIGNS = {d.name: d for d in (RetrainFlipDesign("small", powered=False), RetrainFlipDesign("powered", powered=True))}
#: The protocol of the positive control: full-batch gradient descent on the squared loss.
CONTROL_PROTOCOL = GD_MSE
#: The set whose row the ablation and the positive control accompany.
COMPANION_SET = "mnist:10class"


def design(p: PresetSizes) -> RetrainFlipDesign:
    """The retrain-based flip design preset `p` names (`small` unless it says otherwise)."""
    name = p.get("retrain_flip_design", "small")
    if name not in DESIGNS:
        raise UserInputError(f"unknown retrain-based flip design {name!r}; use one of {', '.join(DESIGNS)}")
    return DESIGNS[name]


def flip_retrain_unit_configs(p: PresetSizes, data_dir: str | None, sets: tuple[str, ...] | None = None,
                              companions: bool | None = None) -> dict[str, dict[str, Any]]:
    """`RetrainFlipConfig` keyword arguments (without the protocol) for each network of each set the preset runs
    (`sets`: these instead), at the preset's design (`design`): the small design n = 100 (below the batch of 128, so
    the protocols train full-batch), the top 10 % by |influence|; the powered design n = 500 and the simulated number
    of top points; both PGD at eps 0.3 at the preset's malleability width. The powered design adds the fixed-context
    ablation of MLP-Attn (`units.flip_retrain_fixed`) to MNIST 10 classes (`companions`: whatever the design)."""
    d = design(p)
    sizes = d.sizes(p)
    out = {}
    for key in retrain_flip_sets(p) if sets is None else sets:
        ds, task = split_set(key)
        out.update({units.flip_retrain(m, ds, task): {
            "model": m, "dataset": ds, "task": task, **sizes, "width": p["mall_width"], "eps": 0.3, "attack": "pgd",
            "attack_steps": p["attack_steps"], "data_dir": data_dir} for m in MODELS})
        if (d.powered if companions is None else companions) and key == COMPANION_SET:
            out[units.flip_retrain_fixed()] = {**out[units.flip_retrain("attn", ds, task)], "fixed_context": True}
    return out


def flip_control_unit_config(p: PresetSizes, data_dir: str | None) -> dict[str, Any]:
    """`RetrainFlipConfig` keyword arguments of the positive control (`units.FLIP_RETRAIN_CONTROL`, without its
    protocol, `CONTROL_PROTOCOL`): MLP-Attn at the preset's design and malleability width on unit-norm MNIST inputs (10
    classes), the regime where the NTK theory behind the flip rate is exact in the wide limit."""
    return {**flip_retrain_unit_configs(p, data_dir, (COMPANION_SET,), False)[units.flip_retrain("attn")],
            "preprocess": "unit"}


def companion_units(p: PresetSizes) -> tuple[str, ...]:
    """The companion units preset `p` runs (the powered design's ablation and positive control), base names."""
    return (units.flip_retrain_fixed(), units.FLIP_RETRAIN_CONTROL) if design(p).powered else ()


def flip_retrain_rule(key: str) -> str:
    """The rule of set `key`'s row: `FLIP_RETRAIN_RULE` on that data set and task."""
    rule = FLIP_RETRAIN_RULE.replace(SET_LABELS["mnist:10class"], SET_LABELS[key], 1)
    return rule if key == "mnist:10class" else rule.replace("(D24)", "(D24; this data set's row: D25)")


FLIP_RETRAIN_RULE = (
    "for each network trained under the protocol on MNIST (10 classes): the top 10 % of the training points by "
    "|NTK influence| of a reference network (the paper's selection) are perturbed by PGD at eps 0.3 against it, "
    "and, as the baseline, by random signs of the same eps; each point's actual effect (the change of the summed "
    "test loss the network is trained with when the point is removed) is measured by retraining, in full and "
    "without the point, on the clean and on each perturbed training set, under every retrain seed; flip rate = "
    "share of the points whose mean effect changes sign by more than the seed noise (t quantile times the pooled "
    "seed-to-seed sd of the paired changes over sqrt(seeds)), with its 95 % Wilson interval; seed-to-seed rate = "
    "share of (point, pair of seeds) whose clean effects have opposite signs. Holds if MLP-Attn's attack flip rate "
    "has its lower end above both its random-noise flip rate and its seed-to-seed rate and above 2L-ReLU's attack "
    "flip rate; partly if it lies above its two baselines but not above 2L-ReLU's rate; does not hold if its upper "
    "end lies below the larger of its two baselines or below 2L-ReLU's rate; inconclusive otherwise; not "
    "measurable if any network (reference or retrained) fails the gate or no selected point of MLP-Attn has a "
    "clean effect beyond its seed noise. Its power at the design's size (to reach 'holds' at a true flip rate of 0.5 "
    "against a baseline of 0.3, simulated: verify.power) is printed beside it, not judged (added in D28). With four "
    "retrain seeds or more the seed-halves null (the same flip statistic between the clean effects of two disjoint "
    "halves of the seeds) is a third baseline; at the powered design (presets powered, paper, gpu: n = 500, the top "
    "points the power simulation asks for, 10 retrain seeds) the row also reads its positive control "
    "(flip-retrain-control, rule below): where it does not hold the row is not measurable (the instrument is broken), "
    "where it was not measurable a 'holds' becomes 'partly (not validated)'; and the ablation with MLP-Attn's "
    "context held fixed in the retrains is reported beside, not judged (added in D30, before any run of the powered "
    "design). Fixed before its first run (D24)")

FLIP_CONTROL_RULE = (
    "positive control of the retrain-based flip instrument, in the regime where the NTK theory behind the flip rate is "
    "exact in the wide limit: MLP-Attn trained by full-batch gradient descent on the squared loss (protocol gd-mse) on "
    "unit-norm MNIST inputs (10 classes), the powered design of the retrain-based flip row (its selection, PGD attack "
    "and retrain seeds). Not measurable if a network fails the gate, no selected point's clean effect lies beyond its "
    "seed noise, or the NTK attack flip rate of the selected points is not above their NTK random-sign flip rate "
    "(no flips to recover); holds if the NTK attack flip rate lies inside the 95 % Wilson interval of the "
    "retrain-based attack flip rate and that interval's lower end lies above the larger of its baselines (random "
    "signs, seed-to-seed, seed halves); does not hold otherwise. Fixed before its first run (D30)")


def _pct(ci: list[float]) -> str:
    return f"[{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]"


def _network_text(r: RetrainFlipRecord) -> str:
    a, b = r.flips["attack"]["training"], r.flips["random"]["training"]
    s = r.seed_flips["training"]
    sq = r.flips["attack"]["squared"]
    return (f"{model_name(r.model)}: attack flips {a['n_flipped']}/{a['n_points']} = {100 * a['flip_rate']:.0f} % "
            f"{_pct(a['flip_ci'])}, random {100 * b['flip_rate']:.0f} % {_pct(b['flip_ci'])}, seed-to-seed "
            f"{100 * s['rate']:.0f} % {_pct(s['ci'])}; same-seed pairs {100 * a['pair_flip_rate']:.0f} % vs random "
            f"{100 * b['pair_flip_rate']:.0f} %; on the squared error {100 * sq['flip_rate']:.0f} %; NTK flip rate of "
            f"the same points {100 * r.ntk_flips['attack']['flip_rate']:.0f} % (random "
            f"{100 * r.ntk_flips['random']['flip_rate']:.0f} %); {r.resolved['training']}/{a['n_points']} clean "
            f"effects beyond seed noise (train/test acc {r.training['train_acc']:.2f}/{r.training['test_acc']:.2f})")


def _gate_failures(r: RetrainFlipRecord) -> str:
    """'' when the reference and every retrained network pass the gate; else how many failed and the first reason."""
    nets = [{"set": "reference", "seed": r.config["seeds"][0], "removed": None, **r.training["gate"]}, *r.gates]
    bad = [g for g in nets if not g["passed"]]
    if not bad:
        return ""
    g = bad[0]
    what = f"{g['set']} seed {g['seed']}" + (f" without point {g['removed']}" if g.get("removed") is not None else "")
    return f"{model_name(r.model)}: {len(bad)} of {len(nets)} networks, first {what}: {g['reason']}"


def baseline_rate(r: RetrainFlipRecord) -> float:
    """The larger of a network's baselines on the training loss: the random-sign flip rate, the seed-to-seed rate and,
    where recorded (four retrain seeds or more), the seed-halves null."""
    rates = [r.flips["random"]["training"]["flip_rate"], r.seed_flips["training"]["rate"]]
    if r.null_halves:
        rates.append(r.null_halves["training"]["flip_rate"])
    return max(rates)


def _halves_text(r: RetrainFlipRecord) -> str:
    if not r.null_halves:
        return ""
    h = r.null_halves["training"]
    return f", seed-halves null {100 * h['flip_rate']:.0f} % {_pct(h['flip_ci'])} ({h['seeds_per_half']} seeds a half)"


def flip_control_outcome(r: RetrainFlipRecord) -> Outcome:
    """`FLIP_CONTROL_RULE` on the positive control's record (MLP-Attn under gd-mse)."""
    cfg = r.config
    protocol = (f"MNIST 10 classes, n_train={cfg['n_train']}, n_test={cfg['n_test']}, width {cfg['width']}, protocol "
                f"{cfg['protocol']} (up to {cfg['epochs']} epochs), {cfg['preprocess']} inputs, top {cfg['tau']:g} by "
                f"|influence| perturbed by {cfg['attack'].upper()} at eps {cfg['eps']:g}; {len(cfg['seeds'])} retrain "
                "seeds")
    ours = _network_text(r) + _halves_text(r)
    numbers = {"flips": r.flips, "seed_flips": r.seed_flips, "ntk_flips": r.ntk_flips, "resolved": r.resolved,
               "null_halves": r.null_halves}
    failed = _gate_failures(r)
    ntk_a, ntk_r = r.ntk_flips["attack"]["flip_rate"], r.ntk_flips["random"]["flip_rate"]
    why = (f"below the adequacy gate ({failed})" if failed else
           "no selected point's clean effect lies beyond the seed noise" if r.resolved["training"] == 0 else
           f"the NTK attack flip rate {100 * ntk_a:.0f} % is not above its random-sign rate {100 * ntk_r:.0f} %: no "
           "flips to recover" if ntk_a <= ntk_r else "")
    if why:
        return Outcome(f"not measurable: {why}. {ours}", NA, protocol, numbers, gate=GATE_TEXT)
    a = r.flips["attack"]["training"]
    lo, hi = a["flip_ci"]
    base = baseline_rate(r)
    ok = lo <= ntk_a <= hi and lo > base
    return Outcome(ours, HOLDS if ok else NOT, protocol, numbers, gate=GATE_TEXT,
                   condition=f"NTK attack flip rate {100 * ntk_a:.0f} % vs the retrain-based {_pct(a['flip_ci'])}; "
                             f"its larger baseline {100 * base:.0f} %")


def _companions(out: Outcome, control: RetrainFlipRecord | None, fixed: RetrainFlipRecord | None) -> Outcome:
    """`out` read with the powered design's companions where the run has them (`FLIP_RETRAIN_RULE`): a positive control
    that does not hold makes it not measurable, one that was not measurable turns a 'holds' into 'partly (not
    validated)'; the fixed-context ablation goes beside."""
    extra, numbers = [], dict(out.numbers)
    if isinstance(fixed, RetrainFlipRecord):
        a = fixed.flips["attack"]["training"]
        extra.append(f"with MLP-Attn's context held fixed in the retrains (ablation, not judged): attack flips "
                     f"{a['n_flipped']}/{a['n_points']} = {100 * a['flip_rate']:.0f} % {_pct(a['flip_ci'])} against "
                     f"its larger baseline {100 * baseline_rate(fixed):.0f} %")
        numbers["ablation_fixed_context"] = {"flips": fixed.flips, "seed_flips": fixed.seed_flips,
                                             "null_halves": fixed.null_halves, "baseline": baseline_rate(fixed)}
    verdict, partly_as, ours = out.verdict, out.partly_as, out.ours
    if isinstance(control, RetrainFlipRecord):
        c = flip_control_outcome(control)
        numbers["positive_control"] = {"verdict": c.verdict.value, "condition": c.condition}
        extra.append(f"positive control (MLP-Attn, gd-mse, unit inputs) {c.verdict.value}: {c.condition or c.ours}")
        if c.verdict is NOT and out.verdict is not NA:
            verdict, partly_as = NA, None
            ours = f"not measurable: the retrain-based flip instrument failed its positive control. {ours}"
        elif c.verdict is not HOLDS and out.verdict is HOLDS:
            verdict, partly_as = PARTLY, PartlyAs.NOT_VALIDATED
            ours = f"holds, but the instrument's positive control was not measurable. {ours}"
    if extra:
        ours = f"{ours}; {'; '.join(extra)}"
    return replace(out, verdict=verdict, partly_as=partly_as, ours=ours, numbers=numbers)


def flip_retrain_outcome(rs: dict[str, RetrainFlipRecord], control: Any = None, fixed: Any = None) -> Outcome:
    """`FLIP_RETRAIN_RULE` on the two networks' records (keyed by model kind), with the powered design's positive
    control and fixed-context ablation where given (`_companions`)."""
    return _companions(_flip_retrain_outcome(rs), control, fixed)


def _flip_retrain_outcome(rs: dict[str, RetrainFlipRecord]) -> Outcome:
    cfg = rs["attn"].config
    label = {("mnist", "binary"): "MNIST 3-vs-8", ("cifar10", "10class"): "CIFAR-10 10 classes"}.get(
        (cfg.get("dataset", "mnist"), cfg.get("task", "10class")), "MNIST 10 classes")
    protocol = (f"{label}, n_train={cfg['n_train']}, n_test={cfg['n_test']}, width {cfg['width']}, protocol "
                f"{cfg['protocol']} (up to {cfg['epochs']} epochs), {cfg['preprocess']} inputs, top {cfg['tau']:g} by "
                f"|influence| perturbed by {cfg['attack'].upper()} ({cfg['attack_steps']} steps, eps {cfg['eps']:g}); "
                f"{len(cfg['seeds'])} retrain seeds; effects on the test {rs['attn'].loss}")
    numbers = {m: {"flips": r.flips, "seed_flips": r.seed_flips, "ntk_flips": r.ntk_flips, "resolved": r.resolved,
                   **({"null_halves": r.null_halves} if r.null_halves else {})} for m, r in rs.items()}
    ours = "; ".join(_network_text(r) + _halves_text(r) for r in rs.values())
    failed = [_gate_failures(r) for r in rs.values()]
    if any(failed):
        return Outcome(f"not measurable: below the adequacy gate ({'; '.join(f for f in failed if f)}). {ours}", NA,
                       protocol, numbers, gate=GATE_TEXT)
    attn, relu = rs["attn"], rs["relu"]
    if attn.resolved["training"] == 0:
        return Outcome(f"not measurable: no selected point's clean effect lies beyond the seed noise. {ours}", NA,
                       protocol, numbers, gate=GATE_TEXT)
    a = attn.flips["attack"]["training"]
    pairs = int(attn.seed_flips["training"].get("n_pairs") or a["n_points"])
    power = {"points": a["n_points"], "p_attack": P_ATTACK, "p_baseline": P_BASELINE,
             "power": flip_power(a["n_points"], seed_pairs=pairs),
             "design_points": design_points(retrain_seeds=len(cfg["seeds"])), "method": "verify.power (simulated)"}
    numbers = {**numbers, "power": power}
    ours += (f"; power of this design to reach 'holds' at a true flip rate {P_ATTACK:g} against a baseline "
             f"{P_BASELINE:g}: {power['power']:.2f} (simulated; {power['design_points'] or 'more than 200'} points "
             f"would give {TARGET:g})")
    baseline = baseline_rate(attn)
    relu_rate = relu.flips["attack"]["training"]["flip_rate"]
    lo, hi = a["flip_ci"]
    beats = lo > baseline
    if beats and lo > relu_rate:
        verdict = HOLDS
    elif beats:
        verdict = PARTLY
    elif hi < baseline or hi < relu_rate:
        verdict = NOT
    else:
        verdict = INCONCLUSIVE
    return Outcome(ours, verdict, protocol, numbers, gate=GATE_TEXT,
                   partly_as=PartlyAs.NOT_BEYOND_CONTROL if verdict is PARTLY else None,
                   condition=f"MLP-Attn attack flip rate {_pct(a['flip_ci'])} vs its larger baseline "
                             f"{100 * baseline:.0f} % and 2L-ReLU's {100 * relu_rate:.0f} %")


def _evaluate(key: str = "mnist:10class") -> Callable[[Results], Outcome]:
    def evaluate(results: Results) -> Outcome:
        return flip_retrain_outcome({m: results[u] for m, u in zip(MODELS, set_units(key), strict=True)},
                                    results.get(units.FLIP_RETRAIN_CONTROL), results.get(units.flip_retrain_fixed()))

    return evaluate


def retrain_flip_verdict(results: Results, key: str = "mnist:10class") -> str | None:
    """The verdict of set `key`'s retrain-based flip row in one condition's results (None when its units did not run
    there)."""
    if not all(isinstance(results.get(u), RetrainFlipRecord) for u in set_units(key)):
        return None
    return _evaluate(key)(results).verdict.value


_STATEMENT = ("A small adversarial perturbation of the most influential training points flips the sign of their "
              "actual effect on the retrained MLP-Attn network more often than noise and than for 2L-ReLU")
_PAPER = "the paper's flip rates are NTK leave-one-out influence of a kernel machine; not measured by retraining"


def _row(claim_id: str, key: str, statement: str) -> Claim:
    """The retrain-based flip row `claim_id` (written out at the call) of set `key`."""
    return Claim(claim_id, "Method (retrain-based flip rate)", statement, paper=_PAPER,
                 rule=f"{flip_retrain_rule(key)}. Positive control (flip-retrain-control): {FLIP_CONTROL_RULE}",
                 units=set_units(key), evaluate=_evaluate(key), group="malleability", empirical=True,
                 optional_units=(units.flip_retrain_fixed(),) if key == COMPANION_SET else (),
                 fixed_optional_units=(units.FLIP_RETRAIN_CONTROL,))


RETRAIN_FLIP_CLAIMS = [
    _row("flip-retrain-mnist", "mnist:10class", _STATEMENT),
    _row("flip-retrain-binary-mnist", "mnist:binary", f"MNIST 3-vs-8: {_STATEMENT[0].lower()}{_STATEMENT[1:]}"),
    _row("flip-retrain-cifar10", "cifar10:10class", f"CIFAR-10: {_STATEMENT[0].lower()}{_STATEMENT[1:]}"),
]
