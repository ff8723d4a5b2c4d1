"""Which way MLP-Attn's context product `h C`, `C = X^T X` (X the n x d training inputs), is cheaper.

Through the d x d `C` a row costs d^2 multiply-adds; through the factor, `(h X^T) X`, 2 n d. `empirics.nets.models`
chooses by this rule and `verify.costs` prices the product by it; torch-free, so the cost model imports it
without torch.
"""

from __future__ import annotations


def factor_is_cheaper(n: int, d: int) -> bool:
    """Whether `(h X^T) X` costs fewer multiply-adds per row than `h C`: 2 n < d (CIFAR-10's d = 3072 at n = 500;
    MNIST's d = 784 only below n = 392)."""
    return 2 * n < d


def context_product_macs(n: int, d: int) -> int:
    """Multiply-adds per row of one context product the way `empirics.nets.models.TwoLayerNet` computes it."""
    return 2 * n * d if factor_is_cheaper(n, d) else d * d
