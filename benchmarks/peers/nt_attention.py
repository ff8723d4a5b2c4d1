"""Cross-check of the suite's attention kernels against neural-tangents, for the one case it covers in closed form.

neural-tangents' `GlobalSelfAttention` has an infinite-width kernel only with `linear_scaling=True` (keys and
queries tied, scores divided by the key width). With `attention_mechanism="IDENTITY"` and the training set as the
one sequence, its scores converge to `G / d` (`G = X X^T`), so the layer is the paper's linearized attention
`(G / d) X W_V / sqrt(d)` with random values, and its NNGP is `G^3 / d^3`: Thm 4.1's Gram-induced kernel.

Two steps, because the peer runs in its own environment (`.venv-peers`, see README.md beside this file):

    python benchmarks/peers/nt_attention.py prepare --out /tmp/nt_att.npz          # suite environment
    .venv-peers/bin/python benchmarks/peers/nt_attention.py check --inputs /tmp/nt_att.npz

`prepare` writes real MNIST inputs, the suite's closed form (`theory.gram`, Thm 4.1) and a Monte Carlo estimate
of the same kernel over initialisations of the finite layer (the estimator of `empirics.kernels.mc_reference`: the mean
over independent draws, with standard error std / sqrt(draws)). `check` imports nothing from the suite: it computes
neural-tangents' closed form and reports its agreement with both (exit code 1 if either check fails).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

#: Key/query width, value width and draws of the finite layer in the Monte Carlo estimate.
MC_KEY, MC_VAL, MC_DRAWS = 1024, 64, 32


def _finite_layer_nngp(X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw of the finite tied-key/query identity-attention layer's output Gram, averaged over its value
    channels: `(S V)(S V)^T / k_v` with `S = (X W)(X W)^T / (d k)` and `V = X W_V / sqrt(d)`."""
    n, d = X.shape
    Z = X @ rng.standard_normal((d, MC_KEY)) / np.sqrt(d)
    S = Z @ Z.T / MC_KEY
    V = X @ rng.standard_normal((d, MC_VAL)) / np.sqrt(d)
    out = S @ V
    return out @ out.T / MC_VAL


def prepare(out: str, n: int) -> None:
    """Suite side: inputs, the Thm 4.1 closed form and the Monte Carlo estimate (mean, standard error)."""
    from empirics.data.datasets import DataRequest, load_dataset
    from theory import gram

    X = load_dataset("mnist", n_train=n, n_test=1, request=DataRequest(sample="first")).x_train.astype(np.float64)
    d = X.shape[1]
    G = gram.gram(X)
    closed = G @ G @ G / d**3
    rng = np.random.default_rng(20260313)
    draws = np.stack([_finite_layer_nngp(X, rng) for _ in range(MC_DRAWS)])
    np.savez(out, x=X, closed=closed, mc_mean=draws.mean(axis=0),
             mc_se=draws.std(axis=0, ddof=1) / np.sqrt(MC_DRAWS))
    print(f"wrote {out}: n={n}, d={d}, Monte Carlo {MC_DRAWS} draws at key width {MC_KEY}")


def check(inputs: str) -> int:
    """Peer side: neural-tangents' closed-form NNGP of the same layer against the suite's numbers."""
    import jax

    jax.config.update("jax_enable_x64", True)
    from neural_tangents import stax

    z = np.load(inputs)
    X = z["x"]
    _, _, kernel_fn = stax.GlobalSelfAttention(
        n_chan_out=1, n_chan_key=1, n_chan_val=1, n_heads=1, linear_scaling=True,
        attention_mechanism="IDENTITY", W_key_std=1.0, W_query_std=1.0, W_value_std=1.0, W_out_std=1.0)
    nt = np.asarray(kernel_fn(X[None], None, "nngp")).reshape(X.shape[0], X.shape[0])
    closed, mean, se = z["closed"], z["mc_mean"], z["mc_se"]
    rel = float(np.abs(nt - closed).max() / np.abs(closed).max())
    zmax = float((np.abs(nt - mean) / np.maximum(se, 1e-300)).max())
    rel_mc = float(np.abs(nt - mean).max() / np.abs(nt).max())
    res: dict[str, Any] = {
        "neural_tangents_vs_thm41_closed_form_max_rel": rel, "closed_form_agrees": rel <= 1e-10,
        "neural_tangents_vs_suite_monte_carlo_max_z": zmax, "monte_carlo_max_rel": rel_mc,
        "monte_carlo_agrees": zmax <= 5.0,
        "note": "the finite layer's mean differs from the limit by O(1/key width); |z| <= 5 allows for it only "
                "while that bias stays below the Monte Carlo error"}
    print(json.dumps(res, indent=2))
    return 0 if res["closed_form_agrees"] and res["monte_carlo_agrees"] else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=24)
    c = sub.add_parser("check")
    c.add_argument("--inputs", required=True)
    args = ap.parse_args(argv)
    if args.step == "prepare":
        prepare(args.out, args.n)
        return 0
    return check(args.inputs)


if __name__ == "__main__":
    sys.exit(main())
