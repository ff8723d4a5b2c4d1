"""`python -m benchmarks [--quick] [--json FILE] [--markdown FILE] ...`: see benchmarks/README.md.

`--threads N` also limits the BLAS libraries of numpy and scipy (OpenBLAS, MKL, OpenMP) to N threads;
their thread counts are read when numpy is first imported, so they are set here, before any import.
"""

from __future__ import annotations

import os
import sys


def _threads_from_argv(argv: list[str]) -> str | None:
    """The value of `--threads N` / `--threads=N` in `argv`, if any."""
    for i, arg in enumerate(argv):
        if arg == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return None


if __name__ == "__main__":
    n = _threads_from_argv(sys.argv[1:])
    if n and n.isdigit():
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = n
    from benchmarks.run import main

    sys.exit(main())
