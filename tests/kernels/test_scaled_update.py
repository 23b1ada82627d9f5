"""The compiled in-place update of AddUpdate (kernels/elemwise.py: compiled_scaled_update):
bit for bit the values of the NumPy passes (opr/utility.py: add_update_apply)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megbrain.kernels import elemwise as ew
from megbrain.opr.utility import add_update_apply, add_update_coefs

N = ew.COMPILED_UPDATE_MIN_SIZE
COEFS = [0.0, 1.0, -1.0, 0.9, -0.01, 2.5, -0.0, 1e-30, np.inf, np.nan]


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    nan = np.isnan(a)
    return bool(
        np.array_equal(nan, np.isnan(b))
        and np.array_equal(a.view(np.int32)[~nan], b.view(np.int32)[~nan])
    )


def _operands(seed: int, n: int, specials: bool):
    rng = np.random.default_rng(seed)
    d = rng.uniform(-3, 3, n).astype(np.float32)
    x = rng.uniform(-3, 3, n).astype(np.float32)
    if specials:
        for arr in (d, x):
            idx = rng.choice(n, 8, replace=False)
            arr[idx] = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 1e-40, -1e-40, 3e38])
    return d, x


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    a=st.sampled_from(COEFS),
    b=st.sampled_from(COEFS),
    c=st.sampled_from(COEFS),
    specials=st.booleans(),
)
def test_compiled_update_equals_numpy_passes(seed, a, b, c, specials):
    d, x = _operands(seed, N + 37, specials)
    coefs = add_update_coefs(np.float32, a, b, c)
    if coefs is None:  # alpha 0, beta 1, bias 0: a copy, never the compiled pass
        return
    want = d.copy()
    with np.errstate(all="ignore"):  # inf - inf in the NumPy passes
        add_update_apply(want, x, coefs, False)
    got = d.copy()
    fn = ew.compiled_scaled_update(got, x)
    assert fn is not None
    fn(*coefs)
    assert _same_bits(got, want)


def test_compiled_update_keeps_negative_zero_without_bias():
    d = np.full(N, -0.0, np.float32)
    x = np.zeros(N, np.float32)
    fn = ew.compiled_scaled_update(d, x)
    fn(*add_update_coefs(np.float32, 1.0, -0.5, 0.0))
    assert np.all(np.signbit(d))  # -0 + -0 = -0; a "+ 0" bias would make it +0


@pytest.mark.parametrize(
    "case",
    ["small", "float64", "shape", "strided", "aliased"],
)
def test_compiled_update_not_applicable(case):
    d = np.zeros(2 * N, np.float32)
    x = np.ones(2 * N, np.float32)
    if case == "small":
        d, x = d[: N - 1], x[: N - 1]
    elif case == "float64":
        d, x = d.astype(np.float64), x.astype(np.float64)
    elif case == "shape":
        d, x = d.reshape(2, N), x[:N]
    elif case == "strided":
        d, x = d[::2], x[::2]
    else:
        x = d
    assert ew.compiled_scaled_update(d, x) is None
