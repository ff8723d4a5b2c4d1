"""The paper's two reference networks beside the user's model (step 4 of `verify.audit.pipeline`): 2L-ReLU and
MLP-Attn at width `ref_width`, trained by the suite on the same data with the width-consistent protocol to a
plateau and judged by the adequacy gate (`empirics.nets.protocols`), then measured like the user's model."""

from __future__ import annotations

from typing import Any

from empirics.common import train_network
from empirics.nets.models import ModelSpec
from empirics.nets.protocols import PROPER, protocol_config
from empirics.progress import log
from empirics.vocab import PAPER_PAIR, model_name
from verify.audit.binding import AuditRun
from verify.audit.measure import Network, SuiteKernels, measure_network
from verify.audit.modelio import FlatInput


def reference_models(run: AuditRun, lead: str, device: str) -> dict[str, dict[str, Any]]:
    """Each reference network's measurements (flip rates ranked by the `lead` estimator, sharpness) with how it
    was trained and its adequacy gate, by kind."""
    cfg, st, t = run.cfg, run.st, run.t
    models: dict[str, dict[str, Any]] = {}
    for kind in PAPER_PAIR.paper_order:
        label = f"{model_name(kind)} (m={cfg.ref_width})"
        log(f"audit: training the {label} reference ({PROPER} protocol, at most {cfg.ref_epochs} epochs)")
        spec = ModelSpec(kind, t.x_train.shape[1], cfg.ref_width, t.out_dim, seed=cfg.seed)
        tcfg = protocol_config(PROPER, cfg.ref_epochs, seed=cfg.seed)
        with st.timed(f"train {kind}"):
            tr = train_network(spec, t, tcfg, device=device, label=f"training {model_name(kind)}")
        tr.model.eval()
        net = Network(label, FlatInput(tr.model, (spec.d,)), SuiteKernels(tr.model), tr.model.W.numel(),
                      cfg.ref_width)
        with st.timed(kind):
            ref, _ = measure_network(net, t, cfg, lead)
        ref["training"] = {"protocol": PROPER, "max_epochs": cfg.ref_epochs, "epochs_run": tr.record.epochs_run,
                           "final_train_loss": tr.record.final_train_loss, "optimizer": "adam",
                           "lr": tr.record.lr, "weight_decay": 0.0, "batch_size": tcfg.batch_size,
                           "plateau_reached": tr.record.plateau_reached}
        ref["gate"] = tr.gate
        models[kind] = ref
    return models
