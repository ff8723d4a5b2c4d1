"""L-infinity attacks in pixel units: FGSM, PGD (random start) and MIM (momentum iterative FGSM).

Each maximises the trained model's per-example loss at the example's own label and returns inputs
inside the eps-ball around the originals and inside the [0, 1] box. For MLP-Attn the attack can see
the attention context fixed at the clean training data (`context="fixed"`) or recomputed with the
perturbed points in it (`context="recomputed"`, which needs the training set and the indices of the
attacked points in it). `random` is the baseline: random signs times eps, same norm as FGSM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from empirics.nets.kinds import KINDS, kinds_where
from empirics.nets.losses import loss_fn
from empirics.vocab import ATTACKS
from ntkm.errors import UserInputError

CONTEXT_MODES = ("fixed", "recomputed")


@dataclass(frozen=True)
class AttackConfig:
    """`step_size=None` means 2.5 * eps / steps (Madry et al.); `decay` is MIM's momentum mu."""

    name: str
    eps: float
    steps: int = 10
    step_size: float | None = None
    decay: float = 1.0
    random_start: bool = True
    seed: int = 0
    context: str = "fixed"

    def __post_init__(self) -> None:
        if self.name not in ATTACKS:
            raise UserInputError(f"unknown attack '{self.name}'; choose from {', '.join(ATTACKS)}")
        if not (0.0 <= self.eps <= 1.0):
            raise UserInputError(f"eps must be in [0, 1] (pixel units), got {self.eps}")
        if self.steps < 1:
            raise UserInputError(f"attack steps must be >= 1, got {self.steps}")
        if self.context not in CONTEXT_MODES:
            raise UserInputError(f"unknown attack context '{self.context}'; choose fixed or recomputed")

    @property
    def alpha(self) -> float:
        return self.step_size if self.step_size is not None else 2.5 * self.eps / self.steps


def _project(x_adv: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.clamp(torch.min(torch.max(x_adv, x - eps), x + eps), 0.0, 1.0)


def attack(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: AttackConfig,
           train_x: torch.Tensor | None = None, train_idx: torch.Tensor | None = None) -> torch.Tensor:
    """Adversarial versions of `x` (same shape), within `cfg.eps` of `x` and within [0, 1]."""
    x = x.detach()
    if cfg.eps == 0.0:
        return x.clone()
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
    if cfg.name == "random":
        signs = torch.randint(0, 2, x.shape, generator=gen).to(x) * 2 - 1
        return torch.clamp(x + cfg.eps * signs, 0.0, 1.0)
    info = KINDS.get(getattr(getattr(model, "spec", None), "kind", None))  # None: not one of the suite's networks
    if cfg.context == "recomputed" and info is not None and info.has_context and not info.recomputed_context:
        raise UserInputError(f"a recomputed-context attack is not implemented for model '{info.name}' (only "
                             f"{', '.join(kinds_where(recomputed_context=True))}); use context fixed")
    recompute = cfg.context == "recomputed" and info is not None and info.recomputed_context
    if recompute and (train_x is None or train_idx is None):
        raise UserInputError("a recomputed-context attack needs the training set and the attacked indices")
    out_dim = None
    was_training = model.training
    model.eval()

    def grad_of_loss(x_adv: torch.Tensor) -> torch.Tensor:
        nonlocal out_dim
        with torch.enable_grad():  # also when called under torch.no_grad()
            x_adv = x_adv.detach().requires_grad_(True)
            if recompute:
                ctx = train_x.detach().index_copy(0, train_idx, x_adv)
                out = model(x_adv, context_inputs=ctx)
            else:
                out = model(x_adv)
            out_dim = out.shape[1]
            loss = loss_fn(out_dim)(out, y).sum()
            (g,) = torch.autograd.grad(loss, x_adv)
        return g

    if cfg.name == "fgsm":
        x_adv = _project(x + cfg.eps * grad_of_loss(x).sign(), x, cfg.eps)
    else:
        x_adv = x.clone()
        if cfg.name == "pgd" and cfg.random_start:
            noise = (torch.rand(x.shape, generator=gen) * 2 - 1).to(x) * cfg.eps
            x_adv = _project(x + noise, x, cfg.eps)
        momentum = torch.zeros_like(x)
        for _ in range(cfg.steps):
            g = grad_of_loss(x_adv)
            if cfg.name == "mim":
                dims = tuple(range(1, g.dim()))
                momentum = cfg.decay * momentum + g / g.abs().mean(dim=dims, keepdim=True).clamp_min(1e-30)
                g = momentum
            x_adv = _project(x_adv + cfg.alpha * g.sign(), x, cfg.eps)
    model.train(was_training)
    return x_adv.detach()
