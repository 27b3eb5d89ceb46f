"""Decode one token at a time: the replayed step (core/replay.py) gives the logits of the step run
through the launchers, bit for bit, at every position of whole contexts and after a reset; a step whose
launches do not match is never replayed; an imported quantized GGUF file is decoded from its block bytes
(core.generate.Generator's ``quantized``) with the logits and greedy tokens of its float32 weights and
fewer device bytes."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from core.config import ModelConfig
from core.generate import Generator
from core.model import LOGITS_MATRIX, Model
from core.quant_base import QuantFrozen, QuantFrozenGroup
from core.replay import StepReplayer, _pos_args
from tests.test_lora_quant import KEPT, mixed  # noqa: F401 (mixed: the quantized file fixture)
from tests.test_model import TINY, random_weights

# GQA with head_dim 6 (TINY), multi-query with head_dim 16, and plain multi-head attention with head_dim 8
# over a context longer than the 128 positions of RoPE's first cos/sin table (a buffer that must not grow mid-replay)
CONFIGS = [TINY, ModelConfig(vocab_size=61, d_model=32, n_layers=3, n_heads=2, n_kv_heads=1, ffn_dim=40, context_length=23),
           ModelConfig(vocab_size=40, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=24, context_length=300)]


def plain(gen: Generator) -> Generator:
    gen._decode = StepReplayer(gen.dev, max_tries=0)  # never recorded: every token through the launchers
    return gen


@pytest.mark.parametrize("config", CONFIGS, ids=["tiny_gqa", "mqa_hd16", "mha_hd8"])
def test_replayed_decode_gives_the_launchers_logits_bit_for_bit(config, device):
    w = random_weights(config, 11)
    replayed, direct = Generator(device, config, w), plain(Generator(device, config, w))
    tokens = np.random.default_rng(3).integers(0, config.vocab_size, 2 * config.context_length).tolist()
    for gen in (replayed, direct):
        gen.rows = [gen.feed(tokens[:3])] + [gen.feed([t]) for t in tokens[3:config.context_length]]
        gen.reset()  # decode again from position 0, one token at a time, over other tokens
        gen.rows += [gen.feed([t]) for t in tokens[config.context_length:]]
    assert replayed._decode.replay is not None and len(replayed._decode.replay) > 0
    assert direct._decode.replay is None
    for i, (a, b) in enumerate(zip(replayed.rows, direct.rows)):
        np.testing.assert_array_equal(a, b, err_msg=f"row {i}")
    assert len({int(np.argmax(r)) for r in replayed.rows}) > 2  # not one answer everywhere


class _Kernel:
    function_name = "k"


def test_launches_that_do_not_follow_the_position_are_not_replayed():
    k, other, buf, buf2 = _Kernel(), _Kernel(), object(), object()
    i32 = np.int32

    def step(pos, kernel=k, b=buf, extra=0, size=(16,)):
        return [(kernel, size, (16,), (b, i32(pos), i32(7), i32(pos + 3 + extra), np.float32(0.5)))]

    assert _pos_args(step(4), step(5)) == [[(1, 5), (3, 8)]]
    assert "launches" in _pos_args(step(4), step(5) + step(5))
    assert "kernel or sizes" in _pos_args(step(4), step(5, kernel=other))
    assert "kernel or sizes" in _pos_args(step(4), step(5, size=(32,)))
    assert "argument 0" in _pos_args(step(4), step(5, b=buf2))  # another buffer
    assert "argument 3" in _pos_args(step(4), step(5, extra=1))  # grew by two: not pos + constant


def test_a_step_that_never_matches_runs_as_is(device):
    from core.kernels.swiglu import SwiGLU

    swiglu, h, gate_up = SwiGLU(device), device.alloc(8), device.zeros(16)
    calls = []

    def step(pos):  # pos % 3 + 1 launches: never the same number at two consecutive positions
        calls.append(pos)
        for _ in range(pos % 3 + 1):
            swiglu.forward_fused(h, gate_up, 1, 8)

    rep = StepReplayer(device, max_tries=2)
    for pos in range(8):
        rep(pos, step)
    assert rep.replay is None and calls == list(range(8))


def test_a_quantized_file_decodes_from_its_bytes_like_its_float32_weights(mixed, device):
    c = dataclasses.replace(mixed.config, context_length=24)
    assert mixed.config.tie_embeddings
    before = device.allocated_bytes
    q = Generator.for_model(device, dataclasses.replace(mixed, config=c))
    q_bytes = device.allocated_bytes - before
    before = device.allocated_bytes
    f = Generator(device, c, mixed.weights)
    f_bytes = device.allocated_bytes - before
    quantized = {n for n, v in q.views.items() if isinstance(v, QuantFrozen | QuantFrozenGroup)}
    assert quantized == KEPT | {LOGITS_MATRIX}  # token_embd is Q8_0: the logits read it as stored
    assert isinstance(q.views["blk.1.attn_qkv"], QuantFrozenGroup)  # Q4_K, Q4_K, Q6_K: a matrix per member
    assert q_bytes < f_bytes - 4 * sum(np.asarray(mixed.weights[n]).size for n in ("blk.0.ffn_gate.weight",
                                                                                      "blk.0.ffn_up.weight"))
    prompt = np.random.default_rng(5).integers(3, c.vocab_size, 4).tolist()
    rows_q, rows_f = [q.feed(prompt)], [f.feed(prompt)]
    for _ in range(c.context_length - len(prompt)):  # greedy, each on its own tokens
        rows_q.append(q.feed([int(np.argmax(rows_q[-1]))]))
        rows_f.append(f.feed([int(np.argmax(rows_f[-1]))]))
    scale = float(np.abs(np.stack(rows_f)).max())
    np.testing.assert_allclose(np.stack(rows_q), np.stack(rows_f), atol=2e-5 * scale + 1e-4, rtol=1e-4)
    assert [int(np.argmax(r)) for r in rows_q] == [int(np.argmax(r)) for r in rows_f]
    assert q._decode.replay is not None  # the quantized step is replayed too


def test_an_untied_quantized_output_is_read_as_stored(tmp_path, device):
    """An untied output.weight in a kept format leaves the float32 store: only its bytes are on the device."""
    import gguf

    from core.gguf_import import import_gguf
    from core.tokenizer import Tokenizer
    from tests.test_gguf_import import CFG, write_llama
    from tests.test_lora_quant import TYPES

    tok = Tokenizer.train(["The mayor keeps bees and plays chess by the river."] * 20, vocab_size=280)
    config = dataclasses.replace(CFG, tie_embeddings=False, n_layers=1)
    types = {**{k: v for k, v in TYPES.items() if k.startswith("blk.0.")}, "token_embd.weight": gguf.GGMLQuantizationType.F16,
             "output.weight": gguf.GGMLQuantizationType.Q4_0}
    loaded = import_gguf(write_llama(tmp_path / "untied.gguf", tok, config=config, types=types, seed=4))
    c = dataclasses.replace(loaded.config, context_length=12)
    q = Generator.for_model(device, dataclasses.replace(loaded, config=c))
    f = Generator(device, c, loaded.weights)
    assert isinstance(q.views[LOGITS_MATRIX], QuantFrozen) and "output.weight" not in q.params.layout.slots
    prompt = [5, 9, 14]
    np.testing.assert_allclose(q.feed(prompt), f.feed(prompt), atol=2e-4, rtol=1e-4)
    for t in (3, 8, 2, 7):
        np.testing.assert_allclose(q.feed([t]), f.feed([t]), atol=2e-4, rtol=1e-4)


def test_a_file_with_float32_and_quantized_layers_decodes(tmp_path, device):
    """Layer 0 all F32 (small: one launch, core/kernels/decode.cl), layer 1 Q8_0 (read as stored: separate
    launches); the one-launch layer was once chosen for every layer from layer 0's matrices alone, and the
    first single token then crashed on layer 1's quantized matrix (found by a break-it review)."""
    import gguf

    from core.gguf_import import import_gguf
    from core.tokenizer import Tokenizer
    from tests.test_gguf_import import write_llama

    Q = gguf.GGMLQuantizationType
    tok = Tokenizer.train(["The mayor keeps bees and plays chess by the river."] * 20, vocab_size=280)
    config = ModelConfig(vocab_size=280, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, context_length=16)
    mats = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    types = {**{f"blk.0.{m}.weight": Q.F32 for m in mats}, **{f"blk.1.{m}.weight": Q.Q8_0 for m in mats},
             "token_embd.weight": Q.F32}
    loaded = import_gguf(write_llama(tmp_path / "mixed_layers.gguf", tok, config=config, types=types, seed=1))
    q, f = Generator.for_model(device, loaded), Generator(device, loaded.config, loaded.weights)
    assert isinstance(q.views["blk.1.attn_qkv"], QuantFrozen) and not hasattr(q.views["blk.0.attn_qkv"], "forward")
    np.testing.assert_allclose(q.feed([5, 9, 14]), f.feed([5, 9, 14]), atol=2e-4, rtol=1e-4)
    for t in (3, 8, 2, 7, 11):
        np.testing.assert_allclose(q.feed([t]), f.feed([t]), atol=2e-4, rtol=1e-4)


def test_a_lora_model_on_a_quantized_file_decodes_the_bytes_with_its_adapters(mixed, device):
    """A LoRA model on a quantized file decodes the file's matrices as stored with the adapters beside them
    (as llama.cpp's --lora): the logits of the training Model's forward, of the merged float32 weights (within
    float32 rounding), the replayed step's bit for bit those of the launchers, over the whole context; the
    device holds the estimate's bytes (within 1 % on a CPU, at most them elsewhere), fewer than the merged float32
    generator."""
    from core import quant_base
    from core.lora import LoRAConfig, LoRALinear, merge
    from core.model import block_matrices, memory_bytes
    from tests.test_lora import random_adapter

    lora = LoRAConfig(rank=4, alpha=8.0)
    c = dataclasses.replace(mixed.config, context_length=16)
    ad = random_adapter(c, lora, 2)
    loaded = dataclasses.replace(mixed, config=c, weights=merge(mixed.weights, ad, lora), lora=lora, adapter=ad,
                                 base_weights=mixed.weights)
    before = device.allocated_bytes
    gen = Generator.for_model(device, loaded)
    q_bytes = device.allocated_bytes - before
    before = device.allocated_bytes
    merged = Generator(device, c, loaded.weights)
    f_bytes = device.allocated_bytes - before
    adapted = [v for v in gen.views.values() if isinstance(v, LoRALinear)]
    assert {isinstance(v.frozen, QuantFrozen | QuantFrozenGroup) for v in adapted} == {True, False}  # some stay float32
    blocks = quant_base.plan(c, block_matrices(c), mixed.quantized.types)
    logits = quant_base.plan(c, [(LOGITS_MATRIX, [c.output_weight])], mixed.quantized.types)
    estimate = (memory_bytes(c, 1, training=False, lora=lora, generation=True, quantized=blocks)[0]
                + quant_base.device_bytes(c, logits)[0])  # tied: the logits' quantized token_embd, not counted
    # within 1 % (the adapters' alignment padding) where the matmuls' scratch is the packed panels the rule counts
    # (CPUs); on a GPU the rule's scratch bound is more than its split-K partials take (H200: 3.24 of 4.16 MB)
    assert q_bytes <= 1.01 * estimate and (not device.is_cpu or q_bytes >= 0.99 * estimate) and q_bytes < f_bytes
    m = Model(device, c, batch_size=1, weights=mixed.weights, lora=lora, adapter=ad, quantized=mixed.quantized,
              training=False)
    tokens = np.random.default_rng(1).integers(3, c.vocab_size, (1, 6)).astype(np.int32)
    first = gen.feed(tokens[0].tolist())
    np.testing.assert_allclose(first, m.logits(tokens)[0, -1], atol=2e-4, rtol=1e-4)
    np.testing.assert_allclose(first, merged.feed(tokens[0].tolist()), atol=2e-4, rtol=1e-4)
    ref = plain(Generator.for_model(device, loaded))
    rows = [first, ref.feed(tokens[0].tolist())]
    assert np.array_equal(rows[0], rows[1])
    for _ in range(c.context_length - tokens.shape[1]):  # greedy on the replayed generator's tokens
        t = int(np.argmax(rows[0]))
        rows = [gen.feed([t]), ref.feed([t])]
        assert np.array_equal(rows[0], rows[1])
        np.testing.assert_allclose(rows[0], merged.feed([t]), atol=2e-4, rtol=1e-4)
    assert gen._decode.replay is not None and ref._decode.replay is None


def test_a_lora_model_on_a_float32_file_decodes_its_merged_weights(tmp_path, device):
    """A GGUF base with nothing quantized (an F32 file) keeps nothing in its formats: its LoRA model decodes the
    merged float32 weights (the one-launch layers apply), not base + adapters (2x slower there; break-it review)."""
    import gguf

    from core.gguf_import import import_gguf
    from core.lora import LoRAConfig, LoRALinear, merge
    from core.tokenizer import Tokenizer
    from tests.test_gguf_import import CFG, write_llama
    from tests.test_lora import random_adapter

    tok = Tokenizer.train(["The mayor keeps bees and plays chess by the river."] * 20, vocab_size=280)
    types = {name: gguf.GGMLQuantizationType.F32 for name, _ in CFG.param_shapes()}
    base = import_gguf(write_llama(tmp_path / "f32.gguf", tok, config=CFG, types=types, seed=2))
    assert base.quantized is not None  # a GGUF file always brings its raw tensors
    lora = LoRAConfig(rank=4, alpha=8.0)
    ad = random_adapter(base.config, lora, 5)
    loaded = dataclasses.replace(base, weights=merge(base.weights, ad, lora), lora=lora, adapter=ad,
                                 base_weights=base.weights)
    gen = Generator.for_model(device, loaded)
    assert not any(isinstance(v, (LoRALinear, QuantFrozen)) for v in gen.views.values())
    merged = Generator(device, base.config, loaded.weights)
    assert np.array_equal(gen.feed([5, 9, 14]), merged.feed([5, 9, 14]))


def test_smollm2_q4_k_m_decodes_from_its_bytes_like_llama_cpp(device):
    """SmolLM2-135M-Instruct as llama.cpp quantizes it to Q4_K_M (what most such files are): mostly Q5_0 (576 is
    no multiple of the K-quants' 256), Q8_0, Q4_K and Q6_K. Every block matrix is decoded from its bytes (the
    [q;k;v] of Q5_0 and Q8_0 members as Q8_0, widened exactly), and each greedy step's logits agree with
    llama.cpp's on the same file within its 8-bit activation error (tests/test_gguf_import.py's Q4_TOLERANCE);
    the answer names Paris."""
    from gguf import GGMLQuantizationType as Q

    from core.gguf_import import import_gguf
    from core.model import block_matrices
    from tests.artifacts import open_llama, smollm2_requantized
    from tests.test_gguf_import import PROMPT, Q4_TOLERANCE

    loaded = import_gguf(smollm2_requantized("Q4_K_M"))
    types = set(loaded.meta["tensor_types"].values())
    assert {"Q5_0", "Q8_0", "Q4_K", "Q6_K"} <= types
    config = dataclasses.replace(loaded.config, context_length=48)
    loaded = dataclasses.replace(loaded, config=config)
    gen = Generator.for_model(device, loaded)
    assert all(isinstance(gen.views[name], QuantFrozen) for name, _ in block_matrices(config))
    assert {gen.views[f"blk.{i}.attn_qkv"].w.qtype for i in range(config.n_layers)} >= {Q.Q8_0, Q.Q5_0}
    ids = loaded.tokenizer.encode(PROMPT, parse_special=True)
    llm = open_llama(smollm2_requantized("Q4_K_M"), n_ctx=48)
    llm.eval(ids)
    ours, got = gen.feed(ids), []
    for _ in range(8):
        theirs = np.array(llm.scores[llm.n_tokens - 1])
        assert np.abs(ours - theirs).max() < Q4_TOLERANCE
        top2 = np.sort(ours)[-2:]
        if top2[1] - top2[0] > Q4_TOLERANCE:
            assert int(np.argmax(ours)) == int(np.argmax(theirs))
        got.append(int(np.argmax(theirs)))  # both follow llama.cpp's tokens
        ours = gen.feed([got[-1]])
        llm.eval([got[-1]])
    llm.close()
    assert "Paris" in loaded.tokenizer.decode(got)
