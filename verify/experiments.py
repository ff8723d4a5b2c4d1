"""The experiment units that `verify claims` needs, sized by a preset.

Each unit calls one experiment function of `theory` / `empirics` (the same ones the single
commands use) with plain, JSON-serialisable arguments, so that its config is its cache key.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from empirics.vocab import DATASETS
from ntkm.codec import encode
from verify.claims import units as names
from verify.presets import PresetSizes, n_train_for, preset
from verify.records import KappaRecord, TheoryRecord
from verify.runner import Unit, config_kwargs

if TYPE_CHECKING:
    from empirics.attribution.influence import RetrainRecord
    from empirics.experiments.distance import DistanceRecord
    from empirics.experiments.landscape import LandscapeRecord
    from empirics.experiments.malleability import MalleabilityRecord
    from empirics.experiments.retrain_flip import RetrainFlipRecord


def theory_unit(seed: int) -> TheoryRecord:
    from theory.checks import run_all_checks

    return TheoryRecord.from_dict({"checks": [asdict(c) for c in run_all_checks(seed=seed)]})


def kappa_unit(dataset: str, ns: list[int], sample: str, preprocess: str, eps: float,
               data_dir: str | None) -> KappaRecord:
    """kappa(G) against n; sizes that the available data cannot provide are recorded as such."""
    from empirics.data.datasets import DataRequest
    from empirics.experiments.kappa import kappa_rows
    from ntkm.errors import UserInputError

    rows, missing = [], []
    for n in ns:
        try:
            rows += kappa_rows(dataset, (n,), request=DataRequest(sample=sample, data_dir=data_dir),
                               preprocess=preprocess, eps=eps)
        except UserInputError as exc:
            missing.append({"n": n, "reason": str(exc)})
            if not rows and n == ns[-1]:
                raise  # no size could be loaded at all: a data problem, not a result (never cached)
    return KappaRecord.from_dict(encode({"dataset": dataset, "sample": sample, "preprocess": preprocess,
                                         "rows": rows, "missing": missing}))


def distance_unit(**kwargs: Any) -> DistanceRecord:
    from empirics.experiments.distance import DistanceConfig, run_ntk_distance

    return run_ntk_distance(DistanceConfig(**config_kwargs(kwargs)))


def malleability_unit(**kwargs: Any) -> MalleabilityRecord:
    from empirics.experiments.malleability import MalleabilityConfig, run_malleability

    return run_malleability(MalleabilityConfig(**config_kwargs(kwargs)))


def landscape_unit(**kwargs: Any) -> LandscapeRecord:
    from empirics.experiments.landscape import LandscapeConfig, run_landscape

    return run_landscape(LandscapeConfig(**config_kwargs(kwargs)))


def protocol_train(p: PresetSizes, protocol: str, dataset: str | None = None, preprocess: str = "raw"
                   ) -> dict[str, Any]:
    """The training config (as a dict) of claims protocol `protocol` (`verify.claims.base.CLAIMS_PROTOCOLS`) at
    preset `p`: the paper's setup for `paper_epochs`, or the width-consistent protocol up to `epochs` (its rate is the
    pilot's choice for `dataset` and the input `preprocess`, `empirics.nets.protocols.proper_lr`, at the protocol's
    exponent on the schedule axis where it names one)."""
    from empirics.nets.protocols import protocol_config
    from verify.claims.base import claims_protocol

    cp = claims_protocol(protocol)
    return asdict(protocol_config(cp.training, p[cp.epochs_key], dataset=dataset, preprocess=preprocess,
                                  lr_power=cp.lr_power))


def retrain_unit(train: dict[str, Any], **kwargs: Any) -> RetrainRecord:
    """The leave-one-out retraining check under the unit's protocol (`empirics.attribution.influence`)."""
    from empirics.attribution.influence import ProtocolRetrainConfig, protocol_retrain_study
    from empirics.nets.protocols import schedule_axis_power

    power = schedule_axis_power(train, kwargs.get("dataset", "mnist"), kwargs.get("preprocess", "raw"))
    return protocol_retrain_study(ProtocolRetrainConfig(protocol=train["protocol"], epochs=train["epochs"],
                                                        **({"lr_power": power} if power is not None else {}),
                                                        **kwargs))


def retrain_flip_unit(train: dict[str, Any], **kwargs: Any) -> RetrainFlipRecord:
    """The retrain-based flip study under the unit's protocol (`empirics.experiments.retrain_flip`)."""
    from empirics.experiments.retrain_flip import RetrainFlipConfig, retrain_flip_study
    from empirics.nets.protocols import schedule_axis_power

    power = schedule_axis_power(train, kwargs.get("dataset", "mnist"), kwargs.get("preprocess", "raw"))
    return retrain_flip_study(RetrainFlipConfig(protocol=train["protocol"], epochs=train["epochs"],
                                                **({"lr_power": power} if power is not None else {}),
                                                **config_kwargs(kwargs)))


def units_for(preset_name: str, data_dir: str | None = None, device: str | None = None,
              every_set: bool = False) -> dict[str, Unit]:
    """Every unit the claims registry may need at this preset, keyed by unit name. Units that train networks exist
    once per condition, claims protocol x the preset's input preprocessings, named `base@protocol` (raw pixels, whose
    config is as before the axis) or `base@protocol+preprocess` (with `preprocess` in its config; see
    `verify.claims.units.condition`). `device` (cpu, cuda),
    when given, goes into the config of every unit that trains networks (and so into its cache key). The
    retrain-based flip units exist for the data sets and tasks the preset runs (`retrain_flip_sets`; `every_set`:
    for all of them, at this preset's sizes; `not_run_units` names the others)."""
    from empirics.attribution.influence import RetrainRecord
    from empirics.experiments.distance import DistanceRecord
    from empirics.experiments.landscape import LandscapeRecord
    from empirics.experiments.malleability import MalleabilityRecord
    from empirics.experiments.retrain_flip import RetrainFlipRecord
    from empirics.nets.protocols import GD_MSE, protocol_config
    from verify.claims.base import PROTOCOLS
    from verify.claims.influence import control_unit_config, retrain_unit_configs
    from verify.claims.kappa import kappa_extra_units
    from verify.claims.landscape import landscape_unit_configs
    from verify.claims.malleability import malleability_unit_configs
    from verify.claims.retrain_flip import (
        CONTROL_PROTOCOL,
        RETRAIN_FLIP_SETS,
        companion_units,
        flip_control_unit_config,
        flip_retrain_unit_configs,
    )
    from verify.claims.variants import variant_unit_configs

    p = preset(preset_name)
    seeds = list(p["seeds"])
    units: dict[str, Unit] = {names.THEORY: Unit(names.THEORY, {"seed": 0}, theory_unit, TheoryRecord)}
    for ds in DATASETS:
        units[names.kappa(ds)] = Unit(names.kappa(ds), {
            "dataset": ds, "ns": list(p["kappa_ns"]), "sample": "first", "preprocess": "raw", "eps": 0.1,
            "data_dir": data_dir}, kappa_unit, KappaRecord)
    units.update(kappa_extra_units(p, data_dir))
    control = {**control_unit_config(p, data_dir), "train": asdict(protocol_config(GD_MSE, p["epochs"])),
               **({"device": device} if device else {})}
    units[names.INFLUENCE_CONTROL] = Unit(names.INFLUENCE_CONTROL, control, retrain_unit, RetrainRecord)
    empirical: dict[str, tuple[dict[str, Any], Any, Any]] = {}
    distance = (distance_unit, DistanceRecord)
    malleability = (malleability_unit, MalleabilityRecord)
    for ds in DATASETS:
        empirical[names.ntk_distance(ds)] = ({
            "dataset": ds, "widths": list(p["widths"]), "seeds": seeds, "n_train": n_train_for(p, ds),
            "n_test": p["n_test"], "data_dir": data_dir,
            **({} if p.get("ntk_gd_mse", True) else {"gd_mse": False})}, *distance)
    empirical.update({k: (v, *malleability) for k, v in malleability_unit_configs(p, data_dir).items()})
    empirical.update({k: (v, landscape_unit, LandscapeRecord) for k, v in landscape_unit_configs(p, data_dir).items()})
    empirical.update({k: (v, retrain_unit, RetrainRecord) for k, v in retrain_unit_configs(p, data_dir).items()})
    empirical.update({k: (v, retrain_flip_unit, RetrainFlipRecord)
                      for k, v in flip_retrain_unit_configs(p, data_dir, RETRAIN_FLIP_SETS if every_set else None,
                                                            True if every_set else None).items()})
    if every_set or companion_units(p):
        flip_control = {**flip_control_unit_config(p, data_dir),
                        "train": asdict(protocol_config(CONTROL_PROTOCOL, p["epochs"])),
                        **({"device": device} if device else {})}
        units[names.FLIP_RETRAIN_CONTROL] = Unit(names.FLIP_RETRAIN_CONTROL, flip_control, retrain_flip_unit,
                                                 RetrainFlipRecord)
    kinds = {"distance": distance, "malleability": malleability}
    empirical.update({k: (v, *kinds[kind]) for k, (kind, v) in variant_unit_configs(p, data_dir).items()})
    for protocol in p.get("protocols", PROTOCOLS):
        for pre in p["preprocessings"]:
            for base, (cfg, fn, record) in empirical.items():
                name = names.at(base, protocol, pre)
                train = protocol_train(p, protocol, cfg.get("dataset"), pre)
                units[name] = Unit(name, {**cfg, "train": train, **({"preprocess": pre} if pre != "raw" else {}),
                                          **({"device": device} if device else {})}, fn, record)
    return units


def _about(seconds: float) -> str:
    """'about 24 min' (hours from 90 minutes, seconds under a minute)."""
    if seconds >= 5400:
        return f"about {seconds / 3600:.1f} h"
    return f"about {round(seconds / 60)} min" if seconds >= 60 else f"about {max(1, round(seconds))} s"


def not_run_units(preset_name: str, data_dir: str | None = None, device: str | None = None) -> dict[str, str]:
    """The units of the registry that preset `preset_name` does not run (the retrain-based flip rows of the data sets
    and tasks outside its `retrain_flip_sets`), each with the reason its row gives: the presets that run it and what
    its row's units (both networks, one condition) would cost here, at this preset's sizes, by the cost model
    (`verify.costs.CALIBRATED`, seconds of one core)."""
    from verify import costs
    from verify.claims.base import PROTOCOLS
    from verify.claims.retrain_flip import RETRAIN_FLIP_SETS, companion_units, retrain_flip_sets, set_units
    from verify.presets import PRESET_NAMES, PRESETS

    p = preset(preset_name)
    every = units_for(preset_name, data_dir, device, every_set=True)
    out: dict[str, str] = {}
    if "runs" in p:  # a preset of selected units (gpu, powered): every other unit is not run, and says where it runs
        for name in every:
            if name.split("@")[0] not in p["runs"]:
                out[name] = (f"not run at preset {preset_name} ({p.get('runs_why', 'it runs selected units')}; this "
                             "row runs at quick, full and paper)")
    for key in RETRAIN_FLIP_SETS:
        if key in retrain_flip_sets(p):
            continue
        where = [n for n in PRESET_NAMES if key in retrain_flip_sets(PRESETS[n])]
        runs = f"runs at {', '.join(where[:-1])} and {where[-1]}" if len(where) > 1 else (
            f"runs at {where[0]}" if where else "no preset runs it")
        for protocol in p.get("protocols", PROTOCOLS):
            for pre in p["preprocessings"]:
                row = [names.at(u, protocol, pre) for u in set_units(key)]
                est = costs.plan([(u, every[u].config) for u in row])
                seconds = sum(c.total_s for c in est.values())
                reason = (f"not run at preset {preset_name} ({runs}; {_about(seconds)} of one core here by the cost "
                          "model)")
                out.update(dict.fromkeys(row, reason))
    if not companion_units(p):  # the powered design's ablation and positive control
        where = [n for n in PRESET_NAMES if companion_units(PRESETS[n])]
        reason = (f"not run at preset {preset_name} (the powered retrain-based flip design's companion; runs at "
                  f"{', '.join(where)})")
        out[names.FLIP_RETRAIN_CONTROL] = reason
        for protocol in p.get("protocols", PROTOCOLS):
            for pre in p["preprocessings"]:
                out[names.at(names.flip_retrain_fixed(), protocol, pre)] = reason
    return out
