"""The audit record's types: `AuditRecord`, the JSON `verify audit --json` writes, as pydantic models.

Why: the record's readers (the `--fail-on` gate, the terminal and Markdown summaries, `verify audit diff`) read typed
attributes instead of `.get(` chains, a saved record is validated by the same types (`parse_record`: one-line
`UserInputError` naming the field), and `verify/schemas/audit.schema.json` is generated from them
(`python -m verify.audit.record --write-schema`), so the schema cannot drift from what is read.

Every model keeps the fields it does not name (`extra="allow"`): only what a reader relies on is typed; the large
free-form sections (diagnostics, the outcome panel, each network's sharpness and kernel, ...) stay dicts. Values are
checked strictly (no "20" for 20); non-finite numbers are stored as the strings "nan", "inf" and "-inf"
(`ntkm.codec`) and read as floats. A field later versions added has a default, so an older record is still read.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from empirics.records import RunHeader
from ntkm.codec import NONFINITE, encode
from ntkm.errors import UserInputError
from verify.audit.config import AUDIT_ATTACKS, PANELS, SCHEMA_VERSION
from verify.audit.risk import ALL_LEVELS
from verify.audit.validity import FRAGILE, INCONCLUSIVE, NOT_MEASURABLE, TRUSTWORTHY
from verify.audit.verdict_stability import KNIFE_EDGE, STABLE

#: Where the generated schema is committed (packaged with `verify`).
SCHEMA_FILE = Path(__file__).parents[1] / "schemas" / "audit.schema.json"
_NONFINITE_NAMES = list(NONFINITE)


def _stored_float(v: Any) -> Any:
    """A stored non-finite number ("nan", "inf", "-inf") as its float; anything else is left to the float check."""
    return NONFINITE[v] if isinstance(v, str) and v in NONFINITE else v


def _proportion(v: float) -> float:
    """A proportion lies in [0, 1], or is NaN (not measured)."""
    if not (math.isnan(v) or 0.0 <= v <= 1.0):
        raise ValueError(f"a proportion must lie in [0, 1] or be nan, got {v}")
    return v


#: A number as stored: finite, or one of the strings "nan", "inf", "-inf".
Num = Annotated[float, BeforeValidator(_stored_float),
                WithJsonSchema({"anyOf": [{"type": "number"}, {"enum": _NONFINITE_NAMES}]})]
#: A proportion as stored: in [0, 1], or "nan".
Proportion = Annotated[float, BeforeValidator(_stored_float), AfterValidator(_proportion),
                       WithJsonSchema({"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"const": "nan"}]})]
Attack = Literal[AUDIT_ATTACKS]  # type: ignore[valid-type]
Panel = Literal[PANELS]  # type: ignore[valid-type]
Level = Literal[ALL_LEVELS]  # type: ignore[valid-type]
Verdict = Literal[TRUSTWORTHY, FRAGILE, INCONCLUSIVE, NOT_MEASURABLE]


class Part(BaseModel):
    """Base of the record's sections: strict values, unnamed fields kept."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)


class AuditConfigRecord(Part):
    """`config`: the audit's settings (`verify.audit.config.AuditConfig`, every field stored)."""

    model: str
    train: str
    eps: float = Field(ge=0, le=1)
    tau: float = Field(ge=0, le=1)
    attacks: list[Attack] = Field(min_length=1)
    n: int = Field(ge=2)
    n_test: int = Field(ge=1)
    seed: int
    reference: bool
    panels: list[Panel]
    projection_dim: int | None = Field(default=None, ge=0)


class Projection(Part):
    """`model.projection`: how the kernel was projected (dim 0: the exact kernel) and its measured error."""

    dim: int = Field(ge=0)
    kind: str
    seed: int | None = None
    error: dict[str, Any] | None = None


class ModelInfo(Part):
    """`model`: the audited file, its format and how its kernel was computed."""

    path: str
    format: str
    sha256: str
    input_shape: list[Annotated[int, Field(ge=1)]]
    outputs: int = Field(ge=1)
    kernel_method: str
    projection: Projection | None = None


class DataInfo(Part):
    """`data`: the training and test points the audit used."""

    n_train: int = Field(ge=2)
    n_test: int = Field(ge=1)
    d: int = Field(ge=1)
    task: str


class AttackResult(Part):
    """One attack's result on a network: the flip rate of the attacked points and the rank correlation."""

    flip_rate: Proportion
    rho_all: Num


class Baseline(Part):
    """The random-noise baseline of the same size: its flip rates, their mean and spread."""

    flip_rates: list[Proportion]
    mean: Proportion
    std: Num


class Gate(Part):
    """The adequacy gate of a network (or the model gate): whether it passed, and why."""

    passed: bool


class Network(Part):
    """One audited network (`models.user`, or a reference): its flip rates, baseline and accuracies."""

    label: str
    parameters: int = Field(ge=1)
    n_selected: int = Field(ge=1)
    train_acc: Proportion | None = None
    test_acc: Proportion
    attacks: dict[str, AttackResult]
    baseline: Baseline
    worst_attack: Attack
    worst_flip_rate: Proportion
    worst_rho_all: Num
    influence_total: list[Num]
    gate: Gate | None = None


class Risk(Part):
    """`risk`: the level, the rule that issued it, and the numbers it compared."""

    level: Level
    reason: str | None = None
    flip_rate: Proportion
    noise_ceiling: Num
    low_ceiling: Num | None = None
    high_floor: Num | None = None
    relu_reference: Num
    attn_reference: Num
    left_out: list[str] = Field(default_factory=list)
    rule: str
    advice: list[str]


class LeverClass(Part):
    """One row of `lever_classes`: a class's share of the levers against its share of the training set."""

    label: int
    class_: str = Field(alias="class")
    levers: int
    helpful: int
    harmful: int
    share_of_levers: Num
    share_of_training: Num
    over: Num
    p: Num | None = None
    p_holm: Num | None = None
    beyond_chance: bool | None = None


class Attributions(Part):
    """`attributions`: the lead estimator's per-test influence, named here; the array is in the `.npz` (`file`)."""

    estimator: str
    shape: list[int]
    file: str | None = None


class Lever(Part):
    """One lever example: a top-|influence| training point, its role and the attacks that flipped it."""

    index: int = Field(ge=0)
    label: int = Field(ge=0)
    influence: Num
    role: Literal["helpful", "harmful"]
    flipped_by: list[Attack]


class Interval(Part):
    """An estimate with its 95 % interval."""

    value: Num
    lo: Num
    hi: Num


class LdsScore(Interval):
    """One estimator's LDS against the re-fits, and as a fraction of the noise ceiling (where measured)."""

    label: str | None = None
    fraction: Num | None = None
    fraction_lo: Num | None = None
    fraction_hi: Num | None = None
    fraction_level: Num | None = None


class VerdictStability(Part):
    """`panels.validity.stability`: whether the verdict survives reruns of its scoring and resamples of its subsets
    (`verify.audit.verdict_stability`)."""

    label: Literal[STABLE, KNIFE_EDGE]
    stable: bool
    agreement: Proportion
    resamples: int = Field(ge=1)
    text: str


class Validity(Part):
    """`panels.validity`: the estimators scored against re-fits, the lead estimator, the verdict and its
    stability (absent in records before 2026-12-06, and where the verdict is not measurable)."""

    verdict: Verdict
    lds: dict[str, LdsScore] = Field(default_factory=dict)
    lead: str | None = None
    best: str | None = None
    ceiling: Interval | None = None
    stability: VerdictStability | None = None

    @property
    def knife_edge(self) -> bool:
        """Whether the verdict is a knife-edge (a rerun or a resample reads otherwise)."""
        return self.stability is not None and not self.stability.stable


class BudgetStep(Part):
    """One budget of the budget curve: the attack's flip rate there and whether it breaks past random noise."""

    eps: Num
    flip_rate: Num
    breaks: Any


class Budget(Part):
    """`panels.budget`: the flip rate against the budget and the breaking budget."""

    breaking_eps: float | None = Field(default=None, ge=0)
    breaking_label: str
    by_eps: list[BudgetStep]


class Ranking(Part):
    """One ranking of the planted-poison self-test: its precision at k."""

    precision: Proportion


class Poison(Part):
    """`panels.poison`: the planted-poison self-test (precision at k of each ranking, against chance)."""

    verdict: str
    k: int | None = Field(default=None, ge=1)
    chance: Proportion | None = None
    headline: str | None = None
    rankings: dict[str, Ranking] | None = None


class Panels(Part):
    """`panels`: the panels that ran and each one's result (large free-form parts stay dicts)."""

    run: list[Panel]
    validity: Validity | None = None
    budget: Budget | None = None
    poison: Poison | None = None
    outcome: dict[str, Any] | None = None
    skipped: dict[str, Any] | None = None


class CodeVersion(Part):
    """`code`: the git commit of the suite that ran the audit, and whether its work tree had uncommitted changes
    (None where it did not run from a git checkout; absent in records before 2026-12-06)."""

    commit: str | None = None
    dirty: bool | None = None


class AuditRecord(RunHeader, Part):
    """The whole audit record (`verify.audit.pipeline.run_audit`): the run header (`RunHeader`: library versions
    and device, shared with the claims records) and the audit's sections."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True, title="verify audit record")

    experiment: Literal["audit"]
    schema_version: int | None = None
    created: str
    config: AuditConfigRecord
    model: ModelInfo
    data: DataInfo
    models: dict[str, Network]
    risk: Risk
    lever_classes: list[LeverClass] | None = None
    attributions: Attributions | None = None
    levers: list[Lever]
    panels: Panels = Field(default_factory=lambda: Panels(run=[]))
    diagnostics: dict[str, Any]
    definitions: dict[str, str]
    timings: dict[str, Annotated[float, Field(ge=0)]]
    code: CodeVersion | None = None

    @field_validator("models")
    @classmethod
    def _has_user(cls, v: dict[str, Network]) -> dict[str, Network]:
        """Every record holds the user's model (`models.user`)."""
        if "user" not in v:
            raise ValueError("missing 'user'")
        return v

    @property
    def user(self) -> Network:
        """The audited model's network (`models.user`)."""
        return self.models["user"]


def _where(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a path into the record (`$.models.user.worst_flip_rate`)."""
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


def record_errors(value: Any) -> list[str]:
    """Where a stored audit record breaks `AuditRecord` (empty when it conforms), one line each naming the field."""
    try:
        AuditRecord.model_validate(value)
    except ValidationError as exc:
        return [f"{_where(e['loc'])}: {'missing' if e['type'] == 'missing' else e['msg'].removeprefix('Value error, ')}"
                for e in exc.errors()]
    return []


def parse_record(value: AuditRecord | Mapping[str, Any], where: str = "audit record") -> AuditRecord:
    """An audit record, stored (JSON values) or live (`run_audit`'s dict: numpy values, floats), as an
    `AuditRecord`; a malformed one is a one-line `UserInputError` naming the first field that breaks it."""
    if isinstance(value, AuditRecord):
        return value
    stored = encode(value)
    errs = record_errors(stored)
    if errs:
        more = f" and {len(errs) - 1} more" if len(errs) > 1 else ""
        raise UserInputError(f"{where} is not an audit record this version reads ({errs[0]}{more})")
    return AuditRecord.model_validate(stored)


def generated_schema() -> dict[str, Any]:
    """The record's JSON Schema (Draft 2020-12), generated from `AuditRecord`."""
    schema = AuditRecord.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://github.com/ntk-malleability-suite/verify/schemas/audit.schema.json",
            **schema,
            "description": f"The JSON written by `verify audit --json` (schema_version {SCHEMA_VERSION}), generated "
                           "from verify.audit.record.AuditRecord (python -m verify.audit.record --write-schema). "
                           "Non-finite numbers are written as the strings \"nan\", \"inf\" and \"-inf\". Objects may "
                           "carry further fields; the ones listed are those a reader can rely on."}


def schema_text() -> str:
    """The generated schema as the committed file holds it."""
    return json.dumps(generated_schema(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    """`python -m verify.audit.record --write-schema`: regenerate the committed schema (else print it)."""
    parser = argparse.ArgumentParser(prog="python -m verify.audit.record", description=main.__doc__)
    parser.add_argument("--write-schema", action="store_true", help=f"write {SCHEMA_FILE}")
    args = parser.parse_args(argv)
    if args.write_schema:
        SCHEMA_FILE.write_text(schema_text())
    else:
        print(schema_text(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
