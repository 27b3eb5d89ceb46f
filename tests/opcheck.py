"""Helpers to run a kernel launcher on numpy inputs and compare with the numpy reference."""
from __future__ import annotations

import numpy as np


def to_device(dev, *arrays):
    """Upload each numpy array (float32/int32) and return the device buffers."""
    return [dev.upload(np.ascontiguousarray(a)) for a in arrays]


def from_device(dev, buf, like):
    """Download ``buf`` into an array shaped and typed like ``like`` (an array or (shape, dtype))."""
    if isinstance(like, np.ndarray):
        return dev.download(buf, like.shape, like.dtype)
    shape, dtype = like
    return dev.download(buf, shape, dtype)


def assert_close(got, want, atol=1e-5, rtol=1e-4, what=""):
    """np.testing.assert_allclose with a message naming the tensor and the worst element."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.all(np.isfinite(got)), f"{what}: non-finite values in kernel output"
    err = np.abs(got - want)
    tol = atol + rtol * np.abs(want)
    if not np.all(err <= tol):
        i = np.unravel_index(np.argmax(err - tol), err.shape)
        raise AssertionError(f"{what}: max error {err.max():.3g} at {i}: got {got[i]!r}, want {want[i]!r}")


def finite_differences(f, x, h):
    """Central differences (f(x + h e_i) - f(x - h e_i)) / 2h of a scalar function, for every
    element of the float64 array ``x`` (modified in place and restored)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + h
        hi = f(x)
        x[i] = old - h
        lo = f(x)
        x[i] = old
        g[i] = (hi - lo) / (2 * h)
    return g


def assert_selfcheck(checks):
    """Every ``Check`` an op's ``selfcheck`` (core/kernels/<op>_ref.py, the Device tab's check too)
    returned is within its tolerance, and there is at least one."""
    assert checks, "selfcheck compared nothing"
    bad = [(c.name, c.max_abs_err, c.tolerance) for c in checks if not c.ok]
    assert not bad, f"over tolerance: {bad}"
