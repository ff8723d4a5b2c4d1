"""The `verify` command: orchestration, presets, the claims registry and the audit pipeline.

numpy's BLAS threads follow `NTKM_THREADS` (default 1, as torch's do in `verify.cli.set_threads`) unless
`OPENBLAS_NUM_THREADS` / `OMP_NUM_THREADS` / `MKL_NUM_THREADS` are set: BLAS reads them once, when numpy is
first imported, which for the `verify` command is after this package. Measured on the 2-core machine under
load: the audit of a 1M-parameter MLP took 155-188 s with two BLAS threads and 88-91 s with one.
"""

import os as _os

_threads = _os.environ.get("NTKM_THREADS", "1")
if _threads.isascii() and _threads.isdigit() and int(_threads) >= 1:
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        _os.environ.setdefault(_var, _threads)
