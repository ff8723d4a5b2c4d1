"""NTK distance against width (the paper's table): does 2L-ReLU converge and MLP-Attn not?"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from empirics.experiments.distance import GD_METRIC, DistanceRecord, slope_interval
from empirics.nets.protocols import GATE_TEXT
from empirics.vocab import DATASETS, PAPER_PAIR, dataset_label
from reports.text import fmt
from verify.claims import units
from verify.claims.base import (
    HOLDS,
    INCONCLUSIVE,
    NA,
    NOT,
    PARTLY,
    Claim,
    Outcome,
    PartlyAs,
    Results,
    Verdict,
    gate_failures,
    gated,
)
from verify.multiplicity import point_test, tests_of

METRIC = "function_abs"
SECONDARY = ("function_lin", "kernel_drift_centred")
NTK_RULE = ("widths at which every seed's network passes the adequacy gate are kept (at least 3, including the "
            "widest of the sweep, else not measurable); two co-primary estimands, each a log-log slope against width "
            "(each seed's least-squares slope, each seed its own data subset and initialisations, with a 95 % "
            "Student-t interval over seeds): (1) the paper's unnormalised function distance ||f_m - f_NTK|| (test "
            "outputs) under the claims protocol, and (2) the estimand NTK theory is exact for, the gd-mse function "
            "change ||(f_T - f_0) - delta_lin|| / ||delta_lin|| (the same spec trained by full-batch gradient descent "
            "on the squared loss, its initial function removed, against the linearised network after the same number "
            "of steps with the analytic kernel; on the widths where those networks pass the gate too, at least 3 "
            "including the widest kept; a sweep that trains none, the qkv variant, whose step has no closed form, "
            "cannot reach 'holds'). Holds if both intervals lie entirely on the claimed side of 0 (below 0 for "
            "'decreases', above for 'rises') and no secondary metric (the doubly centred kernel drift, the "
            "init-matched distance ||f_m - f_lin||) has its interval entirely on the other side for this network: (1) "
            "alone mixes the kernel regime with the random initial function and a loss and optimiser (cross-entropy, "
            "Adam) for which the NTK limit is not exact, (2) alone is not the paper's number; partly (one estimand) if "
            "only one co-primary interval does, including when (2) is not measured or not run (no 'holds' on one "
            "estimand); partly (a secondary metric against) if both do but a secondary metric lies on the other side; "
            "partly (secondary metric) if neither does but a secondary metric has its interval on the claimed side for "
            "this network and not for the other one (on the widths kept for both) and none lies on the other side; "
            "does not hold if every measurable co-primary interval lies entirely on the other side of 0; inconclusive "
            "otherwise. A metric that moves the claimed way for both networks gives no credit; side metrics count in "
            "both directions")


#: Widths needed for a slope (the widest among them).
MIN_WIDTHS = 3



def _width_factor(tcfg: dict[str, Any]) -> str:
    """The schedule's width factor as printed in a row's protocol, e.g. " x (16/m)^0.5" ("" without one)."""
    if not tcfg.get("lr_ref_width"):
        return ""
    return f" x ({tcfg['lr_ref_width']}/m)^{tcfg.get('lr_width_power', 0.5):g}"

def gated_widths(runs: list[dict]) -> tuple[list[int], dict[int, list[str]]]:
    """Widths at which every seed's network passed the adequacy gate, and the reasons for the others."""
    widths = sorted({int(r["width"]) for r in runs})
    dropped = {w: gate_failures([r for r in runs if r["width"] == w]) for w in widths}
    return [w for w in widths if not dropped[w]], {w: why for w, why in dropped.items() if why}


def gd_runs(runs: list[dict]) -> list[dict]:
    """The gd-mse networks of a sweep as runs of their own (their gate as `gate`), where they were trained."""
    return [{"width": r["width"], "seed": r["seed"], "model": f"{r.get('model', '?')} (gd-mse)", "gate": r["gd_gate"],
             GD_METRIC: r[GD_METRIC]} for r in runs if "gd_gate" in r]


def _side(ci: list[float], claimed: str) -> bool:
    """Whether a slope interval lies entirely on the claimed side of 0."""
    lo, hi = ci
    return (hi < 0) if claimed == "decreasing" else (lo > 0)


def _ntk_verdict(co: list[bool], measured_both: bool, against: list[str], credit: list[str],
                 opposite: bool) -> tuple[Verdict, PartlyAs | None]:
    """`NTK_RULE` on its parts: which co-primary intervals lie on the claimed side (`co`), whether both estimands
    were measured, the secondary metrics on the other side (`against`) and those giving credit, and whether every
    measurable co-primary interval lies on the other side (`opposite`)."""
    if all(co) and measured_both:
        return (PARTLY, PartlyAs.SECONDARY_AGAINST) if against else (HOLDS, None)
    if any(co):
        return PARTLY, PartlyAs.ONE_ESTIMAND
    if credit and not against:
        return PARTLY, PartlyAs.SECONDARY
    return (NOT, None) if opposite else (INCONCLUSIVE, None)


def ntk_claim(ds: str, kind: str, claimed: str, unit: str | None = None) -> Callable[[Results], Outcome]:
    """`claimed` is "decreasing" (2L-ReLU converges) or "rises" (MLP-Attn moves away from its NTK); `unit`
    defaults to the paper-model sweep `ntk-distance:{ds}` (a variant names its own)."""

    def evaluate(results: Results) -> Outcome:
        res: DistanceRecord = results[unit or units.ntk_distance(ds)]
        block = res.models[kind]
        treated, control = PAPER_PAIR
        other_kind = treated if kind == control else control
        other = res.models.get(other_kind)
        cfg = res.config
        tcfg = cfg["train"]
        protocol = (f"{res.data.get('label', ds)}, n_train={cfg['n_train']}, n_test={cfg['n_test']}, widths "
                    f"{cfg['widths']}, protocol {tcfg.get('protocol', 'custom')} ({tcfg['optimizer']} lr "
                    f"{tcfg['lr']}{_width_factor(tcfg)}"
                    f", wd {tcfg['weight_decay']} {tcfg.get('decay', 'coupled')}, "
                    f"{'up to ' if tcfg.get('plateau') else ''}{tcfg['epochs']} epochs), NTK parameterisation"
                    f"{'; MLP-Attn context centred (variant)' if cfg.get('attn_centre') else ''}; "
                    f"f_NTK = KRR with the analytic NTK, ridge {res.ridge_rule} = {fmt(res.ridge)}")
        widths, dropped = gated_widths(block.runs)
        if len(widths) < MIN_WIDTHS or widths[-1] != max(cfg["widths"]):
            why = gated(block.runs, GATE_TEXT, protocol)
            return Outcome(f"not measurable: fewer than {MIN_WIDTHS} widths, or not the widest, have every network "
                           f"above the adequacy gate (kept {widths or 'none'}). " + (why.ours if why else ""), NA,
                           protocol, {"widths_kept": widths, "dropped": dropped}, gate=GATE_TEXT)
        runs = [r for r in block.runs if r["width"] in widths]
        fa = [block.mean(w, METRIC) for w in widths]
        si = slope_interval(widths, runs, METRIC)
        g_runs = gd_runs(runs)
        g_widths = gated_widths(g_runs)[0] if g_runs else []
        gd_ok = len(g_widths) >= MIN_WIDTHS and g_widths[-1] == widths[-1]
        gd_si = slope_interval(g_widths, [r for r in g_runs if r["width"] in g_widths], GD_METRIC) if gd_ok else None
        co = [_side(si["ci"], claimed)] + ([gd_si is not None and _side(gd_si["ci"], claimed)] if g_runs else [])
        o_widths = gated_widths(other.runs)[0] if other is not None else []
        shared = [w for w in widths if w in o_widths]
        credit = []
        sec = {m: slope_interval(widths, runs, m) for m in SECONDARY}
        for metric in SECONDARY if len(shared) >= MIN_WIDTHS else ():
            mine = slope_interval(shared, [r for r in runs if r["width"] in shared], metric)["ci"]
            theirs = slope_interval(shared, [r for r in other.runs if r["width"] in shared], metric)["ci"]
            if _side(mine, claimed) and not _side(theirs, claimed):
                credit.append(metric)
        other_side = "rises" if claimed == "decreasing" else "decreasing"
        against = [m for m in SECONDARY if _side(sec[m]["ci"], other_side)]
        opposite = _side(si["ci"], other_side) and (gd_si is None or _side(gd_si["ci"], other_side))
        measured_both = gd_si is not None
        verdict, partly_as = _ntk_verdict(co, measured_both, against, credit, opposite)
        gd_txt = (f"gd-mse function change slope {fmt(gd_si['slope'])} [{fmt(gd_si['ci'][0])}, {fmt(gd_si['ci'][1])}] "
                  f"on widths {g_widths}" if gd_si is not None else
                  f"gd-mse function change not measurable (widths with every gd-mse network above the gate: "
                  f"{g_widths or 'none'})" if g_runs else "no gd-mse networks in this sweep")
        ours = (", ".join(f"m={w}: {fmt(m)}" for w, m in zip(widths, fa, strict=True))
                + f"; slope {fmt(si['slope'])} [{fmt(si['ci'][0])}, {fmt(si['ci'][1])}] ({si['seeds']} seeds)"
                + f"; {gd_txt}"
                + "; " + "; ".join(f"{m} slope {fmt(sec[m]['slope'])} [{fmt(sec[m]['ci'][0])}, {fmt(sec[m]['ci'][1])}]"
                                   for m in SECONDARY)
                + (f"; widths dropped (a network below the gate): {dropped}" if dropped else "")
                + f"; train/test acc at m={widths[-1]}: {fmt(block.mean(widths[-1], 'train_acc'))}/"
                  f"{fmt(block.mean(widths[-1], 'test_acc'))}"
                + (f"; credit from {', '.join(credit)}" if credit and not any(co) else "")
                + (f"; against: {', '.join(against)} on the other side of 0" if against else ""))
        condition = (f"slope CI {'< 0' if claimed == 'decreasing' else '> 0'} for both co-primary estimands, no "
                     "secondary metric on the other side"
                     f" (got [{fmt(si['ci'][0])}, {fmt(si['ci'][1])}] and "
                     + (f"[{fmt(gd_si['ci'][0])}, {fmt(gd_si['ci'][1])}])" if gd_si is not None else "not measurable)"))
        return Outcome(ours, verdict, protocol,
                       {"widths": widths, "function_abs_mean": fa, "slope_interval": si,
                        "secondary_credit": credit, "secondary_against": against, "gd_mse_slope_interval": gd_si,
                        "gd_mse_widths": g_widths, "co_primary_on_side": co,
                        "secondary": sec, "widths_kept": widths, "dropped": dropped},
                       si["seeds"], gate=GATE_TEXT, condition=condition, partly_as=partly_as,
                       tests=tests_of(point_test("function distance slope", si, 0.0),
                                      point_test("gd-mse slope", gd_si, 0.0)))

    return evaluate


CONTRAST_RULE = ("on the widths at which both networks pass the gate in every seed (at least 3, including the widest): "
                 "the paper's contrast: slope of log ||f_m - f_NTK|| against log width, MLP-Attn minus 2L-ReLU, "
                 "per-seed slopes, 95 % Student-t interval of the difference paired by seed, beside each network's "
                 "own slope interval: holds if the difference interval lies above 0, 2L-ReLU's own slope interval "
                 "lies below 0 (ReLU converges) and MLP-Attn's own slope interval does not lie entirely below 0 "
                 "(attention is not shown to converge: the claim is 'does not converge', not 'converges more "
                 "slowly'); partly (converges more slowly) if the difference lies above 0 but MLP-Attn's own interval "
                 "lies below 0; partly (ReLU convergence not shown) if the difference lies above 0 and ReLU's own "
                 "interval does not lie below 0; does not hold if the difference interval lies below 0; inconclusive "
                 "if it contains 0")


def contrast_verdict(diff: list[float], relu: list[float], attn: list[float]) -> tuple[Verdict, PartlyAs | None]:
    """`CONTRAST_RULE` on the three slope intervals (difference Attn - ReLU, ReLU's own, Attn's own)."""
    if diff[0] > 0:
        if attn[1] < 0:
            return PARTLY, PartlyAs.SLOWER
        return (HOLDS, None) if relu[1] < 0 else (PARTLY, PartlyAs.CONVERGENCE_NOT_SHOWN)
    return (NOT, None) if diff[1] < 0 else (INCONCLUSIVE, None)


def _contrast_claim(ds: str) -> Callable[[Results], Outcome]:
    def evaluate(results: Results) -> Outcome:
        res: DistanceRecord = results[units.ntk_distance(ds)]
        relu, attn = res.models["relu"], res.models["attn"]
        protocol = f"the two ntk-distance sweeps of {res.data.get('label', ds)} (see the per-model rows)"
        attn_w = gated_widths(attn.runs)[0]
        widths = [w for w in gated_widths(relu.runs)[0] if w in attn_w]
        if len(widths) < MIN_WIDTHS or widths[-1] != max(res.config["widths"]):
            why = gated(relu.runs + attn.runs, GATE_TEXT, protocol)
            return Outcome(f"not measurable: fewer than {MIN_WIDTHS} widths, or not the widest, have both networks "
                           f"above the adequacy gate in every seed (kept {widths or 'none'}). "
                           + (why.ours if why else ""), NA, protocol, {"widths_kept": widths}, gate=GATE_TEXT)
        keep_r = [r for r in relu.runs if r["width"] in widths]
        diff = slope_interval(widths, [r for r in attn.runs if r["width"] in widths], METRIC, minus=keep_r)
        relu_si = slope_interval(widths, keep_r, METRIC)
        attn_si = slope_interval(widths, [r for r in attn.runs if r["width"] in widths], METRIC)
        verdict, partly_as = contrast_verdict(diff["ci"], relu_si["ci"], attn_si["ci"])
        ours = (f"slope difference Attn - ReLU {fmt(diff['slope'])} [{fmt(diff['ci'][0])}, {fmt(diff['ci'][1])}]; "
                f"ReLU slope {fmt(relu_si['slope'])} [{fmt(relu_si['ci'][0])}, {fmt(relu_si['ci'][1])}]; "
                f"Attn slope {fmt(attn_si['slope'])} [{fmt(attn_si['ci'][0])}, {fmt(attn_si['ci'][1])}] "
                f"({diff['seeds']} seeds)")
        return Outcome(ours, verdict, protocol, {"difference": diff, "relu": relu_si, "attn": attn_si},
                       diff["seeds"], gate=GATE_TEXT, partly_as=partly_as,
                       tests=tests_of(point_test("slope difference", diff, 0.0), point_test("ReLU slope", relu_si, 0.0),
                                      point_test("Attn slope", attn_si, 0.0)),
                       condition="difference CI > 0, ReLU slope CI < 0 and Attn slope CI not entirely < 0")

    return evaluate


NTK_CLAIMS = [
    Claim("ntk-relu-mnist", "Table (NTK distance)", "2L-ReLU on MNIST: NTK distance decreases with width",
          paper="45.1 (m=16), 39.9 (1024), 39.2 (4096): decreases", rule=NTK_RULE, units=(units.ntk_distance("mnist"),),
          evaluate=ntk_claim("mnist", "relu", "decreasing"), group="ntk", empirical=True),
    Claim("ntk-attn-mnist", "Table (NTK distance)", "MLP-Attn on MNIST: NTK distance rises with width",
          paper="10.3 (m=16), 33.3 (1024), 43.4 (4096): non-monotone, then rises", rule=NTK_RULE,
          units=(units.ntk_distance("mnist"),), evaluate=ntk_claim("mnist", "attn", "rises"), group="ntk",
          empirical=True),
    Claim("ntk-relu-cifar10", "Table (NTK distance)", "2L-ReLU on CIFAR-10: NTK distance decreases with width",
          paper="246.2 (m=16), 101.7 (1024), 56.9 (4096): decreases", rule=NTK_RULE,
          units=(units.ntk_distance("cifar10"),), evaluate=ntk_claim("cifar10", "relu", "decreasing"), group="ntk",
          empirical=True),
    Claim("ntk-attn-cifar10", "Table (NTK distance)", "MLP-Attn on CIFAR-10: NTK distance rises monotonically",
          paper="3.7 (m=16), 10.4 (1024), 12.6 (4096): rises", rule=NTK_RULE, units=(units.ntk_distance("cifar10"),),
          evaluate=ntk_claim("cifar10", "attn", "rises"), group="ntk", empirical=True),
    *[Claim(f"ntk-contrast-{ds}", "Sec. 5 (non-convergent NTK dynamics)",
            f"{dataset_label(ds)}: 2L-ReLU converges to its NTK with width, MLP-Attn does not",
            paper="ReLU distance falls, Attn distance rises (the paper's central contrast)", rule=CONTRAST_RULE,
            units=(units.ntk_distance(ds),), evaluate=_contrast_claim(ds), group="ntk", empirical=True)
      for ds in DATASETS],
]
