"""The loss-landscape claim: 2L-ReLU converges to a sharp minimum, MLP-Attn to a broad, flat basin."""

from __future__ import annotations

from typing import Any

from reports.text import mean_pm
from verify.claims import HOLDS, NA, NOT, PARTLY, Claim, Outcome, Results

LANDSCAPE_DATASETS = ("mnist", "cifar10")
VERDICT_MAP = {"holds": HOLDS, "partly": PARTLY, "does not hold": NOT, "not measurable": NA}


def landscape_unit_configs(p: dict[str, Any], data_dir: str | None) -> dict[str, dict[str, Any]]:
    """Keyword arguments of `LandscapeConfig` for each data set, sized by the preset."""
    return {f"landscape:{ds}": {
        "dataset": ds, "seeds": list(p["seeds"]), "width": p.get("landscape_width", p["mall_width"]),
        "n_train": p["n_train"], "n_test": p["n_test"], "train": {"epochs": p["epochs"]},
        "points": p["landscape_points"], "grid": p["landscape_grid"], "hessian_iters": p["hessian_iters"],
        "hutchinson_samples": p["hutchinson_samples"], "data_dir": data_dir,
    } for ds in LANDSCAPE_DATASETS}


LANDSCAPE_RULE = ("paired by seed: (A) 2L-ReLU's top Hessian eigenvalue (Lanczos on Hessian-vector products) exceeds "
                  "MLP-Attn's in every seed; (B) its filter-normalised loss increase at a relative step of 0.5 "
                  "(Li et al. 2018) exceeds MLP-Attn's in every seed. holds if A and B, partly if one, does not "
                  "hold if neither; caveats (undertrained, not at a minimum, collinear features) are listed")


def _landscape_claim(ds: str) -> Any:
    def evaluate(results: Results) -> Outcome:
        res = results[f"landscape:{ds}"]
        v = res["verdict"]
        relu, attn = res["models"]["relu"]["summary"], res["models"]["attn"]["summary"]
        ours = (f"top eigenvalue ReLU {mean_pm(relu['top_eigenvalue'])} vs Attn {mean_pm(attn['top_eigenvalue'])}; "
                f"filter-normalised increase ReLU {mean_pm(relu['filter_increase'])} vs Attn "
                f"{mean_pm(attn['filter_increase'])}; trace ReLU {mean_pm(relu['trace'])} vs Attn "
                f"{mean_pm(attn['trace'])}; train acc ReLU {mean_pm(relu['train_acc'])}, Attn "
                f"{mean_pm(attn['train_acc'])}")
        caveats = v.get("caveats") or []
        if caveats:
            ours += ". Caveats: " + "; ".join(caveats)
        cfg = res["config"]
        protocol = (f"{res['data'].get('label', ds)}, n_train={cfg['n_train']}, width {cfg['width']}, "
                    f"{cfg['train']['optimizer']} {cfg['train']['epochs']} epochs; Hessian of the training loss "
                    f"w.r.t. W ({cfg['hessian_iters']} Lanczos steps, {cfg['hutchinson_samples']} Hutchinson probes)")
        return Outcome(ours, VERDICT_MAP.get(v["verdict"], NA), protocol,
                       {"relu_sharper_seeds": v.get("relu_sharper_seeds")}, v.get("seeds"))

    return evaluate


LANDSCAPE_CLAIMS = [
    Claim(f"landscape-{ds}", "Sec. 5 (loss landscape)",
          f"{'MNIST' if ds == 'mnist' else 'CIFAR-10'}: 2L-ReLU sits in a sharp, narrow minimum; MLP-Attn in a "
          "broad, flat basin", paper="sharp (ReLU) vs flat (Attn); qualitative", rule=LANDSCAPE_RULE,
          units=(f"landscape:{ds}",), evaluate=_landscape_claim(ds), group="landscape")
    for ds in LANDSCAPE_DATASETS
]
