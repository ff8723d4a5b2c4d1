"""The panels that re-fit the user's model (steps 3 and 5 of `verify.audit.pipeline`): the control re-fit and the
validity panel, which names the estimator the flip rates rank by (`validate`), then the budget curves, the outcome
table and the planted-poison self-test from that estimator's influence (`later_panels`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from empirics.attribution.audit_attribution import NOT_APPLICABLE, OK, peer_estimators, unscored
from empirics.progress import log
from empirics.vocab import NOT_MEASURABLE
from verify.audit.binding import AuditRun
from verify.audit.budget import budget_curves
from verify.audit.config import PANELS
from verify.audit.ensemble import EnsembleLead, Ensembles, base_estimator, ensemble_estimates, is_ensemble
from verify.audit.estimators import PAPER_ESTIMATOR
from verify.audit.measure import Estimated, KernelProvider, NetworkContext
from verify.audit.modelio import FlatInput
from verify.audit.outcome import CurveGrid, outcome_curves, outcome_panel, poison_panel
from verify.audit.refit import RefitInputs, Refitter, refit_adequacy
from verify.audit.validity import Estimates, estimator_rows, validity_panel


@dataclass
class Refits:
    """The re-fit side of one audit: the panel entries so far (`out`) and the re-fitter, None when no panel re-fits
    or the control re-fit was not adequate (then every re-fit panel already says why in `out`)."""

    out: dict[str, Any]
    refit: Refitter | None = None
    #: The ensemble estimators and their kept members (None where the validity panel did not run).
    ensembles: Ensembles | None = None

    def attribution(self, lead: str) -> EnsembleLead | None:
        """The lead as an ensemble the flip rates rank by (None: the lead is one network's estimator)."""
        if self.ensembles is None or self.refit is None or not is_ensemble(lead):
            return None
        return self.ensembles.lead(lead, self.refit)


def validate(run: AuditRun, est: Estimated) -> Refits:
    """The control re-fit and its adequacy, then the validity panel: the audit's own estimators of `est` and the
    attribution libraries scored against re-fits, which names the estimator the flip rates will rank by."""
    cfg, st, t, model, loaded = run.cfg, run.st, run.t, run.model, run.loaded
    out: dict[str, Any] = {"run": [p for p in PANELS if p in cfg.panels]}
    refit_panels = [p for p in ("validity", "outcome", "poison") if p in cfg.panels]
    if not refit_panels:
        return Refits(out)
    x, xt, input_shape = t.x_train, t.x_test, run.input_shape
    rcfg = cfg.refit_config()
    refit = Refitter.for_module(run.fit_module, run.refit_net, rcfg, t.out_dim, input_shape)
    log(f"audit: control re-fit ({rcfg.describe()})")
    with st.timed("re-fits"):
        ctrl = refit.control(x, t.y_train, cfg.seed, {"train": x, "test": xt})
    gate = refit_adequacy(rcfg.kind, ctrl, t, est.accuracy)
    out["refit"] = {"kind": rcfg.kind, "description": rcfg.describe(), "control": gate,
                    "user_code": bool(rcfg.train_fn)}
    if not gate["passed"]:
        for p in refit_panels:
            out[p] = {"verdict": NOT_MEASURABLE, "reason": f"the control re-fit is not adequate ({gate['reason']})"}
        return Refits(out)
    if "validity" in cfg.panels:
        graph = run.fit_module if isinstance(run.fit_module, torch.fx.GraphModule) else None
        peers = {}
        if cfg.peers:
            log(f"audit: the attribution libraries' estimators ({', '.join(cfg.peers)})")
            if loaded.static_batch:
                peers = unscored(cfg.peers, NOT_APPLICABLE, f"the model runs batches of exactly "
                                 f"{loaded.static_batch} examples (exported with a static batch size), and the "
                                 "libraries need per-example batches")
            else:
                with st.timed("attribution libraries"):
                    peers = peer_estimators(model, graph, t, cfg.peers, cfg.seed, lambda g: FlatInput(g, input_shape))
        if run.provider.projection is None:
            with st.timed("ensembles"):
                ens = ensemble_estimates(refit, t, cfg, input_shape, run.max_bytes, cfg.ensemble)
        else:
            ens = Ensembles(skipped="the kernel is projected for this model's size: an exact kernel per member would "
                                    "cost far more than the audit's own")
        others = {**est.per_test, **ens.per_test,
                  **{k: r.pop("influence") for k, r in peers.items() if r["status"] == OK}}
        estimates = Estimates(est.per_test["ntk"], est.per_test["gn"], others)
        with st.timed("validity"):
            out["validity"] = validity_panel(refit, t, estimates, est.accuracy, cfg)
        skipped = {**est.skipped, **({"ensembles": ens.skipped} if ens.skipped and cfg.ensemble else {})}
        estimator_rows(out["validity"], {**est.seconds, **dict.fromkeys(ens.per_test, ens.seconds)}, peers, skipped)
        out["validity"]["ensemble"] = {"members": ens.seeds, "seconds": ens.seconds, "skipped": ens.skipped}
        return Refits(out, refit, ens)
    return Refits(out, refit)


def lead_of(panels: dict[str, Any]) -> str:
    """The estimator the flip rates rank by: the validity panel's lead, else NTK leave-one-out (the paper's)."""
    return (panels.get("validity") or {}).get("lead", PAPER_ESTIMATOR)


def reference_estimator(lead: str) -> str:
    """The estimator the reference networks' flip rates rank by: the lead, or for an ensemble lead the estimator it
    averages (the references are the suite's own networks, not re-fitted into ensembles)."""
    return base_estimator(lead)


def _poison_kernels(run: AuditRun, refit: Refitter) -> Any:
    """How the planted-poison panel computes the kernels of a re-fitted network: as the audit's own kernel was
    computed (a user's train function: a fresh Jacobian, projected alike)."""
    provider, input_shape = run.provider, run.input_shape
    if refit.cfg.train_fn:
        def kernels(net: torch.nn.Module) -> KernelProvider:
            return provider.for_network(net, input_shape)
    else:
        def kernels(net: torch.nn.Module) -> KernelProvider:
            return provider.refreshed()
    return kernels


def later_panels(run: AuditRun, ctx: NetworkContext, user: dict[str, Any], refits: Refits) -> dict[str, Any]:
    """The budget curves, and the outcome and planted-poison panels that re-fit the model, from the influence of the
    estimator the flip rates rank by (`ctx`)."""
    cfg, st, t, model = run.cfg, run.st, run.t, run.model
    out, refit = refits.out, refits.refit
    clean = ctx.clean
    if "budget" in cfg.panels:
        with st.timed("budget curves"):
            out["budget"] = budget_curves(ctx.probe, clean, cfg)
    if refit is None:
        return out
    inp = RefitInputs(refit, model, t)
    if "budget" in cfg.panels and "outcome" in cfg.panels:
        with st.timed("outcome"):
            out["budget"]["refit"] = outcome_curves(inp, clean.per_test, clean.total, CurveGrid.of(out["budget"]), cfg)
    if "outcome" in cfg.panels:
        with st.timed("outcome"):
            out["outcome"] = outcome_panel(inp, clean.per_test, np.asarray(user["selected"]), user["worst_attack"], cfg)
    if "poison" in cfg.panels:
        with st.timed("planted poison"):
            out["poison"] = poison_panel(inp, _poison_kernels(run, refit), cfg)
    out["refit"]["count"] = refit.count
    out["refit"]["path"] = refit.describe_path()
    out["refit"]["seconds"] = refit.seconds
    return out
