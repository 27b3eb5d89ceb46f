"""LoRA in the engine (core/lora.py, core.model.Model(lora=...)): logits and loss of the base with
the adapters against the float64 numpy llama on merged weights, every adapter gradient by finite
differences, the frozen base bit-identical after training, no weight gradient of a frozen matrix."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from core.kernels.matmul import Matmul
from core.lora import LoRAConfig, LoRAError, adapter_params, base_name, init_adapter, merge
from core.model import Model, memory_bytes, step_matmuls
from core.lora import lora_matmuls
from tests import reference as ref
from tests.test_model import TINY, batch, random_weights


def random_adapter(config, lora, seed):
    """Adapters with B != 0 too (B = 0 at init would give A no gradient)."""
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal(v.shape) * 0.3).astype(np.float32) for k, v in init_adapter(config, lora, 0).items()}


def merged64(w, adapter, lora):
    """W + scale * B @ A in float64, written again here (independent of core.lora.merge)."""
    out = {k: v.astype(np.float64) for k, v in w.items()}
    for name in adapter:
        if name.endswith(".lora_a"):
            base = name[:-len(".lora_a")]
            out[base] = out[base] + lora.scale * adapter[base + ".lora_b"].astype(np.float64) @ adapter[name]
    return out


TARGET_SETS = [None, ("attn_k", "ffn_down"), ("attn_q", "attn_v", "ffn_up")]


@pytest.mark.parametrize("targets", TARGET_SETS, ids=["all", "k+down", "q+v+up"])
def test_adapter_gradients_match_finite_differences(device, targets):
    lora = LoRAConfig(rank=3, alpha=5.0, **({"targets": targets} if targets else {}))
    w, ad = random_weights(TINY, 3), random_adapter(TINY, lora, 4)
    model = Model(device, TINY, batch_size=2, weights=w, lora=lora, adapter=ad)
    tokens, targets_, mask = batch(TINY, 2, 11, 4)
    np.testing.assert_allclose(model.logits(tokens), ref.llama_forward(merged64(w, ad, lora), TINY, tokens),
                               atol=2e-4, rtol=1e-4)
    stats = model.forward_backward(tokens, targets_, mask)
    assert stats.loss == pytest.approx(ref.llama_loss(merged64(w, ad, lora), TINY, tokens, targets_, mask), rel=1e-4)
    grads = model.grads.to_numpy()
    assert set(grads) == set(ad)
    ad64 = {k: v.astype(np.float64) for k, v in ad.items()}
    rng, eps = np.random.default_rng(5), 1e-5
    for name, g in grads.items():
        flat = ad64[name].reshape(-1)
        for i in rng.choice(flat.size, size=min(4, flat.size), replace=False):
            old = flat[i]
            flat[i] = old + eps
            hi = ref.llama_loss(merged64(w, ad64, lora), TINY, tokens, targets_, mask)
            flat[i] = old - eps
            lo = ref.llama_loss(merged64(w, ad64, lora), TINY, tokens, targets_, mask)
            flat[i] = old
            fd = (hi - lo) / (2 * eps)
            got = g.reshape(-1)[i]
            assert abs(got - fd) <= 2e-4 + 2e-3 * abs(fd), f"{name}[{i}]: backward {got:.6g} vs finite diff {fd:.6g}"
    total = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
    assert stats.grad_norm == pytest.approx(total, rel=1e-4)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_frozen_base_is_bit_identical_after_training(device, tied):
    cfg = dataclasses.replace(TINY, tie_embeddings=tied)
    lora = LoRAConfig(rank=4, alpha=8.0)
    w = random_weights(cfg, 9)
    model = Model(device, cfg, batch_size=2, weights=w, lora=lora, seed=1)
    start = model.adapter_weights()
    assert all(not v.any() for k, v in start.items() if k.endswith(".lora_b"))  # B = 0: the base exactly
    np.testing.assert_array_equal(model.logits(batch(cfg, 1, 5, 2)[0]), Model(device, cfg, 1, w, training=False)
                                  .logits(batch(cfg, 1, 5, 2)[0]))
    for s in range(3):
        model.forward_backward(*batch(cfg, 2, 9, 10 + s))
        model.optimizer_step(1e-2, 0.1, 0.9, 0.98, 1e-8)
    after = model.weights()
    for name in w:
        assert np.array_equal(after[name], w[name]), name
    trained = model.adapter_weights()
    assert all(not np.array_equal(trained[k], start[k]) for k in start)
    state = model.optimizer_state()
    assert set(state["m"]) == set(start) and all(state["m"][k].any() for k in start)
    assert model.grads.layout.total == model.train_layout.total < cfg.n_params()


def test_no_weight_gradient_of_a_frozen_matrix_is_computed(device):
    """Every product a LoRA step runs is a base forward/input-gradient product or an adapter product:
    those with a transposed A (weight gradients) all have a multiple of the rank, at most 3 adapters' (the
    stacked A's of [q; k; v]), as one side."""
    cfg = dataclasses.replace(TINY, context_length=16)
    lora = LoRAConfig(rank=5, alpha=5.0)
    model = Model(device, cfg, batch_size=2, lora=lora, seed=0)
    seen, real = [], Matmul.__call__

    def record(self, c, a, b, M, N, K, trans_a=False, trans_b=False, **kw):
        seen.append((M, N, K, bool(trans_a), bool(trans_b)))
        return real(self, c, a, b, M, N, K, trans_a, trans_b, **kw)

    Matmul.__call__ = record
    try:
        model.forward_backward(*batch(cfg, 2, 16, 3))
    finally:
        Matmul.__call__ = real
    grads = [s for s in seen if s[3]]
    stacked = {p * lora.rank for p in (1, 2, 3)}
    assert grads and all(M in stacked or N in stacked for M, N, *_ in grads), grads
    full = set(step_matmuls(cfg, 32, training=True))
    assert set(seen) == {s for s in full if not s[3]} | set(lora_matmuls(cfg, lora, 32))


def test_merge_and_inference_weights_give_the_adapted_model(device):
    lora = LoRAConfig(rank=2, alpha=3.0, targets=("attn_output", "ffn_gate"))
    w, ad = random_weights(TINY, 1), random_adapter(TINY, lora, 2)
    model = Model(device, TINY, batch_size=1, weights=w, lora=lora, adapter=ad, training=False)
    merged = model.inference_weights()
    for k, v in merged64(w, ad, lora).items():
        np.testing.assert_allclose(merged[k], v, atol=1e-6, rtol=1e-6, err_msg=k)
    tokens = batch(TINY, 1, 7, 3)[0]
    np.testing.assert_allclose(model.logits(tokens), Model(device, TINY, 1, merged, training=False).logits(tokens),
                               atol=1e-5, rtol=1e-5)
    with pytest.raises(LoRAError, match="blk.0.attn_output.weight.lora_a"):
        merge({}, ad, lora)


def test_lora_config_is_checked_and_memory_is_smaller():
    with pytest.raises(LoRAError, match="lora rank"):
        LoRAConfig(rank=0)
    with pytest.raises(LoRAError, match="lora alpha"):
        LoRAConfig(alpha=float("nan"))
    with pytest.raises(LoRAError, match="lora targets"):
        LoRAConfig(targets=("attn_q", "lm_head"))
    assert LoRAConfig(targets=("ffn_down", "attn_q")).targets == ("attn_q", "ffn_down")
    assert base_name("blk.3.ffn_up.weight.lora_b") == "blk.3.ffn_up.weight"
    big = dataclasses.replace(TINY, d_model=256, n_heads=4, n_kv_heads=2, ffn_dim=640, n_layers=4, vocab_size=2000)
    lora = LoRAConfig(rank=8)
    assert adapter_params(big, lora) == 4 * 8 * ((256 + 256) * 2 + (256 + 128) * 2 + (256 + 640) * 3)
    assert memory_bytes(big, 1, lora=lora)[0] < 0.5 * memory_bytes(big, 1)[0]
