"""matplotlib figures from result records (PNG, written atomically). Computes nothing scientific."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ntkm.io import atomic_write_bytes  # noqa: E402
from ntkm.tables import at_width, widths  # noqa: E402
from theory.paper import PAPER_MODEL_NAMES  # noqa: E402

MODEL_COLORS = {"relu": "#1f77b4", "attn": "#d62728"}


def save_figure(fig: Any, path: str | Path, dpi: int = 150) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


def distance_vs_width(result: dict[str, Any], path: str | Path,
                      metrics: tuple[str, ...] = ("function_abs", "kernel_drift_centred",
                                                  "init_vs_analytic_centred")) -> Path:
    """One panel per metric: mean ± std over seeds against width (log axes); the legend gives each model's
    log-log slope with its 95 % interval over seeds where the record has one."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    data = result.get("config", {}).get("dataset", "")
    for ax, metric in zip(axes[0], metrics, strict=True):
        for kind, res in result["models"].items():
            ws = widths(res["per_width"])
            if metric not in res["per_width"][str(ws[0])]:
                continue
            mean = [at_width(res["per_width"], w, metric)["mean"] for w in ws]
            std = [at_width(res["per_width"], w, metric)["std"] for w in ws]
            si = res.get("trends", {}).get(metric, {}).get("slope_interval")
            label = PAPER_MODEL_NAMES.get(kind, kind) + (
                f" (slope {si['slope']:.2f} [{si['ci'][0]:.2f}, {si['ci'][1]:.2f}])" if si else "")
            ax.errorbar(ws, mean, yerr=std, marker="o", capsize=3, label=label, color=MODEL_COLORS.get(kind))
        ax.set_xscale("log", base=2)
        if metric != "function_abs":
            ax.set_yscale("log")
        ax.set_xlabel("width m")
        ax.set_title(f"{metric} ({data})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def kappa_vs_n(kappa_results: dict[str, dict[str, Any]], path: str | Path,
               paper_kappa: dict[str, float] | None = None) -> Path:
    """kappa(G) and kappa_d(G) against n per dataset (log axes), with the paper's value as a line."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    colors = {"mnist": "#1f77b4", "cifar10": "#ff7f0e"}
    for ds, res in kappa_results.items():
        rows = res.get("rows", [])
        if not rows:
            continue
        ns = [r["n"] for r in rows]
        k = [float(r["kappa"]) for r in rows]
        kd = [float(r["kappa_d"]) for r in rows]
        finite = [(n, v) for n, v in zip(ns, k, strict=True) if v != float("inf")]
        if finite:
            ax.plot(*zip(*finite, strict=True), "o-", color=colors.get(ds), label=f"{ds} kappa(G)")
        ax.plot(ns, kd, "s--", color=colors.get(ds), alpha=0.6, label=f"{ds} kappa_d(G)")
        if paper_kappa and ds in paper_kappa:
            ax.axhline(paper_kappa[ds], color=colors.get(ds), lw=0.8, ls=":", label=f"{ds}: paper's value")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("n (first n training images, raw pixels)")
    ax.set_ylabel("condition number")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def _landscape_mean(runs: list[dict[str, Any]], key: str, split: str) -> tuple[list[float], Any, Any, Any]:
    """x values, and the mean / min / max over seeds of one landscape curve."""
    import numpy as np

    xs = runs[0][key]["alpha" if key == "interpolation" else "t"]
    vals = np.asarray([r[key][split] for r in runs], dtype=float)
    return xs, vals.mean(axis=0), vals.min(axis=0), vals.max(axis=0)


def landscape_lines(result: dict[str, Any], path: str | Path) -> Path:
    """Left: training (solid) and test (dashed) loss from initialisation (alpha 0) to the trained
    weights (alpha 1) and beyond. Right: the 1-D slice along a filter-normalised random direction.
    Mean over seeds, with the min-max band of the training loss."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    data = result.get("config", {}).get("dataset", "")
    spans = []
    for ax, key, xlabel in ((axes[0], "interpolation", "alpha  (0 = init, 1 = trained)"),
                            (axes[1], "slice_1d", "t  (filter-normalised step)")):
        for kind, res in result["models"].items():
            runs = res["runs"]
            color = MODEL_COLORS.get(kind)
            label = PAPER_MODEL_NAMES.get(kind, kind)
            xs, mean, lo, hi = _landscape_mean(runs, key, "train")
            ax.plot(xs, mean, color=color, label=f"{label} train")
            ax.fill_between(xs, lo, hi, color=color, alpha=0.15, linewidth=0)
            xs_t, mean_t, _, _ = _landscape_mean(runs, key, "test")
            ax.plot(xs_t, mean_t, color=color, linestyle="--", label=f"{label} test")
            spans.append((float(min(lo.min(), mean_t.min())), float(max(hi.max(), mean_t.max()))))
        for x0 in ((0.0, 1.0) if key == "interpolation" else (0.0,)):
            ax.axvline(x0, color="grey", linewidth=0.6, linestyle=":")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    lo_all = min(s[0] for s in spans) if spans else 1.0
    hi_all = max(s[1] for s in spans) if spans else 1.0
    if lo_all > 0 and hi_all / lo_all > 20:
        for ax in axes:
            ax.set_yscale("log")
    n_seeds = len(next(iter(result["models"].values()))["runs"]) if result["models"] else 0
    axes[0].set_title(f"linear interpolation ({data}, {n_seeds} seeds)", fontsize=9)
    axes[1].set_title(f"1-D filter-normalised slice ({data})", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def landscape_contours(result: dict[str, Any], path: str | Path) -> Path:
    """One panel per model: the training-loss increase over the trained weights, `L - L(W_T)`, on the
    2-D filter-normalised slice of the first seed. Filled levels are shared across panels (so basin
    widths compare directly); the line contours are each panel's own, labelled."""
    import numpy as np

    kinds = list(result["models"])
    fig, axes = plt.subplots(1, max(1, len(kinds)), figsize=(4.8 * max(1, len(kinds)), 4.4), squeeze=False,
                             constrained_layout=True)
    grids = {}
    for kind in kinds:
        run = result["models"][kind]["runs"][0]
        ts = np.asarray(run["grid_2d"]["t"], dtype=float)
        z = np.asarray(run["grid_2d"]["train"], dtype=float)
        c = int(np.argmin(np.abs(ts)))
        grids[kind] = (ts, z - z[c, c], run["seed"])
    zmin = min(float(g[1].min()) for g in grids.values()) if grids else 0.0
    zmax = max(float(g[1].max()) for g in grids.values()) if grids else 1.0
    shared = np.linspace(zmin, zmax if zmax > zmin else zmin + 1e-12, 16)
    data = result.get("config", {}).get("dataset", "")
    filled = None
    for ax, kind in zip(axes[0], kinds, strict=False):
        ts, dz, seed = grids[kind]
        filled = ax.contourf(ts, ts, dz, levels=shared, cmap="viridis")
        if float(dz.max()) > float(dz.min()):
            lines = ax.contour(ts, ts, dz, levels=8, colors="white", linewidths=0.6)
            ax.clabel(lines, fontsize=6, fmt="%.2g")
        ax.plot([0.0], [0.0], marker="*", color="red", markersize=9)
        ax.set_aspect("equal")
        ax.set_xlabel("direction 1")
        ax.set_ylabel("direction 2")
        ax.set_title(f"{PAPER_MODEL_NAMES.get(kind, kind)} ({data}, seed {seed})\ntrain loss - L(W_T)", fontsize=9)
    if filled is not None:
        fig.colorbar(filled, ax=list(axes[0]), shrink=0.85, format="%.3g", label="L - L(W_T) (shared scale)")
    return save_figure(fig, path)


def flip_rate_bars(results: dict[str, dict[str, Any]], path: str | Path) -> Path:
    """Flip rate per attack for each model with its 95 % t interval over seeds, with the
    random-noise baseline as a hatched bar; one panel per malleability result (e.g. MNIST and CIFAR-10)."""
    import numpy as np

    names = list(results)
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        res = results[name]
        rows = [r for r in res["summary"]["rows"] if r["training"] == "standard"
                and r["intervention"] == "transformed" and r["eps"] == res["eps_values"][0]]
        attacks = list(dict.fromkeys(r["attack"] for r in rows))
        labels = [*attacks, "random"]
        x = np.arange(len(labels))
        for k, kind in enumerate(("relu", "attn")):
            mine = {r["attack"]: r for r in rows if r["model"] == kind}
            if not mine:
                continue
            any_row = next(iter(mine.values()))
            cis = [mine[a].get("flip_ci") for a in attacks] + [any_row.get("baseline_ci")]
            if all(cis):
                means = [100 * float(c["value"]) for c in cis]
                err = np.array([[100 * (float(c["value"]) - float(c["lo"])) for c in cis],
                                [100 * (float(c["hi"]) - float(c["value"])) for c in cis]])
            else:  # records without intervals: mean +- std over seeds
                base = any_row["baseline_flip_rate"]
                means = [100 * mine[a]["flip_rate"]["mean"] for a in attacks] + [100 * base["mean"]]
                err = np.array([100 * mine[a]["flip_rate"]["std"] for a in attacks] + [100 * base["std"]])
            bars = ax.bar(x + (k - 0.5) * 0.38, means, 0.38, yerr=err, capsize=3, color=MODEL_COLORS[kind],
                          label=PAPER_MODEL_NAMES[kind], alpha=0.85)
            bars[-1].set_hatch("//")
            bars[-1].set_alpha(0.45)
        ax.set_xticks(x, [lab.upper() if lab != "random" else "random\n(baseline)" for lab in labels])
        ax.set_ylabel("flip rate of top-tau points (%)")
        title = f"{res['data'].get('label', name)}"[:60]
        ax.set_title(f"{title}\n{res['config']['task']}, eps {res['eps_values'][0]:g}", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
