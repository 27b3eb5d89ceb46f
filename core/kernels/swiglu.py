"""Launcher for ``swiglu.cl``: out = silu(gate) * up and its backward."""
from __future__ import annotations

import numpy as np

from core.device import Device
from core.kernels._launch import grid_stride_size


class SwiGLU:
    """SwiGLU of the llama feed-forward block on float32 buffers of ``n`` elements.

    ``out = silu(gate) * up`` with ``silu(x) = x * sigmoid(x)`` (Shazeer 2020, "GLU Variants
    Improve Transformer"; llama.cpp's ``ggml_swiglu``). Finite for any finite input.
    """

    def __init__(self, dev: Device, local_size: int | None = None):
        self.dev = dev
        self._fwd = dev.kernel("swiglu", "swiglu_forward")
        self._bwd = dev.kernel("swiglu", "swiglu_backward")
        self.local = min(dev.work_group_size(self._fwd, local_size or 256),
                         dev.work_group_size(self._bwd, local_size or 256))

    def _size(self, n: int) -> int:
        return grid_stride_size(self.dev, -(-n // 4), self.local)  # float4 groups per work-item loop

    def forward(self, out, gate, up, n: int) -> None:
        """out (n) = silu(gate (n)) * up (n), overwritten."""
        if n <= 0:
            return
        self._fwd(self.dev.queue, (self._size(n),), (self.local,), out, gate, up, np.int32(n))

    def backward(self, d_gate, d_up, d_out, gate, up, n: int) -> None:
        """d_gate (n) and d_up (n), both overwritten, from d_out, gate, up (n).

        ``d_up = d_out * silu(gate)``,
        ``d_gate = d_out * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate)))``.
        """
        if n <= 0:
            return
        self._bwd(self.dev.queue, (self._size(n),), (self.local,), d_gate, d_up, d_out,
                  gate, up, np.int32(n))
