"""Verdicts under float noise: which claims sit on a knife edge.

The same commit on the same machine gives the same numbers bit for bit (one thread, seeded everything); another
machine (another BLAS, another CPU) may differ in the last bits of every float. A verdict must not depend on those
bits. `knife_edges` re-runs every rule of a claims run on copies of its unit results in which each float `x`
became `x (1 + r u) + a v` (`u`, `v` random signs, one pair per distinct value; `r = TOLERANCE_REL`,
`a = TOLERANCE_ABS`), and
lists the claims whose verdict (under any protocol or condition) changes: those have a number within the
tolerance of a threshold of their rule. The unit results are the rules' inputs (per-seed and per-point values and
the intervals computed from them), so this perturbs what the rules read, not the rules. The design of a run is
the same on every machine and is not moved: the configuration blocks of the results (`CONFIG_KEYS`, e.g. a
training config with `weight_decay` 0.0) and every value that occurs in one of them wherever else it occurs (an
eps of 0.3 that a rule looks runs up by, a width). Moving them measures nothing, and a noisy 0.0 rebuilt into a
`TrainConfig` is a negative weight decay that the config rejects (before this, every quick run's check failed on
it and said only "(check failed)").

What it cannot see: decisions taken before a record is written (the adequacy gate's pass/fail is stored as a
boolean) and the amplification of float noise by training itself (a different last bit in epoch 1 can give a
different network after hundreds of epochs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ntkm.codec import Record, encode

#: Relative and absolute size of the float noise (and so the tolerance that numbers are stated to).
TOLERANCE_REL = 1e-6
TOLERANCE_ABS = 1e-9


@dataclass(frozen=True)
class Tolerance:
    """The float noise's relative and absolute size: `x -> x (1 + rel u) + abs_ v`."""

    rel: float = TOLERANCE_REL
    abs_: float = TOLERANCE_ABS


#: The stated tolerance (`TOLERANCE_REL`, `TOLERANCE_ABS`).
TOLERANCE = Tolerance()
#: Perturbed copies per check and the generator seed of their signs.
N_PERTURBATIONS = 4
SEED = 20_260_313
#: Keys whose value is a unit's configuration, not a measurement: copied unchanged.
CONFIG_KEYS = frozenset({"config", "unit_config"})


class FloatNoise:
    """One draw of float noise: `x -> x (1 + rel u) + abs_ v` with random signs `u`, `v` drawn once per distinct
    value, so equal numbers stay equal (an eps or a width that a rule looks rows up by still matches)."""

    def __init__(self, rng: np.random.Generator, rel: float = TOLERANCE_REL, abs_: float = TOLERANCE_ABS,
                 fixed: frozenset[float] = frozenset()):
        self.rng, self.rel, self.abs = rng, rel, abs_
        self.moved: dict[float, float] = {v: v for v in fixed}

    def __call__(self, obj: Any) -> Any:
        """A copy of the JSON-like `obj` with every finite float moved; integers, booleans, strings, non-finite
        values, configuration blocks (`CONFIG_KEYS`) and the `fixed` values unchanged."""
        if isinstance(obj, dict):
            return {k: v if k in CONFIG_KEYS else self(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self(v) for v in obj]
        if isinstance(obj, float) and np.isfinite(obj):
            if obj not in self.moved:
                u, v = self.rng.choice((-1.0, 1.0), size=2)
                self.moved[obj] = obj * (1.0 + self.rel * u) + self.abs * v
            return self.moved[obj]
        return obj

    def payload(self, payload: Any) -> Any:
        """A unit's result with this noise, of the same type (a typed record is rebuilt from its moved dict)."""
        if isinstance(payload, Record):
            return type(payload).from_dict(self(payload.to_dict()))
        return self(encode(payload))


def design_values(obj: Any, inside: bool = False) -> set[float]:
    """Every float inside a configuration block (`CONFIG_KEYS`) of the JSON-like `obj`."""
    if isinstance(obj, dict):
        return set().union(*(design_values(v, inside or k in CONFIG_KEYS) for k, v in obj.items()))
    if isinstance(obj, list):
        return set().union(*(design_values(v, inside) for v in obj))
    return {obj} if inside and isinstance(obj, float) else set()


def verdicts(row: dict[str, Any], path: str = "") -> Iterator[tuple[str, str]]:
    """Every (where, verdict) in a claims row: the headline and each protocol's or condition's."""
    for k, v in row.items():
        if k == "verdict" and isinstance(v, str):
            yield path or "headline", v
        elif isinstance(v, dict):
            yield from verdicts(v, f"{path}/{k}" if path else k)


def knife_edges(evaluate: Callable[[dict[str, Any]], list[dict[str, Any]]], results: dict[str, Any],
                rows: list[dict[str, Any]], n: int = N_PERTURBATIONS, tolerance: Tolerance = TOLERANCE,
                seed: int = SEED) -> list[dict[str, Any]]:
    """The claims whose verdict moves under float noise: `evaluate(results)` gives the claims rows (in `rows`'s
    order) for a results mapping; each of `n` perturbed copies of `results` (noise of size `tolerance`) is evaluated
    and compared with `rows`. One entry per claim and place, with every verdict seen there."""
    rng = np.random.default_rng(seed)
    fixed = frozenset(set().union(*(design_values(p.to_dict() if isinstance(p, Record) else encode(p))
                                    for p in results.values())))
    base = {r["id"]: dict(verdicts(r)) for r in rows}
    seen: dict[tuple[str, str], set[str]] = {}
    failures: list[dict[str, Any]] = []
    for _ in range(n):
        noise = FloatNoise(rng, tolerance.rel, tolerance.abs_, fixed)
        try:  # the check must never cost a finished run: a rule that fails on noisy input is reported instead
            noisy_rows = evaluate({name: noise.payload(p) for name, p in results.items()})
        except Exception as exc:  # noqa: BLE001 - any failure of any rule is reported the same way
            failures = [{"claim": "(check failed)", "where": type(exc).__name__, "verdicts": [str(exc)[:200]]}]
            break
        for r in noisy_rows:
            for where, v in verdicts(r):
                ref = base.get(r["id"], {}).get(where)
                if ref is not None and v != ref:
                    seen.setdefault((r["id"], where), {ref}).add(v)
    return [{"claim": c, "where": w, "verdicts": sorted(vs)} for (c, w), vs in sorted(seen.items())] + failures


def reproducibility_block(edges: list[dict[str, Any]], n: int = N_PERTURBATIONS) -> dict[str, Any]:
    """The `reproducibility` block of a claims.json: the stated tolerance and the knife-edge claims."""
    return {"tolerance_rel": TOLERANCE_REL, "tolerance_abs": TOLERANCE_ABS, "perturbations": n,
            "method": f"every float x of every unit result replaced by x(1 + {TOLERANCE_REL:g} u) + "
                      f"{TOLERANCE_ABS:g} v (u, v random signs, numpy default_rng({SEED})), every rule re-run "
                      f"{n} times; a claim whose verdict moves has a number within that tolerance of a threshold",
            "knife_edge": edges}
