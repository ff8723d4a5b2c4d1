"""`verify claims --plan`: the units a run would compute, their configs and estimated times, without training.

Each unit is shown with what sizes its numbers (seeds, widths, n, epochs, protocol, preprocessing where its
config has one), whether the cache already holds it (with `--resume`), and its estimated seconds from the cost
model (`verify.costs`, networks shared within a group counted once, as the local executor runs them). The totals
are the estimated time one unit after another and the estimated wall time with the run's `--jobs` workers
(groups taken longest first). On a GPU (`--device cuda`, `verify.costs.gpu_prices`) the units are priced with the
GPU's constants, each unit's networks trained as one stack, and the wall time is the total: the workers share
one device. Units the claims read that the preset does not run (`not_run`, from
`verify.experiments.not_run_units`) are listed after the totals with the reason their rows give.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from verify import costs
from verify.runner import Cache, Unit


def _ranges(values: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out: list[str] = []
    vals = sorted(set(values))
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ",".join(out)


def summary(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a unit's config that size it (absent fields left out)."""
    tr = cfg.get("train") or {}
    seeds = cfg.get("seeds", [cfg["seed"]] if "seed" in cfg else None)
    widths = cfg.get("widths", [cfg["width"]] if "width" in cfg else None)
    out = {"seeds": seeds, "widths": widths, "n_train": cfg.get("n_train"), "n_test": cfg.get("n_test"),
           "ns": cfg.get("ns"), "epochs": tr.get("epochs"), "protocol": tr.get("protocol"),
           "preprocess": cfg.get("preprocess"), "dataset": cfg.get("dataset"),
           "models": cfg.get("models", [cfg["model"]] if "model" in cfg else None)}
    return {k: v for k, v in out.items() if v is not None}


def build(units: Sequence[Unit], cache: Cache | None, jobs: int, needed_by: Mapping[str, list[str]],
          prim: costs.Primitives = costs.CALIBRATED) -> dict[str, Any]:
    """The plan record: every unit in run order, cached ones marked (`cache` None: nothing is reused)."""
    cached = {u.name for u in units if cache is not None and cache.get(u) is not None}
    todo = [(u.name, u.config) for u in units if u.name not in cached]
    grouped = costs.longest_first(todo, prim)
    est: dict[str, costs.UnitCost] = {}
    group_of: dict[str, int] = {}
    cfgs = dict(todo)
    for i, (g, _) in enumerate(grouped, 1):
        est.update(costs.plan([(n, cfgs[n]) for n in g], prim))
        group_of.update(dict.fromkeys(g, i))
    rows = []
    for u in units:
        row: dict[str, Any] = {"unit": u.name, "cached": u.name in cached, "config": summary(u.config),
                               "claims": needed_by.get(u.name, [])}
        if u.name in est:
            c = est[u.name]
            row.update(estimated_s=c.total_s, group=group_of[u.name], networks=c.networks,
                       networks_reused=c.reused)
        rows.append(row)
    total = sum(c.total_s for c in est.values())
    stacked = bool(getattr(prim, "stacked", False))
    workers = 1 if stacked else jobs  # one GPU: the workers share it
    cut = costs.parts(grouped) if stacked else []
    return {"units": rows, "to_compute": len(todo), "cached": len(cached), "jobs": jobs,
            "estimated_total_s": total, "estimated_wall_s": costs.makespan([s for _, s in grouped], workers),
            "groups": len(grouped),
            "parts": [{"units": names, "estimated_s": sec, "fits": sec <= costs.PART_S} for names, sec in cut],
            "part_budget_s": costs.PART_S if stacked else None,
            "cost_model": {"constants": dict(getattr(prim, "c", {})),
                           "source": getattr(prim, "source", "") or costs.CALIBRATION_SOURCE,
                           "stacked": bool(getattr(prim, "stacked", False))}}


def _duration(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def text(plan: Mapping[str, Any]) -> str:
    """The plan as a table for the terminal."""
    w = max([len(r["unit"]) for r in plan["units"]] + [4])
    ww = max([len(",".join(str(x) for x in r["config"].get("widths") or [])) for r in plan["units"]] + [6])
    head = f"{'unit':<{w}} {'seeds':>5} {'seed ids':<9} {'protocol':<17} {'epochs':>6} {'n':>5} {'widths':<{ww}} " \
           f"{'prep':<7} {'estimate':>9}"
    lines = [head]
    for r in plan["units"]:
        c = r["config"]
        seeds = c.get("seeds") or []
        widths = ",".join(str(w) for w in c.get("widths") or []) or "-"
        est = "cached" if r["cached"] else _duration(r["estimated_s"])
        lines.append(f"{r['unit']:<{w}} {len(seeds) or '-':>5} {_ranges(seeds) or '-':<9} "
                     f"{c.get('protocol', '-'):<17} {c.get('epochs', '-'):>6} {c.get('n_train', '-'):>5} "
                     f"{widths:<{ww}} {c.get('preprocess', '-'):<7} {est:>9}")
    lines.append(f"{len(plan['units'])} units: {plan['to_compute']} to compute, {plan['cached']} cached; estimated "
                 f"{_duration(plan['estimated_total_s'])} one after another, {_duration(plan['estimated_wall_s'])} "
                 f"wall with --jobs {plan['jobs']} ({plan['groups']} groups of units sharing networks)"
                 + ("; priced for one GPU, each unit's networks trained as one stack (cost model: "
                    f"{plan['cost_model']['source']})" if plan.get("cost_model", {}).get("stacked") else ""))
    if plan.get("parts"):
        over = [p for p in plan["parts"] if not p["fits"]]
        lines.append(f"In {len(plan['parts'])} part(s) of at most {_duration(plan['part_budget_s'])} (one lent "
                     "session's device check, `benchmarks.gpu_check`; a part cut short keeps its finished units "
                     "cached for `--resume`, at the same code version): "
                     + "; ".join(f"{i} {_duration(p['estimated_s'])}" for i, p in enumerate(plan["parts"], 1))
                     + (f". {len(over)} part(s) are one group of units longer than a session: "
                        + ", ".join(p["units"][0] for p in over) if over else ""))
    by_reason: dict[str, list[str]] = {}
    for unit, why in plan.get("not_run", {}).items():  # units the claims read that this preset does not run
        by_reason.setdefault(why, []).append(unit)
    lines += [f"{', '.join(us)}: {why} (their rows say 'not measurable here')" for why, us in by_reason.items()]
    return "\n".join(lines)
