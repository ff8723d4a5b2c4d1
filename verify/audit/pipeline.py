"""`verify audit`: how much could a few altered training examples change what a model relies on?

The pipeline (`run_audit`; every number lands in one JSON-ready record; nothing is written until all succeeded)
and the audit's output files (`write_outputs`; `verify.audit.ci.read_record` reads a record back). Its parts: the
settings in `verify.audit.config`, the measurements on one network in `verify.audit.measure`, the risk rule in
`verify.audit.risk`, the report's context and HTML in `reports.audit_report`.

1. Load the model safely (`verify.modelio`) and the training / test data; bind the model to the data's
   input shape; validate labels against the model's outputs. All of that on the CPU; then the model and the data
   move once to `--device` (auto: CUDA when visible), where everything below runs (numpy crossings are explicit).
2. Your model's empirical NTK and three influence estimates from it: NTK leave-one-out, Gauss-Newton and
   empirical Fisher (`verify.audit.measure.estimate_network`).
   A model below the accuracy gate (`verify.audit.risk.model_gate`, from step 2's test accuracy) runs no panel
   (steps 3 and 5): nothing they measure could issue a risk level; the record's `panels.skipped` says why.
3. The validity panel (`verify.audit.validity`; re-fitting your model, `verify.audit.refit`: warm start from the
   saved weights, or your `--train-fn`): the three and the attribution libraries scored against re-fits; the one
   of the three that validates best is the *lead estimator* (NTK leave-one-out when the panel does not run).
4. For your model, and for the paper's two reference networks (2L-ReLU and MLP-Attn, width `ref_width`, trained by
   the suite on the same data with the width-consistent protocol to a plateau and judged by the adequacy gate,
   `empirics.protocols`; one below the gate is left out of the scale; `--no-reference` skips them): the flip-rate
   protocol ranking by the lead estimator against a random-noise baseline, and sharpness
   (`verify.audit.measure.measure_network`); and the kernel-regime diagnostics: kappa of the data Gram matrix and of
   the empirical NTK, the v1 / v2 width bounds of Thm 4.7, each model's width (its widest layer) and parameter count.
5. The other panels (`--skip` leaves any out), from the lead estimator's influence: budget curves
   (`verify.audit.budget`), the outcome table and the planted-poison self-test (`verify.audit.outcome`).
6. The risk level (`verify.audit.risk`; issued only for a model that beats chance on the test data and whose
   lead estimator the validity panel finds trustworthy, else "not measurable" or "not validated"), the lever
   examples (the top-|influence| training points by the lead estimator, with which attacks flipped them), and the
   report (`reports/templates/audit.html`).
"""

from __future__ import annotations

import datetime as _dt
import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

from empirics.audit_attribution import NOT_APPLICABLE, OK, peer_estimators, unscored
from empirics.audit_ntk import ModelJacobian
from empirics.audit_structured import ProjectedStructured, StructuredJacobian
from empirics.common import Tensors, train_network
from empirics.influence import InfluenceResult
from empirics.malleability import n_top
from empirics.models import ModelSpec
from empirics.progress import log
from empirics.protocols import PROPER, protocol_config
from empirics.records import device_info, library_versions, peak_rss_gib, pick_device
from ntkm.errors import UserInputError
from theory.bounds import relu_width_bound, width_bound_v1, width_bound_v2
from theory.conditioning import condition_numbers
from verify.audit.budget import REALISTIC_REASON, budget_curves
from verify.audit.ci import summary_markdown
from verify.audit.config import DEFINITIONS, PANELS, SCHEMA_VERSION, SUMMARY_MARKER, AuditConfig
from verify.audit.ensemble import Ensembles, ensemble_estimates
from verify.audit.measure import (
    PROJECTED,
    Estimated,
    GenericKernels,
    Network,
    NetworkContext,
    SuiteKernels,
    estimate_network,
    measure_network,
)
from verify.audit.outcome import CurveGrid, outcome_curves, outcome_panel, poison_panel
from verify.audit.projection import choose_projection, projected_kernel, projection_error
from verify.audit.refit import RefitInputs, Refitter, load_train_fn, refit_adequacy
from verify.audit.risk import NOT_MEASURABLE, assess_risk, model_gate
from verify.audit.validity import Estimates, estimator_rows, validity_panel
from verify.modelio import (
    FlatInput,
    LoadedModel,
    Split,
    bind_input,
    check_labels,
    check_model,
    check_varied,
    fx_graph_for,
    load_model,
    load_split,
    parse_shape,
    probe_batches,
    sniff_format,
)
from verify.multiplicity import ALPHA, holm

REF_LABELS = {"relu": "2L-ReLU", "attn": "MLP-Attn"}


# --- pipeline --------------------------------------------------------------------------------------


def _levers(user: dict[str, Any], split: Split, cfg: AuditConfig) -> list[dict[str, Any]]:
    """The top-k training points by |influence| of the estimator the flip rates rank by, with the attacks that flipped
    their sign, and their NTK leave-one-out and Gauss-Newton influence beside it."""
    total = np.asarray(user["estimator_total"])
    ntk = np.asarray(user["influence_total"])
    gn = np.asarray(user["gn_total"])
    sel = list(user["selected"])
    order = sorted(sel, key=lambda i: (-abs(total[i]), i))[: cfg.top_k]
    out = []
    for i in order:
        pos = sel.index(i)
        flipped = [a for a in cfg.attacks if user["attacks"][a]["examples"][pos]["flipped"]]
        after = {a: user["attacks"][a]["examples"][pos]["new"] for a in cfg.attacks}
        worst = user["worst_attack"]
        out.append({"index": int(i), "label": int(split.y[i]),
                    "class": split.classes[int(split.y[i])] if split.classes and split.y[i] < len(split.classes)
                    else str(int(split.y[i])),
                    "influence": float(total[i]), "ntk_influence": float(ntk[i]), "gn_influence": float(gn[i]),
                    "role": "helpful" if total[i] > 0 else "harmful", "flipped_by": flipped,
                    "influence_after": after,
                    "pixels": split.x[i].round(4).tolist(),
                    "perturbed_pixels": np.asarray(user["adversarial_pixels"][worst][pos]).round(4).tolist()})
    return out


def lever_classes(user: dict[str, Any], split: Split) -> list[dict[str, Any]]:
    """Where the levers lie (issue 43 item 7): for each class, how many of the top-k training points by |influence|
    of the lead estimator (`user["selected"]`) belong to it, helpful and harmful, beside its share of the training
    set; `over` is the ratio of the two shares (above 1: the class holds more of the levers than of the data), `p`
    the exact binomial test of its count against its share of the data (scipy), Holm-adjusted across the classes
    (`p_holm`, `beyond_chance` at 0.05): with few levers a ratio of 2 is often chance."""
    y = np.asarray(split.y)
    total = np.asarray(user["estimator_total"])
    sel = np.asarray(user["selected"], dtype=int)
    rows = []
    for c in np.unique(y):
        mine = sel[y[sel] == c]
        share, base = len(mine) / max(len(sel), 1), float(np.mean(y == c))
        rows.append({"label": int(c), "class": split.classes[int(c)] if split.classes and c < len(split.classes)
                     else str(int(c)), "levers": int(len(mine)), "helpful": int((total[mine] > 0).sum()),
                     "harmful": int((total[mine] <= 0).sum()), "share_of_levers": share, "share_of_training": base,
                     "over": share / base if base > 0 else float("nan"),
                     "p": float(stats.binomtest(len(mine), len(sel), base).pvalue) if len(sel) else 1.0})
    for r, adj in zip(rows, holm([r["p"] for r in rows]), strict=True):
        r["p_holm"] = adj
        r["beyond_chance"] = bool(adj <= ALPHA)
    return sorted(rows, key=lambda r: (-r["levers"], r["label"]))


def attributions(user: dict[str, Any], ctx: NetworkContext, train: Split, test: Split) -> dict[str, Any]:
    """The lead estimator's influence of every training point on every test point's loss (training x test; positive:
    the point helps, removing it raises that loss), for `--attributions` (`write_outputs` saves it as .npz, the JSON
    record keeps only what it is)."""
    per = np.asarray(ctx.estimated.per_test[ctx.estimator], dtype=np.float64)
    return {"estimator": ctx.estimator, "shape": list(per.shape), "influence": per,
            "train_labels": np.asarray(train.y), "test_labels": np.asarray(test.y),
            "levers": np.asarray(user["selected"], dtype=np.int64)}


def _diagnostics(x: np.ndarray, cfg: AuditConfig, models: dict[str, Any]) -> dict[str, Any]:
    cn = condition_numbers(x.astype(np.float64))
    k1, src1 = (cn["kappa"], "kappa") if math.isfinite(cn["kappa"]) else (cn["kappa_eff"], "kappa_eff")
    k2, src2 = (cn["kappa_d"], "kappa_d") if math.isfinite(cn["kappa_d"]) else (cn["kappa_eff"], "kappa_eff")
    v1 = width_bound_v1(k1, cfg.bound_eps)
    v2 = width_bound_v2(k2, x.shape[0])
    relu = relu_width_bound(cfg.bound_eps)
    rows = []
    for key, m in models.items():
        rows.append({"model": key, "label": m["label"], "width": m["width"], "parameters": m["parameters"],
                     "log10_width": math.log10(max(1, m["width"])),
                     "kappa_ntk": m["ntk"]["kappa"], "log10_kappa_ntk": m["ntk"]["log10_kappa"]})
    return {"data_gram": {k: cn[k] for k in ("n", "d", "rank", "kappa", "kappa_d", "kappa_eff", "log10_kappa",
                                             "log10_kappa_d", "log10_kappa_eff")},
            "bound_eps": cfg.bound_eps, "v1_kappa": src1, "v2_kappa": src2,
            "v1": asdict(v1), "v2": asdict(v2), "relu": asdict(relu), "models": rows}


@dataclass
class _Stage:
    """Runs the audit's stages, adding up each one's wall time and noting the process's peak resident memory after it
    (the record's `memory`: which stage raised the peak)."""

    times: dict[str, float] = field(default_factory=dict)
    peak_gib: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, fn: Any, *args: Any, **kw: Any) -> Any:
        tic = time.perf_counter()
        out = fn(*args, **kw)
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - tic
        self.peak_gib[name] = peak_rss_gib()
        return out


def _has_test_split(source: str) -> bool:
    """False only for a .npz without x_test / y_test (every other source has a test split or fails later)."""
    p = Path(source).expanduser()
    if not p.is_file() or sniff_format(p) not in ("npz", "zip"):
        return True
    try:
        with np.load(p, allow_pickle=False) as z:
            return "x_test" in z.files and "y_test" in z.files
    except (ValueError, OSError):
        return True


def load_inputs(cfg: AuditConfig) -> tuple[LoadedModel, Split, Split]:
    """The model and the two data splits, validated against each other (one-line errors)."""
    loaded = load_model(cfg.model, cfg.spec)
    if cfg.test is None and not _has_test_split(cfg.train):
        raise UserInputError(f"--test is required: {cfg.train} holds no x_test / y_test arrays")
    train = load_split(cfg.train, "train", cfg.n, cfg.seed, cfg.data_dir)
    test = load_split(cfg.test or cfg.train, "test", cfg.n_test, cfg.seed, cfg.data_dir)
    if len(train.x) < 2:
        raise UserInputError(f"--train has {len(train.x)} example; the audit needs at least 2")
    if train.x.shape[1] != test.x.shape[1]:
        raise UserInputError(f"training inputs have {train.x.shape[1]} values per example but test inputs have "
                             f"{test.x.shape[1]}")
    check_varied(train, "--train")
    return loaded, train, test


@dataclass(frozen=True)
class AuditRun:
    """One audit's bound inputs, shared by its stages: the settings and stage timer, the tensors, the model as the
    audit calls it (`model`, flat inputs), the network a re-fit trains (`refit_net`) and the module it comes from
    (`fit_module`: the loaded module or its FX graph), the kernel provider, the loaded file, the per-example input
    shape and the memory bound in bytes."""

    cfg: AuditConfig
    st: _Stage
    t: Tensors
    model: FlatInput
    refit_net: torch.nn.Module
    fit_module: torch.nn.Module
    provider: SuiteKernels | GenericKernels
    loaded: LoadedModel
    input_shape: tuple[int, ...]
    max_bytes: int


@dataclass
class _Refits:
    """The re-fit side of one audit: the panel entries so far (`out`) and the re-fitter, None when no panel re-fits
    or the control re-fit was not adequate (then every re-fit panel already says why in `out`)."""

    out: dict[str, Any]
    refit: Refitter | None = None


def _validate(run: AuditRun, est: Estimated) -> _Refits:
    """The control re-fit and its adequacy, then the validity panel: the audit's own estimators of `est` and the
    attribution libraries scored against re-fits, which names the estimator the flip rates will rank by."""
    cfg, st, t, model, loaded = run.cfg, run.st, run.t, run.model, run.loaded
    out: dict[str, Any] = {"run": [p for p in PANELS if p in cfg.panels]}
    refit_panels = [p for p in ("validity", "outcome", "poison") if p in cfg.panels]
    if not refit_panels:
        return _Refits(out)
    x, xt, input_shape = t.x_train, t.x_test, run.input_shape
    rcfg = cfg.refit_config()
    refit = Refitter.for_module(run.fit_module, run.refit_net, rcfg, t.out_dim, input_shape)
    log(f"audit: control re-fit ({rcfg.describe()})")
    ctrl = st.run("re-fits", refit.control, x, t.y_train, cfg.seed, {"train": x, "test": xt})
    gate = refit_adequacy(rcfg.kind, ctrl, t, est.accuracy)
    out["refit"] = {"kind": rcfg.kind, "description": rcfg.describe(), "control": gate,
                    "user_code": bool(rcfg.train_fn)}
    if not gate["passed"]:
        for p in refit_panels:
            out[p] = {"verdict": NOT_MEASURABLE, "reason": f"the control re-fit is not adequate ({gate['reason']})"}
        return _Refits(out)
    if "validity" in cfg.panels:
        graph = run.fit_module if isinstance(run.fit_module, torch.fx.GraphModule) else None
        peers = {}
        if cfg.peers:
            log(f"audit: the attribution libraries' estimators ({', '.join(cfg.peers)})")
            peers = unscored(cfg.peers, NOT_APPLICABLE, f"the model runs batches of exactly {loaded.static_batch} "
                             "examples (exported with a static batch size), and the libraries need per-example "
                             "batches") if loaded.static_batch else \
                st.run("attribution libraries", peer_estimators, model, graph, t, cfg.peers, cfg.seed,
                       lambda g: FlatInput(g, input_shape))
        exact = not (isinstance(run.provider, GenericKernels) and isinstance(run.provider.jac, PROJECTED))
        ens = st.run("ensembles", ensemble_estimates, refit, t, cfg, input_shape, run.max_bytes, cfg.ensemble) \
            if exact else Ensembles(skipped="the kernel is projected for this model's size: an exact kernel per "
                                            "member would cost far more than the audit's own")
        others = {**est.per_test, **ens.per_test,
                  **{k: r.pop("influence") for k, r in peers.items() if r["status"] == OK}}
        estimates = Estimates(est.per_test["ntk"], est.per_test["gn"], others)
        out["validity"] = st.run("validity", validity_panel, refit, t, estimates, est.accuracy, cfg)
        skipped = {**est.skipped, **({"ensembles": ens.skipped} if ens.skipped and cfg.ensemble else {})}
        estimator_rows(out["validity"], {**est.seconds, **dict.fromkeys(ens.per_test, ens.seconds)}, peers, skipped)
        out["validity"]["ensemble"] = {"members": ens.seeds, "seconds": ens.seconds, "skipped": ens.skipped}
    return _Refits(out, refit)


def lead_of(panels: dict[str, Any]) -> str:
    """The estimator the flip rates rank by: the validity panel's lead, else NTK leave-one-out (the paper's)."""
    return (panels.get("validity") or {}).get("lead", "ntk")


def _panels(run: AuditRun, ctx: NetworkContext, user: dict[str, Any], refits: _Refits) -> dict[str, Any]:
    """The budget curves, and the outcome and planted-poison panels that re-fit the model, from the influence of the
    estimator the flip rates rank by (`ctx`)."""
    cfg, st, t, model, provider, loaded = run.cfg, run.st, run.t, run.model, run.provider, run.loaded
    input_shape, max_bytes = run.input_shape, run.max_bytes
    out, refit = refits.out, refits.refit
    clean: InfluenceResult = ctx.clean
    if "budget" in cfg.panels:
        out["budget"] = st.run("budget curves", budget_curves, ctx.probe, clean, cfg)
    if refit is None:
        return out
    inp = RefitInputs(refit, model, t)
    if "budget" in cfg.panels and "outcome" in cfg.panels:
        out["budget"]["refit"] = st.run("outcome", outcome_curves, inp, clean.per_test, clean.total,
                                        CurveGrid.of(out["budget"]), cfg)
    if "outcome" in cfg.panels:
        out["outcome"] = st.run("outcome", outcome_panel, inp, clean.per_test, np.asarray(user["selected"]),
                                user["worst_attack"], cfg)
    if "poison" in cfg.panels:
        if refit.cfg.train_fn:
            proj = provider.jac.projection if isinstance(provider, GenericKernels) and isinstance(
                provider.jac, PROJECTED) else None

            def kernels(net: torch.nn.Module) -> GenericKernels:
                jac = ModelJacobian(net, input_shape)
                return GenericKernels(jac if proj is None else projected_kernel(jac, None, proj, max_bytes), max_bytes)
        elif isinstance(provider, SuiteKernels):
            def kernels(net: torch.nn.Module) -> SuiteKernels:
                return SuiteKernels(loaded.module)
        else:
            def kernels(net: torch.nn.Module) -> GenericKernels:
                return GenericKernels(provider.jac, max_bytes)
        out["poison"] = st.run("planted poison", poison_panel, inp, kernels, cfg)
    out["refit"]["count"] = refit.count
    out["refit"]["path"] = refit.describe_path()
    out["refit"]["seconds"] = refit.seconds
    return out


def run_audit(cfg: AuditConfig) -> dict[str, Any]:
    """Run every measurement and return the JSON-ready audit record (writes nothing)."""
    t0 = time.perf_counter()
    st = _Stage()
    device = pick_device(cfg.device)  # --device cuda without CUDA: a one-line error before any work
    log(f"audit: loading {cfg.model} and the data")
    loaded, train, test = st.run("load", load_inputs, cfg)
    if cfg.target_test is not None and cfg.target_test >= len(test.x):
        raise UserInputError(f"--target-test {cfg.target_test} is beyond the {len(test.x)} test points loaded; give "
                             f"an index 0..{len(test.x) - 1}")
    if cfg.train_fn and set(cfg.panels) & {"validity", "outcome", "poison"}:
        log(f"audit: importing your train function {cfg.train_fn} (this runs your code)")
        load_train_fn(cfg.train_fn)
    image_shape = train.image_shape or test.image_shape
    model, input_shape, out_dim = st.run("bind", bind_input, loaded, train.x, image_shape,
                                         parse_shape(cfg.input_shape))
    check_labels(train, out_dim, "--train")
    check_labels(test, out_dim, "--test")
    st.run("bind", probe_batches, model, {"training": train.x, "test": test.x},
           (n_top(cfg.tau, len(train.x)), 1, cfg.refit_batch), out_dim)
    st.run("bind", check_model, model, loaded, train.x, np.concatenate([train.y, test.y]), out_dim,
           int(cfg.max_memory_gb * 2**30), train.classes)  # issue 42: before any panel
    if image_shape is None and len(input_shape) == 3:
        image_shape = input_shape
    t = Tensors(torch.as_tensor(train.x, device=device), torch.as_tensor(train.y, device=device),
                torch.as_tensor(test.x, device=device), torch.as_tensor(test.y, device=device), out_dim)
    max_bytes = int(cfg.max_memory_gb * 2**30)
    if loaded.is_suite:
        loaded.module.to(device)  # loaded and bound on the CPU; everything after runs on `device`
        provider: SuiteKernels | GenericKernels = SuiteKernels(loaded.module)
        fit_module: torch.nn.Module = loaded.module
        refit_net: torch.nn.Module = model
    else:
        graph = st.run("bind", fx_graph_for, loaded, model, train.x)
        for m in (loaded.module, graph):  # loaded, bound and converted on the CPU; everything after runs on `device`
            if m is not None:
                m.to(device)
        jac = ModelJacobian(model if graph is None else graph, input_shape, graph=graph,
                            static_batch=loaded.static_batch if graph is not None else None)
        structured, why = StructuredJacobian.build(graph, input_shape, loaded.static_batch)
        if structured is None:
            log(f"audit: structured per-example gradients do not apply ({why})")
        proj, proj_reason = choose_projection(jac, len(train.x) + len(test.x), cfg, max_bytes, structured is not None)
        log(f"audit: kernel {proj_reason}")
        provider = GenericKernels(jac if proj is None else projected_kernel(jac, structured, proj, max_bytes),
                                  max_bytes)
        fit_module = loaded.module if graph is None else graph
        refit_net = model if graph is None else FlatInput(graph, input_shape, loaded.static_batch)
    models: dict[str, Any] = {}
    user_net = Network("your model", model, provider, loaded.n_params, loaded.widest_layer())
    est = st.run("your model", estimate_network, user_net, t, cfg)
    projection: dict[str, Any] | None = None
    if isinstance(provider, GenericKernels) and isinstance(provider.jac, PROJECTED):
        p = provider.jac.projection
        err = st.run("projection error", projection_error, provider.jac.jac, provider.jac, t, cfg, max_bytes)
        kron = isinstance(provider.jac, ProjectedStructured)
        projection = {"dim": p.dim, "kind": p.kind, "seed": p.seed, "reason": proj_reason, "error": err,
                      "structure": "kronecker" if kron else "dense",
                      "width": provider.jac.width if kron else p.dim}
        if kron:
            projection.update(allocation_rule=provider.jac.allocation_rule, pilot=provider.jac.pilot,
                              allocation=provider.jac.allocation)
    elif isinstance(provider, GenericKernels):
        projection = {"dim": 0, "kind": "exact", "reason": proj_reason}
    early = model_gate(est.accuracy[1], test.y, out_dim)
    skipped = list(cfg.panels) if not early["passed"] else []  # a model below the gate: no panel can say more
    run = AuditRun(replace(cfg, panels=()) if skipped else cfg, st, t, model, refit_net, fit_module, provider, loaded,
                   input_shape, max_bytes)
    refits = _validate(run, est)
    if skipped:
        log(f"audit: skipping the panels ({early['reason']})")
        refits.out["skipped"] = {"panels": skipped, "reason": f"{early['reason']}, so the panels were not run"}
    lead = lead_of(refits.out)
    models["user"], ctx = st.run("your model", measure_network, user_net, t, cfg, lead, est)
    if cfg.reference:
        for kind in ("relu", "attn"):
            label = f"{REF_LABELS[kind]} (m={cfg.ref_width})"
            log(f"audit: training the {label} reference ({PROPER} protocol, at most {cfg.ref_epochs} epochs)")
            spec = ModelSpec(kind, t.x_train.shape[1], cfg.ref_width, out_dim, seed=cfg.seed)
            tcfg = protocol_config(PROPER, cfg.ref_epochs, seed=cfg.seed)
            tr = st.run(f"train {kind}", train_network, spec, t, tcfg, device=device,
                        label=f"training {REF_LABELS[kind]}")
            tr.model.eval()
            net = Network(label, FlatInput(tr.model, (spec.d,)), SuiteKernels(tr.model), tr.model.W.numel(),
                          cfg.ref_width)
            ref, _ = st.run(kind, measure_network, net, t, cfg, lead)
            ref["training"] = {"protocol": PROPER, "max_epochs": cfg.ref_epochs, "epochs_run": tr.record.epochs_run,
                               "final_train_loss": tr.record.final_train_loss, "optimizer": "adam",
                               "lr": tr.record.lr, "weight_decay": 0.0, "batch_size": tcfg.batch_size,
                               "plateau_reached": tr.record.plateau_reached}
            ref["gate"] = tr.gate
            models[kind] = ref
    user = models["user"]
    panels = _panels(run, ctx, user, refits)
    gate = model_gate(user["test_acc"], test.y, out_dim)
    risk = assess_risk(models, cfg.reference, cfg.eps, gate, panels.get("validity"))
    levers = _levers(user, train, cfg)
    by_class = lever_classes(user, train)
    attrib = attributions(user, ctx, train, test)
    for m in models.values():
        m.pop("adversarial_pixels", None)
    diag = _diagnostics(train.x, cfg, models)
    desc = loaded.describe()
    desc.update({"input_shape": list(input_shape), "outputs": out_dim, "kernel_method": provider.method})
    if projection is not None:
        desc["projection"] = projection
    return {
        "experiment": "audit",
        "schema_version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": asdict(cfg),
        "model": desc,
        "data": {"train": train.provenance, "test": test.provenance, "n_train": int(len(train.x)),
                 "n_test": int(len(test.x)), "d": int(train.x.shape[1]),
                 "image_shape": list(image_shape) if image_shape else None,
                 "classes": train.classes, "task": "binary (one output, MSE on +-1)" if out_dim == 1
                 else f"{out_dim} classes (cross-entropy)"},
        "models": models,
        "risk": risk,
        "levers": levers,
        "lever_classes": by_class,
        "attributions": attrib,
        "panels": panels,
        "diagnostics": diag,
        "definitions": DEFINITIONS,
        "versions": library_versions(),
        "device": {**device_info(), "used": device},
        "timings": {**st.times, "total": time.perf_counter() - t0},
        "memory": {"peak_rss_gib_after_stage": st.peak_gib, "peak_rss_gib": peak_rss_gib()},
    }


# --- outputs ---------------------------------------------------------------------------------------

#: Exit code when the PDF cannot be made (weasyprint or its system libraries missing); HTML is written.
PDF_UNAVAILABLE_EXIT = 3


def output_members(out: Path) -> tuple[str, str, str, str]:
    """The files of one audit's output set: the PDF and the HTML, JSON and Markdown summary beside it."""
    return out.name, out.with_suffix(".html").name, out.with_suffix(".json").name, summary_name(out)


def summary_name(out: Path) -> str:
    """The Markdown summary's file name beside the PDF (`--summary`): `<stem>-summary.md`."""
    return f"{out.stem}-summary.md"


def attributions_name(out: Path) -> str:
    """The exported attributions beside the PDF (`--attributions`): `<stem>-attributions.npz`."""
    return f"{out.stem}-attributions.npz"


#: The member that marks an .npz as this suite's exported attributions (so a stale one may be replaced).
ATTRIBUTIONS_MARK = "ntkm_audit_attributions"


def _save_attributions(path: Path, attrib: dict[str, Any]) -> None:
    """The lead estimator's per-test influence and what it is, as plain arrays (no pickled objects)."""
    arrays = {k: np.asarray(v) for k, v in attrib.items() if k not in ("shape", "file")}
    with open(path, "wb") as f:
        np.savez_compressed(f, **{ATTRIBUTIONS_MARK: np.asarray(1)}, **arrays)


def earlier_audit_file(path: Path) -> bool:
    """Whether an existing file is an earlier audit's output (so it may be removed as stale): a PDF, the
    audit HTML, or an audit JSON record; anything else with that name is left alone."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    if path.suffix == ".pdf":
        return head.startswith(b"%PDF")
    if path.suffix == ".html":
        return b"Training-data malleability audit" in head
    if path.suffix == ".md":
        return head.startswith(SUMMARY_MARKER.encode())
    if path.suffix == ".npz":
        return head.startswith(b"PK") and f"{ATTRIBUTIONS_MARK}.npy".encode() in head
    return b'"experiment": "audit"' in head


def write_outputs(result: dict[str, Any], out: str | Path, html: bool = False, json_out: bool = False,
                  summary: bool = False, attributions: bool = False) -> int:
    """Render everything, stage the PDF (and HTML / JSON) as one output set, then swap it in.

    `summary` adds the Markdown summary for a pull-request comment (`verify.audit.ci.summary_markdown`);
    `attributions` the lead estimator's per-test influence as `<stem>-attributions.npz` (the JSON keeps its name and
    shape; a record re-rendered from JSON has no array to write).
    Returns 0, or `PDF_UNAVAILABLE_EXIT` (3) when weasyprint cannot run: the HTML is then written anyway.
    A stale member of the set (e.g. last run's PDF when this run could make none) is removed, so the
    files beside each other always come from the same run.
    """
    from ntkm.codec import write_json
    from ntkm.io import atomic_write_text
    from reports.audit_report import render_report
    from reports.render import PdfUnavailable, write_pdf
    from verify.outputs import output_set

    out = Path(out).expanduser().absolute()

    pdf_name, html_name, json_name, md_name = output_members(out)
    npz_name = attributions_name(out)
    attrib = result.get("attributions") or {}
    has_array = isinstance(attrib.get("influence"), np.ndarray)
    if attributions and not has_array:
        raise UserInputError("--attributions needs the audit's arrays, which a record re-rendered from JSON does not "
                             "hold; rerun the audit with --attributions")
    if attrib:
        result = {**result, "attributions": {"estimator": str(attrib["estimator"]), "shape": list(attrib["shape"]),
                                             "file": npz_name if attributions else attrib.get("file")}}
    problem, pdf_ok = "", True
    with output_set(out.parent, (*output_members(out), npz_name), owned=earlier_audit_file,
                    manifest=False) as staged:
        if attributions:
            _save_attributions(staged.path(npz_name), attrib)
        page = render_report(result, REALISTIC_REASON)
        try:
            write_pdf(staged.path(pdf_name), page)
        except PdfUnavailable as exc:
            pdf_ok, problem = False, str(exc)
        if json_out:
            write_json(staged.path(json_name), result)
        if html or not pdf_ok:
            atomic_write_text(staged.path(html_name), page)
        if summary:
            atomic_write_text(staged.path(md_name), summary_markdown(result))
    if not pdf_ok:
        sys.stderr.write(f"verify audit: no PDF: {problem} ({out.with_suffix('.html')})\n")
        return PDF_UNAVAILABLE_EXIT
    return 0
