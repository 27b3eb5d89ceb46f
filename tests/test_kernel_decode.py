"""The one-launch decode layer (decode.cl) against its float64 reference (core/kernels/decode_ref.py):
odd sizes (tails of the 16-wide dot products), GQA, multi-query and multi-head attention, positions 0
to the last row, several work-group sizes, the first layer's embedding; the KV cache is written at row
pos only; and where core.model.forward uses it (DecodeLayer.suits)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from core.config import ModelConfig
from core.kernels import decode_ref as ref
from core.kernels._selfcheck import Inputs
from core.kernels.decode import DECODE_LAYER_MACS_X_UNITS, DecodeLayer
from tests.opcheck import assert_selfcheck

SHAPES = {  # d_model, n_heads, n_kv_heads, ffn_dim: K = 20 and 52 leave tails of the 16-wide chunks
    "gqa_hd6": ModelConfig(vocab_size=7, d_model=24, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=37, context_length=13),
    "mqa_hd10": ModelConfig(vocab_size=7, d_model=20, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=52, context_length=13),
    "mha_hd16": ModelConfig(vocab_size=7, d_model=64, n_layers=1, n_heads=4, n_kv_heads=4, ffn_dim=48, context_length=13,
                            rope_theta=500.0, norm_eps=1e-6),
}


def test_selfcheck(device):
    assert_selfcheck(ref.selfcheck(device))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("local", [1, 3, 16, 64])
@pytest.mark.parametrize("pos", [0, 5, 12])
def test_decode_layer_matches_the_reference(device, shape, local, pos):
    c, t = SHAPES[shape], Inputs(device, np.random.default_rng(pos * 7 + local))
    op = DecodeLayer(device, local_size=local)
    assert op.local <= local
    w = ref.layer_weights(c, t)
    x = t.f32(c.d_model)
    k_cache, v_cache = t.f32(c.context_length, c.kv_dim), t.f32(c.context_length, c.kv_dim)
    got = ref.run_layer(device, op, c, x, k_cache, v_cache, w, pos)
    want_x, want_norm, want_k, want_v = ref.decode_layer(c, x, k_cache, v_cache, w, pos)
    np.testing.assert_allclose(got["x"], want_x, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(got["out_norm"], want_norm, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(got["k_cache"][pos], want_k, atol=1e-5)
    np.testing.assert_allclose(got["v_cache"][pos], want_v, atol=1e-5)
    others = np.arange(c.context_length) != pos  # every other row of the cache as it was
    np.testing.assert_array_equal(got["k_cache"][others], k_cache[others])
    np.testing.assert_array_equal(got["v_cache"][others], v_cache[others])


@pytest.mark.parametrize("local", [1, 16])
def test_the_first_layer_embeds_its_token(device, local):
    c, t = SHAPES["gqa_hd6"], Inputs(device, np.random.default_rng(3))
    w, embd = ref.layer_weights(c, t), t.f32(c.vocab_size, c.d_model)
    k_cache, v_cache = t.f32(c.context_length, c.kv_dim), t.f32(c.context_length, c.kv_dim)
    got = ref.run_layer(device, DecodeLayer(device, local_size=local), c, np.full(c.d_model, np.nan, np.float32),
                        k_cache, v_cache, w, 4, token_embd=embd, token=5)
    want_x, want_norm, _, _ = ref.decode_layer(c, embd[5], k_cache, v_cache, w, 4)
    np.testing.assert_allclose(got["x"], want_x, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(got["out_norm"], want_norm, atol=2e-5, rtol=1e-5)


def test_large_scores_stay_finite(device):
    """Scores of order 1e3 (exp would overflow without the max subtracted) give the reference's output."""
    c, t = SHAPES["mha_hd16"], Inputs(device, np.random.default_rng(9))
    w = ref.layer_weights(c, t)
    w["qkv"] = w["qkv"] * 30.0
    x = t.f32(c.d_model)
    k_cache, v_cache = 30.0 * t.f32(c.context_length, c.kv_dim), t.f32(c.context_length, c.kv_dim)
    got = ref.run_layer(device, DecodeLayer(device), c, x, k_cache, v_cache, w, 9)
    want_x = ref.decode_layer(c, x, k_cache, v_cache, w, 9)[0]
    assert np.all(np.isfinite(got["x"]))
    np.testing.assert_allclose(got["x"], want_x, atol=1e-3, rtol=1e-4)


def test_decode_fuses_small_float32_layers_only(device):
    small = ModelConfig()  # the default model: 213k multiply-adds a layer
    smol = ModelConfig(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536)
    units = max(1, device.info.compute_units)
    assert DecodeLayer.suits(device, small, [object()]) == (DecodeLayer.layer_macs(small) * units
                                                              <= DECODE_LAYER_MACS_X_UNITS)
    assert not DecodeLayer.suits(device, smol, [object()])  # 3.5M multiply-adds a layer

    class Quantized:
        def forward(self, out, x, n):
            pass

    assert not DecodeLayer.suits(device, dataclasses.replace(small, d_model=8, ffn_dim=8, n_heads=2, n_kv_heads=2),
                                 [object(), Quantized()])


def test_a_negative_position_is_refused(device):
    """(an odd head_dim or n_kv_heads not dividing n_heads cannot reach it: ModelConfig refuses them)"""
    with pytest.raises(ValueError, match="pos >= 0"):
        DecodeLayer(device)(*([None] * 21), SHAPES["gqa_hd6"], -1)  # refused before any buffer is read
