"""All tensors of one kind (weights, gradients, AdamW moments) in one device allocation.

After llm.c: one buffer, a table of named offsets and shapes, and a sub-buffer per tensor so that
kernels see each tensor as its own ``cl.Buffer``. Each tensor starts on the device's base-address
alignment (CL_DEVICE_MEM_BASE_ADDR_ALIGN); the padding between tensors stays zero. A *group*
(e.g. a layer's ffn_gate and ffn_up) is stored back to back without padding, so that one matmul
can use the group as one matrix; a member that then starts off the alignment has no view of its
own (use the group's view, or its offset in the flat buffer).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from core.device import Device


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives in the flat buffer: offset and size in float32 elements."""

    name: str
    shape: tuple[int, ...]
    offset: int
    size: int


class Layout:
    """Offsets of named tensors in a flat float32 buffer.

    Args:
        shapes: ``[(name, shape), ...]`` in storage order.
        align_elems: every tensor's offset is a multiple of this many float32 elements.
        split_at: name of the first tensor of the second range (``ranges`` gives both), or None.
        groups: ``{group name: [member names]}``; the members must follow each other in ``shapes``
            and are stored back to back (no padding); ``group_slots`` gives each group's extent.

    Raises:
        ValueError: a group's members are not consecutive in ``shapes``.
    """

    def __init__(self, shapes: list[tuple[str, tuple[int, ...]]], align_elems: int, split_at: str | None = None,
                 groups: dict[str, list[str]] | None = None):
        self.slots: dict[str, Slot] = {}
        self.align_elems = align_elems
        groups = groups or {}
        follows = {m: g for g, members in groups.items() for m in members[1:]}  # packed right after the previous
        off = 0
        self.split = None
        for name, shape in shapes:
            if name not in follows:
                off = -(-off // align_elems) * align_elems
            if name == split_at:
                self.split = off
            size = math.prod(shape)
            self.slots[name] = Slot(name, tuple(shape), off, size)
            off += size
        self.total = -(-off // align_elems) * align_elems
        if self.split is None:
            self.split = self.total
        self.group_slots: dict[str, Slot] = {}
        for g, members in groups.items():
            s = [self.slots[m] for m in members]
            if any(b.offset != a.offset + a.size for a, b in zip(s, s[1:])):
                raise ValueError(f"group {g!r}: members {members} are not consecutive tensors")
            self.group_slots[g] = Slot(g, (sum(x.size for x in s),), s[0].offset, sum(x.size for x in s))

    @property
    def ranges(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """((start, size), (start, size)) of the two ranges: before and from ``split_at``."""
        return (0, self.split), (self.split, self.total - self.split)


class TensorStore:
    """A flat float32 device buffer holding every tensor of a :class:`Layout`.

    Attributes:
        flat: the whole ``cl.Buffer`` (``layout.total`` floats).
        views: ``{name: cl.Buffer}`` sub-buffers, one per tensor that starts on the alignment, and
            one per group of ``layout.group_slots`` (under the group's name).
        range_views: sub-buffers of the two ranges of ``layout.ranges`` (empty ranges are None).
        version: a count of the writes through this object (load, copy_from, zero) and the ones kernels made
            and said so (:meth:`changed`), for what is derived from the tensors (core.lora.LoRALinear's Bd).
    """

    def __init__(self, dev: Device, layout: Layout):
        self.dev = dev
        self.layout = layout
        self.flat = dev.zeros(layout.total)
        slots = [*layout.slots.values(), *layout.group_slots.values()]
        self.views = {s.name: self._sub(s.offset, s.size) for s in slots if s.offset % layout.align_elems == 0}
        self.range_views = [self._sub(a, n) if n else None for a, n in layout.ranges]
        self.version = 0

    def changed(self) -> None:
        """Say that a kernel wrote the tensors (an optimizer step): :attr:`version` moves on."""
        self.version += 1

    def _sub(self, offset: int, size: int):
        return self.flat.get_sub_region(offset * 4, max(1, size) * 4)

    def zero(self) -> None:
        """Set every element (padding included) to 0."""
        self.dev.cl.enqueue_fill_buffer(self.dev.queue, self.flat, np.zeros(1, np.float32), 0, self.layout.total * 4)
        self.changed()

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        """Upload host arrays by name.

        Raises:
            ValueError: a tensor of the layout is missing from ``arrays``, or its shape differs.
        """
        host = np.zeros(self.layout.total, np.float32)
        for name, s in self.layout.slots.items():
            if name not in arrays:
                raise ValueError(f"missing tensor {name!r}")
            a = np.asarray(arrays[name], dtype=np.float32)
            if a.shape != s.shape:
                raise ValueError(f"tensor {name!r}: shape {a.shape} != expected {s.shape}")
            host[s.offset:s.offset + s.size] = a.reshape(-1)
        self.dev.upload(host, self.flat)
        self.changed()

    def to_numpy(self) -> dict[str, np.ndarray]:
        """Download every tensor as ``{name: float32 array of its shape}``."""
        host = self.dev.download(self.flat, (self.layout.total,))
        return {n: host[s.offset:s.offset + s.size].reshape(s.shape).copy() for n, s in self.layout.slots.items()}

    def copy_from(self, other: "TensorStore") -> None:
        """Device-to-device copy of another store with the same layout."""
        self.dev.copy(self.flat, other.flat, self.layout.total)
        self.changed()
