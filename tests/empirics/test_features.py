"""Feature strategies (`empirics.nets.features`, issue 41 item 1): every registered kind rebuilds its context on
perturbed training data (checked against a network built on that data, and against the differentiable on-the-fly context
the attacks use), a strategy missing a method cannot be built, an unknown name is one line, and no code outside the
registry compares a strategy's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from empirics.nets.features import STRATEGIES, FeatureStrategy, Identity, strategy
from empirics.nets.kinds import KINDS
from empirics.nets.models import ModelSpec, build_model
from ntkm.errors import UserInputError

ROOT = Path(__file__).resolve().parents[2]
#: Where strategy names may appear as strings: the registry itself and the kind table that names each kind's.
REGISTRY_MODULES = {"empirics/nets/features.py", "empirics/nets/kinds.py"}


def _data(seed: int, n: int = 12, d: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=gen, dtype=torch.float64), torch.rand(5, d, generator=gen, dtype=torch.float64)


#: Every kind with its default options, and each kind that takes the attention options with them too.
CASES = [(n, {}) for n in KINDS] + [(n, o) for n in KINDS if KINDS[n].attention_options
                                    for o in ({"attn_centre": True}, {"attn_rank": 3, "attn_layers": 2})]


@pytest.mark.parametrize("name, options", CASES)
@pytest.mark.parametrize("preprocess", ["raw", "unit"])
def test_every_kind_rebuilds_its_context_on_perturbed_data(name, preprocess, options):
    x, q = _data(0)
    perturbed = x + 0.05 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype)
    spec = ModelSpec(name, x.shape[1], 16, 3, seed=2, preprocess=preprocess, qkv_dim=4, **options)
    net = build_model(spec, x, dtype=torch.float64)
    clean = net.features(q).detach()
    on_the_fly = net.features(q, context_inputs=perturbed).detach()
    net.set_context(perturbed)
    rebuilt = net.features(q).detach()
    # the same seed and input statistics (the clean set's), built directly on the perturbed training set
    fresh = build_model(spec, perturbed, dtype=torch.float64, reference=x).features(q).detach()
    torch.testing.assert_close(rebuilt, fresh, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(on_the_fly, fresh, rtol=1e-10, atol=1e-12)
    if KINDS[name].has_context:
        assert (rebuilt - clean).abs().max() > 1e-6, "the perturbed context did not change the features"
    else:
        torch.testing.assert_close(rebuilt, clean, rtol=0, atol=0)


def test_every_kind_names_a_registered_strategy():
    assert {k.features for k in KINDS.values()} <= set(STRATEGIES)
    assert all(KINDS[n].strategy is STRATEGIES[KINDS[n].features] for n in KINDS)


def test_a_strategy_without_a_context_rebuild_cannot_be_built():
    class Forgetful(FeatureStrategy):
        name = "forgetful"

        def build_context(self, net, x_train, dtype):
            net.register_buffer("context", x_train)

        def features(self, net, x, context_inputs):
            return x

        def analytic(self, spec, x_tr, x):
            return x

        def macs(self, d, n):
            return 0.0, 0.0

    with pytest.raises(TypeError, match="rebuild_context"):
        Forgetful()
    assert isinstance(Identity(), FeatureStrategy)


def test_an_unknown_strategy_is_one_line():
    with pytest.raises(UserInputError) as err:
        strategy("cosine-attention")
    assert "\n" not in str(err.value) and "linear-attention" in str(err.value)


def _string_comparisons(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines of comparisons (==, !=, in) against a string literal in `names`, alone or in a literal collection."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            elts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            if any(isinstance(e, ast.Constant) and e.value in names for e in elts):
                found.append(node.lineno)
    return found


def test_no_code_compares_a_strategy_name():
    names = set(STRATEGIES)
    hits = []
    for pkg in ("empirics", "verify", "benchmarks"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in REGISTRY_MODULES:
                continue
            hits += [f"{rel}:{line}" for line in _string_comparisons(ast.parse(path.read_text()), names)]
    assert not hits, f"a branch on a feature strategy's name (ask the strategy object instead): {hits}"


def test_the_scanner_finds_a_branch_on_a_name():
    tree = ast.parse('if f == "linear-attention":\n    pass\nif g in ("identity", "x"):\n    pass\n')
    assert _string_comparisons(tree, set(STRATEGIES)) == [1, 3]
