"""Generation under the model's rules: its buffers come from core.model.Activations (activation_sizes with
``generation``) and the memory rule training uses (core.model.check_fits) refuses what does not fit."""
from __future__ import annotations

import pytest

from core.config import ModelConfig
from core.generate import Generator
from core.model import activation_sizes, init_weights, memory_bytes

CFG = ModelConfig(d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=48, context_length=40, vocab_size=70)


def test_generation_allocates_what_the_memory_rule_counts(device):
    weights = init_weights(CFG, seed=0)
    before = device.allocated_bytes
    gen = Generator(device, CFG, weights)
    allocated = device.allocated_bytes - before
    total, largest = memory_bytes(CFG, 1, training=False, generation=True)
    assert abs(allocated - total) <= 0.2 * total, (allocated, total)
    sizes = activation_sizes(CFG, 1, CFG.context_length, training=False, generation=True)
    assert len(sizes["k"]) == len(sizes["v"]) == CFG.n_layers and len(sizes["q"]) == 1  # the KV cache per layer
    assert sizes["logits"] == [CFG.vocab_size] and "targets" not in sizes
    a = gen.act
    assert len(a.x) == CFG.n_layers + 1 and len({id(b) for b in a.x}) == 1  # one residual buffer, shared
    assert len({id(b) for b in a.k}) == CFG.n_layers and a.ffn_in[0] is a.attn_in[0] is a.final
    assert largest == 4 * max(CFG.n_params(), max(max(v) for v in sizes.values()))


def test_a_generator_the_device_cannot_hold_is_refused_before_allocating(device, monkeypatch):
    need = memory_bytes(CFG, 1, training=False, generation=True)[0]
    monkeypatch.setattr(device, "global_mem_size", need)  # 90 % of it is all a run may plan to use
    before = device.allocated_bytes
    with pytest.raises(ValueError, match="generation needs about"):
        Generator(device, CFG, init_weights(CFG, seed=0))
    assert device.allocated_bytes == before
