"""Invalid inputs to the public theory API raise UserInputError with a one-line message."""

from __future__ import annotations

import numpy as np
import pytest

from ntkm.errors import UserInputError
from theory.conditioning import condition_numbers, eigenvalues_of_gram, kappa_power, kappa_power_exact
from theory.gram import attention_features, gram, linearized_attention, truncate
from theory.kernels import analytic_ntk_two_layer, arccos0, empirical_ntk_two_layer

BAD_MATRICES = [
    np.empty((0, 3)),
    np.empty((3, 0)),
    np.ones(3),
    np.ones((2, 2, 2)),
    np.array([[1.0, np.nan]]),
    "abc",
]


@pytest.mark.claim("thm4.7-kappa")
@pytest.mark.parametrize("X", BAD_MATRICES, ids=["no-rows", "no-cols", "1d", "3d", "nan", "text"])
def test_condition_numbers_reject_bad_matrices(X: object) -> None:
    with pytest.raises(UserInputError) as exc:
        condition_numbers(X)
    assert "\n" not in str(exc.value)
    with pytest.raises(UserInputError):
        eigenvalues_of_gram(X)


@pytest.mark.claim("thm4.7-kappa")
def test_kappa_helpers_reject_bad_values() -> None:
    for call in (
        lambda: kappa_power(0.5, 3),
        lambda: kappa_power(10.0, -1),
        lambda: kappa_power(float("nan"), 3),
        lambda: condition_numbers(np.eye(2), rtol=-1.0),
        lambda: kappa_power_exact(np.eye(2), 0),
    ):
        with pytest.raises(UserInputError):
            call()


@pytest.mark.claim("thm4.1")
@pytest.mark.parametrize("X", BAD_MATRICES, ids=["no-rows", "no-cols", "1d", "3d", "nan", "text"])
def test_gram_rejects_bad_matrices(X: object) -> None:
    with pytest.raises(UserInputError):
        gram(X)


@pytest.mark.claim("thm4.1")
def test_attention_rejects_mismatched_shapes_and_bad_k() -> None:
    with pytest.raises(UserInputError):
        attention_features(np.ones((3, 2)), np.ones((2, 3)))
    with pytest.raises(UserInputError):
        linearized_attention(np.ones((3, 2)), context=np.ones((3, 4)))
    with pytest.raises(UserInputError):
        linearized_attention(np.ones((3, 2)), k=-1)
    with pytest.raises(UserInputError):
        attention_features(np.ones((3, 2)), np.ones((2, 2)), rank=0)


@pytest.mark.claim("truncation")
def test_truncate_rejects_bad_rank() -> None:
    for r in (0, -2, 1.5, True):
        with pytest.raises(UserInputError):
            truncate(np.ones((3, 2)), r)


@pytest.mark.claim("thm4.2")
def test_kernels_reject_mismatched_widths() -> None:
    with pytest.raises(UserInputError):
        arccos0(np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(UserInputError):
        analytic_ntk_two_layer(np.ones((2, 3)), np.ones((2, 2)))
    with pytest.raises(UserInputError):
        empirical_ntk_two_layer(np.ones((2, 3)), None, np.ones((5, 2)))
