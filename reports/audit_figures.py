"""Figures of the `verify audit` report, drawn from the audit record (computes nothing scientific)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import matplotlib.ticker
import numpy as np

from reports.figures import MODEL_COLORS, plt, save_figure

USER_COLOR = "#222222"
ATTACK_LABELS = {"fgsm": "FGSM", "pgd": "PGD", "mim": "MIM", "random": "random noise"}


def _color(key: str) -> str:
    return USER_COLOR if key == "user" else MODEL_COLORS.get(key, "#777777")


def _eps_text(eps: float) -> str:
    k = eps * 255
    return f"{round(k)}/255" if abs(k - round(k)) < 1e-6 else f"{eps:g}"


def _short(label: str) -> str:
    return label.replace(" (m=", "\n(m=")


def flip_rates(result: dict[str, Any], path: str | Path) -> Path:
    """Grouped bars: flip rate per attack for each model, random noise as mean +- std, with the
    user's noise ceiling and the risk thresholds as horizontal lines."""
    models = result["models"]
    attacks = list(result["config"]["attacks"]) + ["random"]
    keys = list(models)
    width = 0.8 / len(keys)
    fig, ax = plt.subplots(figsize=(7.2, 3.1))
    for j, key in enumerate(keys):
        m = models[key]
        vals = [100 * m["attacks"][a]["flip_rate"] for a in attacks[:-1]] + [100 * m["baseline"]["mean"]]
        errs = [0.0] * (len(attacks) - 1) + [100 * m["baseline"]["std"]]
        xs = np.arange(len(attacks)) + (j - (len(keys) - 1) / 2) * width
        ax.bar(xs, vals, width * 0.92, yerr=errs, capsize=3, color=_color(key), label=m["label"],
               alpha=0.9 if key == "user" else 0.75)
        for xv, v in zip(xs, vals, strict=True):
            ax.text(xv, v + 0.6, f"{v:.0f}", ha="center", va="bottom", fontsize=6.5)
    risk = result["risk"]
    ax.axhline(100 * risk["noise_ceiling"], color="#555", ls=":", lw=1, label="noise ceiling (your model)")
    if risk["high_floor"] > risk["low_ceiling"]:
        if math.isfinite(risk["high_floor"]):
            ax.axhspan(100 * risk["high_floor"], ax.get_ylim()[1] * 1.08, color="#cf222e", alpha=0.06, lw=0)
        ax.axhspan(0, 100 * risk["low_ceiling"], color="#1a7f37", alpha=0.06, lw=0)
    ax.set_xticks(np.arange(len(attacks)), [ATTACK_LABELS.get(a, a) for a in attacks])
    ax.set_ylabel("flip rate (%)")
    ax.set_ylim(0, max(5.0, ax.get_ylim()[1] * 1.08))
    ax.set_title(f"Influence sign flips among the top {result['models']['user']['n_selected']} training points "
                 f"(eps = {_eps_text(result['config']['eps'])})", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def _signed_ticks(lo_mag: float, hi_mag: float) -> tuple[list[float], list[str]]:
    """0 and up to three powers of ten per sign between two magnitudes, as mathtext labels."""
    ks = list(range(math.ceil(math.log10(lo_mag)), math.floor(math.log10(hi_mag)) + 1))
    if not ks:
        ks = [math.floor(math.log10(hi_mag))]
    if len(ks) > 3:
        ks = ks[:: math.ceil(len(ks) / 3)]
    ticks = [-(10.0**k) for k in reversed(ks)] + [0.0] + [10.0**k for k in ks]
    labels = [f"$-10^{{{k}}}$" for k in reversed(ks)] + ["0"] + [f"$10^{{{k}}}$" for k in ks]
    return ticks, labels


def _signed_log_axes(ax: Any, xs: np.ndarray, ys: np.ndarray) -> None:
    """asinh axes (linear near zero, logarithmic beyond the median magnitude) with uncluttered ticks."""
    for values, axis, setter in ((xs, ax.xaxis, ax.set_xscale), (ys, ax.yaxis, ax.set_yscale)):
        finite = np.abs(values[np.isfinite(values) & (values != 0)])
        if not finite.size:
            continue
        width = float(np.quantile(finite, 0.5))
        setter("asinh", linear_width=width)
        ticks, labels = _signed_ticks(width, float(finite.max()))
        axis.set_ticks(ticks, labels)
        axis.set_minor_locator(matplotlib.ticker.NullLocator())


def influence_panels(result: dict[str, Any], path: str | Path) -> Path:
    """(a) NTK leave-one-out vs Gauss-Newton influence; (b) influence before vs after the worst attack."""
    user = result["models"]["user"]
    total = np.asarray(user["influence_total"], dtype=float)
    gn = np.asarray(user["gn_total"], dtype=float)
    before = np.asarray(user.get("estimator_total", user["influence_total"]), dtype=float)
    worst = user["worst_attack"]
    after = np.asarray(user["attacks"][worst]["new_total"], dtype=float)
    sel = np.asarray(user["selected"], dtype=int)
    flipped = np.array([e["flipped"] for e in user["attacks"][worst]["examples"]], dtype=bool)
    fig, axes = plt.subplots(1, 2, figsize=(7.4, 3.2))
    ax = axes[0]
    ax.scatter(total, gn, s=6, color=USER_COLOR, alpha=0.5, lw=0)
    _signed_log_axes(ax, total, gn)
    ax.axhline(0, color="#999", lw=0.6)
    ax.axvline(0, color="#999", lw=0.6)
    ax.set_xlabel("NTK leave-one-out influence")
    ax.set_ylabel("Gauss-Newton influence")
    ax.set_title(f"(a) two influence estimates, Spearman {user['rho_ntk_gn']:.2f}", fontsize=8.5)
    ax = axes[1]
    rest = np.setdiff1d(np.arange(len(before)), sel)
    ax.scatter(before[rest], after[rest], s=5, color="#aaaaaa", lw=0, label="other points")
    ax.scatter(before[sel][~flipped], after[sel][~flipped], s=9, color="#1f77b4", lw=0, label="top, same sign")
    ax.scatter(before[sel][flipped], after[sel][flipped], s=12, color="#d62728", lw=0, label="top, sign flipped")
    _signed_log_axes(ax, before, after)
    ax.axhline(0, color="#999", lw=0.6)
    ax.axvline(0, color="#999", lw=0.6)
    ax.set_xlabel(f"{user.get('estimator_label', 'NTK leave-one-out')} influence before")
    ax.set_ylabel(f"influence after {ATTACK_LABELS.get(worst, worst)}")
    ax.set_title(f"(b) before vs after {ATTACK_LABELS.get(worst, worst)}, rho {user['worst_rho_all']:.2f}",
                 fontsize=8.5)
    ax.legend(fontsize=6.5, loc="lower right", framealpha=0.85, markerscale=1.5)
    for a in axes:
        a.tick_params(labelsize=7)
        a.grid(alpha=0.25)
    fig.tight_layout()
    return save_figure(fig, path)


def _image(pixels: list[float], shape: list[int]) -> tuple[np.ndarray, str | None]:
    arr = np.clip(np.asarray(pixels, dtype=float).reshape(shape), 0, 1)
    if arr.shape[0] == 1:
        return arr[0], "gray"
    return arr[:3].transpose(1, 2, 0), None


def levers(result: dict[str, Any], path: str | Path, per_row: int = 6) -> Path:
    """The lever examples: each clean image above its worst-attack version, or influence bars when the
    inputs are not images."""
    items = result["levers"]
    shape = result["data"]["image_shape"]
    worst = ATTACK_LABELS.get(result["models"]["user"]["worst_attack"], "attack")
    if not shape or len(shape) != 3 or not items:
        return _lever_bars(items, path, result["models"]["user"].get("estimator_label", "NTK leave-one-out"))
    blocks = math.ceil(len(items) / per_row)
    fig, axes = plt.subplots(2 * blocks, per_row, figsize=(7.2, 2.55 * blocks), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for k, it in enumerate(items):
        r, c = 2 * (k // per_row), k % per_row
        img, cmap = _image(it["pixels"], shape)
        axes[r, c].imshow(img, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        flips = ",".join(ATTACK_LABELS.get(a, a) for a in it["flipped_by"]) or "none"
        axes[r, c].set_title(f"#{it['index']} · {it['class']}\n{it['role']} {it['influence']:+.2g}", fontsize=6.5,
                             color="#cf222e" if it["flipped_by"] else "#222")
        img2, _ = _image(it["perturbed_pixels"], shape)
        axes[r + 1, c].imshow(img2, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        axes[r + 1, c].set_title(f"after {worst}\nflipped by: {flips}", fontsize=6, color="#555")
    fig.tight_layout(h_pad=0.6, w_pad=0.4)
    return save_figure(fig, path)


def lever_strip(result: dict[str, Any], path: str | Path, count: int = 8) -> Path | None:
    """The first page's thumbnails: the top `count` levers as they are in your data, each with its class and role
    (None when the inputs are not images)."""
    items = result["levers"][:count]
    shape = result["data"]["image_shape"]
    if not shape or len(shape) != 3 or not items:
        return None
    fig, axes = plt.subplots(1, len(items), figsize=(0.9 * len(items), 1.25), squeeze=False)
    for ax, it in zip(axes[0], items, strict=True):
        img, cmap = _image(it["pixels"], shape)
        ax.imshow(img, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"{it['class']}\n{it['role']}", fontsize=6, color="#cf222e" if it["flipped_by"] else "#222")
        ax.axis("off")
    fig.tight_layout(w_pad=0.3)
    return save_figure(fig, path)


def _lever_bars(items: list[dict[str, Any]], path: str | Path, estimator: str = "NTK leave-one-out") -> Path:
    fig, ax = plt.subplots(figsize=(7.0, 0.25 * max(4, len(items)) + 0.8))
    labels = [f"#{it['index']} ({it['class']})" for it in items]
    vals = [it["influence"] for it in items]
    colors = ["#d62728" if it["flipped_by"] else "#1f77b4" for it in items]
    ax.barh(np.arange(len(items)), vals, color=colors)
    ax.set_yticks(np.arange(len(items)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(0, color="#999", lw=0.6)
    ax.set_xlabel(f"{estimator} influence (red: sign flipped by an attack)")
    fig.tight_layout()
    return save_figure(fig, path)


def spectra(result: dict[str, Any], path: str | Path) -> Path:
    """Eigenvalues of each model's empirical NTK, normalised by the largest (log scale)."""
    fig, ax = plt.subplots(figsize=(5.4, 2.7))
    for key, m in result["models"].items():
        ev = np.asarray(m["ntk"]["eigenvalues"], dtype=float)
        ev = ev[ev > 0] / ev[0] if ev.size and ev[0] > 0 else ev
        kappa = m["ntk"]["kappa"]
        kap = f"kappa = {kappa:.2g}" if math.isfinite(kappa) else "singular"
        ax.plot(np.arange(1, ev.size + 1), ev, color=_color(key), lw=1.3, label=f"{m['label']}: {kap}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("eigenvalue index")
    ax.set_ylabel("lambda_i / lambda_1")
    ax.set_title("Spectrum of the empirical NTK on the training subset", fontsize=8.5)
    ax.legend(fontsize=6.5, frameon=False)
    ax.grid(alpha=0.25)
    fig.tight_layout()
    return save_figure(fig, path)


def budget(panel: dict[str, Any], path: str | Path) -> Path:
    """Flip rate (top) and the kernel predictor's test-accuracy change (bottom) against eps and against k,
    the attack beside random noise of the same size (noise ceiling = mean + 2 std)."""
    refit = panel.get("refit") if isinstance(panel.get("refit"), dict) and "by_eps" in panel["refit"] else None
    rows = 3 if refit else 2
    fig, axes = plt.subplots(rows, 2, figsize=(7.4, 2.3 * rows), sharex="col")
    attack = ATTACK_LABELS.get(panel["attack"], panel["attack"])
    for col, (key, xkey) in enumerate((("by_eps", "eps"), ("by_k", "k"))):
        pts = panel[key]
        xs = np.array([p[xkey] for p in pts], dtype=float)
        ax = axes[0, col]
        ax.plot(xs, [100 * p["flip_rate"] for p in pts], "o-", color=USER_COLOR, lw=1.4, ms=3.5, label=attack)
        ax.plot(xs, [100 * p["noise_mean"] for p in pts], "s--", color="#888", lw=1, ms=3, label="random noise (mean)")
        ax.fill_between(xs, 0, [100 * p["noise_ceiling"] for p in pts], color="#bbbbbb", alpha=0.35, lw=0,
                        label="below noise ceiling")
        ax.set_ylabel("flip rate (%)")
        ax = axes[1, col]
        ax.plot(xs, [100 * p["kernel_acc_change"] for p in pts], "o-", color=USER_COLOR, lw=1.4, ms=3.5,
                label=attack)
        ax.errorbar(xs, [100 * p["kernel_acc_change_noise"] for p in pts],
                    yerr=[100 * p["kernel_acc_change_noise_std"] for p in pts], fmt="s--", color="#888", lw=1,
                    ms=3, capsize=2, label="random noise")
        ax.axhline(0, color="#999", lw=0.6)
        ax.set_ylabel("kernel predictor:\ntest accuracy change (pp)")
        if refit:
            ax = axes[2, col]
            rp = refit[key]
            rx = np.array([p[xkey] for p in rp], dtype=float)
            for arm, fmt, color, lw, ms, what in (("levers", "o-", USER_COLOR, 1.4, 3.5, "levers"),
                                                  ("random", "s--", "#888", 1.0, 3.0, "random points")):
                mid = np.array([100 * p[arm]["target_flip"] for p in rp])
                ivs = [p.get("rows", {}).get("target_flip", {}).get(arm) for p in rp]
                err = None
                if None not in ivs:
                    lo, hi = (np.array([100 * iv[end] for iv in ivs]) for end in ("lo", "hi"))
                    err = [mid - lo, hi - mid]
                ax.errorbar(rx, mid, yerr=err, fmt=fmt, color=color, lw=lw, ms=ms, capsize=2,
                            label=f"{what} ({attack})")
            ax.set_ylabel("re-fitted model:\ntargeted predictions\nchanged (%)")
            if col == 0:
                ax.legend(fontsize=6.5, frameon=False)
    for ax in axes[:, 0]:
        ax.set_xscale("log")
        ax.axvline(panel["realistic_eps"], color="#1a7f37", ls=":", lw=1)
        if panel.get("breaking_eps"):
            ax.axvline(panel["breaking_eps"], color="#cf222e", ls="--", lw=1)
    axes[-1, 0].set_xlabel("eps (green: default 8/255; red: breaking budget)", fontsize=8)
    axes[-1, 1].set_xlabel(f"k, points perturbed (eps = {_eps_text(panel['eps'])})", fontsize=8)
    ks = [p["k"] for p in panel["by_k"]]
    for ax in axes[:, 1]:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(ks))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FixedFormatter([str(k) for k in ks]))
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    axes[0, 0].set_title(f"against eps (top {panel['by_eps'][0]['k']} points)", fontsize=8.5)
    axes[0, 1].set_title("against k", fontsize=8.5)
    axes[0, 0].legend(fontsize=6.5, frameon=False)
    for ax in axes.ravel():
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.25)
    fig.tight_layout()
    return save_figure(fig, path)


def validity(panel: dict[str, Any], path: str | Path) -> Path:
    """(a) predicted vs actual change of the mean test loss over the random subsets; (b) every estimator's LDS with
    its interval, one row each, best first, beside the noise ceiling and the validation bar (a row per estimator,
    labelled in full: a dozen long names do not fit under a narrow axis)."""
    names = sorted(((k, s.get("label", k)) for k, s in panel["lds"].items()),
                   key=lambda kv: -panel["lds"][kv[0]]["value"] if math.isfinite(panel["lds"][kv[0]]["value"])
                   else math.inf)
    rows = max(1, len(names))
    fig = plt.figure(figsize=(7.4, 2.6 + 0.24 * rows + 0.6), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[2.6, 0.24 * rows + 0.6])  # each its own left margin
    axes = [top.subplots(), bottom.subplots()]
    ax = axes[0]
    sc = panel["scatter"]
    ax.scatter(sc["predicted"], sc["actual"], s=12, color=USER_COLOR, alpha=0.7, lw=0, label="random subsets")
    for arm, color in (("top", "#cf222e"), ("random", "#1f77b4")):
        r = panel["removal"][arm]
        ax.scatter([r["predicted"]], [r["actual"]], s=40, marker="D", color=color,
                   label=f"{'top' if arm == 'top' else 'random'} {r['k']} left out")
    noise = panel["noise"]["sd"]
    ax.axhspan(-2 * noise, 2 * noise, color="#bbbbbb", alpha=0.35, lw=0, label="re-fit noise (±2 sd)")
    ax.set_xlabel(textwrap.fill(f"predicted change ({panel.get('lead_label', 'NTK leave-one-out')} influence, the "
                                "lead)", 90), fontsize=7)
    ax.set_ylabel("actual change after re-fit\n(mean test loss)", fontsize=7)
    ax.legend(fontsize=6, frameon=False)
    ax = axes[1]
    lead = panel.get("lead")
    for j, (key, _) in enumerate(names):
        s = panel["lds"][key]
        lo = s["lo"] if math.isfinite(s["lo"]) else s["value"]
        hi = s["hi"] if math.isfinite(s["hi"]) else s["value"]
        color = "#cf222e" if key == lead else USER_COLOR
        ax.errorbar([s["value"]], [j], xerr=[[s["value"] - lo], [hi - s["value"]]], fmt="o", color=color,
                    capsize=3, ms=4)
        ax.text(hi + 0.01, j, f"{s['value']:.2f}", fontsize=6, va="center")
    ceil = panel.get("ceiling", {}).get("value", math.nan)
    if math.isfinite(ceil):
        ax.axvline(ceil, color="#555", ls="--", lw=1, label="noise ceiling")
        ax.axvline(panel["fraction_min"] * ceil, color="#1a7f37", ls=":", lw=1,
                   label=f"validation bar ({panel['fraction_min']:g} x ceiling)")
    ax.axvline(0, color="#999", lw=0.6)
    ax.set_yticks(range(len(names)), [textwrap.shorten(n, 70) + (" (lead)" if k == lead else "")
                                      for k, n in names], fontsize=6)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlim(min(-0.2, ax.get_xlim()[0]), max(1.0, ax.get_xlim()[1]))
    ax.set_xlabel("LDS against the re-fits (95 % interval)", fontsize=7)
    ax.legend(fontsize=6, frameon=False, loc="lower right")
    for a in axes:
        a.tick_params(labelsize=6)
        a.grid(alpha=0.25)
    return save_figure(fig, path)


POISON_LABELS = {"self_influence_ntk": "self-influence\n(NTK, audit)", "harmful_ntk": "harmful\n(NTK)",
                 "levers_abs_ntk": "levers\n|NTK|", "harmful_gn": "harmful\n(Gauss-Newton)",
                 "training_loss": "training loss\n(baseline)"}


def poison(panel: dict[str, Any], path: str | Path) -> Path:
    """Precision at k of each ranking for the planted poison, split by kind, with the chance level."""
    keys = list(panel["rankings"])
    fig, ax = plt.subplots(figsize=(6.4, 2.5))
    xs = np.arange(len(keys))
    rk = panel["rankings"]
    ax.bar(xs - 0.27, [100 * rk[k]["precision"] for k in keys], 0.26, color=USER_COLOR, label="precision at k")
    ax.bar(xs, [100 * rk[k]["recall_label_flip"] for k in keys], 0.26, color="#d62728", alpha=0.8,
           label="label flips found")
    ax.bar(xs + 0.27, [100 * rk[k]["recall_perturbation"] for k in keys], 0.26, color="#1f77b4", alpha=0.8,
           label="perturbations found")
    ax.axhline(100 * panel["chance"], color="#555", ls=":", lw=1, label="chance (k / n)")
    ax.set_xticks(xs, [POISON_LABELS.get(k, k) for k in keys], fontsize=7)
    ax.set_ylabel("% (top k)")
    ax.set_ylim(0, 105)
    ax.set_title(f"Planted poison: {panel['k']} of {round(panel['k'] / panel['chance'])} training points, top k = "
                 f"{panel['k']}", fontsize=8.5)
    ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def all_figures(result: dict[str, Any], folder: str | Path) -> dict[str, Path]:
    """Every audit figure as PNG in `folder`; returns name -> path (panels that were not run are left out)."""
    folder = Path(folder)
    out = {
        "flip_rates": flip_rates(result, folder / "flip_rates.png"),
        "influence": influence_panels(result, folder / "influence.png"),
        "levers": levers(result, folder / "levers.png"),
        "spectra": spectra(result, folder / "spectra.png"),
    }
    strip = lever_strip(result, folder / "lever_strip.png")
    if strip is not None:
        out["lever_strip"] = strip
    panels = result.get("panels", {})
    if "by_eps" in panels.get("budget", {}):
        out["budget"] = budget(panels["budget"], folder / "budget.png")
    if "lds" in panels.get("validity", {}):
        out["validity"] = validity(panels["validity"], folder / "validity.png")
    if "rankings" in panels.get("poison", {}):
        out["poison"] = poison(panels["poison"], folder / "poison.png")
    return out
