"""How the validity panel seeds its LDS re-fits (`--lds-seeds`, issue 43 item 4): one object per design.

The LDS target of a subset is the mean over its repeats of the re-fitted test losses, measured from a level per test
point; the Spearman correlation over subsets is blind to that level, so the seeds decide only which noise the re-fits
share. Re-fitting every subset with the same seeds (`paired`, the earlier design) gives every subset of a repeat the
same batch order and initialisation noise, which the repeats' agreement then counts as signal: on the issue's CNN it
doubled the agreement (0.116 against 0.044-0.051 with a fresh seed per subset) and so inflated the noise ceiling the
verdict divides by. `fresh` gives every re-fit of every subset its own seed: the repeats differ only by their seeds,
as the ceiling assumes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ntkm.errors import UserInputError

#: Offset of the fresh seeds from the audit's seed: clear of the control seeds (seed, seed + 1, ... for the noise
#: and the repeats) and of the removal arms (seed).
FRESH_OFFSET = 1_000_003


@dataclass(frozen=True)
class LdsSeeding:
    """One seeding design: `seed(base, subset, repeat, repeats)` is the seed of a re-fit; `paired` says whether each
    re-fit's change is taken against the control re-fit of its own seed (else against the control of `base`)."""

    name: str
    paired: bool
    text: str

    def seed(self, base: int, subset: int, repeat: int, repeats: int) -> int:
        return base + repeat if self.paired else base + FRESH_OFFSET + subset * repeats + repeat


SEEDINGS: dict[str, LdsSeeding] = {s.name: s for s in (
    LdsSeeding("fresh", paired=False, text="a fresh seed for every re-fit of every subset, changes from the control "
                                           "re-fit of the audit's seed"),
    LdsSeeding("paired", paired=True, text="every subset re-fitted with the seeds seed, seed + 1, ..., each against "
                                           "the control re-fit of its seed"),
)}


def seeding(name: str) -> LdsSeeding:
    """The design called `name`; an unknown name is a one-line error listing them."""
    try:
        return SEEDINGS[name]
    except KeyError:
        raise UserInputError(f"--lds-seeds must be one of {', '.join(SEEDINGS)}, got '{name}'") from None
