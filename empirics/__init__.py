"""Torch side of the suite, in wings: `data` (data sets and their provenance), `nets` (model kinds, networks,
protocols, training and the stacked engine), `kernels` (empirical NTKs), `attribution` (influence and the
Gauss-Newton family, library peers) and `experiments` (the paper's measurements); beside them the pieces every wing
shares: the vocabularies (`vocab`), run records (`records`), intervals, config field help, progress lines and
`common`."""
