"""Per-stage times of the claims experiments at a preset's sizes, each beside its GEMM floor.

The stages are the ones `verify claims` spends its time in: training (per epoch, at every width of
the preset, both networks), the float64 empirical NTK that influence is computed from
(`empirics.attribution.influence.model_kernels`), the NTK leave-one-out influence (`influence_from_kernels`) and
the attacks on the top-tau points. The GEMM floor of a stage is its flop count divided by this
machine's measured matrix-multiply rate in the stage's dtype: no implementation can beat it.

Two per-unit compositions give each stage's share of a unit of work (the formulas the claims
experiments follow):

- malleability unit (one network, one seed, one eps): training for the preset's epochs at the
  malleability width, then `influence_scores` (kernel + influence) for the clean set and after each
  of FGSM, PGD, MIM and the random baseline (5 x kernel + 5 x influence), plus the three attacks;
- NTK-distance unit (one network, one seed): training at every width for the preset's epochs.

Training for the full number of epochs is extrapolated from the measured epochs (marked).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.harness import Check, Row, Timing, TimingPolicy, fmt_time, time_call, time_result

SECTION = "8. Per-stage times of the claims experiments (GEMM floor beside each)"
C = 10


@dataclass
class StagesConfig:
    """Which presets to measure and how much of each."""

    presets: tuple[str, ...] = ("quick", "paper")
    train_epochs: dict[str, int] | None = None
    repeats: int = 3
    max_total_s: float = 20.0
    override: dict[str, dict[str, Any]] | None = None

    def epochs_measured(self, name: str) -> int:
        return (self.train_epochs or {"quick": 2, "paper": 1}).get(name, 1)


def gemm_rates(size: int = 2048) -> dict[str, float]:
    """Measured float32 and float64 matrix-multiply rates (flop/s), median of 5."""
    import torch

    out = {}
    for name, dt in (("float32", torch.float32), ("float64", torch.float64)):
        a = torch.randn(size, size, dtype=dt)
        b = torch.randn(size, size, dtype=dt)
        t = time_call(lambda a=a, b=b: a @ b, TimingPolicy(5, max_total_s=5.0))
        out[name] = 2.0 * size**3 / t.median
    return out


def train_flops(n: int, d: int, m: int) -> float:
    """One epoch: forward `x W^T` (2 n d m) and the weight gradient (2 n d m); the head is negligible."""
    return 4.0 * n * d * m + 4.0 * n * m * C


def kernel_flops(n: int, d: int, m: int, attn: bool) -> float:
    """`model_kernels` on N points: features (attn: 2 N d^2), pre-activations, Gram and mask products."""
    return 2.0 * n * m * d + 2.0 * n * n * (d + m) + (2.0 * n * d * d if attn else 0.0)


def influence_flops(n: int, n_test: int) -> float:
    """Cholesky (n^3/3), the inverse's diagonal and solves (about n^3), test products (2 n^2 (n_test + c))."""
    return n**3 / 3.0 + n**3 + 2.0 * n * n * (n_test + C)


def attack_flops(k: int, d: int, m: int, steps: int, attn: bool) -> float:
    """Per step on k points: forward and input gradient through W (4 k d m), and the context (attn: 4 k d^2)."""
    return steps * (4.0 * k * d * m + (4.0 * k * d * d if attn else 0.0))


@dataclass(frozen=True)
class GemmFloor:
    """A stage's work: its `flops`, run at the measured GEMM `rate` (flop/s) of its `dtype`."""

    flops: float
    rate: float
    dtype: str


def _row(name: str, stage: str, case: str, t: Timing, work: GemmFloor, checks: list[Check] | None = None) -> Row:
    """One stage's row: its time beside its GEMM floor (`work.flops / work.rate`)."""
    flops = work.flops
    floor = flops / work.rate
    return Row(SECTION, f"{name}: {stage}", case, t, value=f"floor {fmt_time(floor)} ({work.dtype} GEMM)",
               ratio=f"{t.median / floor:.1f}x floor", checks=checks or [],
               data={"median_s": t.median, "floor_s": floor, "flops": flops})


def bench_stages(cfg: StagesConfig, x: np.ndarray, y: np.ndarray, log: Callable[[str], None] = print
                 ) -> tuple[list[Row], dict[str, Any]]:
    """Rows per stage and preset, plus the per-unit share tables (in the returned data)."""
    import torch

    from empirics.attribution.influence import influence_from_kernels, model_kernels
    from empirics.common import Tensors, train_network
    from empirics.experiments.malleability import n_top, top_by_abs
    from empirics.nets.attacks import AttackConfig, attack
    from empirics.nets.losses import targets
    from empirics.nets.models import ModelSpec
    from empirics.nets.train import TrainConfig
    from verify.presets import preset

    rates = gemm_rates()
    rows: list[Row] = []
    data: dict[str, Any] = {"gemm_flops_per_s": rates, "presets": {}}
    d = x.shape[1]
    for name in cfg.presets:
        p = {**preset(name), **((cfg.override or {}).get(name, {}))}
        n, nt = p["mall_n_train"], p["mall_n_test"]
        ntr_dist = p["n_train"]
        xt = torch.as_tensor(x[:max(n, ntr_dist)])
        yt = torch.as_tensor(y[:max(n, ntr_dist)])
        xe = torch.as_tensor(x[len(x) - nt:])
        ye = torch.as_tensor(y[len(y) - nt:])
        ep = cfg.epochs_measured(name)
        pd: dict[str, Any] = {"sizes": {k: p[k] for k in ("n_train", "n_test", "widths", "epochs", "mall_width",
                                                          "mall_n_train", "mall_n_test", "attack_steps")},
                              "epochs_measured": ep, "train_epoch_s": {}, "stages": {}}
        log(f"  stages: preset {name}: training per epoch")
        trained: dict[str, Any] = {}
        for kind in ("relu", "attn"):
            for m in sorted(set(p["widths"]) | {p["mall_width"]}):
                nn_ = ntr_dist if m != p["mall_width"] else n
                t = Tensors(xt[:nn_], yt[:nn_], xe, ye, C)
                spec = ModelSpec(kind, d, m, C, seed=0)
                tic = time.perf_counter()
                tr = train_network(spec, t, TrainConfig(epochs=ep, seed=0), label=f"{kind} m={m}")
                per = (time.perf_counter() - tic) / ep
                if m == p["mall_width"]:
                    trained[kind] = tr.model
                tm = Timing([per], f"none; mean over {ep} epoch(s) of one training")
                pd["train_epoch_s"][f"{kind}/{m}/{nn_}"] = per
                rows.append(_row(name, "training, per epoch", f"{kind}, n={nn_}, m={m}, Adam, batch 128", tm,
                                 GemmFloor(train_flops(nn_, d, m), rates["float32"], "float32"),
                                 checks=[Check("training loss finite", 0.0 if np.isfinite(
                                     tr.record.final_train_loss) else 1.0, 0.0)]))
        for kind, model in trained.items():
            m = p["mall_width"]
            attn = kind == "attn"
            log(f"  stages: preset {name}: {kind} kernel, influence, attacks (n={n}, m={m})")
            reps = cfg.repeats if name != "paper" else 1
            kw = {"repeats": reps, "max_total_s": cfg.max_total_s, "warmup": 1 if name != "paper" else 0}
            tk, (K, Kst) = time_result(model_kernels, model, xt[:n], xe, **kw)
            sym = float(np.max(np.abs(K - K.T)) / np.max(np.abs(K)))
            rows.append(_row(name, "kernel (model_kernels, float64)", f"{kind}, N={n}+{nt}, m={m}", tk,
                             GemmFloor(kernel_flops(n + nt, d, m, attn), rates["float64"], "float64"),
                             checks=[Check("kernel symmetry error", sym, 1e-12)]))
            Y = targets(yt[:n], C, torch.float64).numpy()
            Yt = targets(ye, C, torch.float64).numpy()
            ti, inf = time_result(influence_from_kernels, (K, Kst), Y, Yt, ye.numpy(), **kw)
            rows.append(_row(name, "influence (influence_from_kernels)", f"{kind}, n={n}, n_test={nt}", ti,
                             GemmFloor(influence_flops(n, nt), rates["float64"], "float64"),
                             checks=[Check("influence finite", 0.0 if np.all(np.isfinite(inf.total)) else 1.0, 0.0)]))
            k = n_top(0.1, n)
            sel = torch.as_tensor(top_by_abs(inf.total, k))
            att_s: dict[str, float] = {}
            for an in ("fgsm", "pgd", "mim"):
                steps = 1 if an == "fgsm" else p["attack_steps"]
                acfg = AttackConfig(an, 0.3, steps=steps, seed=0)
                ta, adv = time_result(attack, model, xt[:n][sel], yt[:n][sel], acfg, train_x=xt[:n], train_idx=sel,
                                      **kw)
                excess = float(((adv - xt[:n][sel]).abs().max() - 0.3).clamp(min=0))
                att_s[an] = ta.median
                rows.append(_row(name, f"attack {an.upper()}", f"{kind}, top {k} of {n}, m={m}, {steps} step(s)", ta,
                                 GemmFloor(attack_flops(k, d, m, steps, attn), rates["float32"], "float32"),
                                 checks=[Check("L-inf excess over eps", excess, 1e-6)]))
            epochs = p["epochs"]
            unit = {"training": epochs * pd["train_epoch_s"][f"{kind}/{m}/{n}"], "kernel": 5 * tk.median,
                    "influence": 5 * ti.median, "attacks": sum(att_s.values())}
            floor = {"training": epochs * train_flops(n, d, m) / rates["float32"],
                     "kernel": 5 * kernel_flops(n + nt, d, m, attn) / rates["float64"],
                     "influence": 5 * influence_flops(n, nt) / rates["float64"],
                     "attacks": sum(attack_flops(k, d, m, 1 if a == "fgsm" else p["attack_steps"], attn)
                                    for a in att_s) / rates["float32"]}
            pd["stages"][kind] = {"unit_s": unit, "floor_s": floor, "kernel_s": tk.median, "influence_s": ti.median,
                                  "attack_s": att_s, "k": k}
        dist = {kind: sum(p["epochs"] * pd["train_epoch_s"][f"{kind}/{m}/{ntr_dist}"] for m in p["widths"]
                          if f"{kind}/{m}/{ntr_dist}" in pd["train_epoch_s"]) for kind in ("relu", "attn")}
        pd["distance_unit_training_s"] = dist
        data["presets"][name] = pd
    return rows, data


def share_table(data: dict[str, Any]) -> str:
    """Markdown: per preset and network, each stage's time in a malleability unit, its share and floor."""
    lines = ["| preset | network | stage | time in one malleability unit | share | GEMM floor | x floor |",
             "|---|---|---|---|---|---|---|"]
    for name, pd in data.get("presets", {}).items():
        for kind, st in pd["stages"].items():
            total = sum(st["unit_s"].values())
            for stage, s in st["unit_s"].items():
                fl = st["floor_s"][stage]
                mark = f" (extrapolated from {pd['epochs_measured']} epoch(s))" if stage == "training" else ""
                lines.append(f"| {name} | {kind} | {stage} | {fmt_time(s)}{mark} | {100 * s / total:.0f}% | "
                             f"{fmt_time(fl)} | {s / fl:.1f}x |")
            lines.append(f"| {name} | {kind} | **total** | **{fmt_time(total)}** | 100% | "
                         f"{fmt_time(sum(st['floor_s'].values()))} | |")
        for kind, s in pd["distance_unit_training_s"].items():
            lines.append(f"| {name} | {kind} | NTK-distance unit: training at all widths | {fmt_time(s)} "
                         f"(extrapolated) | | | |")
    return "\n".join(lines)
