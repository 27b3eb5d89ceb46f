"""Small helpers shared by the kernel launchers."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from core.device import Device


# LLVM's x86 CPU names (llvm/lib/Target/X86/X86.td) whose vector registers are 512 bits wide (AVX-512).
AVX512_CPUS = frozenset((
    "knl", "knm", "skylake-avx512", "skx", "cascadelake", "cooperlake", "cannonlake", "icelake-client",
    "icelake-server", "rocketlake", "tigerlake", "sapphirerapids", "graniterapids", "graniterapids-d",
    "emeraldrapids", "diamondrapids", "znver4", "znver5", "x86-64-v4"))


def simd_width(dev: Device) -> int:
    """Floats per vector register of the code the device's compiler generates: the preferred float vector
    width (16 on AVX-512 CPUs, 8 on AVX2, 1 where work-items are the lanes, e.g. llvmpipe), except where PoCL
    compiles for a named x86 CPU without AVX-512: then 8.

    PoCL reports the width from the processor (cpuid) but compiles for the CPU its LLVM names in the device
    version (``HSTR: pthread-x86_64-unknown-linux-gnu-znver3``). pip's PoCL (LLVM 14) names an AMD Zen 4
    "znver3" and reports 16, yet builds AVX2 code: 16-float kernels there held their accumulators in two
    256-bit registers each, half of them on the stack (the matmul micro-kernel at 0.6 of numpy's sgemm).
    Returns 4 where the device does not say."""
    try:
        width = int(dev.cl_device.preferred_vector_width_float)
        version = str(dev.cl_device.version)
    except dev.cl.Error:
        return 4
    if width > 8 and "HSTR:" in version:
        target = version.split("HSTR:", 1)[1].strip()
        if "x86_64" in target and not any(target.endswith("-" + cpu) for cpu in AVX512_CPUS):
            return 8
    return width


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``n`` (and >= ``multiple``)."""
    n = max(int(n), 1)
    return ((n + multiple - 1) // multiple) * multiple


def grid_stride_size(dev: Device, n_items: int, local: int, groups_per_unit: int = 8) -> int:
    """Global size for a grid-stride loop over ``n_items`` work units: enough work-groups of
    ``local`` items to fill the device (``groups_per_unit`` per compute unit), never more than
    the work needs. A multiple of ``local``."""
    cap = max(1, dev.info.compute_units * groups_per_unit) * local
    return min(round_up(n_items, local), cap)


def prefers_row_per_item(dev: Device) -> bool:
    """True on CPU devices: row kernels then give each work-item whole rows (no barriers), which
    PoCL runs in one pass; GPUs keep one work-group per row with a local-memory reduction."""
    return bool(int(dev.cl_device.type) & dev.cl.device_type.CPU)


def contiguous_units(dev: Device) -> bool:
    """True on CPU devices: element-wise kernels give each work-item a block of consecutive units
    (see grid.h); GPUs interleave them across work-items (coalesced access)."""
    return prefers_row_per_item(dev)


def work_layout(dev: Device, contiguous: bool | None, rows_per_item: bool | None) -> tuple[np.int32, bool]:
    """A launcher's two work-layout overrides resolved for ``dev`` (None: the device's default, as
    tests pass both values on any device): ``contiguous`` as the kernels' int argument (grid.h's
    element-wise loops, :func:`contiguous_units`) and ``rows_per_item`` (whole rows per work-item,
    :func:`prefers_row_per_item`)."""
    c = contiguous_units(dev) if contiguous is None else contiguous
    r = prefers_row_per_item(dev) if rows_per_item is None else rows_per_item
    return np.int32(c), bool(r)
