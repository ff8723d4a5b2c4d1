"""`verify audit`: how much could a few altered training examples change what a model relies on?

The pipeline (`run_audit`; every number lands in one JSON-ready record; nothing is written until all succeeded).
Each step lives in its own module, named below; the settings are `verify.audit.config`, the output files
`verify.audit.files` (`write_outputs`), the report's context and HTML `reports.audit_report`.

1. Load the model safely (`verify.audit.modelio`) and the training / test data; bind the model to the data's
   input shape (`verify.audit.binding`); validate labels against the model's outputs. All of that on the CPU; then
   the model and the data move once to `--device` (auto: CUDA when visible), where everything below runs (numpy
   crossings are explicit), and the kernel provider is chosen.
2. Your model's empirical NTK and three influence estimates from it: NTK leave-one-out, Gauss-Newton and
   empirical Fisher (`verify.audit.measure.estimate_network`).
   A model below the accuracy gate (`verify.audit.risk.model_gate`, from step 2's test accuracy) runs no panel
   (steps 3 and 5): nothing they measure could issue a risk level; the record's `panels.skipped` says why.
3. The validity panel (`verify.audit.panels.validate`, `verify.audit.validity`; re-fitting your model,
   `verify.audit.refit`: warm start from the saved weights, or your `--train-fn`): the three and the attribution
   libraries scored against re-fits; the one of the three that validates best is the *lead estimator* (NTK
   leave-one-out when the panel does not run).
4. For your model, and for the paper's two reference networks (`verify.audit.references`: 2L-ReLU and MLP-Attn,
   width `ref_width`, trained by the suite on the same data with the width-consistent protocol to a plateau and
   judged by the adequacy gate, `empirics.nets.protocols`; one below the gate is left out of the scale; `--no-reference`
   skips them): the flip-rate protocol ranking by the lead estimator against a random-noise baseline, and sharpness
   (`verify.audit.measure.measure_network`); and the kernel-regime diagnostics (`verify.audit.diagnostics`): kappa
   of the data Gram matrix and of the empirical NTK, the v1 / v2 width bounds of Thm 4.7, each model's width (its
   widest layer) and parameter count.
5. The other panels (`verify.audit.panels.later_panels`; `--skip` leaves any out), from the lead estimator's
   influence: budget curves (`verify.audit.budget`), the outcome table and the planted-poison self-test
   (`verify.audit.outcome`).
6. The risk level (`verify.audit.risk`; issued only for a model that beats chance on the test data and whose
   lead estimator the validity panel finds trustworthy, else "not measurable" or "not validated"), the lever
   examples (`verify.audit.levers`: the top-|influence| training points by the lead estimator, with which attacks
   flipped them, and where they lie by class) and the
   report (`reports/templates/audit.html`).
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import asdict, replace
from typing import Any

from empirics.progress import log
from empirics.records import git_state, peak_rss_gib, pick_device, run_header
from verify.audit.binding import Inputs, Stage, bind, load_inputs, projection_record
from verify.audit.config import DEFINITIONS, SCHEMA_VERSION, AuditConfig
from verify.audit.diagnostics import diagnostics
from verify.audit.levers import attributions, lever_classes, levers
from verify.audit.measure import Network, estimate_network, measure_network
from verify.audit.panels import later_panels, lead_of, reference_estimator, validate
from verify.audit.references import reference_models
from verify.audit.risk import assess_risk, model_gate


def _data_record(inputs: Inputs, image_shape: tuple[int, ...] | None, out_dim: int) -> dict[str, Any]:
    train, test = inputs.train, inputs.test
    return {"train": train.provenance, "test": test.provenance, "n_train": int(len(train.x)),
            "n_test": int(len(test.x)), "d": int(train.x.shape[1]),
            "image_shape": list(image_shape) if image_shape else None,
            "classes": train.classes, "task": "binary (one output, MSE on +-1)" if out_dim == 1
            else f"{out_dim} classes (cross-entropy)"}


def run_audit(cfg: AuditConfig) -> dict[str, Any]:
    """Run every measurement and return the JSON-ready audit record (writes nothing)."""
    t0 = time.perf_counter()
    st = Stage()
    device = pick_device(cfg.device)  # --device cuda without CUDA: a one-line error before any work
    log(f"audit: loading {cfg.model} and the data")
    with st.timed("load"):
        inputs = Inputs(*load_inputs(cfg))
    train, test = inputs.train, inputs.test
    run = bind(cfg, st, inputs, device)
    t, loaded, provider = run.t, inputs.loaded, run.provider
    user_net = Network("your model", run.model, provider, loaded.n_params, loaded.widest_layer())
    with st.timed("your model"):
        est = estimate_network(user_net, t, cfg)
    projection = projection_record(run)
    early = model_gate(est.accuracy[1], test.y, t.out_dim)
    skipped = list(cfg.panels) if not early["passed"] else []  # a model below the gate: no panel can say more
    if skipped:
        run = replace(run, cfg=replace(cfg, panels=()))
    refits = validate(run, est)
    if skipped:
        log(f"audit: skipping the panels ({early['reason']})")
        refits.out["skipped"] = {"panels": skipped, "reason": f"{early['reason']}, so the panels were not run"}
    lead = lead_of(refits.out)
    models: dict[str, Any] = {}
    with st.timed("your model"):
        models["user"], ctx = measure_network(user_net, t, cfg, lead, est, refits.attribution(lead))
    if cfg.reference:  # an ensemble lead: the references rank by the estimator it averages (they are not re-fitted)
        models.update(reference_models(run, reference_estimator(lead), device))
    user = models["user"]
    panels = later_panels(run, ctx, user, refits)
    gate = model_gate(user["test_acc"], test.y, t.out_dim)
    risk = assess_risk(models, cfg.reference, cfg.eps, gate, panels.get("validity"))
    top = levers(user, train, cfg)
    by_class = lever_classes(user, train)
    attrib = attributions(user, ctx, train, test)
    for m in models.values():
        m.pop("adversarial_pixels", None)
    diag = diagnostics(train.x, cfg, models)
    desc = loaded.describe()
    desc.update({"input_shape": list(run.input_shape), "outputs": t.out_dim, "kernel_method": provider.method})
    if projection is not None:
        desc["projection"] = projection
    return {
        "experiment": "audit",
        "schema_version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": asdict(cfg),
        "model": desc,
        "data": _data_record(inputs, run.image_shape, t.out_dim),
        "models": models,
        "risk": risk,
        "levers": top,
        "lever_classes": by_class,
        "attributions": attrib,
        "panels": panels,
        "diagnostics": diag,
        "definitions": DEFINITIONS,
        **run_header(device),
        "code": git_state(),
        "timings": {**st.times, "total": time.perf_counter() - t0},
        "memory": {"peak_rss_gib_after_stage": st.peak_gib, "peak_rss_gib": peak_rss_gib()},
    }
