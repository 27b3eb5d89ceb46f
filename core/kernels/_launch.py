"""Small helpers shared by the kernel launchers."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from core.device import Device


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
