"""Shared fixtures: one OpenCL device per available device (pyopencl's ctx_factory pattern).

CI has PoCL only, so every device test runs on the CPU there; a developer machine with a GPU runs
the same tests on the GPU too. ``OPENCL_LLM_TEST_DEVICE`` (index or name) limits the run to one.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from core.device import list_devices, open_device


def _device_params():
    try:
        devices = list_devices()
    except Exception as e:  # no OpenCL at all: device tests fail loudly, not skip silently
        return [pytest.param(None, id="no-opencl", marks=pytest.mark.xfail(reason=str(e), run=False))]
    want = os.environ.get("OPENCL_LLM_TEST_DEVICE")
    if want:
        from core.device import select_device
        devices = [select_device(want)]
    return [pytest.param(d, id=f"{d.kind.lower()}{d.index}") for d in devices]


@pytest.fixture(params=_device_params(), scope="session")
def device(request):
    """A :class:`core.device.Device` for each OpenCL device on this machine."""
    return open_device(request.param)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
