"""The audit pipeline in parts (issue 41: `verify/audit/pipeline.py` imports at most 12 first-party modules; each
step in a module of its own): the import bound, and the parts that compute something checked against an
independent computation (the levers by class, the diagnostics' kappa fallback)."""

from __future__ import annotations

import ast
import math
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from empirics.data.userdata import Split
from empirics.vocab import PAPER_PAIR
from theory.bounds import width_bound_v1
from verify.audit import references
from verify.audit.binding import AuditRun, Stage
from verify.audit.config import AuditConfig
from verify.audit.diagnostics import diagnostics
from verify.audit.files import earlier_audit_file
from verify.audit.levers import lever_classes, levers
from verify.audit.panels import lead_of

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("ntkm", "theory", "empirics", "verify", "reports")
#: The bound of issue 41's "Done when".
MAX_PIPELINE_IMPORTS = 12


def first_party_imports(path: Path) -> set[str]:
    """The first-party modules a file imports, anywhere in it."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        out.update(n for n in names if n.split(".")[0] in FIRST_PARTY)
    return out


def test_the_pipeline_imports_at_most_twelve_first_party_modules():
    mods = first_party_imports(ROOT / "verify/audit/pipeline.py")
    assert len(mods) <= MAX_PIPELINE_IMPORTS, sorted(mods)


def test_the_import_count_sees_lazy_imports(tmp_path: Path):
    f = tmp_path / "m.py"
    f.write_text("import numpy\nfrom verify.audit import risk\ndef g():\n    import empirics.vocab\n")
    assert first_party_imports(f) == {"verify.audit", "empirics.vocab"}


def _split(y: list[int], classes: list[str] | None = None) -> Split:
    x = np.linspace(0, 1, 3 * len(y), dtype=np.float32).reshape(len(y), 3)
    return Split(x, np.asarray(y), None, classes, {})


def _binom_two_sided(k: int, n: int, p: float) -> float:
    """The exact two-sided binomial p value by its definition (the outcomes no more likely than k), no scipy."""
    pmf = [math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(n + 1)]
    return min(1.0, sum(q for q in pmf if q <= pmf[k] * (1 + 1e-7)))


def test_lever_classes_count_and_test_each_class_against_its_share():
    y = [0] * 10 + [1] * 10 + [2] * 20
    selected = [0, 1, 2, 3, 4, 5, 10, 20]  # 6 of class 0, 1 of class 1, 1 of class 2
    total = np.where(np.arange(40) % 2 == 0, 1.0, -1.0)
    rows = lever_classes({"selected": selected, "estimator_total": total}, _split(y, ["a", "b", "c"]))
    counts = Counter(y[i] for i in selected)
    by = {r["label"]: r for r in rows}
    for c, r in by.items():
        assert r["levers"] == counts.get(c, 0)
        assert r["class"] == "abc"[c]
        assert r["helpful"] == sum(1 for i in selected if y[i] == c and total[i] > 0)
        assert r["share_of_training"] == pytest.approx(y.count(c) / 40)
        assert r["p"] == pytest.approx(_binom_two_sided(r["levers"], len(selected), y.count(c) / 40), rel=1e-6)
    assert [r["label"] for r in rows] == [0, 1, 2]  # most levers first, ties by label
    assert all(r["p_holm"] >= r["p"] for r in rows)


def test_levers_are_the_top_points_by_absolute_influence_of_the_lead_estimator():
    y = [0, 1, 0, 1, 0]
    total = np.array([0.1, -0.9, 0.5, 0.0, -0.2])
    cfg = AuditConfig(model="m", train="t", top_k=2, attacks=("fgsm",))
    ex = [{"flipped": i == 1, "new": float(i)} for i in range(5)]
    user = {"selected": [0, 1, 2, 3, 4], "estimator_total": total, "influence_total": total * 2, "gn_total": total * 3,
            "attacks": {"fgsm": {"examples": ex}}, "worst_attack": "fgsm",
            "adversarial_pixels": {"fgsm": [np.zeros(3)] * 5}}
    out = levers(user, _split(y), cfg)
    assert [r["index"] for r in out] == [1, 2]
    assert out[0]["role"] == "harmful" and out[0]["flipped_by"] == ["fgsm"] and out[1]["flipped_by"] == []
    assert out[0]["ntk_influence"] == pytest.approx(-1.8) and out[0]["gn_influence"] == pytest.approx(-2.7)


def test_diagnostics_fall_back_to_the_effective_kappa_on_rank_deficient_data():
    rng = np.random.default_rng(0)
    x = rng.random((6, 4))
    x = np.vstack([x, x[:1]])  # a repeated row: the Gram matrix is singular
    cfg = AuditConfig(model="m", train="t")
    user = {"label": "your model", "width": 8, "parameters": 40, "ntk": {"kappa": 10.0, "log10_kappa": 1.0}}
    d = diagnostics(x, cfg, {"user": user})
    assert d["v1_kappa"] == "kappa_eff"
    assert d["v1"]["value"] == pytest.approx(width_bound_v1(d["data_gram"]["kappa_eff"], cfg.bound_eps).value)
    assert d["models"][0]["log10_width"] == pytest.approx(math.log10(8))


def test_the_references_are_the_papers_pair_under_their_paper_names(monkeypatch):
    """`references.reference_models` trains and measures the paper's pair, in the paper's order, under the paper's
    names, with how each was trained and its adequacy gate."""
    import torch

    from empirics.common import Tensors
    from empirics.nets.protocols import PROPER

    monkeypatch.setenv("NTKM_PROGRESS", "0")
    g = torch.Generator().manual_seed(5)
    t = Tensors(torch.rand(24, 6, generator=g), torch.arange(24) % 3, torch.rand(8, 6, generator=g),
                torch.arange(8) % 3, 3)
    cfg = AuditConfig("model", "train", tau=0.25, steps=2, baseline_seeds=2, hessian_iters=2, attacks=("pgd",),
                      eps=0.2, seed=1, ref_width=8, ref_epochs=2)
    models = references.reference_models(SimpleNamespace(cfg=cfg, st=Stage(), t=t), "ntk", "cpu")
    assert list(models) == list(PAPER_PAIR.paper_order) == ["relu", "attn"]
    assert [m["label"] for m in models.values()] == ["2L-ReLU (m=8)", "MLP-Attn (m=8)"]
    for m in models.values():
        assert m["training"]["protocol"] == PROPER and m["training"]["max_epochs"] == 2 and "passed" in m["gate"]
        assert m["estimator"] == "ntk" and len(m["selected"]) == m["n_selected"] > 0


def test_the_lead_is_the_validity_panels_else_ntk_leave_one_out():
    assert lead_of({}) == "ntk" and lead_of({"validity": None}) == "ntk"
    assert lead_of({"validity": {"lead": "ef"}}) == "ef"


def test_stage_adds_up_the_time_of_a_repeated_stage():
    import time

    st = Stage()
    for _ in range(2):
        with st.timed("a"):
            time.sleep(0.02)
    assert st.times["a"] >= 0.04 and "a" in st.peak_gib
    with pytest.raises(ZeroDivisionError), st.timed("b"):
        raise ZeroDivisionError
    assert set(st.times) == {"a", "b"}  # a stage that fails is still timed
    assert "kernel_reason" in AuditRun.__dataclass_fields__


def test_an_unrelated_file_is_not_an_earlier_audit(tmp_path: Path):
    f = tmp_path / "report.pdf"
    f.write_text("my own notes")
    assert not earlier_audit_file(f)


def test_every_kernel_provider_answers_the_protocol():
    """The audit asks a kernel provider (`verify.audit.measure.KernelProvider`), never its class: the suite's closed
    form recomputes the whole kernel and has no projection; an exact and a projected generic kernel give their
    projection, a refreshed copy without cached Jacobians, and the same kind of kernel for another network, whose
    clean kernel equals the one a provider built directly on that network gives."""
    import torch
    from torch import nn

    from empirics.kernels.audit_ntk import ModelJacobian, Projection
    from empirics.nets.models import ModelSpec, build_model
    from verify.audit.measure import GenericKernels, KernelProvider, SuiteKernels
    from verify.audit.projection import projected_kernel

    torch.manual_seed(0)
    x, xt = torch.rand(10, 4), torch.rand(3, 4)
    suite = SuiteKernels(build_model(ModelSpec("relu", 4, 8, 2, seed=0), x), 1 << 26)
    net, other = (nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)) for _ in range(2))
    exact = GenericKernels(ModelJacobian(net, (4,)), 1 << 26)
    proj = Projection(16, seed=3)
    projected = GenericKernels(projected_kernel(ModelJacobian(net, (4,)), None, proj, 1 << 26), 1 << 26)
    for p in (suite, exact, projected):
        assert isinstance(p, KernelProvider) and isinstance(p.method, str)
        assert type(p.refreshed()) is type(p)
    assert suite.recomputes_whole and suite.projection is None
    assert not exact.recomputes_whole and exact.projection is None and projected.projection == proj
    exact.clean(x, xt)
    assert exact.refreshed()._train is None  # a re-fit in place gets no stale Jacobians
    for p in (exact, projected):
        moved = p.for_network(other, (4,))
        assert moved.projection == p.projection
        K, Kst = moved.clean(x, xt)
        direct = GenericKernels(ModelJacobian(other, (4,)), 1 << 26) if p.projection is None else GenericKernels(
            projected_kernel(ModelJacobian(other, (4,)), None, proj, 1 << 26), 1 << 26)
        K2, Kst2 = direct.clean(x, xt)
        assert np.allclose(K, K2) and np.allclose(Kst, Kst2)
    assert suite.for_network(other, (4,)).projection is None


def test_a_refit_graph_gets_the_factored_jacobians_of_the_bound_model():
    """`verify.audit.measure.model_jacobian`: a re-fit of a graph-bound model (an FX graph) gets the factored linear
    layers, as the audit's own kernel does (without them a 1M-parameter MLP's ensemble member assembled 48 GiB of
    Jacobians in blocks), and the same kernel as plain autograd."""
    import torch
    from torch import nn

    from empirics.kernels.audit_ntk import ModelJacobian
    from verify.audit.measure import model_jacobian

    torch.manual_seed(0)
    x = torch.rand(6, 5)
    batch = torch.export.Dim("batch", min=1)
    gm = torch.export.export(nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)), (x,),
                             dynamic_shapes=({0: batch},)).module()
    factored, plain = model_jacobian(gm, (5,)), ModelJacobian(gm, (5,))
    assert factored.layers and not plain.layers
    assert factored.bytes_per_example() < plain.bytes_per_example()
    assert torch.allclose(factored.kernel(x), plain.kernel(x), rtol=1e-5, atol=1e-6)
    assert not model_jacobian(nn.Linear(5, 3), (5,)).layers  # an eager module: plain autograd
