"""core/tensor_store.py: the flat layout, aligned tensors, groups stored back to back."""
import numpy as np
import pytest

from core.tensor_store import Layout, TensorStore

SHAPES = [("a", (3, 5)), ("g", (7, 3)), ("u", (7, 3)), ("z", (4,))]


def test_group_members_are_back_to_back_and_others_aligned():
    lay = Layout(SHAPES, 8, split_at="z", groups={"gu": ["g", "u"]})
    s = lay.slots
    assert [s[n].offset for n in "agu"] == [0, 16, 37]  # g aligned, u right after g (21 elements)
    assert s["z"].offset % 8 == 0 and s["z"].offset >= 58
    assert lay.group_slots["gu"].offset == 16 and lay.group_slots["gu"].size == 42
    assert lay.split == s["z"].offset
    with pytest.raises(ValueError, match="not consecutive"):
        Layout(SHAPES, 8, groups={"bad": ["a", "u"]})


def test_store_round_trip_and_views(device, rng):
    align = max(1, device.base_align_bytes // 4)
    shapes = [("a", (3, 5)), ("g", (7, 3)), ("u", (7, 3)), ("z", (4,))]
    lay = Layout(shapes, align, groups={"gu": ["g", "u"]})
    store = TensorStore(device, lay)
    arrays = {n: rng.standard_normal(sh).astype(np.float32) for n, sh in shapes}
    store.load(arrays)
    back = store.to_numpy()
    for n in arrays:
        assert np.array_equal(back[n], arrays[n])
    assert "gu" in store.views  # the group as one matrix [g; u] (14, 3)
    got = device.download(store.views["gu"], (14, 3))
    assert np.array_equal(got, np.concatenate([arrays["g"], arrays["u"]]))
    # a member off the alignment has no sub-buffer of its own
    assert ("u" in store.views) == (lay.slots["u"].offset % align == 0)
