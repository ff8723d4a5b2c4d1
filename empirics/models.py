"""The paper's two networks: 2L-ReLU and MLP-Attn (PAPER.md, "Objects").

Both compute `f(x) = m^-1/2 * A^T relu(W x~)` with `A` (m x c) fixed random signs and only `W`
(m x d) trained. 2L-ReLU uses the raw input, `x~ = x`; MLP-Attn uses linearized attention over
the whole training set, `x~ = normalise(C^k x)` with `C = X_train^T X_train` (optionally from the
top-r SVD truncation of X_train; or, as the suite's named "centred" variant, from the mean-removed
X_train with queries centred by the same mean). Because `C` depends on every training point, perturbing
training data changes every feature: the mechanism behind the claimed malleability.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from theory.errors import UserInputError

MODEL_KINDS = ("relu", "attn")
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

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise UserInputError(f"unknown model '{self.kind}'; choose one of {', '.join(MODEL_KINDS)}")
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

    def to_dict(self) -> dict:
        return asdict(self)


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


def attention_features(x: torch.Tensor, context: torch.Tensor, layers: int = 1) -> torch.Tensor:
    """`normalise(C^k x)` row by row; intermediate rescaling does not change the result."""
    h = x
    for _ in range(layers):
        h = h @ context  # C is symmetric, so (C h^T)^T = h C
        h = h / h.norm(dim=1, keepdim=True).clamp_min(1e-30)
    return h


class TwoLayerNet(nn.Module):
    """2L-ReLU (`kind="relu"`) or MLP-Attn (`kind="attn"`); only `W` is a parameter."""

    def __init__(self, spec: ModelSpec, x_train: torch.Tensor | None = None, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.spec = spec
        gen = torch.Generator().manual_seed(spec.seed)
        std = 1.0 if spec.parameterization == "ntk" else spec.d**-0.5
        self.W = nn.Parameter(torch.randn(spec.width, spec.d, generator=gen, dtype=torch.float64).to(dtype) * std)
        signs = torch.randint(0, 2, (spec.width, spec.out_dim), generator=gen, dtype=torch.int64) * 2 - 1
        self.register_buffer("A", signs.to(dtype))
        if spec.kind == "attn":
            if x_train is None:
                raise UserInputError("MLP-Attn needs the training inputs to build its attention context")
            self.register_buffer("context", attention_context(x_train.to(dtype), spec.attn_rank, spec.attn_centre))
            if spec.attn_centre:
                self.register_buffer("context_mean", x_train.to(dtype).mean(dim=0))
        else:
            self.register_buffer("context", torch.zeros(0, dtype=dtype))

    @property
    def width(self) -> int:
        return self.spec.width

    def set_context(self, x_train: torch.Tensor) -> None:
        """Rebuild `C` from (possibly perturbed) training inputs."""
        if self.spec.kind == "attn":
            x_train = x_train.to(self.context.dtype)
            self.context = attention_context(x_train, self.spec.attn_rank, self.spec.attn_centre)
            if self.spec.attn_centre:
                self.context_mean = x_train.mean(dim=0)

    def features(self, x: torch.Tensor, context_inputs: torch.Tensor | None = None) -> torch.Tensor:
        """`x~`: raw input for 2L-ReLU; attention features for MLP-Attn.

        `context_inputs` (a training set) recomputes `C` on the fly and differentiably, e.g. for an
        attack that sees its own effect on the context.
        """
        if self.spec.kind == "relu":
            return x
        if context_inputs is None:
            ctx = self.context
            mean = self.context_mean if self.spec.attn_centre else None
        else:
            ctx = attention_context(context_inputs, self.spec.attn_rank, self.spec.attn_centre)
            mean = context_inputs.mean(dim=0) if self.spec.attn_centre else None
        return attention_features(x if mean is None else x - mean, ctx, self.spec.attn_layers)

    def head(self, feats: torch.Tensor) -> torch.Tensor:
        """The trained part, `m^-1/2 A^T relu(W x~)`, on precomputed features `x~`."""
        return (torch.relu(feats @ self.W.T) @ self.A) / self.spec.width**0.5

    def forward(self, x: torch.Tensor, context_inputs: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.features(x, context_inputs))


def build_model(spec: ModelSpec, x_train: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                device: str = "cpu") -> TwoLayerNet:
    return TwoLayerNet(spec, x_train, dtype).to(device)


def save_model(model: TwoLayerNet, path: str | Path) -> tuple[Path, Path]:
    """Save weights as safetensors plus a JSON architecture spec beside it (`PATH.json`).

    The audit loads this pair without unpickling anything.
    """
    from safetensors.torch import save_file

    from empirics.records import atomic_write_bytes, atomic_write_text

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
