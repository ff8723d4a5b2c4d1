"""The paper's two networks, 2L-ReLU and MLP-Attn (docs/PAPER.md, "Objects"), and two attention variants.

Both compute `f(x) = m^-1/2 * A^T relu(W x~)` with `A` (m x c) fixed random signs and only `W`
(m x d) trained. 2L-ReLU uses the raw input, `x~ = x`; MLP-Attn uses linearized attention over
the whole training set, `x~ = normalise(C^k x)` with `C = X_train^T X_train` (optionally from the
top-r SVD truncation of X_train; or, as the suite's named "centred" variant, from the mean-removed
X_train with queries centred by the same mean). Because `C` depends on every training point, perturbing
training data changes every feature: the mechanism behind the claimed malleability.

Variants beyond the paper, with the same head and the training set as the attention sequence:
`softmax` (parameter-free, `x~ = normalise(softmax(x X^T / T) X)`) and `qkv` (trainable single-head
linearized attention, `x~ = normalise((x Q)(X K)^T (X V))` with `Q, K, V` (d x k) trained with `W`;
identity `Q, K, V` would give MLP-Attn). `qkv` is a `QKVAttentionNet`, not a `TwoLayerNet`, because its
features move during training.

Input preprocessing (`ModelSpec.preprocess`, README "Input preprocessing") is the network's fixed first layer:
`raw` passes the [0, 1] pixels through; `channel` standardises each colour channel, `(x - mu_c) / sd_c`; `unit`
does that and then scales each input to unit Euclidean norm. Its statistics (buffers `input_shift`,
`input_scale`, one value per input coordinate) are computed once, when the network is built, from the clean
training inputs it is built with, and are saved with the weights. Every input, the attention context's
included, goes through this layer, so attacks and the audit's eps stay in pixel units; rebuilding the context
(`set_context`, `context_inputs`) sends the new inputs through the same fixed statistics.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from empirics.data.datasets import INPUT_PREPROCESSINGS, input_statistics
from empirics.nets.features import QKV_DIM, normalise
from empirics.nets.features import attention_context as attention_context
from empirics.nets.features import attention_features as attention_features
from empirics.nets.features import gram_factor as gram_factor
from empirics.nets.features import softmax_attention_features as softmax_attention_features
from empirics.nets.kinds import kind, kinds_where
from ntkm.errors import UserInputError

#: Kinds whose features depend on the training set (an attention context).
CONTEXT_KINDS = kinds_where(has_context=True)
PARAMETERIZATIONS = ("ntk", "standard")


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild a network: recorded in every result and beside saved weights.

    parameterization: "ntk" draws W ~ N(0, 1) (the paper's NTK parameterisation, output scaled by
    m^-1/2); "standard" draws W ~ N(0, 1/d) with the same fixed output layer.
    attn_layers: k stacked linearized-attention layers with the training-set context (x -> C^k x).
    attn_rank: keep only the top-r singular directions of X_train in the context (truncation).
    attn_centre: the centred variant (not the paper's model): `x~ = normalise(C_c^k (x - mu))` with `mu` the
    training mean and `C_c` the context of the mean-removed training inputs.
    attn_temperature: softmax temperature `T` of kind "softmax" (None: `sqrt(d)`, the transformer's scaling, or
        `1 / sqrt(d)` under `preprocess="unit"`; see `temperature`).
    qkv_dim: the dimension k of the query, key and value projections of kind "qkv" (the head sees k features).
    preprocess: the fixed input layer, raw, channel or unit (module docstring).
    channels: colour channels of the flattened C,H,W input, for the per-channel statistics (1 for raw).
    """

    kind: str
    d: int
    width: int
    out_dim: int
    parameterization: str = "ntk"
    attn_layers: int = 1
    attn_rank: int | None = None
    seed: int = 0
    attn_centre: bool = False
    attn_temperature: float | None = None
    qkv_dim: int = QKV_DIM
    preprocess: str = "raw"
    channels: int = 1

    def __post_init__(self) -> None:
        info = kind(self.kind)
        if not info.has_context:  # no context: the attention options mean nothing, so equal networks get equal specs
            for name, default in (("attn_layers", 1), ("attn_rank", None), ("attn_centre", False)):
                object.__setattr__(self, name, default)
        if self.preprocess == "raw":  # no statistics: the channel count means nothing
            object.__setattr__(self, "channels", 1)
        if self.preprocess not in INPUT_PREPROCESSINGS:
            raise UserInputError(f"unknown preprocess '{self.preprocess}'; choose {', '.join(INPUT_PREPROCESSINGS)}")
        if self.channels < 1 or self.d % self.channels:
            raise UserInputError(f"channels must divide the input dimension d={self.d} (got {self.channels})")
        if self.parameterization not in PARAMETERIZATIONS:
            raise UserInputError(
                f"unknown parameterization '{self.parameterization}'; choose ntk or standard"
            )
        if self.width < 1 or self.d < 1 or self.out_dim < 1:
            raise UserInputError(f"width, d and out_dim must be positive (got {self.width}, {self.d}, {self.out_dim})")
        if self.attn_layers < 1:
            raise UserInputError(f"attn_layers must be >= 1 (got {self.attn_layers})")
        if self.attn_rank is not None and self.attn_rank < 1:
            raise UserInputError(f"attn_rank must be >= 1 (got {self.attn_rank})")
        if info.has_context and not info.attention_options and (self.attn_layers != 1 or self.attn_rank is not None
                                                                 or self.attn_centre):
            raise UserInputError(f"attention layers, rank and centring apply to MLP-Attn only; drop --attn-layers, "
                                 f"--attn-rank and --centre for model '{self.kind}'")
        t = self.attn_temperature
        if t is not None and not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise UserInputError(f"attn_temperature must be a positive number (got {t})")
        if self.qkv_dim < 1:
            raise UserInputError(f"qkv_dim must be >= 1 (got {self.qkv_dim})")

    @property
    def temperature(self) -> float:
        """The softmax temperature `T`: `attn_temperature`, else `sqrt(d)` (the transformer's scaling for inputs whose
        entries have unit scale), and `1 / sqrt(d)` for unit-norm inputs (`preprocess="unit"`, entries of scale
        1/sqrt(d)), so that the logits x.x'/T spread like sqrt(d) cos(x, x') under both. With unit-norm inputs and
        `T = sqrt(d)` every logit lies in [-1/sqrt(d), 1/sqrt(d)], the softmax is uniform to within 7 % on MNIST,
        every input gets the same features, and the network stays at chance (docs/DEVIATIONS.md D22)."""
        if self.attn_temperature is not None:
            return float(self.attn_temperature)
        return self.d**-0.5 if self.preprocess == "unit" else self.d**0.5

    @property
    def head_dim(self) -> int:
        """Input dimension of the head `W`: `qkv_dim` for the trained attention (kind "qkv"), else d."""
        return kind(self.kind).strategy.head_dim(self)

    def to_dict(self) -> dict:
        return asdict(self)


def reference_statistics(reference: torch.Tensor, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """`empirics.data.datasets.input_statistics` of the reference inputs, computed on the CPU in float64 (numpy): the
    one step of building a network that leaves the inputs' device; `_register_preprocess` puts the result back there."""
    return input_statistics(reference.detach().cpu().double().numpy(), channels)


def _register_preprocess(module: nn.Module, spec: ModelSpec, reference: torch.Tensor | None,
                         dtype: torch.dtype) -> None:
    """The fixed input layer's statistics as buffers (none for raw), from the clean training inputs `reference`."""
    if spec.preprocess == "raw":
        return
    if reference is None:
        raise UserInputError(f"preprocess '{spec.preprocess}' needs the training inputs for its statistics; build "
                             "the model with x_train")
    shift, scale = reference_statistics(reference, spec.channels)
    # the statistics live where the reference inputs do (a model built from GPU inputs preprocesses them there)
    module.register_buffer("input_shift", torch.as_tensor(shift, dtype=dtype, device=reference.device))
    module.register_buffer("input_scale", torch.as_tensor(scale, dtype=dtype, device=reference.device))


def apply_preprocess(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The fixed first layer of `module` (a suite network) on raw inputs `x` (differentiable in `x`)."""
    mode = module.spec.preprocess
    if mode == "raw":
        return x
    h = (x - module.input_shift) / module.input_scale
    return normalise(h) if mode == "unit" else h


class _SuiteBase(nn.Module):
    """The shared head `m^-1/2 A^T relu(W x~)` on `features`. Loading a state dict resizes the `context` buffer
    to the saved one (its shape depends on the training set, which a model rebuilt from its spec lacks)."""

    spec: ModelSpec

    @property
    def width(self) -> int:
        return self.spec.width

    def features(self, x: torch.Tensor, context_inputs: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def preprocess_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Raw pixels -> what the network computes on (the fixed first layer, `apply_preprocess`)."""
        return apply_preprocess(self, x)

    def head(self, feats: torch.Tensor) -> torch.Tensor:
        """The trained part, `m^-1/2 A^T relu(W x~)`, on precomputed features `x~`."""
        return (torch.relu(feats @ self.W.T) @ self.A) / self.spec.width**0.5

    def forward(self, x: torch.Tensor, context_inputs: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.features(x, context_inputs))

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: object, **kwargs: object) -> None:
        saved = state_dict.get(prefix + "context")
        if isinstance(saved, torch.Tensor) and saved.shape != self.context.shape:
            self.context = torch.zeros(saved.shape, dtype=self.context.dtype, device=self.context.device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def _init_head(module: nn.Module, spec: ModelSpec, gen: torch.Generator, dtype: torch.dtype) -> None:
    """`W` (m x head_dim; N(0, 1) in NTK parameterisation, N(0, 1/head_dim) standard) and the fixed signs `A`."""
    k = spec.head_dim
    std = 1.0 if spec.parameterization == "ntk" else k**-0.5
    module.W = nn.Parameter(torch.randn(spec.width, k, generator=gen, dtype=torch.float64).to(dtype) * std)
    signs = torch.randint(0, 2, (spec.width, spec.out_dim), generator=gen, dtype=torch.int64) * 2 - 1
    module.register_buffer("A", signs.to(dtype))


class TwoLayerNet(_SuiteBase):
    """2L-ReLU (`kind="relu"`), MLP-Attn (`kind="attn"`) or softmax attention (`kind="softmax"`, the training
    set as keys and values); only `W` is a parameter.

    MLP-Attn with the plain (centred or not) Gram context multiplies by it as `(h X^T) X` through the n x d
    preprocessed training inputs where that is cheaper (`factor_is_cheaper`: 2 n < d, CIFAR-10 at n = 500), kept
    as the non-persistent buffer `context_factor`: state dicts and saved models hold `C` only, a model loaded from
    one multiplies by `C`, `set_context` rebuilds both, and assigning `context` directly drops the factor."""

    def __init__(self, spec: ModelSpec, x_train: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                 reference: torch.Tensor | None = None):
        super().__init__()
        info = kind(spec.kind)
        if info.trains_attention:
            raise UserInputError(f"model '{spec.kind}' trains its attention: build it with "
                                 "empirics.nets.models.build_model")
        self.spec = spec
        gen = torch.Generator().manual_seed(spec.seed)
        _init_head(self, spec, gen, dtype)
        _register_preprocess(self, spec, x_train if reference is None else reference, dtype)
        x_train = None if x_train is None else self.preprocess_inputs(x_train.to(dtype))
        info.strategy.build_context(self, x_train, dtype)

    def set_context(self, x_train: torch.Tensor) -> None:
        """Rebuild `C` from (possibly perturbed) training inputs (raw pixels; the input statistics stay fixed): the
        kind's feature strategy rebuilds whatever context it keeps (`empirics.nets.features`)."""
        x_train = self.preprocess_inputs(x_train.to(self.context.dtype))
        kind(self.spec.kind).strategy.rebuild_context(self, x_train)

    def __setattr__(self, name: str, value: object) -> None:
        """Assigning `context` directly drops the factor (which no longer matches it): `C` is then used."""
        buffers = self.__dict__.get("_buffers", {})
        if name == "context" and "context_factor" in buffers and isinstance(value, torch.Tensor):
            buffers["context_factor"] = value.new_zeros(0)
        super().__setattr__(name, value)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: object, **kwargs: object) -> None:
        """Loading copies `C` into place; the factor (never saved) is dropped, so the loaded `C` is what is used."""
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if "context_factor" in self._buffers:
            self._buffers["context_factor"] = self.context.new_zeros(0)

    def features(self, x: torch.Tensor, context_inputs: torch.Tensor | None = None) -> torch.Tensor:
        """`x~`: raw input for 2L-ReLU; attention features for MLP-Attn.

        `context_inputs` (a training set) recomputes `C` on the fly and differentiably, e.g. for an
        attack that sees its own effect on the context. Both go through the fixed input layer first.
        """
        x = self.preprocess_inputs(x)
        if context_inputs is not None:
            context_inputs = self.preprocess_inputs(context_inputs)
        return kind(self.spec.kind).strategy.features(self, x, context_inputs)


class QKVAttentionNet(_SuiteBase):
    """Trainable single-head linearized attention over the training set, then the paper's head (kind "qkv").

    `x~ = normalise((x Q)(X K)^T (X V)) = normalise(x Q K^T C V)`, `C = X^T X`; `Q, K, V` (d x k) and `W`
    (m x k) are trained, `A` fixed. NTK parameterisation: `Q = W_Q / sqrt(d)` with `W_Q ~ N(0, 1)` (likewise
    K, V); standard: `Q = W_Q ~ N(0, 1/d)`. A scalar factor of the scores cancels in the normalisation.
    """

    def __init__(self, spec: ModelSpec, x_train: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                 reference: torch.Tensor | None = None):
        super().__init__()
        if not kind(spec.kind).trains_attention:
            raise UserInputError(f"QKVAttentionNet is model 'qkv', not '{spec.kind}'")
        self.spec = spec
        gen = torch.Generator().manual_seed(spec.seed)
        _init_head(self, spec, gen, dtype)
        std = 1.0 if spec.parameterization == "ntk" else spec.d**-0.5
        for name in ("W_Q", "W_K", "W_V"):
            w = torch.randn(spec.d, spec.qkv_dim, generator=gen, dtype=torch.float64).to(dtype) * std
            setattr(self, name, nn.Parameter(w))
        _register_preprocess(self, spec, x_train if reference is None else reference, dtype)
        x_train = None if x_train is None else self.preprocess_inputs(x_train.to(dtype))
        kind(spec.kind).strategy.build_context(self, x_train, dtype)

    @property
    def alpha(self) -> float:
        """Forward multiplier of `W_Q, W_K, W_V`: `d^-1/2` (NTK parameterisation) or 1 (standard)."""
        return self.spec.d**-0.5 if self.spec.parameterization == "ntk" else 1.0

    def set_context(self, x_train: torch.Tensor) -> None:
        """Rebuild `C` from (possibly perturbed) training inputs (raw pixels; the input statistics stay fixed)."""
        kind(self.spec.kind).strategy.rebuild_context(self, self.preprocess_inputs(x_train.to(self.context.dtype)))

    def mixing(self, context: torch.Tensor | None = None) -> torch.Tensor:
        """`M = K^T C V` (k x k), so that the unnormalised features are `u = (x Q) M`."""
        a = self.alpha
        ctx = self.context if context is None else context
        return (a * self.W_K).T @ (ctx @ (a * self.W_V))

    def features(self, x: torch.Tensor, context_inputs: torch.Tensor | None = None) -> torch.Tensor:
        """`x~ = normalise(x Q M)` on preprocessed `x`; `context_inputs` rebuilds `C` differentiably (attacks)."""
        ctx_inputs = None if context_inputs is None else self.preprocess_inputs(context_inputs)
        return kind(self.spec.kind).strategy.features(self, self.preprocess_inputs(x), ctx_inputs)


SuiteNet = TwoLayerNet | QKVAttentionNet


class _InputLayer(nn.Module):
    """The fixed first layer alone, as a network of `spec` built on `x_train` would hold it."""

    def __init__(self, spec: ModelSpec, x_train: torch.Tensor):
        super().__init__()
        self.spec = spec
        _register_preprocess(self, spec, x_train, x_train.dtype)


def input_channels(ds: object) -> int:
    """Colour channels of a data set's images, for `ModelSpec.channels` (1 when its image shape is unknown)."""
    shape = getattr(ds, "image_shape", None)
    return int(shape[0]) if shape is not None and len(shape) == 3 else 1


def preprocessed_inputs(spec: ModelSpec, x_train: np.ndarray, *xs: np.ndarray) -> tuple[np.ndarray, ...]:
    """`x_train` and `xs` (raw pixels) through the fixed input layer of a network of `spec` built on `x_train`, as
    float64: what the analytic reference kernels must be computed on."""
    xt = torch.as_tensor(np.asarray(x_train, dtype=np.float64))
    layer = _InputLayer(spec, xt)
    return tuple(apply_preprocess(layer, torch.as_tensor(np.asarray(x, dtype=np.float64))).numpy()
                 for x in (xt, *xs))


def build_model(spec: ModelSpec, x_train: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                device: str = "cpu", reference: torch.Tensor | None = None) -> SuiteNet:
    """The network of `spec` (`QKVAttentionNet` for kind "qkv", else `TwoLayerNet`) on raw training inputs
    `x_train`. `reference`: the inputs the preprocessing statistics come from, where they are not `x_train`
    (a leave-one-out refit keeps the full training set's statistics)."""
    cls = QKVAttentionNet if kind(spec.kind).trains_attention else TwoLayerNet
    return cls(spec, x_train, dtype, reference).to(device)


def save_model(model: SuiteNet, path: str | Path) -> tuple[Path, Path]:
    """Save weights as safetensors plus a JSON architecture spec beside it (`PATH.json`).

    The audit loads this pair without unpickling anything.
    """
    from safetensors.torch import save_file

    from ntkm.io import atomic_write_bytes, atomic_write_text

    path = Path(path)
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp))
    atomic_write_bytes(path, tmp.read_bytes())
    tmp.unlink()
    spec_path = path.with_suffix(path.suffix + ".json")
    spec = {"format": "ntk-malleability-suite/two-layer", "spec": model.spec.to_dict()}
    atomic_write_text(spec_path, json.dumps(spec, indent=2))
    return path, spec_path
