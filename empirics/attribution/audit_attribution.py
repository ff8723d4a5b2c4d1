"""The field's attribution libraries as estimators of the audit: influence of every training point on every test loss
from kronfluence (EK-FAC, KFAC, and its identity-preconditioned gradient dot product) and from TRAK (`traker`, the
MadryLab package), each at its documented configuration, for the audit's validity panel to score by the same LDS.

Both libraries are optional (`pip install '.[attribution]'`); without one, its estimators report how to install it.
kronfluence tracks only `nn.Linear` and `nn.Conv2d` modules, and the audit's models are TorchScript or exported
graphs whose layers are `aten.linear` / `aten.conv2d` calls: `modular` rewrites a copy of the graph so that each such
call is a module again (the same weights, the same function). Everything runs on copies of the model, so the audit's
own model and its re-fits are untouched.

Sign convention of every estimator here, as the audit's: `influence[i, t] > 0` when training point i helps test point
t, i.e. removing i is predicted to raise t's loss (kronfluence: positive scores reduce the measurement; TRAK: positive
scores raise the correct-class margin).

Wiring check (a positive control): kronfluence's identity-preconditioned scores are exactly the dot products of the
per-example loss gradients, which `loss_gradients` computes independently with autograd; `wiring_check` compares
the two on a subset of points, and a disagreement beyond float32 rounding marks every kronfluence estimator failed.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import importlib.util
import io
import logging
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from empirics.common import Tensors
from empirics.nets.losses import loss_fn

_aten = torch.ops.aten
INSTALL = "pip install '.[attribution]'"
#: Largest TRAK projection (its documented default); at most half the training points and at most the parameters,
#: since TRAK inverts the projected gradients' X^T X without a ridge, singular once the projection exceeds either.
TRAK_PROJ_DIM = 2048
#: Relative tolerance of the wiring check (float32 gradients summed over at most a few million parameters).
WIRING_TOL = 1e-4
WIRING_POINTS = (48, 12)
NOT_INSTALLED, NOT_APPLICABLE, FAILED, OK = "not installed", "not applicable", "failed", "ok"


def installed(name: str) -> str | None:
    """The version of the library behind estimator `name`, or None when it cannot be imported."""
    module, dist = peer(name).module, peer(name).distribution
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


# --- the model as modules ----------------------------------------------------------------------------------------


def _get(gm: nn.Module, target: str) -> torch.Tensor:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _arg(node: torch.fx.Node, i: int, name: str, default: Any) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def modular(graph: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, int]:
    """A copy of `graph` in which every `aten.linear` / `aten.conv2d` call whose weight (and bias) are read from the
    module's own tensors is an `nn.Linear` / `nn.Conv2d` submodule holding copies of them; and how many were made."""
    gm = copy.deepcopy(graph)
    made = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (_aten.linear.default, _aten.conv2d.default):
            continue
        w, b = _arg(node, 1, "weight", None), _arg(node, 2, "bias", None)
        if not (isinstance(w, torch.fx.Node) and w.op == "get_attr"):
            continue
        if b is not None and not (isinstance(b, torch.fx.Node) and b.op == "get_attr"):
            continue
        weight = _get(gm, str(w.target)).detach()
        bias = None if b is None else _get(gm, str(b.target)).detach()
        if node.target is _aten.linear.default:
            mod: nn.Module = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
        else:
            groups = int(_arg(node, 6, "groups", 1))
            mod = nn.Conv2d(weight.shape[1] * groups, weight.shape[0], tuple(weight.shape[2:]),
                            stride=tuple(_arg(node, 3, "stride", (1, 1))),
                            padding=tuple(_arg(node, 4, "padding", (0, 0))),
                            dilation=tuple(_arg(node, 5, "dilation", (1, 1))), groups=groups, bias=bias is not None)
        mod.weight = nn.Parameter(weight.clone())
        if bias is not None:
            mod.bias = nn.Parameter(bias.clone())
        name = f"attribution_{made}"
        gm.add_submodule(name, mod.to(weight.dtype))
        with gm.graph.inserting_before(node):
            new = gm.graph.call_module(name, (node.args[0],))
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        made += 1
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm, made


def exported_graph(net: nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    """`net` (an eager module on flat inputs) as an FX graph with a dynamic batch dimension."""
    batch = torch.export.Dim("batch", min=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(net, (x[:2].clone(),), dynamic_shapes=({0: batch},))
    return ep.module()


def tracked_params(model: nn.Module) -> list[torch.Tensor]:
    """The weights and biases of the model's `nn.Linear` / `nn.Conv2d` modules (what kronfluence scores with)."""
    return [p for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d)) for p in m.parameters(recurse=False)]


def loss_gradients(model: nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                   out_dim: int) -> np.ndarray:
    """Per-example gradients (m, P) of the model's own loss w.r.t. `params`, one backward pass per example (float64)."""
    per_ex = loss_fn(out_dim)
    rows = []
    with torch.enable_grad():
        for i in range(len(x)):
            g = torch.autograd.grad(per_ex(model(x[i:i + 1]), y[i:i + 1]).sum(), params, allow_unused=True)
            rows.append(torch.cat([(torch.zeros_like(p) if gi is None else gi).reshape(-1).double()
                                   for gi, p in zip(g, params, strict=True)]))
    return torch.stack(rows).cpu().numpy()


# --- kronfluence -------------------------------------------------------------------------------------------------


def _task(out_dim: int) -> Any:
    """kronfluence's Task for the model's own loss: summed per-example loss; `sample` draws the targets from the
    model's predictive distribution (the true Fisher: a class from the softmax, or f + N(0, 1) for one output)."""
    from kronfluence.task import Task

    per_ex = loss_fn(out_dim)

    class OwnLoss(Task):
        def compute_train_loss(self, batch: Any, model: nn.Module, sample: bool = False) -> torch.Tensor:
            xx, yy = batch
            out = model(xx)
            if not sample:
                return per_ex(out, yy).sum()
            with torch.no_grad():
                if out_dim == 1:
                    t = out[:, 0].detach() + torch.randn_like(out[:, 0])
                else:
                    yy = torch.multinomial(torch.softmax(out.detach(), -1), 1).flatten()
            return (0.5 * (out[:, 0] - t) ** 2).sum() if out_dim == 1 else per_ex(out, yy).sum()

        def compute_measurement(self, batch: Any, model: nn.Module) -> torch.Tensor:
            xx, yy = batch
            return per_ex(model(xx), yy).sum()

    return OwnLoss()


def kronfluence_scores(model: nn.Module, data: Tensors, strategy: str, seed: int, batch_size: int = 128,
                       damping: float | None = None) -> np.ndarray:
    """kronfluence pairwise scores of `strategy` ("ekfac", "kfac", "identity"), as influence (n, t) of `data`'s training
    on its test points; `damping` is `ScoreArguments(damping_factor=...)` (None: the library's documented heuristic,
    0.1 x the mean eigenvalue; the identity strategy ignores it), true Fisher (`FactorArguments(strategy=...)`).
    `model` is changed (prepared)."""
    from kronfluence.analyzer import Analyzer, prepare_model
    from kronfluence.arguments import FactorArguments, ScoreArguments
    from torch.utils.data import TensorDataset

    logging.getLogger("kronfluence").setLevel(logging.ERROR)
    x, y, xt, yt = data.x_train, data.y_train, data.x_test, data.y_test
    task = _task(data.out_dim)
    model.eval()
    model = prepare_model(model, task)
    train, test = TensorDataset(x, y), TensorDataset(xt, yt)
    bs = max(1, min(batch_size, len(x)))
    with tempfile.TemporaryDirectory(prefix="audit-kronfluence-") as tmp, torch.random.fork_rng(), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        an = Analyzer(analysis_name="audit", model=model, task=task, output_dir=tmp, disable_tqdm=True, cpu=True,
                      disable_model_save=True)
        an.fit_all_factors(factors_name=strategy, dataset=train, per_device_batch_size=bs,
                           factor_args=FactorArguments(strategy=strategy), overwrite_output_dir=True)
        an.compute_pairwise_scores(scores_name="s", factors_name=strategy, query_dataset=test, train_dataset=train,
                                   per_device_query_batch_size=max(1, min(bs, len(xt))), per_device_train_batch_size=bs,
                                   score_args=ScoreArguments(damping_factor=damping), overwrite_output_dir=True)
        scores = an.load_pairwise_scores("s")["all_modules"]
    return scores.double().cpu().numpy().T.copy()


def wiring_check(model: nn.Module, data: Tensors, seed: int) -> dict[str, Any]:
    """kronfluence's identity scores against the dot products of autograd's per-example loss gradients, on the
    first `WIRING_POINTS` training and test points: they are the same number, so they must agree to rounding."""
    x, y, xt, yt, out_dim = data.x_train, data.y_train, data.x_test, data.y_test, data.out_dim
    m, k = min(WIRING_POINTS[0], len(x)), min(WIRING_POINTS[1], len(xt))
    params = tracked_params(model)
    g, gt = loss_gradients(model, params, x[:m], y[:m], out_dim), loss_gradients(model, params, xt[:k], yt[:k], out_dim)
    ref = g @ gt.T
    got = kronfluence_scores(copy.deepcopy(model), Tensors(x[:m], y[:m], xt[:k], yt[:k], out_dim), "identity", seed)
    scale = float(np.abs(ref).max())
    err = float(np.abs(got - ref).max() / scale) if scale > 0 else float("nan")
    return {"train_points": m, "test_points": k, "parameters": int(g.shape[1]), "max_rel_diff": err,
            "tolerance": WIRING_TOL, "passed": bool(np.isfinite(err) and err <= WIRING_TOL),
            "against": "dot products of per-example loss gradients by autograd (the suite's gradient dot product)"}


# --- TRAK --------------------------------------------------------------------------------------------------------


def trak_proj_dim(n: int, n_params: int) -> int:
    return max(1, min(TRAK_PROJ_DIM, n // 2, n_params))


def trak_scores(model: nn.Module, data: Tensors, seed: int, batch_size: int = 64) -> np.ndarray:
    """TRAK scores (n, t) of one model on `data`'s training and test points: `TRAKer(task="image_classification")`
    (the margin output), on the CPU in float32, normal projection to `trak_proj_dim(n)` dimensions seeded by `seed`."""
    from trak import TRAKer
    from trak.projectors import BasicProjector, ProjectionType

    logging.getLogger("TRAK").setLevel(logging.ERROR)
    x, y, xt, yt = data.x_train, data.y_train, data.x_test, data.y_test
    model.eval()
    n, t = len(x), len(xt)
    n_params = sum(p.numel() for p in model.parameters())
    k = trak_proj_dim(n, n_params)
    # traker 0.3.2 frees a one-block projection matrix after featurizing and then scores with it (AttributeError):
    # blocks of at most half the projection keep it regenerating its (seeded, identical) blocks instead.
    projector = BasicProjector(grad_dim=n_params, proj_dim=k, seed=seed,
                               proj_type=ProjectionType.normal, device="cpu", block_size=min(100, max(1, (k + 1) // 2)))
    with tempfile.TemporaryDirectory(prefix="audit-trak-") as tmp, contextlib.redirect_stderr(io.StringIO()):
        tr = TRAKer(model=model, task="image_classification", train_set_size=n, save_dir=tmp, device="cpu",
                    use_half_precision=False, projector=projector, logging_level=logging.ERROR)
        state = model.state_dict()
        tr.load_checkpoint(state, model_id=0)
        for i in range(0, n, batch_size):
            tr.featurize(batch=(x[i:i + batch_size], y[i:i + batch_size]), num_samples=len(x[i:i + batch_size]))
        tr.finalize_features()
        tr.start_scoring_checkpoint(exp_name="audit", checkpoint=state, model_id=0, num_targets=t)
        for i in range(0, t, batch_size):
            tr.score(batch=(xt[i:i + batch_size], yt[i:i + batch_size]), num_samples=len(xt[i:i + batch_size]))
        scores = tr.finalize_scores(exp_name="audit")
    return np.asarray(scores, dtype=np.float64).reshape(n, t)


# --- the registry -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LibraryPeer:
    """One library estimator the validity panel scores beside the suite's own: what it is called, the library it
    needs, what it can score, and how (`score(model, data, seed)` -> influence (n, t); `config(n, n_params)` -> the
    configuration it ran with, as the report prints it)."""

    name: str
    label: str
    module: str
    distribution: str
    #: It tracks `nn.Linear` / `nn.Conv2d` modules only (kronfluence): needs one, and the wiring check first.
    tracks_layers: bool
    #: Fewest model outputs it can score (TRAK's classification margin needs two).
    min_outputs: int
    score: Callable[[nn.Module, Tensors, int], np.ndarray]
    config: Callable[[int, int], str]


def _kronfluence(strategy: str, damping: float | None, text: str) -> LibraryPeer:
    return LibraryPeer(strategy, text, "kronfluence", "kronfluence", tracks_layers=True, min_outputs=1,
                       score=partial(_kron_score, strategy=strategy, damping=damping),
                       config=lambda n, p: _kron_config(strategy, damping))


def _kron_score(model: nn.Module, data: Tensors, seed: int, strategy: str, damping: float | None) -> np.ndarray:
    return kronfluence_scores(model, data, strategy, seed, damping=damping)


def _kron_config(strategy: str, damping: float | None) -> str:
    if strategy == IDENTITY:
        return "FactorArguments(strategy='identity'): no preconditioning"
    how = "kronfluence's documented heuristic, 0.1 x the mean eigenvalue" if damping is None else f"{damping:g}"
    return f"FactorArguments(strategy='{strategy}'), ScoreArguments(damping_factor={damping}) ({how}), true Fisher"


#: kronfluence's identity-preconditioned strategy: the gradient dot product the wiring check compares with autograd.
IDENTITY = "identity"
#: Every library peer, in the report's order. kronfluence's EK-FAC and KFAC use the library's documented damping
#: heuristic (`damping_factor=None`: 0.1 x the mean eigenvalue); its default of 1e-8 leaves the inverse of a
#: near-singular curvature unregularised, which scored EK-FAC at LDS 0.36 against 0.74 with the heuristic on the
#: issue's logistic regression (issue 43 item 4).
PEER_REGISTRY: dict[str, LibraryPeer] = {p.name: p for p in (
    _kronfluence("ekfac", None, "kronfluence EK-FAC"),
    _kronfluence("kfac", None, "kronfluence KFAC"),
    _kronfluence(IDENTITY, None, "kronfluence gradient dot product (identity)"),
    LibraryPeer("trak", "TRAK (traker, one model)", "trak", "traker", tracks_layers=False, min_outputs=2,
                score=lambda model, data, seed: trak_scores(model, data, seed),
                config=lambda n, p: (f"TRAKer(task='image_classification'), one model, normal projection to "
                                     f"{trak_proj_dim(n, p)} dimensions, float32")),
)}
PEERS = tuple(PEER_REGISTRY)
KRONFLUENCE = tuple(n for n, p in PEER_REGISTRY.items() if p.tracks_layers)
PEER_LABELS = {n: p.label for n, p in PEER_REGISTRY.items()}


def peer(name: str) -> LibraryPeer:
    """The peer called `name`; an unknown name is a one-line error listing them."""
    try:
        return PEER_REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown library peer {name!r}; one of {', '.join(PEER_REGISTRY)}") from None


# --- all of them -------------------------------------------------------------------------------------------------


def _row(name: str, status: str, reason: str = "", **kw: Any) -> dict[str, Any]:
    return {"label": PEER_LABELS[name], "status": status, "reason": reason, **kw}


def unscored(names: tuple[str, ...], status: str, reason: str) -> dict[str, dict[str, Any]]:
    """The same row, not scored and why, for each of `names`."""
    return {nm: _row(nm, status, reason) for nm in names}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def peer_estimators(net: nn.Module, graph: torch.fx.GraphModule | None, data: Tensors, names: tuple[str, ...],
                    seed: int, wrap: Callable[[nn.Module], nn.Module] = lambda m: m) -> dict[str, dict[str, Any]]:
    """Each requested library estimator's row: status ("ok", "not installed", "not applicable", "failed"), its
    reason, version, configuration and seconds, and for "ok" its influence (n, t) of `data`'s training on its test
    points under `influence`.

    `net` maps flat inputs to outputs; `graph` is its FX graph when the audit has one (`wrap` turns a graph into the
    model on flat inputs), else `net` is exported. Never raises for a library's failure: the row says what failed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _peer_rows(net, graph, data, names, seed, wrap)


def _peer_rows(net: nn.Module, graph: torch.fx.GraphModule | None, data: Tensors, names: tuple[str, ...],
               seed: int, wrap: Callable[[nn.Module], nn.Module]) -> dict[str, dict[str, Any]]:
    """`peer_estimators` without its warnings filter."""
    x, xt, out_dim = data.x_train, data.x_test, data.out_dim
    rows: dict[str, dict[str, Any]] = {}
    missing = {nm: installed(nm) for nm in names}
    for nm in names:
        if missing[nm] is None:
            rows[nm] = _row(nm, NOT_INSTALLED, f"{peer(nm).distribution} is not installed: {INSTALL}")
    todo = [nm for nm in names if nm not in rows]
    if not todo:
        return rows
    try:
        gm = graph if graph is not None else exported_graph(net, x)
        base, made = modular(gm)
        model = wrap(base)
    except Exception as exc:  # noqa: BLE001 - a model the rewrite cannot handle: the rows say why
        for nm in todo:
            rows[nm] = _row(nm, NOT_APPLICABLE, f"the model has no FX graph to rewrite into modules "
                            f"({_first_line(exc)})")
        return rows
    wiring: dict[str, Any] | None = None
    for nm in todo:
        version, est = missing[nm], peer(nm)
        if est.tracks_layers and not made:
            rows[nm] = _row(nm, NOT_APPLICABLE, f"the model has no linear or conv2d layer ({est.module} tracks only "
                            "those)", version=version)
            continue
        if out_dim < est.min_outputs:
            rows[nm] = _row(nm, NOT_APPLICABLE, f"{est.label} needs at least {est.min_outputs} model outputs (its "
                            "classification margin)", version=version)
            continue
        try:
            if est.tracks_layers and wiring is None:
                wiring = wiring_check(copy.deepcopy(model), data, seed)
            tic = time.perf_counter()
            if est.tracks_layers and not wiring["passed"]:
                rows[nm] = _row(nm, FAILED, f"the wiring check failed: kronfluence's identity scores differ from "
                                f"autograd's gradient dot products by {wiring['max_rel_diff']:.2g} (relative)",
                                version=version, wiring=wiring)
                continue
            infl = est.score(copy.deepcopy(model), data, seed)
            config = est.config(len(x), sum(p.numel() for p in model.parameters()))
        except Exception as exc:  # noqa: BLE001 - a library failing on this model: the row says how
            rows[nm] = _row(nm, FAILED, _first_line(exc), version=version)
            continue
        secs = time.perf_counter() - tic
        if infl.shape != (len(x), len(xt)) or not np.isfinite(infl).all():
            rows[nm] = _row(nm, FAILED, f"scores of shape {infl.shape} with non-finite values", version=version)
            continue
        rows[nm] = _row(nm, OK, version=version, config=config, seconds=secs, influence=infl,
                        **({"wiring": wiring} if est.tracks_layers else {}))
    return rows
