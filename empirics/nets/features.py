"""Feature strategies: how a network of a kind computes the input of its head, one object per strategy.

A kind (`empirics.nets.kinds.Kind.features`) holds one of these objects, and every place that used to branch on the
strategy's name asks it instead (issue 41): the network building and rebuilding its attention context on (possibly
perturbed) training inputs, the torch features, their float64 analytic counterpart for the closed-form reference
kernel of Thm 4.2 (`empirics.experiments.distance.analytic_features`), and the extra multiply-adds of one forward pass
for the cost model (`verify.costs.flops`). Every method is abstract, so a new strategy that forgets one (the context
rebuild on perturbed data, where a missing branch once kept the clean context silently) fails when it is built.

The networks (`empirics.nets.models`) pass their preprocessed inputs: every method here works after the fixed input
layer. A strategy stores its state on the network as buffers (`context`, and MLP-Attn's `context_factor` and
`context_mean`), so a saved model holds it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
from torch import nn

from empirics.nets.context_product import context_product_macs, factor_is_cheaper
from ntkm.errors import UserInputError
from theory import gram, kernels

if TYPE_CHECKING:
    from empirics.nets.models import ModelSpec

#: The dimension k of the query, key and value projections of the trained attention (`ModelSpec.qkv_dim`'s default).
QKV_DIM = 64


def normalise(h: torch.Tensor) -> torch.Tensor:
    """Each row scaled to unit Euclidean norm (a zero row stays zero)."""
    return h / h.norm(dim=1, keepdim=True).clamp_min(1e-30)


def attention_context(x_train: torch.Tensor, rank: int | None = None, centre: bool = False) -> torch.Tensor:
    """`C = X^T X` (d x d), or its rank-r truncation `V_r S_r^2 V_r^T`. Differentiable in X.

    `centre`: the context of the mean-removed inputs, `(X - mu)^T (X - mu)`.
    """
    if centre:
        x_train = x_train - x_train.mean(dim=0)
    if rank is None:
        return x_train.T @ x_train
    _, s, vh = torch.linalg.svd(x_train, full_matrices=False)
    r = min(rank, s.shape[0])
    v = vh[:r].T
    return (v * s[:r] ** 2) @ v.T


def attention_features(x: torch.Tensor, context: torch.Tensor | None, layers: int = 1,
                       factor: torch.Tensor | None = None) -> torch.Tensor:
    """`normalise(C^k x)` row by row; intermediate rescaling does not change the result.

    `factor`: an n x d `X` with `C = X^T X`, given when `h C = (h X^T) X` is cheaper (`factor_is_cheaper`);
    then `context` is not read. Equal to the d x d product up to floating-point rounding, and as differentiable.
    """
    h = x
    for _ in range(layers):
        h = normalise(h @ context if factor is None else (h @ factor.T) @ factor)  # C symmetric: (C h^T)^T = h C
    return h


def gram_factor(x_train: torch.Tensor, rank: int | None = None, centre: bool = False) -> torch.Tensor | None:
    """The n x d `X` (mean-removed for `centre`) with `attention_context(x_train, rank, centre) = X^T X`, where
    the context is the plain Gram and the factor is cheaper (`factor_is_cheaper`); else None (a rank-r truncation
    keeps the d x d product)."""
    if rank is not None or not factor_is_cheaper(*x_train.shape):
        return None
    return x_train - x_train.mean(dim=0) if centre else x_train


def softmax_attention_features(x: torch.Tensor, keys: torch.Tensor, temperature: float) -> torch.Tensor:
    """`normalise(softmax(x X^T / T) X)`: softmax attention of each row of `x` over the rows of `keys`."""
    if keys.shape[0] == 0:
        raise UserInputError("the softmax model has no training set as its context; build it with the training "
                             "inputs or call set_context(x_train)")
    return normalise(torch.softmax(x @ keys.T / temperature, dim=1) @ keys)


class FeatureStrategy(ABC):
    """How a kind's head input is computed from preprocessed inputs; `name` is its registry key."""

    name: ClassVar[str]

    def head_dim(self, spec: ModelSpec) -> int:
        """Input dimension of the head `W`: the input dimension, unless the strategy projects."""
        return spec.d

    @abstractmethod
    def build_context(self, net: nn.Module, x_train: torch.Tensor | None, dtype: torch.dtype) -> None:
        """Register the network's context buffers from the preprocessed training inputs (None: built without)."""

    @abstractmethod
    def rebuild_context(self, net: nn.Module, x_train: torch.Tensor) -> None:
        """Replace the context with one built from (possibly perturbed) preprocessed training inputs."""

    @abstractmethod
    def features(self, net: nn.Module, x: torch.Tensor, context_inputs: torch.Tensor | None) -> torch.Tensor:
        """The head's input on preprocessed `x`; `context_inputs` (preprocessed) rebuilds the context on the fly,
        differentiably (an attack that sees its own effect on the context)."""

    @abstractmethod
    def analytic(self, spec: ModelSpec, x_tr: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The input map of Thm 4.2 in float64 numpy (context from `x_tr`) on rows `x`; an error where the kind
        has no closed form."""

    @abstractmethod
    def macs(self, d: int, n: int) -> tuple[float, float]:
        """Multiply-adds the features add to a forward pass, per example and per batch, at input dimension `d`
        and `n` training points (the head's own are priced by `verify.costs.flops`)."""


def _empty(net: nn.Module, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(0, dtype=dtype, device=net.W.device)


class Identity(FeatureStrategy):
    """2L-ReLU: the preprocessed input itself; no context."""

    name = "identity"

    def build_context(self, net: nn.Module, x_train: torch.Tensor | None, dtype: torch.dtype) -> None:
        net.register_buffer("context", _empty(net, dtype))

    def rebuild_context(self, net: nn.Module, x_train: torch.Tensor) -> None:
        """No context depends on the training set: nothing to rebuild."""

    def features(self, net: nn.Module, x: torch.Tensor, context_inputs: torch.Tensor | None) -> torch.Tensor:
        return x

    def analytic(self, spec: ModelSpec, x_tr: np.ndarray, x: np.ndarray) -> np.ndarray:
        return x

    def macs(self, d: int, n: int) -> tuple[float, float]:
        return 0.0, 0.0


class LinearAttention(FeatureStrategy):
    """MLP-Attn: `normalise(C^k x)` with the training-set context `C` (rank and centring from the spec). With the
    plain Gram context it multiplies by `(h X^T) X` through the n x d training inputs where that is cheaper, kept
    as the non-persistent buffer `context_factor` (an empty placeholder where the d x d product is used)."""

    name = "linear-attention"

    @staticmethod
    def _factor(spec: ModelSpec, x_train: torch.Tensor) -> torch.Tensor:
        f = gram_factor(x_train, spec.attn_rank, spec.attn_centre)
        return x_train.new_zeros(0) if f is None else f.clone()

    def build_context(self, net: nn.Module, x_train: torch.Tensor | None, dtype: torch.dtype) -> None:
        if x_train is None:
            raise UserInputError("MLP-Attn needs the training inputs to build its attention context")
        spec, x_train = net.spec, x_train.to(dtype)
        net.register_buffer("context", attention_context(x_train, spec.attn_rank, spec.attn_centre))
        net.register_buffer("context_factor", self._factor(spec, x_train), persistent=False)
        if spec.attn_centre:
            net.register_buffer("context_mean", x_train.mean(dim=0))

    def rebuild_context(self, net: nn.Module, x_train: torch.Tensor) -> None:
        spec, x_train = net.spec, x_train.to(net.context.dtype)
        net.context = attention_context(x_train, spec.attn_rank, spec.attn_centre)
        net.context_factor = self._factor(spec, x_train)
        if spec.attn_centre:
            net.context_mean = x_train.mean(dim=0)

    def features(self, net: nn.Module, x: torch.Tensor, context_inputs: torch.Tensor | None) -> torch.Tensor:
        spec = net.spec
        rank, centre = spec.attn_rank, spec.attn_centre
        if context_inputs is None:
            factor = net.context_factor if net.context_factor.dim() == 2 else None  # else the empty placeholder
            ctx = net.context
            mean = net.context_mean if centre else None
        else:  # C is built only where the factor is not cheaper
            factor = gram_factor(context_inputs, rank, centre)
            ctx = attention_context(context_inputs, rank, centre) if factor is None else None
            mean = context_inputs.mean(dim=0) if centre else None
        return attention_features(x if mean is None else x - mean, ctx, spec.attn_layers, factor)

    def analytic(self, spec: ModelSpec, x_tr: np.ndarray, x: np.ndarray) -> np.ndarray:
        return gram.attention_features(x_tr, x, k=spec.attn_layers, rank=spec.attn_rank, centre=spec.attn_centre)

    def macs(self, d: int, n: int) -> tuple[float, float]:
        return float(context_product_macs(n, d)), 0.0


class SoftmaxAttention(FeatureStrategy):
    """Softmax attention over the training inputs as keys and values, `normalise(softmax(x X^T / T) X)`."""

    name = "softmax-attention"

    def build_context(self, net: nn.Module, x_train: torch.Tensor | None, dtype: torch.dtype) -> None:
        ctx = x_train.to(dtype) if x_train is not None else torch.zeros(0, net.spec.d, dtype=dtype,
                                                                           device=net.W.device)
        net.register_buffer("context", ctx.clone())

    def rebuild_context(self, net: nn.Module, x_train: torch.Tensor) -> None:
        net.context = x_train.to(net.context.dtype).clone()

    def features(self, net: nn.Module, x: torch.Tensor, context_inputs: torch.Tensor | None) -> torch.Tensor:
        keys = net.context if context_inputs is None else context_inputs
        return softmax_attention_features(x, keys, net.spec.temperature)

    def analytic(self, spec: ModelSpec, x_tr: np.ndarray, x: np.ndarray) -> np.ndarray:
        return kernels.softmax_attention_features(x_tr, x, spec.temperature)

    def macs(self, d: int, n: int) -> tuple[float, float]:
        return 2.0 * n * d, 0.0


class TrainedAttention(FeatureStrategy):
    """Trainable single-head linearized attention (`empirics.nets.models.QKVAttentionNet`): `normalise(x Q K^T C V)`
    with `C = X^T X`; the projections train with the head, so there is no closed form (Monte Carlo reference)."""

    name = "trained-attention"

    def head_dim(self, spec: ModelSpec) -> int:
        return spec.qkv_dim

    def build_context(self, net: nn.Module, x_train: torch.Tensor | None, dtype: torch.dtype) -> None:
        ctx = (attention_context(x_train.to(dtype)) if x_train is not None
               else torch.zeros(net.spec.d, net.spec.d, dtype=dtype, device=net.W.device))
        net.register_buffer("context", ctx)

    def rebuild_context(self, net: nn.Module, x_train: torch.Tensor) -> None:
        net.context = attention_context(x_train.to(net.context.dtype))

    def features(self, net: nn.Module, x: torch.Tensor, context_inputs: torch.Tensor | None) -> torch.Tensor:
        ctx = None if context_inputs is None else attention_context(context_inputs)
        return normalise((x @ (net.alpha * net.W_Q)) @ net.mixing(ctx))

    def analytic(self, spec: ModelSpec, x_tr: np.ndarray, x: np.ndarray) -> np.ndarray:
        raise UserInputError(f"model '{spec.kind}' has no closed-form reference kernel (its projections train); use "
                             "empirics.experiments.distance.reference_kernels (Monte Carlo)")

    def macs(self, d: int, n: int) -> tuple[float, float]:
        return float(d * QKV_DIM + QKV_DIM * QKV_DIM), float(d * d * QKV_DIM + d * QKV_DIM * QKV_DIM)


#: Every feature strategy by name.
STRATEGIES: dict[str, FeatureStrategy] = {s.name: s for s in (Identity(), LinearAttention(), SoftmaxAttention(),
                                                              TrainedAttention())}


def strategy(name: str) -> FeatureStrategy:
    """The strategy called `name`; an unknown name is a one-line error listing them."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise UserInputError(f"unknown feature strategy '{name}'; choose one of {', '.join(STRATEGIES)}") from None
