"""The experiment units that `verify claims` needs, sized by a preset.

Each unit calls one experiment function of `theory` / `empirics` (the same ones the single
commands use) with plain, JSON-serialisable arguments, so that its config is its cache key.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from verify.presets import preset
from verify.runner import Unit

DATASETS = ("mnist", "cifar10")


def theory_unit(seed: int) -> dict[str, Any]:
    from theory.checks import run_all_checks

    return {"checks": [asdict(c) for c in run_all_checks(seed=seed)]}


def kappa_unit(dataset: str, ns: list[int], sample: str, preprocessing: str, eps: float,
               data_dir: str | None) -> dict[str, Any]:
    """kappa(G) against n; sizes that the available data cannot provide are recorded as such."""
    from theory.errors import UserInputError
    from verify.commands.kappa import kappa_rows

    rows, missing = [], []
    for n in ns:
        try:
            rows += kappa_rows(dataset, (n,), sample=sample, preprocessing=preprocessing, eps=eps,
                               data_dir=data_dir)
        except UserInputError as exc:
            missing.append({"n": n, "reason": str(exc)})
    return {"dataset": dataset, "sample": sample, "preprocessing": preprocessing, "rows": rows,
            "missing": missing}


def distance_unit(dataset: str, widths: list[int], seeds: list[int], n_train: int, n_test: int,
                  epochs: int, data_dir: str | None) -> dict[str, Any]:
    from empirics.distance import DistanceConfig, run_ntk_distance
    from empirics.train import TrainConfig

    cfg = DistanceConfig(dataset=dataset, widths=tuple(widths), seeds=tuple(seeds), n_train=n_train,
                         n_test=n_test, train=TrainConfig(epochs=epochs), data_dir=data_dir)
    return run_ntk_distance(cfg)


def _typed(kwargs: dict[str, Any]) -> dict[str, Any]:
    """JSON-style unit config -> dataclass arguments (lists become tuples, `train` a TrainConfig)."""
    from empirics.train import TrainConfig

    out = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
    if isinstance(out.get("train"), dict):
        out["train"] = TrainConfig(**out["train"])
    return out


def malleability_unit(**kwargs: Any) -> dict[str, Any]:
    from empirics.malleability import MalleabilityConfig, run_malleability

    return run_malleability(MalleabilityConfig(**_typed(kwargs)))


def landscape_unit(**kwargs: Any) -> dict[str, Any]:
    from empirics.landscape import LandscapeConfig, run_landscape

    return run_landscape(LandscapeConfig(**_typed(kwargs)))


def units_for(preset_name: str, data_dir: str | None = None) -> dict[str, Unit]:
    """Every unit the claims registry may need, keyed by unit name."""
    p = preset(preset_name)
    seeds = list(p["seeds"])
    units: dict[str, Unit] = {"theory": Unit("theory", {"seed": 0}, theory_unit)}
    for ds in DATASETS:
        units[f"kappa:{ds}"] = Unit(f"kappa:{ds}", {
            "dataset": ds, "ns": list(p["kappa_ns"]), "sample": "first", "preprocessing": "raw", "eps": 0.1,
            "data_dir": data_dir}, kappa_unit)
        units[f"ntk-distance:{ds}"] = Unit(f"ntk-distance:{ds}", {
            "dataset": ds, "widths": list(p["widths"]), "seeds": seeds, "n_train": p["n_train"],
            "n_test": p["n_test"], "epochs": p["epochs"], "data_dir": data_dir}, distance_unit)
    units.update(malleability_units(p, data_dir))
    units.update(landscape_units(p, data_dir))
    return units


def malleability_units(p: dict[str, Any], data_dir: str | None) -> dict[str, Unit]:
    """Filled in by the malleability claims (see verify/claims.py)."""
    from verify.claims_mall import malleability_unit_configs

    return {name: Unit(name, cfg, malleability_unit) for name, cfg in malleability_unit_configs(p, data_dir).items()}


def landscape_units(p: dict[str, Any], data_dir: str | None) -> dict[str, Unit]:
    from verify.claims_landscape import landscape_unit_configs

    return {name: Unit(name, cfg, landscape_unit) for name, cfg in landscape_unit_configs(p, data_dir).items()}
