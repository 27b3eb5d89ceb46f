"""Numpy reference of the matmul (``matmul.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_matmul.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``matmul.py`` with it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.kernels._selfcheck import Check, Inputs

if TYPE_CHECKING:
    from core.device import Device
    from core.kernels.matmul import Matmul


def matmul_forward(a: np.ndarray, b: np.ndarray, trans_a: bool = False, trans_b: bool = False,
                   c: np.ndarray | None = None) -> np.ndarray:
    """op(a) (M,K) @ op(b) (K,N) in float64, plus c (M,N) when given (accumulate).

    a is stored (M,K), or (K,M) when trans_a; b is stored (K,N), or (N,K) when trans_b.
    """
    a64 = a.astype(np.float64).T if trans_a else a.astype(np.float64)
    b64 = b.astype(np.float64).T if trans_b else b.astype(np.float64)
    out = a64 @ b64
    if c is not None:
        out = out + c
    return out.astype(np.float32)


def selfcheck(dev: Device, op: Matmul | None = None, rng: np.random.Generator | None = None) -> list[Check]:
    """C (67, 45) = A (67, 33) @ B, B stored (33, 45) and transposed (45, 33), against
    :func:`matmul_forward` (1e-4). ``op`` defaults to a new ``Matmul(dev)`` (the Device tab passes its
    tuned one); the errors are returned, not raised."""
    from core.kernels.matmul import Matmul

    op, t = op or Matmul(dev), Inputs(dev, rng)
    M, N, K = 67, 45, 33
    out = []
    for trans_b, name in ((False, "matmul"), (True, "matmul (B transposed)")):
        a, b = t.f32(M, K), t.f32(N, K) if trans_b else t.f32(K, N)
        c = dev.alloc(M * N)
        op(c, dev.upload(a), dev.upload(b), M, N, K, trans_b=trans_b)
        out.append(Check(name, t.err(c, matmul_forward(a, b, trans_b=trans_b)), 1e-4))
    return out
