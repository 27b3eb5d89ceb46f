"""Launcher for ``adamw.cl``: the AdamW parameter update."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from core.device import Device
from core.kernels._launch import contiguous_units, grid_stride_size

if TYPE_CHECKING:
    import pyopencl as cl

PROVEN_LIMIT = 1e30
"""What :func:`update_bounds` lets any value of the update reach: far below float32's largest (3.4e38), so
the kernel's float32 rounding (a relative 1e-7 per operation) cannot carry a value past it."""
SQUARE_FLOOR = 2.0 ** -62
"""Every float32 element whose square vanishes from a float32 sum of squares (underflow, also where
denormals are flushed to zero) is smaller than this: a gradient bound from such a sum adds it."""
ROUNDING_MARGIN = 1e-5
"""Relative margin added to each bound per update for the float32 rounding of the few operations making it."""


def update_bounds(bounds: tuple[float, float, float], grad_bound: float, lr: float, beta1: float, beta2: float,
                  eps: float, weight_decay: float, bias_correction1: float,
                  bias_correction2: float) -> tuple[float, float, float] | None:
    """Bounds on the largest ``|p|``, ``|m|``, ``v`` after an AdamW update, when they prove every new
    weight and moment finite; None when they do not (the update may still be finite: :meth:`AdamW.step`
    then checks it element by element).

    With every ``|g_i * grad_scale| <= G`` (``grad_bound``: the global gradient L2 norm, plus
    :data:`SQUARE_FLOOR`, times the clip factor as float32 bounds every element) and ``bounds`` on the
    current state (``|p|, |m|, v``), the formula of
    adamw.cl gives ``|m'| <= b1 |m| + (1-b1) G``, ``v' <= b2 v + (1-b2) G^2``, the ratio ``|m'/bc1| /
    (sqrt(v'/bc2) + eps) <= |m'| / (bc1 eps)`` and ``|p'| <= |p| + lr (ratio + |wd| |p|)``, each term of
    which is bounded too (``|wd| |p|`` may overflow where ``lr`` is tiny). Computed in
    float64 from the float32 hyperparameters, G doubled for the float32 rounding of the norm, each bound
    grown by :data:`ROUNDING_MARGIN`; every intermediate must stay below :data:`PROVEN_LIMIT`, with
    eps > 0, betas in [0, 1) and lr >= 0.

    Returns:
        ``(|p'|, |m'|, v')`` bounds, or None.
    """
    lr, b1, b2, eps, wd, bc1, bc2 = (float(np.float32(x)) for x in (lr, beta1, beta2, eps, weight_decay,
                                                                    bias_correction1, bias_correction2))
    if not (eps > 0 and 0 <= b1 < 1 and 0 <= b2 < 1 and bc1 > 0 and bc2 > 0 and lr >= 0):
        return None
    w, m, v = (float(x) for x in bounds)
    g = 2.0 * float(grad_bound)
    m1 = b1 * m + (1 - b1) * g
    v1 = b2 * v + (1 - b2) * g * g
    ratio = m1 / bc1 / eps
    decay = abs(wd) * w
    p1 = w + lr * (ratio + decay)
    if not all(math.isfinite(x) and 0 <= x < PROVEN_LIMIT
               for x in (w, m, v, g * g, m1 / bc1, v1 / bc2, ratio, decay, ratio + decay, lr * (ratio + decay), p1)):
        return None
    return p1 * (1 + ROUNDING_MARGIN), m1 * (1 + ROUNDING_MARGIN), v1 * (1 + ROUNDING_MARGIN)


class AdamW:
    """AdamW with decoupled weight decay (Loshchilov & Hutter 2019; Adam: Kingma & Ba 2015).

    Elementwise over flat float32 buffers: one call updates all parameters at once, with weight
    decay on the first ``n_decay`` elements (the matrices) and none on the rest (norm weights); an update
    that would make a weight or moment non-finite is not applied (:meth:`step`).

    Attributes:
        bounds: bounds on ``(largest |p|, largest |m|, largest v)`` after the last update applied
            (:func:`update_bounds`; None after a refused one, before any, or when unknown), for the next
            call's ``bounds`` (:meth:`step`).
        checked: the updates that ran ``adamw_check`` (the others were proven finite).
    """

    def __init__(self, dev: Device, local_size: int | None = None,
                 contiguous: bool | None = None):
        self.dev = dev
        # work split of the element-wise loops (grid.h): blocks per item on CPUs, interleaved on GPUs
        self.contiguous = np.int32(contiguous_units(dev) if contiguous is None else contiguous)
        self._check = dev.kernel("adamw", "adamw_check")
        self._step = dev.kernel("adamw", "adamw_step")
        self.local = min(dev.work_group_size(k, local_size or 256) for k in (self._check, self._step))
        # [0]: adamw_check's flag (1: the update would not be finite); [1..3]: its maxima of |p|, |m|, v (float bits)
        self._state = dev.zeros(4, np.int32)
        self.bounds: tuple[float, float, float] | None = None
        self.checked = 0

    def step(self, params: cl.Buffer, grads: cl.Buffer, m: cl.Buffer, v: cl.Buffer, n: int,
             lr: float, beta1: float, beta2: float, eps: float,
             weight_decay: float, step: int, grad_scale: float = 1.0, n_decay: int | None = None,
             grad_bound: float | None = None, bounds: tuple[float, float, float] | None = None) -> bool:
        """One AdamW update of ``n`` elements, all or nothing: ``params``, ``m`` and ``v`` are updated in
        place unless the update would make any of them non-finite (then nothing changes).

        With ``g = grads * grad_scale``: ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``,
        ``p -= lr * (m / (1-b1^t) / (sqrt(v / (1-b2^t)) + eps) + wd_i * p)``, ``t = step``, with
        ``wd_i = weight_decay`` for ``i < n_decay`` and 0 after. ``adamw_check`` computes the update first
        without storing it and sets a device flag that ``adamw_step`` reads (adamw.cl): no copy of the
        buffers is needed to undo a bad update, and the flag is read back once (one small download).
        Given ``grad_bound`` and ``bounds`` that prove the update finite (:func:`update_bounds`), the
        check pass is skipped: ``adamw_step`` alone reads and writes the buffers once. The check also
        measures the state's maxima, from which (with ``grad_bound``) the bounds after the update follow.

        Args:
            params, m, v: float32 ``(n,)``; ``m`` and ``v`` start at zero.
            grads: float32 ``(n,)``, read only.
            step: the 1-based step count ``t`` (bias corrections are computed here in float64
                and passed as float32).
            grad_scale: multiplies the gradient first (the clipping factor).
            n_decay: elements (from the start) that get weight decay; default all ``n``.
            grad_bound: a bound on every ``|grads_i * float32(grad_scale)|`` (the gradient's L2 norm
                plus :data:`SQUARE_FLOOR`, times that), or None.
            bounds: :attr:`bounds` of the update that produced the current ``params``, ``m``, ``v``
                (the caller vouches that nothing else wrote them since), or None.

        Returns:
            Whether the update was applied (False: it would have made a weight or moment non-finite,
            e.g. an lr that overflows float32, and the buffers are as they were).

        Raises:
            ValueError: ``step < 1``, or ``n`` past the int32 index range.
        """
        if step < 1:
            raise ValueError(f"AdamW step is 1-based, got {step}")
        if n == 0:
            return True
        bc1 = 1.0 - float(beta1) ** int(step)
        bc2 = 1.0 - float(beta2) ** int(step)
        if n >= 2**31:
            raise ValueError(f"AdamW over {n} elements exceeds the int32 index range")
        n_decay = n if n_decay is None else max(0, min(int(n_decay), n))
        size = grid_stride_size(self.dev, -(-n // 4), self.local)
        scalars = (np.int32(n), np.int32(n_decay), np.float32(lr), np.float32(beta1), np.float32(beta2),
                   np.float32(eps), np.float32(weight_decay), np.float32(bc1), np.float32(bc2),
                   np.float32(grad_scale), self.contiguous)
        self.dev.set_int(self._state, 0, 4)
        hp = (lr, beta1, beta2, eps, weight_decay, bc1, bc2)
        after = update_bounds(bounds, grad_bound, *hp) if bounds is not None and grad_bound is not None else None
        if after is None:
            self.checked += 1
            self.dev.launch(self._check, (size,), (self.local,), self._state, params, m, v, grads, *scalars)
        self.dev.launch(self._step, (size,), (self.local,), self._state, params, m, v, grads, *scalars)
        state = self.dev.download(self._state, (4,), np.int32)
        applied = int(state[0]) == 0
        if after is None and applied and grad_bound is not None:  # the check measured the state before
            after = update_bounds(tuple(float(x) for x in state[1:].view(np.float32)), grad_bound, *hp)
        self.bounds = after if applied else None
        return applied
