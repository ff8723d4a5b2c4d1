"""Thm 4.7 (second part): width bound m = Omega(kappa^6 / eps^2) (v1) and kappa_d^6 n log n (v2)."""

from __future__ import annotations

import math

import pytest
import sympy as sp
from hypothesis import given
from hypothesis import strategies as st
from tolerances import F64_LOG10, F64_ROUNDING

from ntkm.errors import UserInputError
from theory.bounds import eps_for_width_v1, relu_width_bound, width_bound_v1, width_bound_v2
from theory.checks import HOLDS_CORRECTED, PAPER_KAPPA, PAPER_WIDTH_V1, check_thm47_width

pytestmark = pytest.mark.claim("thm4.7-width")


def test_symbolic_log_form_and_inverse() -> None:
    kappa, eps, m = sp.symbols("kappa epsilon m", positive=True)
    bound = kappa**6 / eps**2
    assert (
        sp.simplify(sp.expand_log(sp.log(bound, 10), force=True) - (6 * sp.log(kappa, 10) - 2 * sp.log(eps, 10))) == 0
    )
    (solution,) = sp.solve(sp.Eq(bound, m), eps)
    assert sp.simplify(solution - kappa**3 / sp.sqrt(m)) == 0


def test_paper_inputs_give_the_formula_values_not_the_rounded_exponents() -> None:
    mnist = width_bound_v1(PAPER_KAPPA["MNIST"], 1.0)
    cifar = width_bound_v1(PAPER_KAPPA["CIFAR-10"], 1.0)
    assert mnist.value == pytest.approx(1.2e3**6, rel=F64_ROUNDING)
    assert cifar.value == pytest.approx(8.7e3**6, rel=F64_ROUNDING)
    assert mnist.value >= PAPER_WIDTH_V1["MNIST"]
    assert cifar.value < PAPER_WIDTH_V1["CIFAR-10"]


def test_cifar_figure_needs_the_eps_factor() -> None:
    eps = eps_for_width_v1(PAPER_KAPPA["CIFAR-10"], PAPER_WIDTH_V1["CIFAR-10"])
    assert eps == pytest.approx(8.7e3**3 / 1e12, rel=F64_ROUNDING)
    assert 0 < eps < 1
    assert width_bound_v1(PAPER_KAPPA["CIFAR-10"], eps).value == pytest.approx(1e24, rel=F64_ROUNDING)
    assert relu_width_bound(eps).value == pytest.approx(1 / eps**2, rel=F64_ROUNDING)


@given(st.floats(1.0, 1e300), st.floats(1e-300, 1e300))
def test_log10_value_always_finite_and_consistent(kappa: float, eps: float) -> None:
    b = width_bound_v1(kappa, eps)
    assert math.isfinite(b.log10_value)
    assert b.log10_value == pytest.approx(6 * math.log10(kappa) - 2 * math.log10(eps), abs=F64_LOG10)
    if b.log10_value < 300:
        assert b.value == pytest.approx(10**b.log10_value, rel=F64_LOG10)
    elif b.log10_value > 309:
        assert b.value == math.inf
    assert b.formula == "m = kappa^6 / eps^2" and b.inputs == {"kappa": kappa, "eps": eps}


@given(st.floats(1.0, 1e100), st.floats(1.0, 1e3), st.floats(1e-6, 1.0), st.floats(1.0, 1e3))
def test_monotone(kappa: float, f: float, eps: float, g: float) -> None:
    assert width_bound_v1(kappa * f, eps).log10_value >= width_bound_v1(kappa, eps).log10_value - F64_ROUNDING
    assert width_bound_v1(kappa, eps / g).log10_value >= width_bound_v1(kappa, eps).log10_value - F64_ROUNDING
    assert width_bound_v1(kappa, eps).log10_value >= relu_width_bound(eps).log10_value - F64_ROUNDING


@given(st.floats(1.0, 1e200), st.integers(2, 10**12))
def test_v2_formula(kappa_d: float, n: int) -> None:
    b = width_bound_v2(kappa_d, n)
    expected = 6 * math.log10(kappa_d) + math.log10(n) + math.log10(math.log(n))
    assert b.log10_value == pytest.approx(expected, abs=F64_LOG10)
    assert math.isfinite(b.log10_value)


def test_infinite_kappa_gives_infinite_bound() -> None:
    assert width_bound_v1(math.inf, 0.1).value == math.inf
    assert width_bound_v2(math.inf, 10).log10_value == math.inf
    assert eps_for_width_v1(math.inf, 1e10) == math.inf


@pytest.mark.parametrize(
    "call",
    [
        lambda: width_bound_v1(10.0, 0.0),
        lambda: width_bound_v1(10.0, -1.0),
        lambda: width_bound_v1(10.0, math.nan),
        lambda: width_bound_v1(0.5, 0.1),
        lambda: width_bound_v1("10", 0.1),
        lambda: width_bound_v2(10.0, 1),
        lambda: width_bound_v2(10.0, 2.5),
        lambda: relu_width_bound(0.0),
        lambda: eps_for_width_v1(10.0, 0.0),
    ],
)
def test_invalid_inputs_raise_user_input_error(call) -> None:
    with pytest.raises(UserInputError):
        call()


def test_check_reports_corrected_with_computed_numbers() -> None:
    result = check_thm47_width(0)
    assert result.verdict == HOLDS_CORRECTED
    cifar = result.numbers["per_dataset"]["CIFAR-10"]
    assert cifar["kappa6"] == pytest.approx(8.7e3**6)
    assert cifar["eps_for_paper_width_v1"] == pytest.approx(0.658503, rel=1e-5)
    assert result.numbers["v2_consistent_with_assumed_n"]
