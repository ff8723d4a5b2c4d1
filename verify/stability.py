"""Seed stability of every verdict: leave-one-seed-out verdicts and the seed bootstrap.

A verdict rests on a handful of seeds (10 at quick): one seed can decide it. `stability` re-runs every claim's rule
on copies of the unit results in which the seeds were (a) dropped one at a time (leave-one-seed-out) and (b) drawn
with replacement, as many as there were (`N_RESAMPLES` draws of the seed bootstrap, numpy `default_rng(SEED)`), and
reports per claim which single-seed drops change its verdict and the share of bootstrap draws that give the same
verdict. A verdict is **fragile** when a leave-one-out changes it or its bootstrap agreement is below
`FRAGILE_AGREEMENT` (the constants below are part of the pre-registration, `verify.preregistration`).

Resampling is done per record layout (`LAYOUTS`, keyed by the unit's record class): each layout knows where the
seeds are in its record (the per-seed runs, the per-seed rows, the retrain seeds' columns) and returns the record with
those per-seed values taken in the drawn order and every summary the rules read recomputed by the code that produced
it (`empirics.experiments.mall_stats.summarise`, `empirics.experiments.landscape.landscape_verdict`, the
distance sweep's spreads, trends and slope intervals, `empirics.experiments.retrain_flip.effect_flips`). A seed
drawn twice is two replicates: its second
copy gets a fresh label (the largest seed + 1, ...), so nothing that groups by seed merges them. Records without seeds
(`NO_SEEDS`: theory checks, kappa per n, one retrained network's influence check) are held fixed; a claim that reads no
seeded record says "not computable" and why, never a default.

The units that share a seed axis (the same layout axis and the same seed labels: the data seeds of every
experiment, or the retrain seeds of the retrain-based flip rows) are resampled with one draw, so a claim that reads
several of them (MNIST and CIFAR-10, two networks, a gate) sees one consistent set of seeds. Leave-one-out drops each
seed of each axis in turn (the other axes unchanged). Before any resample, every rule is re-run with every seed once
(the identity draw): a claim whose verdict that does not reproduce is "not computable" (the resampler does not
describe its record), so a stability figure is never one of a record the rules read differently.

`python -m verify.stability CLAIMS.json` computes the same for a saved claims.json, without rerunning any experiment
(claims.json drops the per-example records of the malleability runs; their flip rates are rebuilt as the
sufficient statistic the summary reads: `flip_rate * n_selected` flipped points).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from ntkm.codec import Record, decode, encode

#: A verdict is fragile when its bootstrap agreement is below this share, or when a leave-one-out changes it.
FRAGILE_AGREEMENT = 0.8
#: Seed bootstrap draws per run, and the seed of their generator.
N_RESAMPLES = 1000
SEED = 20_260_401
#: The rule as the pre-registration records it (`verify.preregistration.registered_parts`).
RULE = (f"seed stability: every rule re-run with each seed left out in turn and on {N_RESAMPLES} seed bootstrap "
        f"resamples (seeds drawn with replacement, as many as there were, numpy default_rng({SEED})); a verdict is "
        f"'fragile' when a leave-one-out changes it or fewer than {FRAGILE_AGREEMENT:g} of the resamples give it")

#: A record layout's resampler: (record dict, positions into its seed list (with repeats), the labels of the drawn
#: seeds) -> the record dict with its per-seed values in the drawn order and its summaries recomputed.
Resample = Callable[[dict[str, Any], Sequence[int], Sequence[int]], dict[str, Any]]


class NotComputable(Exception):
    """A record whose per-seed values cannot be resampled (the message says why)."""


@dataclass(frozen=True)
class Layout:
    """Where the seeds are in one record type: `seeds` lists them (in the order positions index), `resample` takes
    positions and labels, `axis` names what a seed is there (units with the same axis and seeds share a draw)."""

    seeds: Callable[[dict[str, Any]], list[int]]
    resample: Resample
    axis: str = "data seed"
    #: The record dict as every resample starts from it (work that does not depend on the draw, done once).
    prepare: Callable[[dict[str, Any]], dict[str, Any]] = lambda rec: rec


def labels(seeds: Sequence[int], positions: Sequence[int]) -> list[int]:
    """The labels of the drawn seeds: a seed's own on its first draw, a fresh one (above every seed) on a repeat."""
    fresh = max(seeds) + 1 if seeds else 0
    out: list[int] = []
    for p in positions:
        s = seeds[p]
        if s in out:
            s, fresh = fresh, fresh + 1
        out.append(s)
    return out


def pick(items: list[dict[str, Any]], seeds: Sequence[int], positions: Sequence[int], labs: Sequence[int],
         key: str = "seed") -> list[dict[str, Any]]:
    """The per-seed `items` (dicts with a `key` seed) of the drawn seeds, in the drawn order, relabelled."""
    by: dict[int, list[dict[str, Any]]] = {}
    for it in items:
        by.setdefault(it[key], []).append(it)
    return [{**it, key: lab} for p, lab in zip(positions, labs, strict=True) for it in by.get(seeds[p], [])]


# ---- the layouts ---------------------------------------------------------------------------------------------------

def _run_seeds(runs: Iterable[dict[str, Any]]) -> list[int]:
    return sorted({int(r["seed"]) for r in runs})


def distance_seeds(rec: dict[str, Any]) -> list[int]:
    return _run_seeds(r for m in rec["models"].values() for r in m["runs"])


def resample_distance(rec: dict[str, Any], positions: Sequence[int], labs: Sequence[int]) -> dict[str, Any]:
    """An NTK-distance record (`empirics.experiments.distance.run_ntk_distance`): each model's runs (one per width and
    seed) of the drawn seeds, and its per-width spreads, trends (with `seeds_agreeing`) and slope intervals recomputed
    as `run_ntk_distance` computes them; the reference kernels per seed taken with them. `ntk_predictor_norm` (a mean of
    per-seed norms the record does not keep, read by no rule) is left as it was."""
    from empirics.common import spread
    from empirics.experiments.distance import METRICS, slope_interval, trend
    from ntkm import tables

    seeds = distance_seeds(rec)
    widths = list(rec["config"]["widths"])
    models = {}
    for kind, m in rec["models"].items():
        rk = pick(m["runs"], seeds, positions, labs)
        per_width = {str(w): {k: spread([r[k] for r in rk if r["width"] == w])
                              for k in METRICS + ("train_acc", "test_acc", "epochs_run", "rel_weight_change")}
                     for w in widths}
        trends = {}
        for metric in METRICS:
            tr = trend(widths, [tables.at_width(per_width, w, metric)["mean"] for w in widths])
            seed_verdicts = [_seed_trend(widths, [r[metric] for r in rk if r["seed"] == s]) for s in labs]
            tr["seeds_agreeing"] = sum(v == tr["verdict"] for v in seed_verdicts)
            tr["seeds"] = len(labs)
            tr["slope_interval"] = slope_interval(widths, rk, metric)
            trends[metric] = tr
        ref = m["reference"]
        models[kind] = {**m, "runs": rk, "per_width": encode(per_width), "trends": encode(trends),
                        "reference": [ref[p] for p in positions] if len(ref) == len(seeds) else ref,
                        "ntk_predictor_test_acc": encode(spread([r["ntk_predictor_test_acc"] for r in rk]))}
    return {**rec, "models": models, "config": {**rec["config"], "seeds": list(labs)}}


#: One seed's own trend verdict (`empirics.experiments.distance.trend`) by its widths and values: a seed's values do not
#: change when it is drawn, so each is computed once per process.
_SEED_TRENDS: dict[tuple[tuple[int, ...], tuple[float, ...]], str] = {}


def _seed_trend(widths: list[int], values: list[float]) -> str:
    from empirics.experiments.distance import trend

    key = (tuple(widths), tuple(values))
    if key not in _SEED_TRENDS:
        _SEED_TRENDS[key] = trend(widths, values)["verdict"]
    return _SEED_TRENDS[key]


def malleability_seeds(rec: dict[str, Any]) -> list[int]:
    return _run_seeds(rec["runs"])


def with_examples(run: dict[str, Any]) -> dict[str, Any]:
    """A malleability run whose flip measurements lack their per-example records (claims.json drops them) with the
    records the summary reads rebuilt from the sufficient statistic it keeps: `flip_rate * n_selected` of the
    selected points flipped (which ones is not kept; `empirics.experiments.mall_stats` reads only their mean per
    seed)."""
    ms = []
    for m in run["measurements"]:
        if "flip_rate" in m and "examples" not in m:
            n = int(m["n_selected"])
            sel = run.get("selected")
            k = m["flip_rate"] * n
            if sel is None or len(sel) != n or not math.isclose(k, round(k), abs_tol=1e-9):
                raise NotComputable(f"run {run.get('model')} seed {run.get('seed')}: its per-example flips are not "
                                    "in the record and cannot be rebuilt from its flip rate")
            m = {**m, "examples": [{"index": int(i), "flipped": j < round(k)} for j, i in enumerate(sel)]}
        ms.append(m)
    return {**run, "measurements": ms}


def malleability_prepared(rec: dict[str, Any]) -> dict[str, Any]:
    """A malleability record whose runs have their per-example flip records (`with_examples`), rebuilt once."""
    return {**rec, "runs": [with_examples(r) for r in rec["runs"]]}


def resample_malleability(rec: dict[str, Any], positions: Sequence[int], labs: Sequence[int]) -> dict[str, Any]:
    """A malleability record (`empirics.experiments.malleability.run_malleability`): the runs of the drawn seeds (every
    model and training) and the summary recomputed by `empirics.experiments.mall_stats.summarise`."""
    from empirics.experiments.mall_stats import summarise
    from empirics.experiments.malleability import MalleabilityConfig
    from verify.runner import config_kwargs

    seeds = malleability_seeds(rec)
    runs = [with_examples(r) for r in pick(rec["runs"], seeds, positions, labs)]
    config = {**rec["config"], "seeds": list(labs)}
    summary = summarise(runs, MalleabilityConfig(**config_kwargs(config)))
    return {**rec, "runs": runs, "config": config, "summary": summary}


def landscape_seeds(rec: dict[str, Any]) -> list[int]:
    return _run_seeds(r for m in rec["models"].values() for r in m["runs"])


def resample_landscape(rec: dict[str, Any], positions: Sequence[int], labs: Sequence[int]) -> dict[str, Any]:
    """A landscape record (`empirics.experiments.landscape.run_landscape`): each model's runs of the drawn seeds, their
    spreads and the experiment's own judgement (`landscape_verdict`) recomputed."""
    from empirics.common import spread
    from empirics.experiments.landscape import SUMMARY_METRICS, landscape_verdict

    seeds = landscape_seeds(rec)
    models = {}
    for kind, m in rec["models"].items():
        rk = pick(m["runs"], seeds, positions, labs)
        models[kind] = {"runs": rk, "summary": {k: spread([r[k] for r in rk]) for k in SUMMARY_METRICS}}
    return {**rec, "models": {k: {**m, "summary": encode(m["summary"])} for k, m in models.items()},
            "verdict": encode(landscape_verdict({"models": models})), "config": {**rec["config"], "seeds": list(labs)}}


def binary_kappa_seeds(rec: dict[str, Any]) -> list[int]:
    return sorted(int(s) for s in rec["seeds"])


def resample_binary_kappa(rec: dict[str, Any], positions: Sequence[int], labs: Sequence[int]) -> dict[str, Any]:
    """A binary-kappa record (`empirics.experiments.premise.binary_kappa_unit`): the rows (per data set, n and seed) of
    the drawn seeds; the rule computes its geometric means from them."""
    seeds = binary_kappa_seeds(rec)
    blocks: dict[tuple[Any, Any], list[dict[str, Any]]] = {}  # rows per (data set, n), in the record's order
    for r in rec["rows"]:
        blocks.setdefault((r["dataset"], r["n"]), []).append(r)
    return {**rec, "rows": [r for rows in blocks.values() for r in pick(rows, seeds, positions, labs)],
            "seeds": list(labs)}


def retrain_flip_seeds(rec: dict[str, Any]) -> list[int]:
    return [int(s) for s in rec["config"]["seeds"]]


def resample_retrain_flip(rec: dict[str, Any], positions: Sequence[int], labs: Sequence[int]) -> dict[str, Any]:
    """A retrain-based flip record (`empirics.experiments.retrain_flip.retrain_flip_study`): the retrain seeds' columns
    of every effect matrix (points x seeds) and their gates, and the flips, the seed-to-seed rate and the resolved
    points
    recomputed (`effect_flips`, `seed_flip_rate`, `resolved_points`, `halves_by_loss`). The NTK flip rates (no
    retrain) are kept."""
    from empirics.experiments.retrain_flip import effect_flips, halves_by_loss, resolved_points, seed_flip_rate

    seeds = retrain_flip_seeds(rec)
    effects = {sn: {ln: [[row[p] for p in positions] for row in m] for ln, m in by.items()}
               for sn, by in rec["effects"].items()}
    losses = ("training", "squared")
    flips = {name: {ln: effect_flips(np.array(effects["clean"][ln]), np.array(effects[name][ln])) for ln in losses}
             for name in rec["flips"]}
    return {**rec, "config": {**rec["config"], "seeds": list(labs)}, "effects": effects, "flips": encode(flips),
            "gates": pick(rec["gates"], seeds, positions, labs),
            "seed_flips": encode({ln: seed_flip_rate(np.array(effects["clean"][ln])) for ln in losses}),
            "resolved": encode({ln: resolved_points(np.array(effects["clean"][ln])) for ln in losses}),
            **({"null_halves": encode(halves_by_loss(effects["clean"]))} if "null_halves" in rec else {})}


#: Record class name -> where its seeds are and how to resample them.
LAYOUTS: dict[str, Layout] = {
    "DistanceRecord": Layout(distance_seeds, resample_distance),
    "MalleabilityRecord": Layout(malleability_seeds, resample_malleability, prepare=malleability_prepared),
    "LandscapeRecord": Layout(landscape_seeds, resample_landscape),
    "BinaryKappaRecord": Layout(binary_kappa_seeds, resample_binary_kappa),
    "RetrainFlipRecord": Layout(retrain_flip_seeds, resample_retrain_flip, axis="retrain seed"),
}
#: Record class name -> why its record has no seeds to resample (held fixed in every resample).
NO_SEEDS: dict[str, str] = {
    "TheoryRecord": "theory checks (no seeds)",
    "KappaRecord": "kappa(G) per n of one sample (no seeds)",
    "PremiseRecord": "kappa of one sample per n and width (no seeds)",
    "RetrainRecord": "one network's influence against its retraining, replicated over removed points, not seeds",
}


# ---- resampling a run's results --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Axis:
    """The units that share one seed axis (one draw): the axis name and its seeds."""

    name: str
    seeds: tuple[int, ...]
    units: tuple[str, ...]

    def describe(self) -> str:
        return f"{len(self.seeds)} {self.name}s ({', '.join(self.units)})"


def _as_dict(payload: Any) -> dict[str, Any]:
    """A unit result as a plain dict with floats (NaN and infinities as numbers, as the producing code saw them)."""
    return decode(payload.to_dict() if isinstance(payload, Record) else encode(payload))


def _plain(payload: Any) -> dict[str, Any]:
    """A resampled unit's plain dict (`_as_dict`) as its layout's resamples start from it (`Layout.prepare`)."""
    return LAYOUTS[type(payload).__name__].prepare(_as_dict(payload))


def axes_of(results: dict[str, Any]) -> tuple[list[Axis], dict[str, str]]:
    """The seed axes of a run's results and, for every other unit, why it is held fixed."""
    groups: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    fixed: dict[str, str] = {}
    for name, payload in results.items():
        layout = LAYOUTS.get(type(payload).__name__)
        if isinstance(payload, dict) and "unavailable" in payload:
            fixed[name] = f"not measured: {payload['unavailable']}"
            continue
        if layout is None:
            fixed[name] = NO_SEEDS.get(type(payload).__name__, "no per-seed values (not a record the suite resamples)")
            continue
        try:
            seeds = tuple(layout.seeds(_as_dict(payload)))
        except (KeyError, TypeError) as exc:
            fixed[name] = f"its seeds cannot be found ({type(exc).__name__}: {exc})"
            continue
        if len(seeds) < 2:
            fixed[name] = f"{len(seeds)} {layout.axis} (nothing to resample)"
            continue
        groups.setdefault((layout.axis, seeds), []).append(name)
    return [Axis(a, s, tuple(u)) for (a, s), u in groups.items()], fixed


def resampled(results: dict[str, Any], axis: Axis, positions: Sequence[int],
              plain: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """`results` with the units of `axis` resampled at `positions` (typed records rebuilt), the rest as they are.
    `plain`: each unit's `_as_dict`, where the caller keeps them (they are computed here otherwise)."""
    labs = labels(axis.seeds, positions)
    out = dict(results)
    for name in axis.units:
        p = results[name]
        rec = plain[name] if plain is not None and name in plain else _plain(p)
        new = LAYOUTS[type(p).__name__].resample(rec, positions, labs)
        out[name] = typed(type(p), new) if isinstance(p, Record) else new
    return out


def _hollow(rec: Record) -> dict[str, Any]:
    """A stand-in of `rec`'s stored dict with every field empty (typed in no time; replaced after)."""
    out = {}
    for f in fields(rec):
        x = getattr(rec, f.name)
        out[f.name] = type(x)() if isinstance(x, (list, dict, str, int, float)) and not isinstance(x, bool) else x
    return out


def typed(cls: type[Record], new: dict[str, Any]) -> Record:
    """`cls.from_dict(new)`, faster: the per-seed run lists (`runs` at the top and in each of `models`), which are
    plain decoded values already, are set aside while the rest is typed and put back as they are."""
    models = new.get("models")
    slim = {**new}
    done = {k: v for k, v in new.items() if isinstance(v, Record)}  # typed already (a recomputed summary)
    for k, v in done.items():
        slim[k] = _hollow(v)
    top = slim.pop("runs", None)
    if top is not None:
        slim["runs"] = []
    inner: dict[str, Any] = {}
    if isinstance(models, dict) and all(isinstance(m, dict) and "runs" in m for m in models.values()):
        inner = {k: m["runs"] for k, m in models.items()}
        slim["models"] = {k: {**m, "runs": []} for k, m in models.items()}
    rec = cls.from_dict(slim)
    rec = replace(rec, **done) if done else rec
    if top is not None:
        rec = replace(rec, runs=top)
    if inner:
        rec = replace(rec, models={k: replace(m, runs=inner[k]) for k, m in rec.models.items()})
    return rec


# ---- stability per claim -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunConditions:
    """A run's preprocessings and claims protocols: the conditions its claims rows are evaluated under (`claim_row`)."""

    preprocessings: Sequence[str]
    protocols: Sequence[str]


@dataclass(frozen=True)
class Resampling:
    """The seed bootstrap: `n` resamples drawn by numpy `default_rng(seed)`."""

    n: int = N_RESAMPLES
    seed: int = SEED


#: The pre-registered bootstrap (`N_RESAMPLES`, `SEED`).
RESAMPLING = Resampling()


@dataclass(frozen=True)
class _Plan:
    """What `stability` works out before any resample: the seed axes and the units held fixed (with why), the unit
    results each claim reads, its verdict in the run (`base`), the claims with seed axes (`live`, each with its axes)
    and the blocks of those without (`out`)."""

    axes: list[Axis]
    fixed: dict[str, str]
    reads: dict[str, set[str]]
    base: dict[str, str]
    live: list[tuple[Any, list[Axis]]]
    out: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Resamples:
    """What every bootstrap draw starts from (sent once to each worker process): the seed axes drawn (`used`), the
    results with every seed once (`ident`) and each resampled unit's plain dict (`plain`)."""

    used: list[Axis]
    ident: dict[str, Any]
    plain: dict[str, dict[str, Any]]


def _read_units(claim: Any, preprocessings: Sequence[str], protocols: Sequence[str]) -> set[str]:
    from verify.claims import claim_units

    return set(claim_units(claim, preprocessings, protocols))


def stability(claims: Sequence[Any], results: dict[str, Any], conditions: RunConditions,
              rows: Sequence[dict[str, Any]] | None = None, resampling: Resampling = RESAMPLING,
              evaluate: Callable[[Any, dict[str, Any]], dict[str, Any]] | None = None,
              ) -> dict[str, dict[str, Any]]:
    """Per claim id, its `stability` block: leave-one-seed-out verdicts, bootstrap agreement over `resampling.n`
    resamples of every seed axis (one draw per axis and resample, `default_rng(resampling.seed)`), and `fragile`; or
    `computable: False` with the reason. `results`: the run's unit results (typed records, as the rules read them);
    `conditions`: the run's preprocessings and protocols; `rows`: the claims rows of the run (recomputed where not
    given); `evaluate(claim, results)`: a claims row (default `claim_row`)."""
    from verify.claims import claim_row

    pres, protos = tuple(conditions.preprocessings), tuple(conditions.protocols)
    row_of = evaluate or (lambda c, res: claim_row(c, res, pres, protos))
    axes, fixed = axes_of(results)
    reads = {c.id: _read_units(c, pres, protos) & results.keys() for c in claims}
    out: dict[str, dict[str, Any]] = {}
    live = []
    for c in claims:
        mine = [a for a in axes if reads[c.id] & set(a.units)]
        if not mine:
            why = "; ".join(sorted({fixed[u] for u in reads[c.id] if u in fixed})) or "it reads no unit result"
            out[c.id] = _not_computable(f"no per-seed values to resample ({why})")
        else:
            live.append((c, mine))
    base = {r["id"]: r["verdict"] for r in rows} if rows is not None else {c.id: row_of(c, results)["verdict"]
                                                                              for c, _ in live}

    from verify.claims import all_claims

    registry = {id(c) for c in all_claims()}  # a worker rebuilds its claims from the registry: only registered ones
    parallel = RunConditions(pres, protos) if evaluate is None and all(id(c) in registry for c, _ in live) else None
    plan = _Plan(axes, fixed, reads, base, live, out)
    with _memoised():
        return _stability(claims, results, row_of, plan, resampling, parallel)


@contextlib.contextmanager
def _memoised() -> Iterator[None]:
    """While resampling, two pure functions called thousands of times per resample memoised (the same floats,
    sooner): the Student quantile of `empirics.intervals` (of n and the level), and one seed's log-log slope in the
    distance sweep's slope intervals (of the widths and that seed's values, which a draw does not change)."""
    from empirics import intervals
    from empirics.experiments import distance

    original, slope = intervals._tq, distance.loglog_slope
    intervals._tq = functools.lru_cache(maxsize=None)(original)
    distance.loglog_slope = _memo_slope(slope)
    try:
        yield
    finally:
        intervals._tq, distance.loglog_slope = original, slope


def _memo_slope(slope: Callable[[Sequence[float], Sequence[float]], float]
                ) -> Callable[[Sequence[float], Sequence[float]], float]:
    """`slope(widths, values)` memoised on the floats of both (NaN values are compared by their bits)."""
    memo: dict[tuple[bytes, bytes], float] = {}

    def memoised(widths: Sequence[float], values: Sequence[float]) -> float:
        key = (np.asarray(widths, float).tobytes(), np.asarray(values, float).tobytes())
        if key not in memo:
            memo[key] = slope(widths, values)
        return memo[key]

    return memoised


def _stability(claims: Sequence[Any], results: dict[str, Any],
               row_of: Callable[[Any, dict[str, Any]], dict[str, Any]], plan: _Plan, resampling: Resampling,
               parallel: RunConditions | None = None) -> dict[str, dict[str, Any]]:
    axes, fixed, reads, base, live = plan.axes, plan.fixed, plan.reads, plan.base, plan.live
    out, n = dict(plan.out), resampling.n
    # identity: every seed once must reproduce the verdict, or the resampler does not describe the record
    try:
        plain = {u: _plain(results[u]) for a in axes for u in a.units}
        ident = results
        for a in axes:
            ident = resampled(ident, a, range(len(a.seeds)), plain)
        same = _verdicts(row_of, ident, live)
    except NotComputable as exc:
        return {**out, **{c.id: _not_computable(str(exc)) for c, _ in live}}
    ok = []
    for c, mine in live:
        if same[c.id] != base[c.id]:
            out[c.id] = _not_computable(f"the rule re-run on its resampled records with every seed once gives "
                                        f"'{same[c.id]}', not '{base[c.id]}'")
        else:
            ok.append((c, mine))
    loo: dict[str, list[dict[str, Any]]] = {c.id: [] for c, _ in ok}
    for a in axes:
        users = [(c, m) for c, m in ok if a in m]
        for drop, s in enumerate(a.seeds):
            got = _verdicts(row_of, resampled(ident, a, [p for p in range(len(a.seeds)) if p != drop], plain), users)
            for c, _ in users:
                if got[c.id] != base[c.id]:
                    loo[c.id].append({"seed": s, "axis": a.name, "verdict": got[c.id]})
    rng = np.random.default_rng(resampling.seed)
    used = [a for a in axes if any(a in m for _, m in ok)]
    draws = [[rng.integers(0, len(a.seeds), len(a.seeds)).tolist() for a in used] for _ in range(n)]
    counts: dict[str, Counter[str]] = {c.id: Counter() for c, _ in ok}
    for cid, got in _bootstrap_counts(draws, Resamples(used, ident, plain), row_of, ok, parallel).items():
        counts[cid].update(got)
    for c, mine in ok:
        agree = counts[c.id][base[c.id]] / n if n else float("nan")
        out[c.id] = {"computable": True, "verdict": base[c.id], "loo_changes": loo[c.id],
                     "loo_seeds": [x["seed"] for x in loo[c.id]], "bootstrap_agreement": agree, "resamples": n,
                     "bootstrap_verdicts": dict(counts[c.id].most_common()),
                     "fragile": bool(loo[c.id]) or agree < FRAGILE_AGREEMENT,
                     "axes": [a.describe() for a in mine],
                     "held_fixed": {u: fixed[u] for u in sorted(reads[c.id]) if u in fixed}}
    return {c.id: out[c.id] for c in claims}


#: Bootstrap draws per task of the worker processes (small, so that an interrupt ends them soon).
CHUNK = 25


def _count_draws(draws: Sequence[list[list[int]]], ctx: Resamples,
                 row_of: Callable[[Any, dict[str, Any]], dict[str, Any]],
                 ok: Sequence[tuple[Any, list[Axis]]]) -> dict[str, Counter[str]]:
    """The verdict counts of each claim of `ok` over `draws` (one seed draw per axis of `ctx.used` each)."""
    counts: dict[str, Counter[str]] = {c.id: Counter() for c, _ in ok}
    for draw in draws:
        res = ctx.ident
        for a, positions in zip(ctx.used, draw, strict=True):
            res = resampled(res, a, positions, ctx.plain)
        for cid, v in _verdicts(row_of, res, ok).items():
            counts[cid][v] += 1
    return counts


#: In a worker process: what `_init_worker` received (the claims rebuilt from the registry by id).
_WORKER: dict[str, Any] = {}


def _init_worker(ids: list[str], conditions: RunConditions, ctx: Resamples,
                 axes_of_claim: dict[str, list[int]]) -> None:
    from verify.claims import all_claims, claim_row

    pres, protos = conditions.preprocessings, conditions.protocols
    by_id = {c.id: c for c in all_claims()}
    _WORKER.update(ctx=ctx, row_of=lambda c, res: claim_row(c, res, pres, protos),
                   ok=[(by_id[i], [ctx.used[k] for k in axes_of_claim[i]]) for i in ids])


def _worker_chunk(draws: list[list[list[int]]]) -> dict[str, Counter[str]]:
    w = _WORKER
    with _memoised():
        return _count_draws(draws, w["ctx"], w["row_of"], w["ok"])


def _bootstrap_counts(draws: list[list[list[int]]], ctx: Resamples,
                      row_of: Callable[[Any, dict[str, Any]], dict[str, Any]], ok: list[tuple[Any, list[Axis]]],
                      parallel: RunConditions | None) -> dict[str, Counter[str]]:
    """The verdict counts over every draw: here, or, with `parallel` = the run's conditions under the default rule
    (`claim_row`), in spawned worker processes (as many as usable cores, at most 4), each counting chunks of draws
    drawn here in order, so the counts do not depend on how many workers ran. An interrupt ends the workers."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = min(4, cores, len(draws) // CHUNK)
    if parallel is None or workers < 2:
        return _count_draws(draws, ctx, row_of, ok)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ids = [c.id for c, _ in ok]
    axes_of_claim = {c.id: [ctx.used.index(a) for a in mine if a in ctx.used] for c, mine in ok}
    ex = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
                             initargs=(ids, parallel, ctx, axes_of_claim))
    total: dict[str, Counter[str]] = {i: Counter() for i in ids}
    try:
        for got in ex.map(_worker_chunk, [draws[i:i + CHUNK] for i in range(0, len(draws), CHUNK)]):
            for cid, counter in got.items():
                total[cid].update(counter)
    except BaseException:
        for proc in list(getattr(ex, "_processes", {}).values()):
            proc.terminate()
        ex.shutdown(wait=False, cancel_futures=True)
        raise
    ex.shutdown()
    return total


def _verdicts(row_of: Callable[[Any, dict[str, Any]], dict[str, Any]], res: dict[str, Any],
              which: Iterable[tuple[Any, list[Axis]]]) -> dict[str, str]:
    got = {}
    for c, _ in which:
        try:
            got[c.id] = row_of(c, res)["verdict"]
        except Exception as exc:  # noqa: BLE001 - a rule failing on a resample is counted, never a crash
            got[c.id] = f"(rule failed: {type(exc).__name__}: {str(exc)[:60]})"
    return got


def _not_computable(why: str) -> dict[str, Any]:
    return {"computable": False, "reason": f"not computable: {why}", "fragile": None}


def stability_block(n: int = N_RESAMPLES, wall_s: float | None = None) -> dict[str, Any]:
    """The `stability` block of a claims.json: the method and its thresholds (each row carries its own result)."""
    return {"method": RULE, "fragile_agreement": FRAGILE_AGREEMENT, "resamples": n, "seed": SEED,
            **({"wall_s": wall_s} if wall_s is not None else {})}


def label(st: dict[str, Any] | None) -> str:
    """The text printed beside a verdict: 'fragile' where fragile, else ''."""
    return "fragile" if st and st.get("fragile") else ""


def describe(st: dict[str, Any] | None) -> str:
    """One line of a row's stability, for the report."""
    if not st:
        return ""
    if not st.get("computable"):
        return st["reason"]
    loo = ", ".join(f"{x['axis']} {x['seed']} -> {x['verdict']}" for x in st["loo_changes"]) or "none"
    return (f"{'fragile' if st['fragile'] else 'stable'}: bootstrap agreement {st['bootstrap_agreement']:.2f} "
            f"({st['resamples']} seed resamples); leave-one-seed-out changes: {loo}")


# ---- from a saved claims.json ----------------------------------------------------------------------------------------

def results_from_record(record: dict[str, Any]) -> dict[str, Any]:
    """The unit results of a claims.json as the rules read them (typed records, by each unit's record type at the
    record's preset); a unit this version does not know stays a dict."""
    from verify.experiments import units_for
    from verify.runner import UnitResult

    units = units_for(record["preset"], None, None)
    out = {}
    for name, stored in record["results"].items():
        u = units.get(name)
        try:
            out[name] = UnitResult.from_dict(stored, u.record if u is not None else None).payload
        except (TypeError, KeyError, ValueError):
            out[name] = {k: v for k, v in stored.items()}
    return out


def from_record(record: dict[str, Any], n: int = N_RESAMPLES, seed: int = SEED,
                only: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """`stability` of a saved claims.json's claims (those named in `only`, else all), against its stored verdicts."""
    from verify.claims import all_claims
    from verify.claims.base import not_run
    from verify.experiments import not_run_units

    results = results_from_record(record)
    pres, protos = tuple(record["preprocessings"]), tuple(record["protocols"])
    for u, why in not_run_units(record["preset"], None, None).items():
        results.setdefault(u, not_run(why))
    rows = [r for r in record["claims"] if only is None or r["id"] in only]
    ids = {r["id"] for r in rows}
    claims = [c for c in all_claims() if c.id in ids]
    kept = [r for r in rows if r["id"] in {c.id for c in claims}]
    return stability(claims, results, RunConditions(pres, protos), kept, Resampling(n, seed))


def table(record: dict[str, Any], st: dict[str, dict[str, Any]]) -> str:
    """A text table: claim, verdict, leave-one-out changes, bootstrap agreement, fragile."""
    lines = [f"{'claim':<26} {'verdict':<20} {'LOO changes (seed -> verdict; r: retrain seed)':<50} "
             f"{'agreement':>9}  fragile"]
    for r in record["claims"]:
        s = st.get(r["id"])
        if s is None:
            continue
        if not s["computable"]:
            lines.append(f"{r['id']:<26} {r['verdict']:<20} {s['reason']}")
            continue
        loo = ", ".join(("" if x["axis"] == "data seed" else "r") + f"{x['seed']}->{_short(x['verdict'])}"
                        for x in s["loo_changes"]) or "-"
        lines.append(f"{r['id']:<26} {r['verdict']:<20} {loo:<50} {s['bootstrap_agreement']:>9.3f}  "
                     f"{'FRAGILE' if s['fragile'] else '-'}")
    return "\n".join(lines)


def _short(verdict: str) -> str:
    return {"inconclusive": "inc", "does not hold": "not", "not measurable here": "n/m", "partly": "partly",
            "holds": "holds", "underdetermined": "undet"}.get(verdict, verdict[:24])


def main(argv: Sequence[str] | None = None) -> int:
    from ntkm.codec import read_json

    ap = argparse.ArgumentParser(prog="python -m verify.stability", description=__doc__.splitlines()[0])
    ap.add_argument("record", help="a claims.json written by 'verify claims'")
    ap.add_argument("--resamples", type=int, default=N_RESAMPLES)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--only", help="comma-separated claim ids")
    ap.add_argument("--json", help="also write the per-claim stability as JSON to this file")
    args = ap.parse_args(argv)
    record = read_json(args.record)
    only = [s.strip() for s in args.only.split(",")] if args.only else None
    t0 = time.perf_counter()
    st = from_record(record, args.resamples, args.seed, only)
    print(table(record, st))
    print(f"({args.resamples} resamples, {time.perf_counter() - t0:.0f} s; fragile: a leave-one-out changes the "
          f"verdict or agreement < {FRAGILE_AGREEMENT:g})")
    if args.json:
        from ntkm.codec import write_json

        write_json(args.json, {**stability_block(args.resamples), "claims": st})
    return 0


if __name__ == "__main__":
    sys.exit(main())
