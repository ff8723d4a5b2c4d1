"""Presets: how big each experiment is.

- `smoke`: seconds; tiny n and widths; what CI runs end to end.
- `quick` (default): half an hour on a 2-core CPU; real MNIST / CIFAR-10 subsets (the bundled sample is
  enough when the full data is absent); 10 seeds, one condition (proper training on standardised inputs scaled to
  unit norm, `unit`).
- `replicate`: quick on ten other seeds (10-19: other data subsets, initialisations and batch orders), the
  independent replication of quick's verdicts (issue 40 item 1): its time is quick's.
- `axes`: quick, with proper training judged under both preprocessings (raw pixels and `unit`), so that every
  verdict that depends on the input preprocessing is named ("underdetermined (preprocessing)"): about twice quick
  (its `unit` units are quick's, so `--resume` over a quick run's cache computes only the raw ones).
- `schedule`: quick, with proper training judged under both learning-rate schedules of the schedule axis (the rate's
  exponent of decrease with width 1/2, quick's, and 1/4, protocol `proper-quarter`, each at its piloted anchor), so
  that every verdict that depends on the schedule is named ("underdetermined (schedule)", issue 40 item 3): about
  twice quick (its exponent-1/2 units are quick's, so `--resume` over a quick run's cache computes only the others).
- `powered`: the powered retrain-based flip study of MNIST 10 classes alone, in quick's condition (issue 40 item 5):
  n = 500, the top points the power simulation asks for (80), 10 retrain seeds, with the fixed-context ablation and
  the gd-mse positive control; every other row says it was not run here. Priced by `--plan` (days on a 2-core CPU; a
  GPU preset's work).
- `full`: quick's sizes and seeds under every condition (paper and proper protocols, proper at both schedules, x raw
  and standardised unit-norm inputs) and with the gd-mse estimand of the NTK rows: hours on a 2-core CPU (README,
  Presets).
- `paper`: the paper's reported scale (500 epochs, widths to 4096, larger n); meant for a GPU.
- `gpu`: the decisive experiments at the paper's scale, for one GPU: the NTK-distance sweeps (paper protocol and its
  gd-mse twins) at widths 16-4,096, n = 5,000 and 10 seeds on both data sets, the 10-class and binary flip units at
  n = 5,000, and the retrain-based flip rows, on raw and unit-norm inputs; every other row says it was not run at
  this preset (`runs`). Priced by `verify claims --preset gpu --plan` with the GPU's measured constants; longer
  than one lent session, it runs in parts: `--resume` continues from the cache (`benchmarks.gpu_check`).

Every experiment reads its sizes from here, so one table documents the scale of every number.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from ntkm.errors import UserInputError

PRESET_NAMES = ("smoke", "quick", "replicate", "axes", "schedule", "powered", "full", "paper", "gpu")


class PresetSizes(TypedDict):
    """The size table of one preset: every key an experiment may read, defined here once (a key that is
    not declared here is a type error for the checker, not a silent `KeyError` at run time)."""

    n_train: int
    n_test: int
    widths: tuple[int, ...]
    seeds: tuple[int, ...]
    epochs: int
    paper_epochs: int
    mall_width: int
    mall_n_train: int
    mall_n_test: int
    attack_steps: int
    adv_max_epochs: int
    landscape_points: int
    landscape_grid: int
    hessian_iters: int
    hutchinson_samples: int
    kappa_ns: tuple[int, ...]
    n_train_by_dataset: dict[str, int]
    preprocessings: tuple[str, ...]
    #: The claims protocols (`verify.claims.base.CLAIMS_PROTOCOLS`) `verify claims` judges every empirical claim under.
    protocols: tuple[str, ...]
    #: Whether each NTK-distance network also gets its gd-mse twin (the co-primary estimand of the NTK rows).
    ntk_gd_mse: bool
    #: Sweeps of the premise units (`verify.claims.kappa.kappa_extra_units`), where they differ from its defaults.
    premise_ns: NotRequired[tuple[int, ...]]
    premise_widths: NotRequired[tuple[int, ...]]
    binary_kappa_ns: NotRequired[tuple[int, ...]]
    #: Retrain seeds of the retrain-based flip units (`verify.claims.retrain_flip`), where not 3.
    retrain_seeds: NotRequired[int]
    #: The data sets and tasks (`DATASET:TASK`) whose retrain-based flip rows run, where not MNIST 10 classes alone
    #: (`verify.claims.retrain_flip.RETRAIN_FLIP_SETS`); the rows of the others say they were not run here.
    retrain_flip_sets: NotRequired[tuple[str, ...]]
    #: The retrain-based flip design (`verify.claims.retrain_flip.DESIGNS`), where not `small`: `powered` is sized by
    #: the power simulation and runs the fixed-context ablation and the gd-mse positive control beside (issue 40
    #: item 5).
    retrain_flip_design: NotRequired[str]
    #: The units (base names, before '@') the preset runs, where not every unit (`gpu`); the claims rows of the
    #: others say they were not run at this preset (`verify.experiments.not_run_units`).
    runs: NotRequired[tuple[str, ...]]
    #: Why a preset of selected units (`runs`) runs only those: the reason every other row prints.
    runs_why: NotRequired[str]
    #: Seed bootstrap draws of the seed-stability check (`verify.stability`), where not `N_RESAMPLES` (1,000).
    stability_resamples: NotRequired[int]


_QUICK: PresetSizes = {
    "n_train": 500, "n_test": 200, "widths": (16, 64, 256, 512), "seeds": tuple(range(10)), "epochs": 1000,
    "paper_epochs": 500, "mall_width": 512, "mall_n_train": 500, "mall_n_test": 200, "attack_steps": 10,
    "adv_max_epochs": 60, "landscape_points": 21, "landscape_grid": 11, "hessian_iters": 20,
    "hutchinson_samples": 10, "kappa_ns": (32, 50, 64, 100, 128, 200, 500, 1000, 2000),
    "n_train_by_dataset": {"cifar10": 250}, "preprocessings": ("unit",), "protocols": ("proper",),
    "ntk_gd_mse": False,
}

PRESETS: dict[str, PresetSizes] = {
    "smoke": {
        "n_train": 100, "n_test": 40, "widths": (16, 64, 256), "seeds": (0, 1), "epochs": 20, "paper_epochs": 20,
        "mall_width": 128, "mall_n_train": 100, "mall_n_test": 40, "attack_steps": 3, "adv_max_epochs": 5,
        "landscape_points": 5, "landscape_grid": 5, "hessian_iters": 5, "hutchinson_samples": 3,
        "kappa_ns": (50, 100, 200), "n_train_by_dataset": {}, "premise_ns": (16, 32), "premise_widths": (256,),
        "binary_kappa_ns": (32, 64), "preprocessings": ("raw",), "protocols": ("paper", "proper"),
        "ntk_gd_mse": True, "stability_resamples": 20,
    },
    "quick": _QUICK,
    "replicate": {**_QUICK, "seeds": tuple(range(10, 20))},
    "axes": {**_QUICK, "preprocessings": ("raw", "unit")},
    "schedule": {**_QUICK, "protocols": ("proper", "proper-quarter")},
    "powered": {**_QUICK, "retrain_flip_design": "powered", "retrain_seeds": 10,
                "runs": ("flip-retrain:relu", "flip-retrain:attn", "flip-retrain-fixed:attn", "flip-retrain-control"),
                "runs_why": "it runs the powered retrain-based flip study of MNIST 10 classes alone"},
    "full": {**_QUICK, "preprocessings": ("raw", "unit"), "protocols": ("paper", "proper", "proper-quarter"),
             "ntk_gd_mse": True,
             "adv_max_epochs": 100, "retrain_seeds": 10,
             "retrain_flip_sets": ("mnist:10class", "mnist:binary", "cifar10:10class")},
    "paper": {
        "n_train": 5000, "n_test": 1000, "widths": (16, 64, 256, 1024, 4096), "seeds": tuple(range(10)), "epochs": 1000,
        "paper_epochs": 500, "mall_width": 4096, "mall_n_train": 5000, "mall_n_test": 1000, "attack_steps": 40,
        "adv_max_epochs": 100, "landscape_points": 41, "landscape_grid": 21, "hessian_iters": 50,
        "hutchinson_samples": 30, "kappa_ns": (50, 100, 200, 500, 1000, 2000, 5000, 10000), "n_train_by_dataset": {},
        "preprocessings": ("raw", "unit"), "protocols": ("paper", "proper"), "ntk_gd_mse": True, "retrain_seeds": 10,
        "retrain_flip_sets": ("mnist:10class", "mnist:binary", "cifar10:10class"), "retrain_flip_design": "powered",
    },
}
PRESETS["gpu"] = {
    **PRESETS["paper"], "protocols": ("paper",), "preprocessings": ("raw", "unit"),
    "runs": ("theory", "ntk-distance:mnist", "ntk-distance:cifar10", "malleability:mnist:10class",
             "malleability:cifar10:10class", "malleability:mnist:binary", "malleability:cifar10:binary",
             "flip-retrain:relu", "flip-retrain:attn", "flip-retrain:mnist:binary:relu",
             "flip-retrain:mnist:binary:attn", "flip-retrain:cifar10:10class:relu",
             "flip-retrain:cifar10:10class:attn", "flip-retrain-fixed:attn", "flip-retrain-control"),
    "runs_why": "its units are the decisive GPU experiments",
}
#: What each preset key means (printed in the README's preset table).
PRESET_KEYS = {
    "epochs": "maximum epochs of the plateau-trained (width-consistent) protocol; fixed epochs in single commands "
              "with --protocol paper",
    "paper_epochs": "epochs of the paper's protocol (the paper reports 500)",
    "n_train_by_dataset": "training points per data set where it differs from n_train / mall_n_train (CIFAR-10 "
                          "inputs are 4x wider than MNIST's, so training costs 4x per point)",
    "adv_max_epochs": "maximum epochs of PGD adversarial training (each epoch costs about attack-steps + 1 normal "
                      "epochs); more than the gate's 50-epoch plateau window at quick (60, for its time budget), "
                      "full and paper (100), so the gate can pass",
    "preprocessings": "input preprocessings `verify claims` judges every empirical claim under, raw first (raw [0, 1] "
                      "pixels; unit: per-channel standardisation, then each input scaled to unit norm, inside the "
                      "model; channel, the standardisation alone, is available to the single commands); each is one "
                      "more run of every empirical unit per protocol",
    "protocols": "claims protocols every empirical claim is judged under (paper: the reported setup; proper: the "
                 "width-consistent protocol; proper-quarter: the same at lr exponent 1/4, the schedule axis); quick "
                 "judges proper only, schedule proper at both exponents, full all three, paper paper and proper",
    "retrain_seeds": "retrain seeds of the retrain-based flip rows (each point's actual effect is measured under every "
                     "seed, so that its seed-to-seed noise is known): 3 unless given (their cost grows linearly; "
                     "README, Presets)",
    "retrain_flip_sets": "data sets and tasks whose retrain-based flip rows run (MNIST 10 classes unless given; full "
                         "and paper add binary MNIST and CIFAR-10): a row whose units a preset does not run says so, "
                         "with their estimated cost, as 'not measurable here'",
    "retrain_flip_design": ("size of the retrain-based flip study: small (n = 100, the top 10 %, its power printed in "
                            "the row) unless given; powered at powered, paper and gpu (n = 500, the top points the "
                            "power simulation asks for, 10 retrain seeds, with the fixed-context ablation and the "
                            "gd-mse positive control beside)"),
    "runs": "the units the preset runs where not all (gpu: the decisive GPU experiments; powered: the powered "
            "retrain-based flip study); the others' rows say 'not measurable here: not run at preset gpu'",
    "runs_why": "why a preset of selected units runs only those, printed in every other row",
    "stability_resamples": "seed bootstrap draws of the seed-stability check of every verdict (verify.stability): "
                           "1,000 unless given; smoke, a test of the machinery with 2 seeds, draws 20",
    "ntk_gd_mse": "whether the NTK-distance sweeps also train every network under gd-mse (the co-primary estimand of "
                  "the NTK rows); off at quick for its time budget, on at full and paper",
}


def n_train_for(p: PresetSizes, dataset: str, key: str = "n_train") -> int:
    """Training-set size of `dataset` at preset `p` (`key` is n_train or mall_n_train)."""
    return int(p.get("n_train_by_dataset", {}).get(dataset, p[key]))


def preset(name: str) -> PresetSizes:
    """The size table of a preset (a copy)."""
    if name not in PRESETS:
        raise UserInputError(f"unknown preset '{name}'; choose one of {', '.join(PRESET_NAMES)}")
    return PresetSizes(**PRESETS[name])


def parse_int_list(text: str, what: str, minimum: int = 1) -> tuple[int, ...]:
    """'16,64,256' -> (16, 64, 256), with a one-line error naming `what` on bad input."""
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserInputError(f"{what} must be comma-separated integers, got '{text}'") from None
    if not vals or any(v < minimum for v in vals):
        raise UserInputError(f"{what} must be integers >= {minimum}, got '{text}'")
    return vals


def parse_float_list(text: str, what: str, lo: float = 0.0, hi: float = 1.0) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserInputError(f"{what} must be comma-separated numbers, got '{text}'") from None
    if not vals or any(not (lo <= v <= hi) for v in vals):
        raise UserInputError(f"{what} must be numbers in [{lo}, {hi}], got '{text}'")
    return vals


def parse_choices(text: str, what: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    vals = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in vals if v not in allowed]
    if not vals or bad:
        raise UserInputError(f"unknown {what} '{','.join(bad) or text}'; choose from {', '.join(allowed)}")
    return vals

