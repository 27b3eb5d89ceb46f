import numpy as np
import pytest

from core.kernels.residual import Residual
from core.kernels import residual_ref as ref
from tests.opcheck import assert_close, from_device, to_device


@pytest.mark.parametrize("n", [1, 7, 33, 257, 4099])
@pytest.mark.parametrize("local", [1, 32, 256])
@pytest.mark.parametrize("contiguous", [False, True], ids=["interleaved", "blocks"])
def test_residual_forward_backward(device, rng, n, local, contiguous):
    op = Residual(device, local_size=local, contiguous=contiguous)
    a, b, g = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    A, B, O, G = to_device(device, a, b, np.zeros(n, np.float32), g)
    op.forward(O, A, B, n)
    assert_close(from_device(device, O, a), ref.residual_forward(a, b), what="out")
    op.backward(A, G, n)  # A += g
    assert_close(from_device(device, A, a), ref.residual_forward(a, g), what="d_in")
