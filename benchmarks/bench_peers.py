"""Peers side by side: the runner's half (inputs, the suite's own numbers, the peers subprocess).

The peers live in their own virtual environment (`benchmarks/peers/README.md`): neural-tangents pins
jax 0.4.23 and numpy < 2, which the suite's environment must not inherit. This module writes the
shared inputs and the suite's results for them to an .npz, times the suite's side in this process,
runs `benchmarks/peers/run_peers.py` with the peers' interpreter and turns its JSON into rows. When
the environment is absent, or a peer cannot be imported, the row says "skipped: <reason>".
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import ROOT, Check, Row, Timing, fmt_ratio, fmt_time, time_call

SECTION = "5. Peers, side by side (separate venv: benchmarks/peers/README.md)"
DEFAULT_VENV = ROOT / ".venv-peers"
SCRIPT = ROOT / "benchmarks" / "peers" / "run_peers.py"


@dataclass
class PeersConfig:
    """Sizes of the side-by-side cases and where the peers' Python is."""

    ntk_ns: tuple[int, ...] = (500, 250, 125)
    ntk_m: int = 1024
    if_n: int = 250
    if_n_test: int = 10
    if_m: int = 256
    if_max_iter: int = 100
    atk_n: int = 500
    atk_m: int = 1024
    atk_steps: int = 10
    eps: float = 0.3
    repeats: int = 3
    max_total_s: float = 30.0
    python: str | None = None
    timeout_s: float = 1200.0


def peers_python(explicit: str | None) -> Path | None:
    """The peers' interpreter: `--peers-python`, else `.venv-peers/bin/python` when it exists."""
    if explicit:
        return Path(explicit)
    cand = DEFAULT_VENV / "bin" / "python"
    return cand if cand.exists() else None


def _model(kind: str, d: int, m: int, x: Any, dtype: Any) -> Any:
    from empirics.models import ModelSpec, build_model

    return build_model(ModelSpec(kind, d, m, 10, seed=0), x, dtype=dtype)


def woodbury_if(Kfull: np.ndarray, r_train: np.ndarray, r_test: np.ndarray, rho: float) -> np.ndarray:
    """`g_i^T (2 J^T J + rho I)^-1 g_t` with `g = 2 J^T r`, from the (N, N, c, c) empirical NTK.

    Push-through identity: `J_i (2 J^T J + rho I)^-1 J_t^T = [(2 K + rho I)^-1 K_(X,t)]_i` with K the
    (n c x n c) training block of the full kernel, so no parameter-space solve is needed.
    """
    import scipy.linalg

    n, c = r_train.shape
    nt = r_test.shape[0]
    N = n + nt
    flat = Kfull.transpose(0, 2, 1, 3).reshape(N * c, N * c)
    Ktr, Kxt = flat[:n * c, :n * c], flat[:n * c, n * c:]
    S = scipy.linalg.solve(2.0 * Ktr + rho * np.eye(n * c), Kxt, assume_a="pos")
    return 4.0 * np.einsum("ia,iatb,tb->it", r_train, S.reshape(n, c, nt, c), r_test)


def prepare(cfg: PeersConfig, x: np.ndarray, y: np.ndarray, path: Path, threads: int) -> dict[str, Any]:
    """Write the peers' inputs and the suite's results to `path`; return the suite's timings."""
    import torch

    from empirics.attacks import AttackConfig, attack
    from empirics.ntk import ntk_two_layer

    ours: dict[str, Any] = {}
    d = x.shape[1]
    xn = torch.as_tensor(x[:max(cfg.ntk_ns)], dtype=torch.float32)
    net = _model("relu", d, cfg.ntk_m, xn, torch.float32)
    hold: dict[str, Any] = {}
    for n_k in sorted(cfg.ntk_ns, reverse=True):
        ours[f"ntk/{n_k}"] = time_call(lambda n_k=n_k: hold.__setitem__("K", ntk_two_layer(net, xn[:n_k])),
                                       repeats=cfg.repeats)
    K = ntk_two_layer(net, xn).numpy()

    xi = x[:cfg.if_n + cfg.if_n_test]
    eye = np.eye(10)
    yi = eye[y[:cfg.if_n + cfg.if_n_test]]
    x64 = torch.as_tensor(xi, dtype=torch.float64)
    net_if = _model("relu", d, cfg.if_m, x64, torch.float64)
    with torch.no_grad():
        resid = (net_if(x64).numpy() - yi)
    Kf = ntk_two_layer(net_if, x64, reduction="full").numpy()
    n = cfg.if_n
    lam_max = float(np.linalg.eigvalsh(Kf[:n, :n].transpose(0, 2, 1, 3).reshape(n * 10, n * 10))[-1])
    rho = 2.0 * lam_max / 50.0

    def ours_if() -> None:
        kf = ntk_two_layer(net_if, x64, reduction="full").numpy()
        hold["q"] = woodbury_if(kf, resid[:n], resid[n:], rho)

    ours["if"] = time_call(ours_if, repeats=cfg.repeats)

    xa = torch.as_tensor(x[:cfg.atk_n], dtype=torch.float32)
    ya = torch.as_tensor(y[:cfg.atk_n], dtype=torch.long)
    net_a = _model("relu", d, cfg.atk_m, xa, torch.float32)
    acfg = AttackConfig("pgd", cfg.eps, steps=cfg.atk_steps, random_start=False)
    ours["pgd"] = time_call(lambda: hold.__setitem__("adv", attack(net_a, xa, ya, acfg)), repeats=cfg.repeats)
    np.savez(path, threads=threads, ntk_ns=np.array(sorted(cfg.ntk_ns, reverse=True)),
             ntk_x=xn.numpy(), ntk_W=net.W.detach().numpy(), ntk_A=net.A.numpy(), ntk_K=K,
             if_x_train=xi[:n].astype(np.float32), if_y_train=yi[:n].astype(np.float32),
             if_x_test=xi[n:].astype(np.float32), if_y_test=yi[n:].astype(np.float32),
             if_W=net_if.W.detach().float().numpy(), if_A=net_if.A.float().numpy(), if_rho=rho,
             if_max_iter=cfg.if_max_iter, if_q=hold["q"],
             atk_x=xa.numpy(), atk_y=ya.numpy(), atk_W=net_a.W.detach().numpy(), atk_A=net_a.A.numpy(),
             atk_eps=cfg.eps, atk_alpha=acfg.alpha, atk_steps=cfg.atk_steps, atk_adv=hold["adv"].numpy())
    return ours


def bench_peers(cfg: PeersConfig, x: np.ndarray, y: np.ndarray, threads: int, log: Any = print
                ) -> tuple[list[Row], dict[str, Any]]:
    """Rows for the three peers (or one skipped row with the reason)."""
    py = peers_python(cfg.python)
    names = [("neural_tangents", "neural-tangents empirical NTK (STRUCTURED_DERIVATIVES)"),
             ("dattri", "dattri IFAttributorCG (parameter-space CG)"),
             ("torchattacks", "torchattacks PGD (no random start)")]
    if py is None or not py.exists():
        reason = (f"skipped: peers venv not found ({DEFAULT_VENV.name}/bin/python); "
                  "see benchmarks/peers/README.md")
        return [Row(SECTION, label, "-", status=reason) for _, label in names], {"status": reason}
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        inputs, out = Path(tmp) / "inputs.npz", Path(tmp) / "peers.json"
        log("  peers: the suite's side")
        ours = prepare(cfg, x, y, inputs, threads)
        log(f"  peers: {py}")
        try:
            proc = subprocess.run([str(py), str(SCRIPT), "--inputs", str(inputs), "--out", str(out),
                                   "--repeats", str(cfg.repeats), "--max-total-s", str(cfg.max_total_s)],
                                  cwd=ROOT, capture_output=True, text=True, timeout=cfg.timeout_s)
            err = proc.stderr
        except subprocess.TimeoutExpired:
            err = f"timed out after {cfg.timeout_s:g} s"
        if not out.exists():
            reason = f"skipped: peers script failed: {err.strip().splitlines()[-1][:300] if err.strip() else '?'}"
            return [Row(SECTION, label, "-", status=reason) for _, label in names], {"status": reason}
        res = json.loads(out.read_text())
    nt = res.get("neural_tangents", {})
    rows = [Row(SECTION, names[0][1], f"n={f['n']}, m={cfg.ntk_m}, float32 (JAX jit)",
                status=f"skipped: {f['error']}", note="the next smaller n is tried")
            for f in nt.get("failed_sizes", [])]
    n_ok = nt.get("n", max(cfg.ntk_ns))
    rows += [
        _row(res, "neural_tangents", names[0][1], f"n={n_ok}, m={cfg.ntk_m}, float32 (JAX jit)",
             ours[f"ntk/{n_ok}"], "suite closed form", [("max_rel_diff", "max rel diff vs suite closed form", 1e-3)]),
        _row(res, "dattri", names[1][1], f"n={cfg.if_n}, n_test={cfg.if_n_test}, m={cfg.if_m}, "
             f"{cfg.if_max_iter} CG iterations", ours["if"], "suite Woodbury on the full NTK (float64)",
             [("max_rel_diff", "max rel diff vs suite Woodbury", 1e-3), ("pearson", "Pearson", None)]),
        _row(res, "torchattacks", names[2][1], f"n={cfg.atk_n}, m={cfg.atk_m}, eps={cfg.eps}, {cfg.atk_steps} "
             "steps", ours["pgd"], "suite PGD",
             [("fraction_differing", "fraction of pixels differing from suite PGD", 1e-3),
              ("max_abs_diff", "max abs diff", None)]),
    ]
    return rows, {"peers": res, "ours": {k: v.to_dict() for k, v in ours.items()}}


def _row(res: dict[str, Any], key: str, label: str, case: str, ours: Timing, ours_label: str,
         checks: list[tuple[str, str, float | None]]) -> Row:
    r = res.get(key, {})
    ver = res.get("versions", {})
    vtxt = {"neural_tangents": f"neural-tangents {ver.get('neural-tangents')}, jax {ver.get('jax')}",
            "dattri": f"dattri {ver.get('dattri')}", "torchattacks": f"torchattacks {ver.get('torchattacks')}"}[key]
    if r.get("status") != "ok":
        if key == "neural_tangents" and r.get("failed_sizes"):
            return Row(SECTION, label, "all sizes", status="skipped: failed at every size (see the rows above)",
                       note=vtxt)
        return Row(SECTION, label, case, status=str(r.get("status", "skipped: no result")), note=vtxt)
    t = Timing(list(r["times_s"]), "1 untimed call (JAX: includes compilation)")
    ratio = t.median / ours.median
    rel = f"suite {fmt_ratio(ratio)} faster" if ratio >= 1 else f"peer {fmt_ratio(1 / ratio)} faster"
    return Row(SECTION, label, case, t, ratio=rel,
               checks=[Check(lab, float(r[k]), thr) for k, lab, thr in checks],
               note=f"{vtxt}; suite side: {ours_label}, {fmt_time(ours.median)} (median of {ours.repeats})",
               data={"peer_s": t.median, "suite_s": ours.median, "ratio": ratio})

