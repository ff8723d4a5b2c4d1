"""What the paper reports (arXiv:2603.13085 v1, and v2 where noted): the numbers our results are
compared against. They are reference values only — never used as, or in place of, a measurement.
Every line below names the paper, so a search for copied figures finds only this file.
"""

from __future__ import annotations

PAPER_DATASET_LABELS = {"mnist": "MNIST", "cifar10": "CIFAR-10"}  # paper's names of the data sets
PAPER_MODEL_NAMES = {"relu": "2L-ReLU", "attn": "MLP-Attn"}  # paper's names of its two networks

#: Condition numbers kappa(G) the paper states (n and preprocessing not stated by the paper).
PAPER_KAPPA = {"mnist": 1.2e3, "cifar10": 8.7e3}  # paper, Sec. 4.3
#: Widths the paper derives from them: v1 m = Omega(kappa^6/eps^2), v2 m = Omega(kappa_d^6 n log n).
PAPER_WIDTH_V1 = {"mnist": 1e18, "cifar10": 1e24}  # paper v1, Thm 4.7
PAPER_WIDTH_V2 = {"mnist": 1e24, "cifar10": 1e29}  # paper v2, Thm 4.7

#: Flip rates in percent, per (dataset, task) -> model -> attack (transformed intervention, eps = 0.3).
PAPER_FLIP: dict[tuple[str, str], dict[str, dict[str, float]]] = {
    ("mnist", "10class"): {"relu": {"fgsm": 4.1, "pgd": 3.3, "mim": 3.4},  # paper Table (10 classes)
                           "attn": {"fgsm": 34.6, "pgd": 28.9, "mim": 21.9}},  # paper Table (10 classes)
    ("cifar10", "10class"): {"relu": {"fgsm": 3.3, "pgd": 3.1, "mim": 3.2},  # paper Table (10 classes)
                             "attn": {"fgsm": 26.4, "pgd": 19.1, "mim": 20.5}},  # paper Table (10 classes)
    ("mnist", "binary"): {"relu": {"fgsm": 8.4, "pgd": 8.4, "mim": 8.6},  # paper Table (binary)
                          "attn": {"fgsm": 25.9, "pgd": 41.0, "mim": 40.5}},  # paper Table (binary)
    ("cifar10", "binary"): {"relu": {"fgsm": 15.2, "pgd": 15.5, "mim": 15.3},  # paper Table (binary)
                            "attn": {"fgsm": 14.3, "pgd": 14.0, "mim": 14.8}},  # paper Table (binary)
}

#: PGD flip rate in percent, standard -> adversarially trained, per (dataset, model).
PAPER_ADV: dict[tuple[str, str], tuple[float, float]] = {
    ("mnist", "relu"): (3.3, 43.4), ("cifar10", "relu"): (3.1, 36.5),  # paper Table (adversarial training)
    ("mnist", "attn"): (28.9, 42.2), ("cifar10", "attn"): (19.1, 38.6),  # paper Table (adversarial training)
}

#: The headline malleability gap, Attn/ReLU flip-rate ratio (v1 and v2).
PAPER_RATIO_V1 = (6.0, 9.0)  # paper v1 abstract: "6-9x"
PAPER_RATIO_V2 = (2.0, 9.0)  # paper v2: "2-9x"
#: The eps values over which the paper says the ranking holds.
PAPER_EPS_SWEEP = (0.1, 0.2, 0.3, 0.5)  # paper, robustness statement
#: Reference worst-case flip rates for an audit run with --no-reference (paper's 10-class flip rates at
#: eps = 0.3, rounded: 2L-ReLU 3-4 % -> 5 %, MLP-Attn 22-35 % -> 20 %, a conservative high threshold).
PAPER_AUDIT_REFERENCE = {"relu": 0.05, "attn": 0.20}  # derived from the paper's flip-rate tables
