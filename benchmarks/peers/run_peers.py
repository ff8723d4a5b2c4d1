"""Peer implementations on the suite's inputs; runs inside the peers venv (see README.md beside it).

    .venv-peers/bin/python benchmarks/peers/run_peers.py --inputs IN.npz --out OUT.json

`IN.npz` is written by the main runner (`python -m benchmarks`): the inputs, the network weights and
the suite's own results for the same computation. This script imports nothing from the suite. For
each peer it records its times (warm-up excluded: one untimed call, which also compiles JAX code;
dattri warms up with 2 CG iterations, since eager torch has nothing to compile), its agreement with
the suite's result, and the exact reason when it cannot be imported or run:

- neural-tangents `empirical_ntk_fn`, STRUCTURED_DERIVATIVES, of `f(W, x) = A^T relu(W x) / sqrt(m)`
  with `trace_axes=(-1,)` (neural-tangents normalises the trace by the number of outputs, so this is
  the suite's "mean" kernel), against the suite's closed form.
- dattri `IFAttributorCG` (parameter-space CG inverse-Hessian-vector products, Koh & Liang) with
  the summed squared loss to one-hot targets: `g_i^T (H + rho I)^-1 g_t`. For this network
  `H = 2 J^T J` exactly (ReLU is piecewise linear in W), so the suite's reference is the same number
  through the Woodbury identity on the full (n c x n c) empirical NTK.
- torchattacks `PGD` without random start, against the suite's PGD without random start (same
  step size, steps and projection; the losses differ only by a positive factor).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable
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


def peer_neural_tangents(z: Any, repeats: int, max_total_s: float) -> dict[str, Any]:
    """neural-tangents' empirical NTK at the largest of `ntk_ns` that runs (larger ones: the error)."""
    try:
        import jax
        import jax.numpy as jnp
        import neural_tangents as nt
    except Exception as exc:  # any import failure is the reported reason
        return _fail("import neural_tangents", exc)
    W, A = jnp.asarray(z["ntk_W"]), jnp.asarray(z["ntk_A"])
    m = W.shape[0]

    def f(params: Any, xx: Any) -> Any:
        return jax.nn.relu(xx @ params.T) @ A / jnp.sqrt(m)

    fn = jax.jit(nt.empirical_ntk_fn(f, trace_axes=(-1,), vmap_axes=0,
                                     implementation=nt.NtkImplementation.STRUCTURED_DERIVATIVES))
    failed: list[dict[str, Any]] = []
    for n in [int(v) for v in z["ntk_ns"]]:
        try:
            x = jnp.asarray(z["ntk_x"][:n])
            out: dict[str, Any] = {}

            def run(x: Any = x, out: dict[str, Any] = out) -> None:
                out["K"] = fn(x, None, W).block_until_ready()

            times = _times(run, repeats, max_total_s)
            K = np.asarray(out["K"], dtype=np.float64)
            ref = z["ntk_K"][:n, :n].astype(np.float64)
            return {"status": "ok", "n": n, "times_s": times, "failed_sizes": failed,
                    "max_rel_diff": float(np.max(np.abs(K - ref)) / np.max(np.abs(ref))),
                    "implementation": "STRUCTURED_DERIVATIVES", "jax_devices": [str(d) for d in jax.devices()]}
        except Exception as exc:  # e.g. XLA out of memory at the larger sizes: try the next size
            failed.append({"n": n, "error": _message(exc)})
    return {"status": "skipped: neural_tangents run failed at every size", "failed_sizes": failed}


def peer_dattri(z: Any, repeats: int, max_total_s: float) -> dict[str, Any]:
    """dattri's CG influence scores (train x test) against the suite's Woodbury values."""
    try:
        import torch
        from dattri.algorithm.influence_function import IFAttributorCG
        from dattri.task import AttributionTask
        from torch.utils.data import DataLoader, TensorDataset
    except Exception as exc:
        return _fail("import dattri", exc)
    try:
        model = _torch_net(z["if_W"], z["if_A"])
        xtr, ytr = torch.as_tensor(z["if_x_train"]), torch.as_tensor(z["if_y_train"])
        xte, yte = torch.as_tensor(z["if_x_test"]), torch.as_tensor(z["if_y_test"])

        def loss_func(params: dict[str, torch.Tensor], data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            xx, yy = data
            out = torch.func.functional_call(model, params, (xx,))
            return ((out - yy) ** 2).sum()

        task = AttributionTask(loss_func=loss_func, model=model, checkpoints=model.state_dict())
        train_loader = DataLoader(TensorDataset(xtr, ytr), batch_size=len(xtr), shuffle=False)
        test_loader = DataLoader(TensorDataset(xte, yte), batch_size=len(xte), shuffle=False)
        out: dict[str, Any] = {}

        def run(max_iter: int = int(z["if_max_iter"])) -> None:
            att = IFAttributorCG(task=task, device="cpu", max_iter=max_iter, regularization=float(z["if_rho"]))
            att.cache(train_loader)
            out["S"] = att.attribute(train_loader, test_loader)

        times = _times(run, repeats, max_total_s, warmup=lambda: run(2))
        S = out["S"].detach().double().numpy()
        ref = z["if_q"].astype(np.float64)
        rel = float(np.max(np.abs(S - ref)) / np.max(np.abs(ref)))
        corr = float(np.corrcoef(S.ravel(), ref.ravel())[0, 1])
        return {"status": "ok", "times_s": times, "max_rel_diff": rel, "pearson": corr,
                "max_iter": int(z["if_max_iter"]), "rho": float(z["if_rho"])}
    except Exception as exc:
        return _fail("dattri run", exc)


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


def main(argv: list[str] | None = None) -> int:
    """Run the peers named by `--only` on `--inputs`; write their results to `--out`."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--inputs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-total-s", type=float, default=30.0)
    p.add_argument("--only", default="neural_tangents,dattri,torchattacks")
    a = p.parse_args(argv)
    z = np.load(a.inputs)
    try:
        import torch

        torch.set_num_threads(int(z["threads"]))
    except Exception:  # torch is only needed by two of the peers
        pass
    peers = {"neural_tangents": peer_neural_tangents, "dattri": peer_dattri, "torchattacks": peer_torchattacks}
    res: dict[str, Any] = {
        "python": platform.python_version(), "executable": sys.executable,
        "versions": {k: _version(k) for k in ("jax", "jaxlib", "neural-tangents", "tf2jax", "numpy", "torch",
                                              "dattri", "torchattacks")},
    }
    for name in a.only.split(","):
        t0 = time.perf_counter()
        res[name] = peers[name](z, a.repeats, a.max_total_s)
        res[name]["wall_s"] = time.perf_counter() - t0
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
