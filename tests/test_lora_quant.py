"""LoRA on a quantized base (core/quant_base.py, ``Model(lora=..., quantized=...)``): the base's block
matrices stay in the file's GGUF formats on the device. Logits and a training step's adapter
gradients equal those of the same model on the base dequantized to float32; the device holds what
the formats say (no float32 copy of those matrices); ``train --base Q.gguf --lora`` keeps the file
quantized, and its adapter loads in llama.cpp on the ORIGINAL quantized file with the same top tokens."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import gguf
from core.checkpoint import load_checkpoint
from core.cli import main
from core.gguf_import import import_gguf
from core.lora import LoRAConfig
from core.model import Model, memory_bytes, quantized_plan
from core.quant_base import device_bytes, group_scratch_floats
from core.tokenizer import Tokenizer
from tests.artifacts import open_llama, write_gguf
from tests.test_finetune import DATA
from tests.test_gguf_import import write_llama
from tests.test_lora import random_adapter
from tests.test_lora_cli import PROMPT, write_f32_smol
from tests.test_model import batch

T = gguf.GGMLQuantizationType
# layer 0: [q;k;v] Q5_0, Q4_0, Q8_0 (q and k widened to Q8_0, the bytes concatenated), gate/up Q4_1, output F16,
# down Q4_K; layer 1: [q;k;v] Q4_K, Q4_K, Q6_K as llama.cpp's Q4_K_M makes them (a matrix per member),
# gate BF16 and up F32 (an F32 member: the group stays float32), output Q4_0, down F32
TYPES = {"blk.0.attn_q.weight": T.Q5_0, "blk.0.attn_k.weight": T.Q4_0, "blk.0.attn_v.weight": T.Q8_0,
         "blk.0.ffn_gate.weight": T.Q4_1, "blk.0.ffn_up.weight": T.Q4_1, "blk.0.attn_output.weight": T.F16,
         "blk.0.ffn_down.weight": T.Q4_K, "blk.1.attn_q.weight": T.Q4_K, "blk.1.attn_k.weight": T.Q4_K,
         "blk.1.attn_v.weight": T.Q6_K, "blk.1.ffn_gate.weight": T.BF16, "blk.1.ffn_up.weight": T.F32,
         "blk.1.attn_output.weight": T.Q4_0, "blk.1.ffn_down.weight": T.F32, "token_embd.weight": T.Q8_0}
KEPT = {"blk.0.attn_qkv", "blk.0.ffn_gate_up", "blk.0.attn_output.weight", "blk.0.ffn_down.weight",
        "blk.1.attn_qkv", "blk.1.attn_output.weight"}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    texts = ["Brindlewick is a small town beside a slow green river.", "The mayor keeps bees and plays chess."] * 20
    tok = Tokenizer.train(texts, vocab_size=300)
    path = write_llama(tmp_path_factory.mktemp("qlora") / "mixed.gguf", tok, types=TYPES, seed=3)
    return import_gguf(path)


def test_quantized_base_gives_the_float32_base_logits_and_gradients(mixed, device):
    lora = LoRAConfig(rank=4, alpha=8.0)
    c = dataclasses.replace(mixed.config, context_length=16)
    assert set(quantized_plan(c, lora, mixed.quantized)) == KEPT
    assert quantized_plan(c, lora, mixed.quantized)["blk.0.attn_qkv"][1] == T.Q8_0
    assert quantized_plan(c, lora, mixed.quantized)["blk.1.attn_qkv"][1] == (T.Q4_K, T.Q4_K, T.Q6_K)
    ad = random_adapter(c, lora, 7)
    before = device.allocated_bytes
    q = Model(device, c, batch_size=2, weights=mixed.weights, lora=lora, adapter=ad, quantized=mixed.quantized)
    q_bytes = device.allocated_bytes - before
    before = device.allocated_bytes
    f = Model(device, c, batch_size=2, weights=mixed.weights, lora=lora, adapter=ad)
    f_bytes = device.allocated_bytes - before
    quant, floats = device_bytes(c, q.quantized_plan)
    assert quant < 4 * floats / 2  # the formats hold less than half of float32's bytes here
    # the float32 copies are not on the device: what was saved is their float size less the formats' bytes and
    # the groups' scratch (blk.1's [q;k;v] is a matrix per member: rows of 2 x 16 tokens, q's 256 outputs)
    group = 4 * group_scratch_floats(c, q.quantized_plan, 2 * 16)
    assert group == 4 * 2 * 16 * 256
    saved = f_bytes - q_bytes
    assert 4 * floats - quant - group - 4096 <= saved <= 4 * floats - quant - group + 4096, (saved, 4 * floats - quant)
    est_q, est_f = memory_bytes(c, 2, lora=lora, quantized=q.quantized_plan)[0], memory_bytes(c, 2, lora=lora)[0]
    assert est_f - est_q == 4 * floats - quant - group
    tokens, targets, mask = batch(c, 2, 13, 4)
    np.testing.assert_allclose(q.logits(tokens), f.logits(tokens), atol=2e-4, rtol=1e-4)
    sq, sf = q.forward_backward(tokens, targets, mask), f.forward_backward(tokens, targets, mask)
    assert sq.loss == pytest.approx(sf.loss, rel=1e-5)
    gq, gf = q.grads.to_numpy(), f.grads.to_numpy()
    assert set(gq) == set(ad)
    for name in gq:
        scale = float(np.abs(gf[name]).max())
        assert scale > 0, name
        np.testing.assert_allclose(gq[name], gf[name], atol=1e-4 * scale + 1e-7, rtol=1e-3, err_msg=name)
    host = q.weights()  # the host view still has every tensor: the matrices' float32 host arrays
    assert set(host) == {n for n, _ in c.param_shapes()}
    assert np.array_equal(host["blk.0.attn_q.weight"], mixed.weights["blk.0.attn_q.weight"])
    held = device.allocated_bytes
    q.forward_backward(*batch(c, 2, 16, 5))  # full rows after shorter ones: the groups' scratch does not grow
    assert device.allocated_bytes == held


@pytest.mark.parametrize("n", [1, 2, 5])
def test_a_group_held_as_a_matrix_per_member_multiplies_as_its_dequantized_rows(device, n):
    """QuantFrozenGroup ([Q4_K; Q4_K; Q6_K; Q8_0] of 40, 24, 8 and 32 rows, n_in 512): its forward and its
    input gradient (also accumulating) equal numpy's on the dequantized rows, one row (a GEMV per member
    into its columns) and more (through the scratch and a rectangular copy)."""
    from core.kernels import qmatmul_ref
    from core.kernels.qmatmul import QMatmul, upload_weight
    from core.quant_base import QuantFrozenGroup
    from tests.test_kernel_qmatmul import random_weight

    rng = np.random.default_rng(n)
    parts, dense = [], []
    for qtype, n_out in ((T.Q4_K, 40), (T.Q4_K, 24), (T.Q6_K, 8), (T.Q8_0, 32)):
        data, shape = random_weight(rng, qtype, n_out, 512)
        parts.append(upload_weight(device, data, qtype, shape))
        dense.append(qmatmul_ref.dequantize(data, qtype, shape).astype(np.float64))
    w = np.concatenate(dense)
    group = QuantFrozenGroup(QMatmul(device), parts)
    assert (group.n_out, group.n_in) == (104, 512)
    x = rng.standard_normal((n, 512)).astype(np.float32)
    dy = rng.standard_normal((n, 104)).astype(np.float32)
    dx0 = rng.standard_normal((n, 512)).astype(np.float32)
    out, bx, bdy = device.zeros(n * 104), device.upload(x), device.upload(dy)
    group.forward(out, bx, n)
    y = device.download(out, (n, 104))
    want = x.astype(np.float64) @ w.T
    np.testing.assert_allclose(y, want, atol=1e-4 * np.abs(want).max())
    for accumulate in (False, True):
        bdx = device.upload(dx0)
        group.input_grad(bdx, bdy, n, accumulate=accumulate)
        want = dy.astype(np.float64) @ w + (dx0 if accumulate else 0)
        np.testing.assert_allclose(device.download(bdx, (n, 512)), want, atol=1e-4 * np.abs(want).max())


def test_lora_model_for_shorter_rows_allocates_less_and_gives_the_same_gradients(mixed, device):
    """``max_seq`` also sizes the adapters' scratch (core.lora.LoRAScratch) and the quantized matmuls':
    a LoRA model on the quantized base built for rows of 6 tokens holds less and gives the loss and the
    adapter gradients of the one built for the whole context, bit for bit."""
    lora = LoRAConfig(rank=4, alpha=8.0)
    c = dataclasses.replace(mixed.config, context_length=16)
    ad = random_adapter(c, lora, 5)
    tokens, targets, mask = batch(c, 2, 6, 9)
    got = []
    for max_seq in (None, 6):
        before = device.allocated_bytes
        m = Model(device, c, batch_size=2, weights=mixed.weights, lora=lora, adapter=ad, quantized=mixed.quantized,
                  max_seq=max_seq)
        got.append((device.allocated_bytes - before, m.memory_estimate(), m.forward_backward(tokens, targets, mask),
                    m.grads.to_numpy()))
    (a_full, e_full, s_full, g_full), (a_short, e_short, s_short, g_short) = got
    assert a_short < a_full and e_short < e_full
    # the rule never counts less than the model allocates; on the H200 this tiny LoRA model on a quantized base
    # allocated 4,044,844 bytes against 5,059,504 estimated (20.05 % less), PoCL within 20 %
    assert a_short <= e_short and e_short - a_short <= 0.25 * e_short
    assert s_short.loss == s_full.loss
    for name in g_full:
        np.testing.assert_array_equal(g_short[name], g_full[name], err_msg=name)


def test_cached_greedy_on_a_quantized_lora_model_gives_the_batched_tokens(mixed, device):
    """One prompt at a time over the model's K/V buffers (core.recall.greedy_cached, single-row forwards
    through the quantized matmuls and the adapters) decodes what greedy_batch decodes."""
    from core.recall import greedy_batch, greedy_cached

    lora = LoRAConfig(rank=4, alpha=8.0)
    c = dataclasses.replace(mixed.config, context_length=16)
    m = Model(device, c, batch_size=2, weights=mixed.weights, lora=lora, adapter=random_adapter(c, lora, 3),
              quantized=mixed.quantized, training=False, max_seq=8)
    rng = np.random.default_rng(4)
    prompts, most = [rng.integers(3, c.vocab_size, n).tolist() for n in (2, 9, 5)], [7, 6, 3]
    want = [greedy_batch(m, [p], [k], eos_id=-1, pad_id=0)[0] for p, k in zip(prompts, most)]
    assert greedy_cached(m, prompts, most, eos_id=-1) == want and [len(o) for o in want] == most
    assert len({t for o in want for t in o}) > 2  # not one token over and over


def write_quant_smol(path):
    """``write_f32_smol``'s tiny llama (SmolLM2's tokenizer) with its block matrices in Q8_0 and Q4_1."""
    f32 = import_gguf(write_f32_smol(path.with_name("f32-" + path.name)))
    w = gguf.GGUFWriter(str(path), "llama")
    r = gguf.GGUFReader(path.with_name("f32-" + path.name))
    for field in r.fields.values():  # the keys as they are (architecture and alignment come from the writer)
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.alignment"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for name, shape in f32.config.param_shapes():
        a = f32.weights[name]
        if len(shape) == 1 or name == "token_embd.weight":
            w.add_tensor(name, a)
            continue
        qtype = T.Q8_0 if ".attn_" in name else T.Q4_1
        w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    write_gguf(w)
    return path


def test_train_lora_on_a_quantized_file_and_llama_cpp_loads_its_adapter(tmp_path, capsys):
    base = write_quant_smol(tmp_path / "tiny-smol-q.gguf")
    data = tmp_path / "data.json"
    data.write_text(json.dumps(DATA))
    out = tmp_path / "run"
    args = ["train", "--base", str(base), "--data", str(data), "--out", str(out), "--context-length", "64",
            "--batch-size", "4", "--lora", "--lora-rank", "4", "--lora-alpha", "8", "--steps", "3",
            "--pretrain-lr", "2e-2", "--tune-lr", "2e-2", "--no-general-questions"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "kept in Q4_1, Q8_0 on the device" in printed, printed
    ad = tmp_path / "adapter.gguf"
    assert main(["export", "--model", str(out), "--adapter", "--out", str(ad)]) == 0
    ck = load_checkpoint(out)
    ids = ck.tokenizer.encode(PROMPT, parse_special=True)
    import core.device

    dev = core.device.open_device(None)
    loaded = import_gguf(base)
    c = dataclasses.replace(ck.config, context_length=64)
    ours = Model(dev, c, batch_size=1, weights=loaded.weights, lora=ck.lora, adapter=ck.adapter,
                 training=False, quantized=loaded.quantized).logits(np.array([ids]))[0]
    plain = Model(dev, c, batch_size=1, weights=loaded.weights, training=False).logits(np.array([ids]))[0]
    assert np.abs(ours - plain).max() > 0.05  # the adapter matters
    llm = open_llama(base, n_ctx=64, lora_path=str(ad))  # the ORIGINAL quantized file
    llm.eval(ids)
    theirs = np.array(llm.scores[:len(ids)])
    llm.close()
    tol = 0.05  # llama.cpp quantizes the activations to 8 bits for Q4_1/Q8_0 dot products
    print(f"llama.cpp --lora on the quantized file: max |delta| {np.abs(ours - theirs).max():.3f}")
    assert np.abs(ours - theirs).max() < 10 * tol
    top2 = np.sort(ours, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > tol
    assert clear.sum() >= len(ids) // 3, np.round(top2[:, 1] - top2[:, 0], 3)
    assert np.array_equal(ours.argmax(-1)[clear], theirs.argmax(-1)[clear])


def test_the_estimate_before_a_lora_run_counts_the_files_formats(tmp_path):
    """What the Hyperparameters tab shows before a LoRA run (core.estimates.training_memory_bytes with the
    header's tensor types, core.gguf_import.read_tensor_types) is the figure the Model checks for the loaded
    file (core.model.memory_bytes with its quantized plan): less than the adapters on a float32 base, which
    is less than a full fine-tune; a LoRA save copies only the adapters."""
    from core.estimates import lora_base_plan, peak_resident_bytes, save_copy_bytes, training_memory_bytes
    from core.gguf_import import read_tensor_types

    base = write_quant_smol(tmp_path / "tiny-smol-q.gguf")
    loaded = import_gguf(base)
    types = read_tensor_types(base)
    assert types == loaded.meta["tensor_types"]
    mc, lora = dataclasses.replace(loaded.config, context_length=64), LoRAConfig(rank=4, alpha=8.0)
    planned = quantized_plan(mc, lora, loaded.quantized)
    assert lora_base_plan(mc, lora, types) == planned and len(planned) == 4 * mc.n_layers
    est = training_memory_bytes(mc, 4, lora=lora, base_types=types)
    assert est == memory_bytes(mc, 4, True, lora=lora, quantized=planned)[0]
    assert est < training_memory_bytes(mc, 4, lora=lora) < training_memory_bytes(mc, 4)
    assert training_memory_bytes(mc, 4, base_types=types) == training_memory_bytes(mc, 4)  # no LoRA: float32
    assert 0 < save_copy_bytes(mc, lora=lora) < save_copy_bytes(mc) / 10
    lora_dev = memory_bytes(mc, 4, True, lora=lora, quantized=planned, max_seq=64)[0]
    lora_peak = peak_resident_bytes(0, mc, lora_dev, True, lora=lora)
    assert lora_peak < peak_resident_bytes(0, mc, memory_bytes(mc, 4, True, max_seq=64)[0], True)
