"""Peers side by side: the runner's half (inputs, the suite's own numbers, the peers subprocess).

The peers live in their own virtual environment (`benchmarks/peers/README.md`): neural-tangents pins
jax 0.4.23 and numpy < 2, which the suite's environment must not inherit. This module writes the
shared inputs and the suite's float64 results for them to an .npz, times the suite's side in this
process, runs `benchmarks/peers/run_peers.py` with the peers' interpreter and turns its JSON into
rows: one row per peer and size at the peer's fastest configuration that agreed with the suite, the
other configurations listed in the note and kept in the record. When the environment is absent, or
a peer cannot be imported, the row says "skipped: <reason>".
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import (
    ROOT,
    Check,
    Row,
    Timing,
    TimingPolicy,
    fmt_num,
    fmt_ratio,
    fmt_time,
    max_rel_diff,
    time_call,
)

SECTION = "5. Peers, side by side (separate venv: benchmarks/peers/README.md)"
DEFAULT_VENV = ROOT / ".venv-peers"
SCRIPT = ROOT / "benchmarks" / "peers" / "run_peers.py"
NT_TOL = 1e-4
IF_TOL = 1e-3


@dataclass
class IFCase:
    """One influence benchmark point: sizes and which dattri methods run there."""

    key: str
    n: int
    n_test: int
    cg_iters: tuple[int, ...] = (10, 20, 40)
    cg_plain_iters: tuple[int, ...] = (20, 100)
    lissa: bool = False
    arnoldi_iters: tuple[int, ...] = ()

    @property
    def n_configs(self) -> int:
        """How many dattri configurations run at this point (each in its own process)."""
        return len(self.cg_iters) + len(self.cg_plain_iters) + (2 if self.lissa else 0) + len(self.arnoldi_iters)


@dataclass(frozen=True)
class PeerJob:
    """One peers process: the peer `name`, and for dattri its case key and configuration index."""

    name: str
    case: str | None = None
    idx: int | None = None


@dataclass
class PeersConfig:
    """Sizes of the side-by-side cases and where the peers' Python is."""

    nt_sizes: tuple[tuple[int, int], ...] = ((250, 1024), (500, 1024), (500, 4096), (1000, 1024), (1000, 4096))
    nt_grid: tuple[int, int] = (64, 1024)
    if_m: int = 256
    if_epochs: int = 5
    if_cases: tuple[IFCase, ...] = field(default_factory=lambda: (
        IFCase("if250", 250, 10, lissa=True, arnoldi_iters=(150, 300)),
        IFCase("if1000", 1000, 100, cg_iters=(10, 20, 30), cg_plain_iters=(60,))))
    if_arnoldi_k: int = 50
    if_lissa_depth: int = 400
    atk_n: int = 500
    atk_m: int = 1024
    atk_steps: int = 10
    eps: float = 0.3
    cnn_n: int = 1000
    cnn_n_test: int = 100
    cnn_epochs: int = 3
    cnn_batch: int = 250
    repeats: int = 3
    max_total_s: float = 30.0
    python: str | None = None
    timeout_s: float = 900.0
    memory_cap_gib: float = 10.0
    only: str = "neural_tangents,dattri,torchattacks,kronfluence"

    @property
    def n_pool(self) -> int:
        return max([n for n, _ in self.nt_sizes] + [self.nt_grid[0], self.atk_n, self.cnn_n + self.cnn_n_test]
                   + [c.n + c.n_test for c in self.if_cases])


def peers_python(explicit: str | None) -> Path | None:
    """The peers' interpreter: `--peers-python`, else `.venv-peers/bin/python` when it exists."""
    if explicit:
        return Path(explicit)
    cand = DEFAULT_VENV / "bin" / "python"
    return cand if cand.exists() else None


def _model(kind: str, d: int, m: int, x: Any, dtype: Any) -> Any:
    from empirics.nets.models import ModelSpec, build_model

    return build_model(ModelSpec(kind, d, m, 10, seed=0), x, dtype=dtype)


def _flat(Kfull: np.ndarray) -> np.ndarray:
    N, _, c, _ = Kfull.shape
    return Kfull.transpose(0, 2, 1, 3).reshape(N * c, N * c)


def woodbury_if(Kfull: np.ndarray, r_train: np.ndarray, r_test: np.ndarray, rho: float) -> np.ndarray:
    """`g_i^T (2 J^T J + rho I)^-1 g_t` with `g = 2 J^T r`, from the (N, N, c, c) empirical NTK.

    Push-through identity: `J_i (2 J^T J + rho I)^-1 J_t^T = [(2 K + rho I)^-1 K_(X,t)]_i` with K the
    (n c x n c) training block of the full kernel, so no parameter-space solve is needed.
    """
    import scipy.linalg

    n, c = r_train.shape
    nt = r_test.shape[0]
    flat = _flat(Kfull)
    Ktr, Kxt = flat[:n * c, :n * c], flat[:n * c, n * c:]
    S = scipy.linalg.solve(2.0 * Ktr + rho * np.eye(n * c), Kxt, assume_a="pos")
    return 4.0 * np.einsum("ia,iatb,tb->it", r_train, S.reshape(n, c, nt, c), r_test)


def topk_if(Kfull: np.ndarray, r_train: np.ndarray, r_test: np.ndarray, rho: float, k: int) -> np.ndarray:
    """The same influence restricted to the top-k eigenspace of `H = 2 J^T J` (what Arnoldi estimates).

    With `2 K_train u = lambda u`, `v = sqrt(2 / lambda) J^T u` is a unit eigenvector of H, and
    `g_i . v = 2 sqrt(2 / lambda) r_i^T K(i, train) u`; the score is `sum_k (g_i . v_k)(g_t . v_k) / (lambda_k + rho)`.
    """
    n, c = r_train.shape
    N = Kfull.shape[0]
    flat = _flat(Kfull)
    lam, U = np.linalg.eigh(2.0 * flat[:n * c, :n * c])
    lam, U = lam[-k:], U[:, -k:]
    P = (flat[:, :n * c] @ U).reshape(N, c, k)
    r = np.concatenate([r_train, r_test])
    a = 2.0 * np.sqrt(2.0 / lam) * np.einsum("na,nak->nk", r, P)
    return (a[:n] / (lam + rho)) @ a[n:].T


def _if_inputs(cfg: PeersConfig, case: IFCase, x: np.ndarray, y: np.ndarray, d: int, hold: dict[str, Any]
               ) -> tuple[dict[str, Any], Timing]:
    """Train the influence network, compute the suite's exact values, time the suite's route."""
    import torch

    from empirics.common import Tensors, train_network
    from empirics.kernels.ntk import empirical_ntk
    from empirics.nets.models import ModelSpec
    from empirics.nets.train import TrainConfig

    n, nt = case.n, case.n_test
    xi, yi = x[:n + nt], y[:n + nt]
    t = Tensors(torch.as_tensor(xi[:n]), torch.as_tensor(yi[:n]), torch.as_tensor(xi[n:]), torch.as_tensor(yi[n:]),
                10)
    tr = train_network(ModelSpec("relu", d, cfg.if_m, 10, seed=0), t, TrainConfig(epochs=cfg.if_epochs, seed=0),
                       label=f"influence net m={cfg.if_m}")
    net = tr.model.double()
    x64 = torch.as_tensor(xi, dtype=torch.float64)
    eye = np.eye(10)
    Y = eye[yi]
    with torch.no_grad():
        resid = net(x64).numpy() - Y
    Kf = empirical_ntk(net, x64, reduction="full").numpy()
    lam_max = float(np.linalg.eigvalsh(2.0 * _flat(Kf[:n, :n]))[-1]) if n * 10 <= 2500 else \
        float(_power_top(2.0 * _flat(Kf[:n, :n])))
    rho = lam_max / 50.0

    def ours() -> None:
        kf = empirical_ntk(net, x64, reduction="full").numpy()
        hold[case.key] = woodbury_if(kf, resid[:n], resid[n:], rho)

    timing = time_call(ours, TimingPolicy(cfg.repeats, max_total_s=cfg.max_total_s))
    arrays = {f"{case.key}_x_train": xi[:n].astype(np.float32), f"{case.key}_y_train": Y[:n].astype(np.float32),
              f"{case.key}_x_test": xi[n:].astype(np.float32), f"{case.key}_y_test": Y[n:].astype(np.float32),
              f"{case.key}_W": net.W.detach().float().numpy(), f"{case.key}_A": net.A.float().numpy(),
              f"{case.key}_rho": rho, f"{case.key}_lam_max": lam_max, f"{case.key}_q": hold[case.key],
              f"{case.key}_cg_iters": np.array(case.cg_iters, dtype=int),
              f"{case.key}_cg_plain_iters": np.array(case.cg_plain_iters, dtype=int),
              f"{case.key}_lissa": case.lissa, f"{case.key}_arnoldi_iters": np.array(case.arnoldi_iters, dtype=int)}
    if case.arnoldi_iters:
        arrays[f"{case.key}_q_topk"] = topk_if(Kf, resid[:n], resid[n:], rho, cfg.if_arnoldi_k)
    return arrays, timing


def _power_top(M: np.ndarray, iters: int = 200) -> float:
    """Largest eigenvalue of a symmetric positive semi-definite matrix (power iteration)."""
    v = np.random.default_rng(0).standard_normal(M.shape[0])
    lam = 0.0
    for _ in range(iters):
        w = M @ v
        lam = float(np.linalg.norm(w))
        v = w / lam
    return lam


def _cnn_inputs(cfg: PeersConfig, x: np.ndarray, y: np.ndarray, log: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train the CNN, save it as a torch.export program, time the audit's influence stage on it."""
    import time

    import torch

    from benchmarks.bench_audit import train
    from benchmarks.peers.run_peers import make_cnn
    from empirics.attribution.gauss_newton import gn_influence_mean, loss_residuals
    from empirics.attribution.influence import Ridge, influence_from_kernels
    from empirics.nets.losses import targets
    from verify.audit.binding import load_inputs
    from verify.audit.config import AuditConfig
    from verify.audit.measure import GenericKernels
    from verify.audit.modelio import bind_input, fx_graph_for, parse_shape

    torch.manual_seed(0)
    n, nt = cfg.cnn_n, cfg.cnn_n_test
    model = make_cnn()
    xs = torch.as_tensor(x[:n + nt]).reshape(-1, 1, 28, 28)
    ys = torch.as_tensor(y[:n + nt])
    acc = train(model, xs[:n], ys[:n], epochs=cfg.cnn_epochs)
    n_params = sum(p.numel() for p in model.parameters())
    arrays = {f"cnn_p_{k}": v.detach().numpy() for k, v in model.state_dict().items()}
    arrays.update({"cnn_x_train": x[:n], "cnn_y_train": y[:n], "cnn_x_test": x[n:n + nt], "cnn_y_test": y[n:n + nt],
                   "cnn_batch": cfg.cnn_batch})
    from empirics.kernels.audit_ntk import JacobianOptions, ModelJacobian

    info: dict[str, Any] = {"n_params": n_params, "train_acc": acc}
    with tempfile.TemporaryDirectory(prefix="bench-cnn-") as tmp:
        path = Path(tmp) / "cnn.pt2"
        ep = torch.export.export(model, (xs[:4],), dynamic_shapes=({0: torch.export.Dim("batch")},))
        torch.export.save(ep, str(path))
        np.savez(Path(tmp) / "train.npz", x=xs[:n].numpy(), y=y[:n])
        np.savez(Path(tmp) / "test.npz", x=xs[n:].numpy(), y=y[n:n + nt])
        acfg = AuditConfig(model=str(path), train=str(Path(tmp) / "train.npz"), test=str(Path(tmp) / "test.npz"),
                           n=n, n_test=nt, reference=False)
        loaded, train_s, test_s = load_inputs(acfg)
        fm, input_shape, out_dim = bind_input(loaded, train_s.x, train_s.image_shape, parse_shape(None))
        graph = fx_graph_for(loaded, fm, train_s.x)
        xt_, yt_ = torch.as_tensor(train_s.x), torch.as_tensor(train_s.y)
        xe_, ye_ = torch.as_tensor(test_s.x), torch.as_tensor(test_s.y)
        out: dict[str, Any] = {}

        def stage() -> None:
            jac = ModelJacobian(fm if graph is None else graph, input_shape, graph=graph,
                                static_batch=loaded.static_batch if graph is not None else None,
                                options=JacobianOptions(progress=False))
            prov = GenericKernels(jac, int(acfg.max_memory_gb * 2**30))
            t0 = time.perf_counter()
            K, Kst = prov.clean(xt_, xe_)
            t1 = time.perf_counter()
            Y = targets(yt_, out_dim, torch.float64).numpy()
            Yt = targets(ye_, out_dim, torch.float64).numpy()
            clean = influence_from_kernels((K, Kst), Y, Yt, ye_.numpy(), reg=Ridge(rel=acfg.ridge_rel))
            with torch.no_grad():
                o_tr, o_te = fm(xt_), fm(xe_)
            gn = gn_influence_mean(K, Kst, loss_residuals(o_tr, yt_), loss_residuals(o_te, ye_), clean.ridge)
            out.update(kernel_s=t1 - t0, influence_s=time.perf_counter() - t1, loo=clean.total, gn=gn.sum(axis=1),
                       method=prov.method)

        log(f"  peers: audit influence stage on the CNN ({n_params:,} parameters)")
        timing = time_call(stage, TimingPolicy(cfg.repeats, max_total_s=cfg.max_total_s))
    from scipy import stats

    arrays.update({"cnn_loo_total": out["loo"], "cnn_gn_total": out["gn"]})
    info.update({"timing": timing, "kernel_s": out["kernel_s"], "influence_s": out["influence_s"],
                 "method": out["method"], "rho_loo_gn": float(stats.spearmanr(out["loo"], out["gn"]).statistic)})
    return arrays, info


def prepare(cfg: PeersConfig, x: np.ndarray, y: np.ndarray, path: Path, threads: int,
            log: Any = print) -> dict[str, Any]:
    """Write the peers' inputs and the suite's results to `path`; return the suite's timings."""
    import torch

    from empirics.kernels.ntk import empirical_ntk
    from empirics.nets.attacks import AttackConfig, attack

    wanted = set(cfg.only.split(","))
    ours: dict[str, Any] = {}
    arrays: dict[str, Any] = {"threads": threads}
    d = x.shape[1]
    hold: dict[str, Any] = {}
    if "neural_tangents" in wanted:
        n_max = max([n for n, _ in cfg.nt_sizes] + [cfg.nt_grid[0]])
        xn = torch.as_tensor(x[:n_max], dtype=torch.float32)
        x64 = xn.double()
        ms = sorted({m for _, m in cfg.nt_sizes} | {cfg.nt_grid[1]})
        for m in ms:
            net = _model("relu", d, m, xn, torch.float32)
            net64 = _model("relu", d, m, x64, torch.float64)
            arrays[f"nt_W_{m}"], arrays[f"nt_A_{m}"] = net.W.detach().numpy(), net.A.numpy()
            for n_k, m_k in [*cfg.nt_sizes, cfg.nt_grid]:
                if m_k != m:
                    continue
                K64 = empirical_ntk(net64, x64[:n_k]).numpy()
                arrays[f"nt_K64_{n_k}_{m}"] = K64
                if (n_k, m_k) == tuple(cfg.nt_grid) and (n_k, m_k) not in cfg.nt_sizes:
                    continue
                t = time_call(lambda n_k=n_k, net=net: hold.__setitem__("K", empirical_ntk(net, xn[:n_k])),
                              TimingPolicy(cfg.repeats))
                ours[f"ntk/{n_k}/{m}"] = {"timing": t, "f32_err": max_rel_diff(hold["K"].numpy(), K64)}
        arrays.update(nt_x=xn.numpy(), nt_sizes=np.array(cfg.nt_sizes, dtype=int), nt_grid_n=cfg.nt_grid[0],
                      nt_grid_m=cfg.nt_grid[1], nt_tol=NT_TOL)
    if "dattri" in wanted:
        for case in cfg.if_cases:
            log(f"  peers: suite influence n={case.n}, n_test={case.n_test}")
            a, t = _if_inputs(cfg, case, x, y, d, hold)
            arrays.update(a)
            ours[f"if/{case.key}"] = t
        arrays.update(if_keys=np.array([c.key for c in cfg.if_cases]), if_tol=IF_TOL, if_arnoldi_k=cfg.if_arnoldi_k,
                      if_lissa_depth=cfg.if_lissa_depth)
    if "torchattacks" in wanted:
        xa = torch.as_tensor(x[:cfg.atk_n], dtype=torch.float32)
        ya = torch.as_tensor(y[:cfg.atk_n], dtype=torch.long)
        net_a = _model("relu", d, cfg.atk_m, xa, torch.float32)
        acfg = AttackConfig("pgd", cfg.eps, steps=cfg.atk_steps, random_start=False)
        ours["pgd"] = time_call(lambda: hold.__setitem__("adv", attack(net_a, xa, ya, acfg)), TimingPolicy(cfg.repeats))
        arrays.update(atk_x=xa.numpy(), atk_y=ya.numpy(), atk_W=net_a.W.detach().numpy(), atk_A=net_a.A.numpy(),
                      atk_eps=cfg.eps, atk_alpha=acfg.alpha, atk_steps=cfg.atk_steps, atk_adv=hold["adv"].numpy())
    if "kronfluence" in wanted:
        a, info = _cnn_inputs(cfg, x, y, log)
        arrays.update(a)
        ours["cnn"] = info
    for name in ("neural_tangents", "dattri", "torchattacks", "kronfluence"):
        arrays[f"has_{name}"] = name in wanted
    np.savez(path, **arrays)
    return ours


LABELS = {"neural_tangents": "neural-tangents empirical NTK", "dattri": "dattri influence function",
          "torchattacks": "torchattacks PGD (no random start)", "kronfluence": "kronfluence EK-FAC influence"}


def bench_peers(cfg: PeersConfig, x: np.ndarray, y: np.ndarray, threads: int, log: Any = print
                ) -> tuple[list[Row], dict[str, Any]]:
    """Rows for the peers (or one skipped row each with the reason)."""
    py = peers_python(cfg.python)
    names = [LABELS[k] for k in cfg.only.split(",")]
    if py is None or not py.exists():
        reason = (f"skipped: peers venv not found ({DEFAULT_VENV.name}/bin/python); "
                  "see benchmarks/peers/README.md")
        return [Row(SECTION, label, "-", status=reason) for label in names], {"status": reason}
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        inputs, out = Path(tmp) / "inputs.npz", Path(tmp) / "peers.json"
        log("  peers: the suite's side")
        ours = prepare(cfg, x, y, inputs, threads, log)
        res: dict[str, Any] = {}
        jobs = [PeerJob(name) for name in cfg.only.split(",") if name != "dattri"]
        if "dattri" in cfg.only.split(","):
            jobs += [PeerJob("dattri", c.key, i) for c in cfg.if_cases for i in range(c.n_configs)]
        for job in jobs:
            case, idx = job.case, job.idx
            log(f"  peers: {job.name}{'' if case is None else f' {case} configuration {idx}'} in {py}")
            got = _run_peer(py, inputs, out, job, cfg)
            for k, v in got.items():
                if k != "dattri" or not isinstance(v, dict) or "cases" not in v:
                    res.setdefault(k, v)
                    continue
                res.setdefault("dattri", {"status": "ok", "cases": {}, "process_end": []})
                if v.get("process_end"):
                    res["dattri"]["process_end"].append(f"{case} #{idx}: {v['process_end']}")
                for key, c in v["cases"].items():
                    have = res["dattri"]["cases"].setdefault(key, {**c, "configs": []})
                    have["configs"] += c.get("configs", [])
                    if not str(c.get("status", "")).startswith("skipped"):
                        have.pop("status", None)
    rows: list[Row] = []
    ver = res.get("versions", {})
    if "neural_tangents" in res:
        rows += nt_rows(res["neural_tangents"], ours, ver)
    if "dattri" in res:
        rows += dattri_rows(res["dattri"], ours, cfg, ver)
    if "torchattacks" in res:
        rows.append(torchattacks_row(res["torchattacks"], ours["pgd"], cfg, ver))
    if "kronfluence" in res:
        rows.append(kronfluence_row(res["kronfluence"], ours["cnn"], cfg, ver))
    public = {k: (v.to_dict() if isinstance(v, Timing) else
                  {kk: (vv.to_dict() if isinstance(vv, Timing) else vv) for kk, vv in v.items()})
              for k, v in ours.items()}
    return rows, {"peers": res, "ours": public}


def _run_peer(py: Path, inputs: Path, out: Path, job: PeerJob, cfg: PeersConfig) -> dict[str, Any]:
    """One peer (one dattri case) in its own process, under the memory cap when it runs torch only."""
    import resource

    name, case, idx = job.name, job.case, job.idx

    def cap() -> None:
        limit = int(cfg.memory_cap_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    cmd = [str(py), str(SCRIPT), "--inputs", str(inputs), "--out", str(out), "--repeats", str(cfg.repeats),
           "--max-total-s", str(cfg.max_total_s), "--only", name] + ([] if case is None else ["--case", case]) \
        + ([] if idx is None else ["--config", str(idx)])
    out.unlink(missing_ok=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=cfg.timeout_s,
                              preexec_fn=None if name == "neural_tangents" else cap)
        err, code = proc.stderr, proc.returncode
    except subprocess.TimeoutExpired:
        err, code = f"timed out after {cfg.timeout_s:g} s", -1
    lines = [ln for ln in err.strip().splitlines() if ln.strip() and "%|" not in ln]
    tail = lines[-1][:300] if lines else "?"
    if not out.exists():
        return {name: {"status": f"skipped: peers script failed (exit {code}): {tail}"}}
    res = json.loads(out.read_text())
    if code != 0:
        res.setdefault(name, {})["process_end"] = f"exit {code} (memory cap {cfg.memory_cap_gib:g} GiB): {tail}"
    return res


def _ratio(peer_s: float, suite_s: float) -> str:
    r = peer_s / suite_s
    return f"suite {fmt_ratio(r)} faster" if r >= 1 else f"peer {fmt_ratio(1 / r)} faster"


def _med(times: list[float]) -> float:
    return float(np.median(times))


def nt_rows(nt: dict[str, Any], ours: dict[str, Any], ver: dict[str, str]) -> list[Row]:
    """The fastest correct neural-tangents configuration at each size, and the grid as information."""
    label = LABELS["neural_tangents"]
    vtxt = f"neural-tangents {ver.get('neural-tangents')}, jax {ver.get('jax')}, jit, float32"
    grid = nt.get("grid", [])
    listed = "; ".join(
        f"{g['implementation']} / {g['layout']} / vmap_axes={g['vmap_axes']}: "
        + (f"{fmt_time(_med(g['times_s']))} (err {fmt_num(g['max_rel_diff'])})" if "times_s" in g
           else f"error {g.get('error', '?')[:80]}") for g in grid)
    rows = [Row(SECTION, f"{label}: configuration grid", f"n={nt.get('grid_n')}, m={nt.get('grid_m')}",
                value=f"{sum(1 for g in grid if g.get('correct'))} of {len(grid)} configurations agree",
                status="info", note=listed)]
    if nt.get("status") != "ok":
        rows.append(Row(SECTION, label, "-", status=str(nt.get("status", "skipped: no result")), note=vtxt))
        return rows
    b = nt["best"]
    conf = f"{b['implementation']}, {b['layout']}, vmap_axes={b['vmap_axes']}"
    for s in nt["sizes"]:
        n, m = s["n"], s["m"]
        suite = ours[f"ntk/{n}/{m}"]
        case = f"n={n}, m={m}, d=784, c=10 traced; {conf}"
        if "times_s" not in s:
            rows.append(Row(SECTION, label, case, status=f"skipped: {s.get('error', '?')}", note=vtxt))
            continue
        t = Timing(list(s["times_s"]), "1 untimed call (includes JAX compilation)")
        st = suite["timing"]
        rows.append(Row(SECTION, label, case, t, ratio=_ratio(t.median, st.median),
                        checks=[Check("max rel diff vs suite float64 kernel", float(s["max_rel_diff"]), NT_TOL),
                                Check("suite float32 max rel diff vs float64", float(suite["f32_err"]))],
                        note=f"{vtxt}; same estimand; suite side: empirical_ntk float32 {fmt_time(st.median)} "
                             f"(median of {st.repeats})",
                        data={"peer_s": t.median, "suite_s": st.median, "ratio": t.median / st.median,
                              "config": conf}))
    return rows


def dattri_rows(res: dict[str, Any], ours: dict[str, Any], cfg: PeersConfig, ver: dict[str, str]) -> list[Row]:
    """Per benchmark point: the fastest agreeing configuration of each dattri method family."""
    rows: list[Row] = []
    if res.get("status") != "ok":
        return [Row(SECTION, LABELS["dattri"], "-", status=str(res.get("status")))]
    for case in cfg.if_cases:
        c = res["cases"].get(case.key, {})
        suite = ours[f"if/{case.key}"]
        base = f"n={case.n}, n_test={case.n_test}, m={cfg.if_m}, rho=lambda_max(H)/50"
        if "configs" not in c:
            rows.append(Row(SECTION, LABELS["dattri"], base, status=str(c.get("status", "skipped: no result"))))
            continue
        if str(c.get("status", "")).startswith("skipped") or res.get("process_end"):
            ends = res.get("process_end") or ["?"]
            rows.append(Row(SECTION, LABELS["dattri"], base, status="info",
                            value=f"{len(ends)} configuration process(es) ended early: " + "; ".join(ends)[:400]))
        families: dict[str, list[dict[str, Any]]] = {}
        for r in c["configs"]:
            families.setdefault(r["method"], []).append(r)
        for method, confs in families.items():
            ok = [r for r in confs if r.get("correct")]
            listed = "; ".join(_conf_text(r) for r in confs)
            same = "exact" in confs[0]["gate"] and "top" not in confs[0]["gate"]
            what = ("same estimand as the suite (Koh & Liang IF, exact Hessian + rho)" if same else
                    f"different estimand: IF restricted to the top-{cfg.if_arnoldi_k} eigenspace of H, checked "
                    "against the suite's exact value of that")
            note = (f"dattri {ver.get('dattri')}, float32; {what}; suite side: full closed-form NTK (float64) + "
                    f"Woodbury solve, {fmt_time(suite.median)} (median of {suite.repeats}); configurations: {listed}")
            if not ok:
                best = min((r for r in confs if "max_rel_diff" in r), key=lambda r: r["max_rel_diff"], default=None)
                why = (f"best error {fmt_num(best['max_rel_diff'])} > {fmt_num(IF_TOL)}" if best else
                       "; ".join(sorted({_error_text(r.get("error", "?")) for r in confs})))
                rows.append(Row(SECTION, f"dattri {method}", base,
                                status=f"skipped: no configuration agreed ({why})", note=note))
                continue
            b = min(ok, key=lambda r: _med(r["times_s"]))
            t = Timing(list(b["times_s"]), "none: eager torch, nothing to compile")
            ratio = _ratio(t.median, suite.median) if same else "none: different estimand"
            rows.append(Row(SECTION, f"dattri {method}", f"{base}; {_conf_text(b, short=True)}", t, ratio=ratio,
                            checks=[Check(f"max rel diff vs suite ({b['gate']})", float(b["max_rel_diff"]), IF_TOL),
                                    Check("Pearson vs exact IF", float(b["pearson_vs_full_if"]))],
                            note=note, data={"peer_s": t.median, "suite_s": suite.median, "same_estimand": same,
                                             "ratio": t.median / suite.median, "config": _conf_text(b, short=True)}))
    return rows


def _conf_text(r: dict[str, Any], short: bool = False) -> str:
    keys = [k for k in ("max_iter", "regularization", "recursion_depth", "scaling", "damping", "proj_dim", "batch_size")
            if k in r]
    cfg = ", ".join(f"{k}={fmt_num(r[k]) if isinstance(r[k], float) else r[k]}" for k in keys)
    if short:
        return cfg
    if "times_s" not in r:
        return f"{cfg}: {_error_text(r.get('error', '?'))}"
    return f"{cfg}: {fmt_time(_med(r['times_s']))}, err {fmt_num(r['max_rel_diff'])}"


def _error_text(err: str) -> str:
    """An exception message, with allocation failures named as what they are."""
    if "DefaultCPUAllocator" in err or "MemoryError" in err or "out of memory" in err.lower():
        return "out of memory under the peers' address-space cap"
    return f"error {err[:80]}"


def torchattacks_row(r: dict[str, Any], ours: Timing, cfg: PeersConfig, ver: dict[str, str]) -> Row:
    """torchattacks PGD against the suite's PGD (same algorithm, same step size)."""
    label = LABELS["torchattacks"]
    case = f"n={cfg.atk_n}, m={cfg.atk_m}, eps={cfg.eps}, {cfg.atk_steps} steps"
    vtxt = f"torchattacks {ver.get('torchattacks')}"
    if r.get("status") != "ok":
        return Row(SECTION, label, case, status=str(r.get("status")), note=vtxt)
    t = Timing(list(r["times_s"]), "1 untimed call")
    return Row(SECTION, label, case, t, ratio=_ratio(t.median, ours.median),
               checks=[Check("fraction of pixels differing from suite PGD", float(r["fraction_differing"]), 1e-3),
                       Check("max abs diff", float(r["max_abs_diff"]))],
               note=f"{vtxt}; same algorithm; suite side: empirics.nets.attacks PGD, {fmt_time(ours.median)} "
                    f"(median of {ours.repeats})",
               data={"peer_s": t.median, "suite_s": ours.median, "ratio": t.median / ours.median})


def kronfluence_row(r: dict[str, Any], ours: dict[str, Any], cfg: PeersConfig, ver: dict[str, str]) -> Row:
    """kronfluence EK-FAC against the audit's influence stage on the same CNN (different estimands)."""
    label = LABELS["kronfluence"]
    st: Timing = ours["timing"]
    case = (f"CNN {ours['n_params']:,} parameters, {cfg.cnn_n} MNIST train x {cfg.cnn_n_test} test, "
            f"cross-entropy; batch {cfg.cnn_batch}")
    vtxt = f"kronfluence {ver.get('kronfluence')}"
    if r.get("status") != "ok":
        return Row(SECTION, label, case, status=str(r.get("status")), note=vtxt)
    t = Timing(list(r["times_s"]), "1 untimed fit + scores")
    return Row(SECTION, label, case, t, ratio=f"{_ratio(t.median, st.median)} (different estimands)",
               checks=[Check("scores finite, shape test x train", 0.0 if r["finite"]
                             and r["shape"] == [cfg.cnn_n_test, cfg.cnn_n] else 1.0, 0.0),
                       Check("Spearman of train totals vs audit NTK-LOO", float(r["spearman_vs_audit_loo"])),
                       Check("vs audit Gauss-Newton", float(r["spearman_vs_audit_gn"])),
                       Check("audit LOO vs GN", float(ours["rho_loo_gn"]))],
               memory=f"{r['peak_rss_gib']:.2g} GiB (peer process peak RSS)",
               note=f"{vtxt}; DIFFERENT estimands, so no agreement gate: EK-FAC approximates the damped "
                    "Gauss-Newton/Fisher influence of the cross-entropy loss in parameter space; the audit computes "
                    "exact NTK leave-one-out and Gauss-Newton influence in kernel space (no Hessian "
                    f"approximation); kronfluence fit {fmt_time(_med(r['fit_s']))} + scores "
                    f"{fmt_time(_med(r['scores_s']))}; audit side ({ours['method']}): kernel "
                    f"{fmt_time(ours['kernel_s'])} + influence {fmt_time(ours['influence_s'])} = "
                    f"{fmt_time(st.median)} (median of {st.repeats})",
               data={"peer_s": t.median, "suite_s": st.median, "ratio": t.median / st.median})
