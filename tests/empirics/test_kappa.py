"""The kappa sweep (`empirics.experiments.kappa`): its condition numbers against numpy's eigenvalues of G = X X^T built
independently from the same images, and the width bounds against their formulas (Thm 4.7, constants 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tolerances import F64_KAPPA

from empirics.data.datasets import DataRequest, load_dataset
from empirics.experiments.kappa import kappa_rows

pytestmark = [pytest.mark.claim("thm4.7-kappa"), pytest.mark.claim("kappa-mnist")]


@pytest.mark.parametrize("preprocessing", ["raw", "center"])
def test_kappa_rows_match_eigenvalues_of_the_gram_matrix(preprocessing):
    ns = (20, 40)
    rows = kappa_rows("mnist", ns, preprocess=preprocessing, eps=0.2, request=DataRequest(source="bundled"))
    assert [r["n"] for r in rows] == list(ns)
    for n, row in zip(ns, rows, strict=True):
        x = load_dataset("mnist", n_train=n, n_test=1, request=DataRequest(source="bundled")).x_train.astype(np.float64)
        if preprocessing == "center":
            x = x - x.mean(axis=0)
        lam = np.linalg.eigvalsh(x @ x.T)[::-1]
        rank = n - 1 if preprocessing == "center" else n  # centring removes one direction
        assert row["d"] == 784 and row["rank"] == rank
        kappa_eff = lam[0] / lam[rank - 1]
        assert math.isclose(row["kappa_eff"], kappa_eff, rel_tol=F64_KAPPA)
        if rank < n:
            assert row["kappa"] == math.inf and row["bound_v1"].value == math.inf
            continue
        assert math.isclose(row["kappa"], kappa_eff, rel_tol=F64_KAPPA)
        assert math.isclose(row["kappa_cubed"], kappa_eff**3, rel_tol=3 * F64_KAPPA)
        assert math.isclose(row["bound_v1"].value, kappa_eff**6 / 0.2**2, rel_tol=6 * F64_KAPPA)
        assert math.isclose(row["bound_v2"].value, row["kappa_d"] ** 6 * n * math.log(n), rel_tol=F64_KAPPA)
        assert row["provenance"]["source"]
