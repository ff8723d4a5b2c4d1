"""Pre-registration: one digest of what decides a verdict before any number is seen, and the list of the changes
made to it after a recorded run.

The digest (`preregistration`) is a sha256 over the canonical JSON (`ntkm.codec.canonical`) of six parts: the
rule text of every claim of the registry (all of them, whatever `--only` selects, so a partial run carries the
same digest), the adequacy gate's text, the two claims protocols (description and training configuration at the
preset), the preset's sizes (the design: seeds, widths, points), the seed-stability rule (`verify.stability.RULE`:
its resamples and the 'fragile' threshold) and the deviations. Each part's own digest and
each rule's are recorded too, so two claims.json files show which part moved.

Deviations live in `docs/DEVIATIONS.md`, one fenced block per entry whose info string is `deviation`:

    ```deviation
    id: D3
    date: 2026-12-01
    commit: 83db447
    claims: ntk-relu-mnist, ntk-attn-mnist
    what: what changed
    why: why it changed
    verdicts_moved: which verdicts it moved (or why that is unknown)
    after_run: the recorded run it came after (optional)
    ```

One `key: value` per line; a line indented by at least two spaces continues the value above it. `claims` is a
comma-separated list of claim ids, `all` (every claim) or `empirical` (every
claim judged on trained networks); `commit` is a hash, or `this` for the commit that adds the entry.
Everything outside the fenced blocks is prose for people and is not parsed.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ntkm.codec import canonical
from ntkm.errors import UserInputError

#: The deviations file of this checkout (the repository root's docs/).
DEVIATIONS_FILE = Path(__file__).resolve().parents[1] / "docs" / "DEVIATIONS.md"
FENCE = "deviation"
REQUIRED = ("id", "date", "commit", "claims", "what", "why", "verdicts_moved")
OPTIONAL = ("after_run",)
ALL, EMPIRICAL = "all", "empirical"
METHOD = ("sha256 of the canonical JSON (sorted keys, no spaces) of {rules: claim id -> rule text, gate: gate text, "
          "protocols: name -> description and training configuration, design: the preset's sizes, stability: the "
          "seed-stability rule and its thresholds, multiplicity: the adjustment printed beside each verdict, "
          "deviations: the entries of docs/DEVIATIONS.md}")

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_COMMIT = re.compile(r"^([0-9a-f]{7,40}|this)(\.\.[0-9a-f]{7,40})?$")
_KEY = re.compile(r"^([a-z_]+):\s?(.*)$")


@dataclass(frozen=True)
class Deviation:
    """One change made after a recorded run (see the module docstring for the fields)."""

    id: str
    date: str
    commit: str
    claims: tuple[str, ...]
    what: str
    why: str
    verdicts_moved: str
    after_run: str = ""

    def touches(self, claim_id: str, empirical: bool = False) -> bool:
        """Whether this change touched the rule (or the design) of claim `claim_id` (`empirical`: a claim judged on
        trained networks)."""
        return ALL in self.claims or claim_id in self.claims or (empirical and EMPIRICAL in self.claims)


def _bad(source: str, line: int, problem: str) -> UserInputError:
    return UserInputError(f"{source}:{line}: {problem}; fix the entry (format: verify/preregistration.py)")


def _fields(lines: list[tuple[int, str]], source: str) -> dict[str, str]:
    """The `key: value` pairs of one block, continuation lines joined with a space."""
    out: dict[str, str] = {}
    key = ""
    for no, raw in lines:
        if not raw.strip():
            continue
        if raw.startswith("  ") and key:
            out[key] = f"{out[key]} {raw.strip()}".strip()
            continue
        m = _KEY.match(raw)
        if not m:
            raise _bad(source, no, f"expected 'key: value', got {raw.strip()[:40]!r}")
        key = m.group(1)
        if key not in REQUIRED + OPTIONAL:
            raise _bad(source, no, f"unknown field '{key}' (fields: {', '.join(REQUIRED + OPTIONAL)})")
        if key in out:
            raise _bad(source, no, f"field '{key}' given twice")
        out[key] = m.group(2).strip()
    return out


def _entry(fields: dict[str, str], source: str, line: int) -> Deviation:
    missing = [k for k in REQUIRED if not fields.get(k)]
    if missing:
        raise _bad(source, line, f"deviation entry lacks {', '.join(missing)}")
    if not _DATE.match(fields["date"]):
        raise _bad(source, line, f"date {fields['date']!r} is not YYYY-MM-DD")
    if not _COMMIT.match(fields["commit"]):
        raise _bad(source, line, f"commit {fields['commit']!r} is not a hash, a range A..B or 'this'")
    claims = tuple(c.strip() for c in fields["claims"].split(",") if c.strip())
    return Deviation(fields["id"], fields["date"], fields["commit"], claims, fields["what"], fields["why"],
                     fields["verdicts_moved"], fields.get("after_run", ""))


def parse_deviations(text: str, source: str = "DEVIATIONS.md") -> list[Deviation]:
    """The entries of a deviations file, in file order (`UserInputError` naming the line of a malformed one)."""
    out: list[Deviation] = []
    block: list[tuple[int, str]] | None = None
    start = 0
    for no, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if block is None:
            if stripped.startswith("```") and stripped[3:].strip() == FENCE:
                block, start = [], no
            continue
        if stripped.startswith("```"):
            out.append(_entry(_fields(block, source), source, start))
            block = None
            continue
        block.append((no, raw))
    if block is not None:
        raise _bad(source, start, "deviation block is not closed with ```")
    ids = [d.id for d in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise _bad(source, 1, f"deviation id {', '.join(dup)} used twice")
    return out


def load_deviations(path: str | Path | None = None) -> list[Deviation] | None:
    """The entries of `path` (default `DEVIATIONS_FILE`); None when the file is absent (an installed copy
    without the repository's docs)."""
    p = Path(path) if path is not None else DEVIATIONS_FILE
    if not p.is_file():
        return None
    return parse_deviations(p.read_text(encoding="utf-8"), p.name)


def _sha(obj: Any) -> str:
    return hashlib.sha256(canonical(obj).encode()).hexdigest()


def registered_parts(preset_name: str) -> dict[str, Any]:
    """What the digest covers apart from the deviations: every claim's rule text, the gate, the protocols at the
    preset and the preset's sizes."""
    from empirics.nets.protocols import DESCRIPTIONS, GATE_TEXT
    from verify.claims import PROTOCOLS, all_claims
    from verify.experiments import protocol_train
    from verify.presets import preset

    p = preset(preset_name)
    protocols = {}
    for name in dict.fromkeys([*PROTOCOLS, *p["protocols"]]):  # a schedule-axis protocol joins where a preset runs it
        cfg = protocol_train(p, name)
        protocols[name] = {"description": DESCRIPTIONS[cfg["protocol"]], "train": cfg}
    from verify.multiplicity import METHOD as MULTIPLICITY
    from verify.stability import RULE as STABILITY_RULE

    return {"rules": {c.id: c.rule for c in all_claims()}, "gate": GATE_TEXT, "protocols": protocols, "design": p,
            "stability": STABILITY_RULE, "multiplicity": MULTIPLICITY}


def preregistration(preset_name: str, path: str | Path | None = None) -> dict[str, Any]:
    """The `preregistration` block of a claims.json: the digest, each part's digest, each rule's digest, and the
    deviations (`UserInputError` when an entry names a claim the registry lacks)."""
    parts = registered_parts(preset_name)
    deviations = load_deviations(path)
    known = set(parts["rules"]) | {ALL, EMPIRICAL}
    for d in deviations or []:
        unknown = [c for c in d.claims if c not in known]
        if unknown:
            raise UserInputError(f"deviation {d.id} names unknown claim {', '.join(unknown)}; use ids from "
                                 "'verify claims --list', 'all' or 'empirical'")
    entries = None if deviations is None else [asdict(d) for d in deviations]
    parts["deviations"] = entries
    return {
        "sha256": _sha(parts),
        "method": METHOD,
        "parts_sha256": {k: _sha(v) for k, v in parts.items()},
        "rules_sha256": {k: _sha(v)[:16] for k, v in parts["rules"].items()},
        "deviations_source": "docs/DEVIATIONS.md" if deviations is not None else "not found (no docs/DEVIATIONS.md)",
        "deviations": entries,
    }
