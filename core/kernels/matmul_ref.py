"""Numpy reference of the matmul (``matmul.cl``).

Written independently of the kernel, float64 inside where it matters. The tests
(``tests/test_kernel_matmul.py``) and the Device tab's self-check (``core/selftest.py``) both
compare the launcher in ``matmul.py`` with it.
"""
from __future__ import annotations

import numpy as np


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
