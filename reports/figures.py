"""matplotlib figures from result records (PNG, written atomically). Computes nothing scientific."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from empirics.records import atomic_write_bytes  # noqa: E402

MODEL_LABELS = {"relu": "2L-ReLU", "attn": "MLP-Attn"}
MODEL_COLORS = {"relu": "#1f77b4", "attn": "#d62728"}


def save_figure(fig: Any, path: str | Path, dpi: int = 150) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


def distance_vs_width(result: dict[str, Any], path: str | Path,
                      metrics: tuple[str, ...] = ("function_abs", "kernel_drift", "init_vs_analytic")) -> Path:
    """One panel per metric: mean ± std over seeds against width (log axes)."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    data = result.get("config", {}).get("dataset", "")
    for ax, metric in zip(axes[0], metrics, strict=True):
        for kind, res in result["models"].items():
            ws = sorted(int(w) for w in res["per_width"])
            mean = [res["per_width"][str(w)][metric]["mean"] for w in ws]
            std = [res["per_width"][str(w)][metric]["std"] for w in ws]
            ax.errorbar(ws, mean, yerr=std, marker="o", capsize=3, label=MODEL_LABELS.get(kind, kind),
                        color=MODEL_COLORS.get(kind))
        ax.set_xscale("log", base=2)
        if metric != "function_abs":
            ax.set_yscale("log")
        ax.set_xlabel("width m")
        ax.set_title(f"{metric} ({data})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
