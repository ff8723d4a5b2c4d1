"""The loss-landscape claim: 2L-ReLU converges to a sharp minimum, MLP-Attn to a broad, flat basin."""

from __future__ import annotations

from typing import Any

from empirics.landscape import LandscapeRecord
from empirics.vocab import DATASETS, LandscapeVerdict, dataset_label
from reports.text import fmt, mean_pm
from verify.claims import units
from verify.claims.base import NA, Claim, Outcome, Results, kernel_predictor, verdict_of
from verify.presets import PresetSizes, n_train_for


def landscape_unit_configs(p: PresetSizes, data_dir: str | None) -> dict[str, dict[str, Any]]:
    """Keyword arguments of `LandscapeConfig` for each data set, sized by the preset."""
    return {units.landscape(ds): {
        "dataset": ds, "seeds": list(p["seeds"]), "width": p["mall_width"],
        "n_train": n_train_for(p, ds, "mall_n_train"), "n_test": p["mall_n_test"],
        "points": p["landscape_points"], "grid": p["landscape_grid"], "hessian_iters": p["hessian_iters"],
        "hutchinson_samples": p["hutchinson_samples"], "data_dir": data_dir,
    } for ds in DATASETS}


LANDSCAPE_RULE = ("not measurable if a network fails the adequacy gate; paired by seed, (B) the "
                  "filter-normalised loss increase at a relative step of 0.5 (Li et al. 2018) and (A') the top Hessian "
                  "eigenvalue divided by the mean input norm ||x~||^2, each judged on the 95 % t interval of "
                  "log(ReLU / Attn) over seeds: holds if both intervals lie above 0, partly if one does, does not hold "
                  "if neither; both are curvatures at the trained point that need no minimum, so a trained point that "
                  "is not a minimum along the init-to-trained line (the loss lower beyond it by more than 1 % of the "
                  "loss at initialisation) is judged too, but at most partly. Raw Hessian numbers (which scale with "
                  "||x~||^2: ~100x larger for raw pixels than for unit attention features) are reported, not judged")


def _landscape_claim(ds: str) -> Any:
    def evaluate(results: Results) -> Outcome:
        res: LandscapeRecord = results[units.landscape(ds)]
        v = res.verdict
        relu, attn = res.models["relu"].summary, res.models["attn"].summary
        cfg = res.config
        tcfg = cfg["train"]
        protocol = (f"{res.data.get('label', ds)}, n_train={cfg['n_train']}, width {cfg['width']}, protocol "
                    f"{tcfg.get('protocol', 'custom')} ({tcfg['optimizer']}, {'up to ' if tcfg.get('plateau') else ''}"
                    f"{tcfg['epochs']} epochs); Hessian of the training loss w.r.t. W ({cfg['hessian_iters']} Lanczos "
                    f"steps, {cfg['hutchinson_samples']} Hutchinson probes)")
        kernel_txt, kernel_acc = kernel_predictor([r for m in res.models.values() for r in m.runs])
        train = (f"train acc ReLU {mean_pm(relu['train_acc'])}, Attn {mean_pm(attn['train_acc'])}; test acc ReLU "
                 f"{mean_pm(relu['test_acc'])}, Attn {mean_pm(attn['test_acc'])}"
                 + (f"; {kernel_txt}" if kernel_txt else ""))
        kernel = {"kernel_predictor_test_acc": kernel_acc} if kernel_acc else {}
        if v.verdict == LandscapeVerdict.NA:
            return Outcome(f"not measurable: {v.reason or ''}; {train}", NA, protocol,
                           {"reason": v.reason, **kernel}, v.seeds, gate=v.gate or "")
        iv = v.intervals

        def ratio(m: str) -> str:
            return (f"log(ReLU/Attn) {fmt(iv[m]['mean'])} [{fmt(iv[m]['ci'][0])}, {fmt(iv[m]['ci'][1])}]")

        ours = (f"filter-normalised increase ReLU {mean_pm(relu['filter_increase'])} vs Attn "
                f"{mean_pm(attn['filter_increase'])}, {ratio('filter_increase')}; top eigenvalue per input scale "
                f"{ratio('sharpness_per_input')}; raw top eigenvalue ReLU {mean_pm(relu['top_eigenvalue'])} vs Attn "
                f"{mean_pm(attn['top_eigenvalue'])} (not judged); {train}")
        caveats = v.caveats or []
        if caveats:
            ours += ". Caveats: " + "; ".join(caveats)
        return Outcome(ours, verdict_of(v.verdict), protocol,
                       {"intervals": iv, "criteria_above": v.criteria_above, **kernel}, v.seeds,
                       gate=v.gate or "", condition="CI of log(ReLU/Attn) > 0 for (B) and (A')")

    return evaluate


LANDSCAPE_CLAIMS = [
    Claim(f"landscape-{ds}", "Sec. 5 (loss landscape)",
          f"{dataset_label(ds)}: 2L-ReLU sits in a sharp, narrow minimum; MLP-Attn in a "
          "broad, flat basin", paper="sharp (ReLU) vs flat (Attn); qualitative", rule=LANDSCAPE_RULE,
          units=(units.landscape(ds),), evaluate=_landscape_claim(ds), group="landscape", empirical=True)
    for ds in DATASETS
]
