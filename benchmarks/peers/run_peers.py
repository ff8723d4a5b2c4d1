"""Peer implementations on the suite's inputs; runs inside the peers venv (see README.md beside it).

    .venv-peers/bin/python benchmarks/peers/run_peers.py --inputs IN.npz --out OUT.json [--only NAMES]

`IN.npz` is written by the main runner (`python -m benchmarks`): the inputs, the network weights and
the suite's own results for the same computation. This script imports nothing from the suite. Every
peer is tried in each configuration its documentation offers for the workload, each configuration is
checked against the suite's float64 result for the same estimand, and the fastest configuration that
passes is the peer's row; the others are recorded with their times and errors. Times exclude one
untimed warm-up call (which also compiles JAX code).

- neural-tangents `empirical_ntk_fn` of `f(x) = A^T relu(W x) / sqrt(m)` with `trace_axes=(-1,)`
  (the suite's per-output "mean" kernel): every `NtkImplementation` (JACOBIAN_CONTRACTION,
  NTK_VECTOR_PRODUCTS, STRUCTURED_DERIVATIVES, AUTO), both weight layouts (`x @ W` with W of shape
  (d, m), and `x @ W.T` with W of shape (m, d)) and `vmap_axes` 0 or None, jitted, float32, on a grid
  size; the fastest correct configuration then runs at every headline size.
- dattri influence functions (Koh & Liang, `g_i^T (H + rho I)^-1 g_t` for the summed squared loss;
  `H = 2 J^T J` exactly for this network): `IFAttributorCG` with the loss as given (regularization
  rho) and with the loss scaled by 1/rho (regularization 1; scores times rho: the same number),
  over CG iteration counts; `IFAttributorLiSSA` (damping and scaling matched to rho); and
  `IFAttributorArnoldi`, which computes a different estimand (the top-k eigenspace of H only) and is
  checked against the suite's exact top-k value.
- torchattacks `PGD` without random start, against the suite's PGD without random start.
- kronfluence `Analyzer` with EK-FAC factors on a small CNN (cross-entropy), pairwise scores of
  every training point on every test point; a different estimand from the audit's (NTK leave-one-out
  and Gauss-Newton influence in kernel space), so its rank agreement is reported, not gated.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import resource
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


def _times(fn: Callable[[], Any], repeats: int, max_total_s: float,
           warmup: Callable[[], Any] | None = None) -> list[float]:
    """One untimed warm-up call (`warmup`, else `fn`), then up to `repeats` timed calls within the budget."""
    (warmup or fn)()
    out: list[float] = []
    while len(out) < repeats:
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        if sum(out) + out[-1] > max_total_s:
            break
    return out


def _version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "absent"


def _message(exc: BaseException) -> str:
    """`Type: first line of the message` (JAX appends a note about filtered frames after the message)."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def _fail(stage: str, exc: BaseException) -> dict[str, Any]:
    return {"status": f"skipped: {stage} failed: {_message(exc)}", "traceback": traceback.format_exc()[-2000:]}


def _rel(a: Any, ref: Any) -> float:
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(a - ref)) / np.max(np.abs(ref)))


CHECKPOINT: list[Callable[[], None]] = []


def _checkpoint() -> None:
    """Write the results so far (a peer that ends the process, e.g. at the memory cap, keeps its earlier rows)."""
    for fn in CHECKPOINT:
        fn()


def _peak_rss_gib() -> float:
    """Peak resident set of this process so far (GiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _torch_net(W: np.ndarray, A: np.ndarray) -> Any:
    import torch
    from torch import nn

    class Net(nn.Module):
        """`f(x) = A^T relu(W x) / sqrt(m)`, W trained, A fixed."""

        def __init__(self) -> None:
            super().__init__()
            self.W = nn.Parameter(torch.as_tensor(W))
            self.register_buffer("A", torch.as_tensor(A))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x @ self.W.T) @ self.A / self.W.shape[0] ** 0.5

    return Net()


def make_cnn() -> Any:
    """The audit comparison's CNN: conv(1->8, 5x5)-pool-conv(8->16, 5x5)-pool-fc(784->96)-fc(96->10)."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 8, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(784, 96), nn.ReLU(), nn.Linear(96, 10),
    )


# --- neural-tangents ------------------------------------------------------------------------------

NT_IMPLEMENTATIONS = ("STRUCTURED_DERIVATIVES", "NTK_VECTOR_PRODUCTS", "JACOBIAN_CONTRACTION", "AUTO")
NT_LAYOUTS = ("x @ W, W (d, m)", "x @ W.T, W (m, d)")


@dataclass(frozen=True)
class NtConfig:
    """One neural-tangents configuration: its `NtkImplementation` name, the weight layout, vmap over the batch."""

    impl: str
    layout: str
    vmap: bool


def _nt_fn(nt: Any, jax: Any, jnp: Any, A: Any, conf: NtConfig) -> Callable[..., Any]:
    """The jitted empirical-NTK function of `f(x) = A^T relu(W x) / sqrt(m)` in configuration `conf`."""
    impl, layout, vmap = conf.impl, conf.layout, conf.vmap
    m = A.shape[0]
    if layout.startswith("x @ W,"):
        def f(params: Any, xx: Any) -> Any:
            return jax.nn.relu(xx @ params) @ A / jnp.sqrt(m)
    else:
        def f(params: Any, xx: Any) -> Any:
            return jax.nn.relu(xx @ params.T) @ A / jnp.sqrt(m)
    return jax.jit(nt.empirical_ntk_fn(f, trace_axes=(-1,), vmap_axes=0 if vmap else None,
                                       implementation=getattr(nt.NtkImplementation, impl)))


def peer_neural_tangents(z: Any, repeats: int, max_total_s: float) -> dict[str, Any]:
    """Every configuration on the grid size, then the fastest correct one at every headline size."""
    try:
        import jax
        import jax.numpy as jnp
        import neural_tangents as nt
    except Exception as exc:  # any import failure is the reported reason
        return _fail("import neural_tangents", exc)
    tol = float(z["nt_tol"])
    grid_n, grid_m = int(z["nt_grid_n"]), int(z["nt_grid_m"])
    grid: list[dict[str, Any]] = []
    W = z[f"nt_W_{grid_m}"]
    A = jnp.asarray(z[f"nt_A_{grid_m}"])
    x = jnp.asarray(z["nt_x"][:grid_n])
    ref = z[f"nt_K64_{grid_n}_{grid_m}"]
    for impl in NT_IMPLEMENTATIONS:
        for layout in NT_LAYOUTS:
            for vmap in (True, False):
                cfg = {"implementation": impl, "layout": layout, "vmap_axes": 0 if vmap else None}
                try:
                    params = jnp.asarray(W.T.copy() if layout.startswith("x @ W,") else W)
                    fn = _nt_fn(nt, jax, jnp, A, NtConfig(impl, layout, vmap))
                    out: dict[str, Any] = {}
                    t0 = time.perf_counter()
                    out["K"] = fn(x, None, params).block_until_ready()
                    first = time.perf_counter() - t0

                    def run(fn: Any = fn, params: Any = params, out: dict[str, Any] = out) -> None:
                        out["K"] = fn(x, None, params).block_until_ready()

                    times = _times(run, repeats, max_total_s / 4, warmup=lambda: None)
                    err = _rel(out["K"], ref)
                    grid.append({**cfg, "times_s": times, "first_call_s": first, "max_rel_diff": err,
                                 "correct": err <= tol})
                except Exception as exc:  # e.g. out of memory: recorded, the next configuration runs
                    grid.append({**cfg, "error": _message(exc), "correct": False})
    ok = [g for g in grid if g.get("correct")]
    if not ok:
        return {"status": "skipped: no neural-tangents configuration agreed with the suite", "grid": grid,
                "grid_n": grid_n, "grid_m": grid_m}
    best = min(ok, key=lambda g: float(np.median(g["times_s"])))
    sizes: list[dict[str, Any]] = []
    for n, m in (tuple(int(v) for v in s) for s in z["nt_sizes"]):
        entry: dict[str, Any] = {"n": n, "m": m}
        try:
            params = jnp.asarray(z[f"nt_W_{m}"].T.copy() if best["layout"].startswith("x @ W,") else z[f"nt_W_{m}"])
            fn = _nt_fn(nt, jax, jnp, jnp.asarray(z[f"nt_A_{m}"]),
                        NtConfig(best["implementation"], best["layout"], best["vmap_axes"] is not None))
            xs = jnp.asarray(z["nt_x"][:n])
            out = {}

            def run(fn: Any = fn, params: Any = params, xs: Any = xs, out: dict[str, Any] = out) -> None:
                out["K"] = fn(xs, None, params).block_until_ready()

            entry["times_s"] = _times(run, repeats, max_total_s)
            entry["max_rel_diff"] = _rel(out["K"], z[f"nt_K64_{n}_{m}"])
        except Exception as exc:
            entry["error"] = _message(exc)
        sizes.append(entry)
    return {"status": "ok", "grid": grid, "grid_n": grid_n, "grid_m": grid_m, "best": best, "sizes": sizes,
            "tol": tol, "jax_devices": [str(d) for d in jax.devices()]}


# --- dattri ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """What a dattri configuration is checked against: its scores times `factor` against `values`, named `gate`."""

    factor: float
    values: np.ndarray
    gate: str


def _dattri_case(z: Any, key: str, repeats: int, max_total_s: float, partial: dict[str, Any]) -> dict[str, Any]:
    import torch
    from dattri.algorithm.influence_function import IFAttributorArnoldi, IFAttributorCG, IFAttributorLiSSA
    from dattri.task import AttributionTask
    from torch.utils.data import DataLoader, TensorDataset

    rho = float(z[f"{key}_rho"])
    lam_max = float(z[f"{key}_lam_max"])
    ref = z[f"{key}_q"].astype(np.float64)
    tol = float(z["if_tol"])
    model = _torch_net(z[f"{key}_W"], z[f"{key}_A"])
    xtr, ytr = torch.as_tensor(z[f"{key}_x_train"]), torch.as_tensor(z[f"{key}_y_train"])
    xte, yte = torch.as_tensor(z[f"{key}_x_test"]), torch.as_tensor(z[f"{key}_y_test"])
    n = len(xtr)
    train_loader = DataLoader(TensorDataset(xtr, ytr), batch_size=n, shuffle=False)
    test_loader = DataLoader(TensorDataset(xte, yte), batch_size=len(xte), shuffle=False)

    def task_for(scale: float) -> Any:
        def loss_func(params: dict[str, torch.Tensor], data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            xx, yy = data
            out = torch.func.functional_call(model, params, (xx,))
            return ((out - yy) ** 2).sum() * scale
        return AttributionTask(loss_func=loss_func, model=model, checkpoints=model.state_dict())

    results: list[dict[str, Any]] = []
    partial["configs"] = results
    only = int(z["if_config"]) if "if_config" in z.files else None
    counter = [-1]

    def measure(name: str, make: Callable[[], Any], against: Reference, warm: Callable[[], Any] | None = None,
                reps: int = repeats, **cfg: Any) -> None:
        factor, reference, gate = against.factor, against.values, against.gate
        counter[0] += 1
        if only is not None and counter[0] != only:
            return
        out: dict[str, Any] = {}

        def run(make: Callable[[], Any] = make) -> None:
            att = make()
            att.cache(train_loader)
            out["S"] = att.attribute(train_loader, test_loader)

        try:
            times = _times(run, reps, max_total_s, warmup=warm)
            S = out["S"].detach().double().numpy() * factor
            err = _rel(S, reference)
            full = _rel(S, ref)
            corr = float(np.corrcoef(S.ravel(), ref.ravel())[0, 1])
            results.append({"method": name, **cfg, "times_s": times, "max_rel_diff": err,
                            "max_rel_diff_vs_full_if": full, "pearson_vs_full_if": corr, "gate": gate,
                            "correct": err <= tol, "peak_rss_gib": _peak_rss_gib()})
        except Exception as exc:
            results.append({"method": name, **cfg, "error": _message(exc), "correct": False, "gate": gate})
        _checkpoint()

    scaled, plain = task_for(1.0 / rho), task_for(1.0)
    warm = IFAttributorCG(task=scaled, device="cpu", max_iter=2, regularization=1.0)
    warm.cache(train_loader)
    warm.attribute(train_loader, test_loader)
    for iters in (int(v) for v in z[f"{key}_cg_iters"]):
        measure("CG, loss scaled by 1/rho", lambda it=iters: IFAttributorCG(task=scaled, device="cpu", max_iter=it,
                                                                             regularization=1.0),
                Reference(rho, ref, "exact IF"), warm=lambda: None, max_iter=iters, regularization=1.0)
    for iters in (int(v) for v in z[f"{key}_cg_plain_iters"]):
        measure("CG, loss as given", lambda it=iters: IFAttributorCG(task=plain, device="cpu", max_iter=it,
                                                                      regularization=rho),
                Reference(1.0, ref, "exact IF"), warm=lambda: None, max_iter=iters, regularization=rho)
    if bool(z[f"{key}_lissa"]):
        depth = int(z["if_lissa_depth"])
        scaling = lam_max
        for bsz in (n, max(1, n // 5)):
            measure("LiSSA", lambda bsz=bsz: IFAttributorLiSSA(
                        task=task_for(n / bsz), device="cpu", batch_size=bsz, num_repeat=1, recursion_depth=depth,
                        damping=rho / scaling, scaling=scaling),
                    Reference((bsz / n) ** 2, ref, "exact IF"), warm=lambda: None, reps=1, recursion_depth=depth,
                    batch_size=bsz, scaling=scaling, damping=rho / scaling)
    k = int(z["if_arnoldi_k"])
    for it in (int(v) for v in z[f"{key}_arnoldi_iters"]):
        measure("Arnoldi (top-k eigenspace of H)", lambda it=it: IFAttributorArnoldi(
                    task=plain, device="cpu", proj_dim=k, max_iter=it, regularization=rho),
                Reference(1.0, z[f"{key}_q_topk"].astype(np.float64), f"exact top-{k} IF"), warm=lambda: None, reps=1,
                proj_dim=k, max_iter=it, regularization=rho)
    return {"n": n, "n_test": len(xte), "rho": rho, "lam_max": lam_max, "tol": tol, "configs": results}


def peer_dattri(z: Any, repeats: int, max_total_s: float) -> dict[str, Any]:
    """dattri's influence functions in each configuration, per benchmark point."""
    try:
        import dattri.algorithm.influence_function  # noqa: F401
    except Exception as exc:
        return _fail("import dattri", exc)
    out: dict[str, Any] = {"status": "ok", "cases": {}}
    keys = [str(k) for k in z["if_keys"]]
    if "if_only" in z.files:
        keys = [str(z["if_only"])]
    for key in keys:
        out["cases"][key] = {"status": "skipped: the process ended during this case (see the last configuration)"}
        try:
            out["cases"][key] = _dattri_case(z, key, repeats, max_total_s, out["cases"][key])
        except Exception as exc:
            out["cases"][key] = _fail("dattri run", exc)
    return out


# --- torchattacks ---------------------------------------------------------------------------------


def peer_torchattacks(z: Any, repeats: int, max_total_s: float) -> dict[str, Any]:
    """torchattacks' PGD without random start against the suite's adversarial examples."""
    try:
        import torch
        import torchattacks
    except Exception as exc:
        return _fail("import torchattacks", exc)
    try:
        model = _torch_net(z["atk_W"], z["atk_A"]).eval()
        x, y = torch.as_tensor(z["atk_x"]), torch.as_tensor(z["atk_y"]).long()
        atk = torchattacks.PGD(model, eps=float(z["atk_eps"]), alpha=float(z["atk_alpha"]), steps=int(z["atk_steps"]),
                               random_start=False)
        out: dict[str, Any] = {}

        def run() -> None:
            out["adv"] = atk(x, y)

        times = _times(run, repeats, max_total_s)
        adv = out["adv"].detach().numpy().astype(np.float64)
        ref = z["atk_adv"].astype(np.float64)
        diff = np.abs(adv - ref)
        return {"status": "ok", "times_s": times, "max_abs_diff": float(diff.max()),
                "fraction_differing": float(np.mean(diff > 1e-6))}
    except Exception as exc:
        return _fail("torchattacks run", exc)


# --- kronfluence ----------------------------------------------------------------------------------


def peer_kronfluence(z: Any, repeats: int, max_total_s: float) -> dict[str, Any]:
    """kronfluence EK-FAC pairwise influence (test x train) on the CNN the audit side also measured."""
    try:
        import torch
        from kronfluence.analyzer import Analyzer, prepare_model
        from kronfluence.arguments import FactorArguments, ScoreArguments
        from kronfluence.task import Task
        from torch import nn
        from torch.utils.data import TensorDataset
    except Exception as exc:
        return _fail("import kronfluence", exc)
    try:
        import logging

        logging.getLogger("kronfluence").setLevel(logging.ERROR)
        state = {k[len("cnn_p_"):]: torch.as_tensor(z[k]) for k in z.files if k.startswith("cnn_p_")}
        xtr = torch.as_tensor(z["cnn_x_train"]).reshape(-1, 1, 28, 28)
        xte = torch.as_tensor(z["cnn_x_test"]).reshape(-1, 1, 28, 28)
        ytr, yte = torch.as_tensor(z["cnn_y_train"]).long(), torch.as_tensor(z["cnn_y_test"]).long()

        class CETask(Task):
            """Summed cross-entropy; the measurement is the test loss (kronfluence's classification task)."""

            def compute_train_loss(self, batch: Any, model: nn.Module, sample: bool = False) -> torch.Tensor:
                xx, yy = batch
                logits = model(xx)
                if sample:
                    with torch.no_grad():
                        yy = torch.multinomial(torch.softmax(logits.detach(), -1), 1).flatten()
                return nn.functional.cross_entropy(logits, yy, reduction="sum")

            def compute_measurement(self, batch: Any, model: nn.Module) -> torch.Tensor:
                xx, yy = batch
                return nn.functional.cross_entropy(model(xx), yy, reduction="sum")

        res: dict[str, Any] = {"status": "ok"}
        bs = int(z["cnn_batch"])

        def once(tag: str) -> dict[str, Any]:
            model = make_cnn()
            model.load_state_dict(state)
            model.eval()
            task = CETask()
            model = prepare_model(model, task)
            with tempfile.TemporaryDirectory(prefix="kronfluence-") as tmp:
                an = Analyzer(analysis_name=f"bench-{tag}", model=model, task=task, output_dir=tmp,
                              disable_tqdm=True, cpu=True, disable_model_save=True)
                t0 = time.perf_counter()
                an.fit_all_factors(factors_name="ekfac", dataset=TensorDataset(xtr, ytr), per_device_batch_size=bs,
                                   factor_args=FactorArguments(strategy="ekfac"), overwrite_output_dir=True)
                t1 = time.perf_counter()
                an.compute_pairwise_scores(scores_name="s", factors_name="ekfac",
                                           query_dataset=TensorDataset(xte, yte),
                                           train_dataset=TensorDataset(xtr, ytr),
                                           per_device_query_batch_size=len(xte), per_device_train_batch_size=bs,
                                           score_args=ScoreArguments(), overwrite_output_dir=True)
                t2 = time.perf_counter()
                S = an.load_pairwise_scores("s")["all_modules"].double().numpy()
            return {"fit_s": t1 - t0, "scores_s": t2 - t1, "total_s": t2 - t0, "S": S}

        once("warmup")
        runs = []
        while len(runs) < repeats:
            runs.append(once(f"r{len(runs)}"))
            if sum(r["total_s"] for r in runs) + runs[-1]["total_s"] > max_total_s:
                break
        S = runs[-1]["S"]
        total = S.sum(axis=0)
        from scipy import stats

        res.update({"times_s": [r["total_s"] for r in runs], "fit_s": [r["fit_s"] for r in runs],
                    "scores_s": [r["scores_s"] for r in runs], "peak_rss_gib": _peak_rss_gib(),
                    "finite": bool(np.all(np.isfinite(S))), "shape": list(S.shape),
                    "spearman_vs_audit_loo": float(stats.spearmanr(total, z["cnn_loo_total"]).statistic),
                    "spearman_vs_audit_gn": float(stats.spearmanr(total, z["cnn_gn_total"]).statistic),
                    "strategy": "ekfac", "damping": "kronfluence default (ScoreArguments().damping_factor)",
                    "batch_size": bs})
        return res
    except Exception as exc:
        return _fail("kronfluence run", exc)


class _Arrays(dict):
    """The inputs as a dict with the `.files` attribute of an `np.load` result."""

    @property
    def files(self) -> list[str]:
        return list(self.keys())


PEERS: dict[str, Callable[[Any, int, float], dict[str, Any]]] = {
    "neural_tangents": peer_neural_tangents, "dattri": peer_dattri, "torchattacks": peer_torchattacks,
    "kronfluence": peer_kronfluence,
}


def main(argv: list[str] | None = None) -> int:
    """Run the peers named by `--only` on `--inputs`; write their results to `--out`."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--inputs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-total-s", type=float, default=30.0)
    p.add_argument("--only", default=",".join(PEERS))
    p.add_argument("--case", default=None, help="dattri: only this benchmark point (a key of if_keys)")
    p.add_argument("--config", type=int, default=None, help="dattri: only this configuration (its index)")
    a = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    z = dict(np.load(a.inputs))
    if a.case:
        z["if_only"] = np.array(a.case)
    if a.config is not None:
        z["if_config"] = np.array(a.config)
    z = _Arrays(z)
    if int(z["threads"]) == 1:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1").strip()
    try:
        import torch

        torch.set_num_threads(int(z["threads"]))
    except Exception:  # torch is only needed by some of the peers
        pass
    res: dict[str, Any] = {
        "python": platform.python_version(), "executable": sys.executable,
        "load_average_start": [round(v, 2) for v in os.getloadavg()], "threads": int(z["threads"]),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "versions": {k: _version(k) for k in ("jax", "jaxlib", "neural-tangents", "tensorflow-cpu", "tf2jax", "numpy",
                                              "torch", "dattri", "torchattacks", "kronfluence")},
    }
    def dump() -> None:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)

    CHECKPOINT.append(dump)
    for name in [s for s in a.only.split(",") if s]:
        if f"has_{name}" in z.files and not bool(z[f"has_{name}"]):
            continue
        t0 = time.perf_counter()
        res[name] = {"status": "skipped: the process ended before this peer finished"}
        res[name] = PEERS[name](z, a.repeats, a.max_total_s)
        res[name]["wall_s"] = time.perf_counter() - t0
        res[name]["peak_rss_gib"] = _peak_rss_gib()
        res[name]["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
