"""Attack throughput and the cost of one flip-rate evaluation, at the quick preset's sizes.

- Attacks: `empirics.nets.attacks.attack` (FGSM, PGD with random start, MIM) on the whole training set of
  the quick preset (`mall_n_train` points, width `mall_width`, `attack_steps` steps, eps 0.3) for
  both trained networks; examples per second. Checked in the same run: every output inside the
  eps-ball and the [0, 1] box, and the mean loss raised above the clean loss.
- One flip-rate evaluation (one model, one attack): clean NTK influence, top-tau selection,
  the attack on the selected points, the kernel and influence recomputed on the modified training
  set, sign flips counted (`empirics.experiments.malleability` pieces). Checked: the suite's influence against
  the independent implementation `theory.krr.loo_influence` on the same kernels. Also the module's
  own `measure_model` for one model and one attack (it adds the random-noise baseline).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.harness import Check, Row, TimingPolicy, fmt_time, max_rel_diff, time_call

SECTION = "3. Attacks and the malleability loop (quick-preset sizes)"


@dataclass
class AttackBenchConfig:
    """Sizes; `None` takes the value of the quick preset (`verify.presets`)."""

    n_train: int | None = None
    n_test: int | None = None
    width: int | None = None
    steps: int | None = None
    epochs: int | None = None
    eps: float = 0.3
    tau: float = 0.1
    repeats: int = 3
    max_total_s: float = 20.0
    attacks: tuple[str, ...] = ("fgsm", "pgd", "mim")
    models: tuple[str, ...] = ("relu", "attn")
    flip_model: str = "attn"
    flip_attack: str = "pgd"

    def resolved(self) -> AttackBenchConfig:
        """A copy with every `None` replaced by the quick preset's value."""
        from verify.presets import preset

        q = preset("quick")
        return AttackBenchConfig(
            self.n_train or q["mall_n_train"], self.n_test or q["mall_n_test"], self.width or q["mall_width"],
            self.steps or q["attack_steps"], self.epochs if self.epochs is not None else q["epochs"], self.eps,
            self.tau, self.repeats, self.max_total_s, self.attacks, self.models, self.flip_model, self.flip_attack)


def _loss(model: Any, x: Any, y: Any) -> float:
    import torch

    from empirics.nets.losses import loss_fn

    with torch.no_grad():
        out = model(x)
        return float(loss_fn(out.shape[1])(out, y).mean())


def bench_attacks(cfg: AttackBenchConfig, x: np.ndarray, y: np.ndarray, devices: tuple[str, ...] = ("cpu",),
                  log: Any = print) -> tuple[list[Row], dict[str, Any]]:
    """Throughput rows for every (model, attack) and the flip-rate evaluation rows."""
    import torch

    from empirics.common import Tensors, train_network
    from empirics.nets.attacks import AttackConfig, attack
    from empirics.nets.models import ModelSpec
    from empirics.nets.train import TrainConfig

    c = cfg.resolved()
    n, nt = c.n_train, c.n_test
    t = Tensors(torch.as_tensor(x[:n], dtype=torch.float32), torch.as_tensor(y[:n], dtype=torch.long),
                torch.as_tensor(x[n:n + nt], dtype=torch.float32), torch.as_tensor(y[n:n + nt], dtype=torch.long),
                10)
    rows: list[Row] = []
    data: dict[str, Any] = {"config": c.__dict__, "throughput": {}, "train_s": {}}
    models = {}
    for kind in dict.fromkeys((*c.models, c.flip_model)):
        log(f"  training {kind} (quick preset: {c.epochs} epochs, width {c.width})")
        t0 = time.perf_counter()
        models[kind] = train_network(ModelSpec(kind, x.shape[1], c.width, 10, seed=0), t,
                                     TrainConfig(epochs=c.epochs, seed=0), label=f"bench {kind}").model
        data["train_s"][kind] = time.perf_counter() - t0
    for kind in c.models:
        model = models[kind]
        clean = _loss(model, t.x_train, t.y_train)
        for name in c.attacks:
            log(f"  attack {name} on {kind}")
            acfg = AttackConfig(name, c.eps, steps=c.steps, seed=0)
            out: dict[str, Any] = {}

            def run(model: Any = model, acfg: AttackConfig = acfg, out: dict[str, Any] = out) -> None:
                out["adv"] = attack(model, t.x_train, t.y_train, acfg)

            tm = time_call(run, TimingPolicy(c.repeats, max_total_s=c.max_total_s))
            adv = out["adv"]
            linf = float((adv - t.x_train).abs().max())
            box = float(max(0.0, -float(adv.min()), float(adv.max()) - 1.0))
            gain = _loss(model, adv, t.y_train) - clean
            rate = n / tm.median
            gpu_txt = ""
            for device in (d for d in devices if d != "cpu"):
                mg = model.to(device)
                xg, yg = t.x_train.to(device), t.y_train.to(device)
                tg = time_call(lambda mg=mg, xg=xg, yg=yg, acfg=acfg: attack(mg, xg, yg, acfg),
                               TimingPolicy(c.repeats), sync=torch.cuda.synchronize)
                gpu_txt = f"{fmt_time(tg.median)} ({n / tg.median:,.0f} ex/s)"
                model.to("cpu")
            steps = 1 if name == "fgsm" else c.steps
            rows.append(Row(SECTION, f"attack {name.upper()} ({steps} step{'s' if steps > 1 else ''})",
                            f"{'MLP-Attn' if kind == 'attn' else '2L-ReLU'}, {n} examples, m={c.width}, eps={c.eps}",
                            tm, value=f"{rate:,.0f} examples/s",
                            checks=[Check("L-inf excess over eps", max(0.0, linf - c.eps), 1e-6),
                                    Check("outside [0,1] by", box, 0.0),
                                    Check("mean loss gain", gain, 0.0, ">=")],
                            gpu=gpu_txt, data={"examples_per_s": rate, "median_s": tm.median}))
            data["throughput"][f"{kind}/{name}"] = rate
    rows += _flip_rows(c, models[c.flip_model], t, data, log)
    return rows, data


def _flip_rows(c: AttackBenchConfig, model: Any, t: Any, data: dict[str, Any], log: Any) -> list[Row]:
    import torch

    from empirics.attribution.influence import Ridge, influence_scores, model_kernels, resolve_ridge
    from empirics.experiments.malleability import MalleabilityConfig, compare, measure_model, n_top, top_by_abs
    from empirics.nets.attacks import AttackConfig, attack
    from empirics.nets.losses import targets
    from theory.krr import loo_influence

    n = t.x_train.shape[0]
    k = n_top(c.tau, n)
    acfg = AttackConfig(c.flip_attack, c.eps, steps=c.steps, seed=0)
    out: dict[str, Any] = {}

    def one_eval() -> None:
        clean = influence_scores(model, (t.x_train, t.y_train), (t.x_test, t.y_test))
        sel = top_by_abs(clean.total, k)
        sel_t = torch.as_tensor(sel)
        x_adv = attack(model, t.x_train[sel_t], t.y_train[sel_t], acfg, train_x=t.x_train, train_idx=sel_t)
        new = influence_scores(model, (t.x_train.index_copy(0, sel_t, x_adv), t.y_train), (t.x_test, t.y_test),
                               Ridge(clean.ridge))
        out["clean"], out["cmp"] = clean, compare(clean, new, sel, keep_examples=False)

    log(f"  flip-rate evaluation ({c.flip_model}, {c.flip_attack})")
    tm = time_call(one_eval, TimingPolicy(c.repeats, max_total_s=c.max_total_s))
    K, Kt = model_kernels(model, t.x_train, t.x_test)
    Y = targets(t.y_train, 10, torch.float64).numpy()
    Yt = targets(t.y_test, 10, torch.float64).numpy()
    ref = loo_influence(K, Y, resolve_ridge(K), Kt, Yt)
    diff = max_rel_diff(out["clean"].per_test, ref)
    flip = out["cmp"]["flip_rate"]
    label = "MLP-Attn" if c.flip_model == "attn" else "2L-ReLU"
    case = f"{label}, n={n}, n_test={t.x_test.shape[0]}, m={c.width}, top {k}, {c.steps} steps"
    rows = [Row(SECTION, f"one flip-rate evaluation ({c.flip_attack.upper()})", case, tm,
                value=f"flip rate {100 * flip:.0f}% (rho_all {out['cmp']['rho_all']:.2f})",
                checks=[Check("influence max rel diff vs theory.krr.loo_influence", diff, 1e-8)],
                note="clean influence + attack on top-tau + kernel and influence recomputed; training not included "
                     f"(training took {fmt_time(data['train_s'][c.flip_model])})",
                data={"median_s": tm.median, "flip_rate": flip})]
    mcfg = MalleabilityConfig(models=(c.flip_model,), attacks=(c.flip_attack,), interventions=("transformed",),
                              eps=c.eps, tau=c.tau, seeds=(0,), width=c.width, n_train=n, n_test=t.x_test.shape[0],
                              attack_steps=c.steps)
    res: dict[str, Any] = {}

    def module_eval() -> None:
        res["r"] = measure_model(model, t, mcfg, 0)

    log("  malleability.measure_model (one model, one attack + random baseline)")
    tm2 = time_call(module_eval, TimingPolicy(c.repeats, max_total_s=c.max_total_s))
    flips = {m["attack"]: m["flip_rate"] for m in res["r"]["measurements"]}
    sel_same = float(np.mean(np.isin(res["r"]["selected"], top_by_abs(out["clean"].total, k))))
    rows.append(Row(SECTION, "malleability.measure_model (attack + random baseline)", case, tm2,
                    value=", ".join(f"{a} {100 * f:.0f}%" for a, f in flips.items()),
                    ratio=f"{tm2.median / tm.median:.2f}x one evaluation",
                    checks=[Check("top-tau selection overlap with the evaluation above", sel_same, 1.0, ">=")],
                    note="what the malleability experiment runs per model, seed and eps (transformed intervention)",
                    data={"median_s": tm2.median, "flip_rates": flips}))
    data["flip_eval_s"] = tm.median
    data["measure_model_s"] = tm2.median
    return rows
