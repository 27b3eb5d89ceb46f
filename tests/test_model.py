"""The whole model on OpenCL against an independent float64 numpy llama (tests/reference.py):
forward logits, every gradient by finite differences, KV-cache generation, determinism,
checkpoint resume, non-finite steps and stop requests."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from core.checkpoint import resume_trainer, save_trainer
from core.config import ModelConfig, StageConfig, TrainConfig
from core.dataset import Dataset, Dialogue, default_dataset
from core.generate import Generator, SamplingSettings
from core.model import Model, init_weights
from core.stages import Stage
from core.trainer import StageReport, StepReport, Trainer
from tests import reference as ref

# odd sizes on purpose: head_dim 6, GQA 4 query heads on 2 kv heads, ffn 37, vocab 53
TINY = ModelConfig(vocab_size=53, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=37, context_length=19)


def random_weights(config, seed, scale=0.3):
    """Weights large enough that every path matters (init_weights' 0.02 makes attention uniform)."""
    rng = np.random.default_rng(seed)
    w = init_weights(config, seed)
    return {k: (v + rng.standard_normal(v.shape) * (0.2 if k.endswith("norm.weight") else scale)).astype(np.float32)
            for k, v in w.items()}


def batch(config, b, t, seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab_size, (b, t)).astype(np.int32)
    targets = rng.integers(0, config.vocab_size, (b, t)).astype(np.int32)
    mask = (rng.random((b, t)) < 0.7).astype(np.float32)
    mask[0, 0] = 1.0
    return tokens, targets, mask


@pytest.mark.parametrize("b,t", [(1, 1), (1, 19), (3, 7)])
def test_forward_matches_numpy_llama(device, b, t):
    w = random_weights(TINY, 1)
    model = Model(device, TINY, batch_size=3, weights=w, training=False)
    tokens, _, _ = batch(TINY, b, t, 2)
    got = model.logits(tokens)
    want = ref.llama_forward(w, TINY, tokens)
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("shape", [(2, 11), (1, 1)], ids=["2x11", "one-token"])
def test_every_gradient_matches_finite_differences(device, tied, shape):
    """Analytic gradients from the OpenCL backward vs central differences of the float64 numpy loss.
    Tied embeddings: token_embd.weight is also the output projection; both gradients add up in it.
    A batch of one token too: its forward keeps what the backward reads (a small model's one-token forward
    otherwise runs each layer as one launch, which keeps none of it: found by a break-it review)."""
    TINY_ = dataclasses.replace(TINY, tie_embeddings=tied)
    w = random_weights(TINY_, 3)
    assert ("output.weight" in w) != tied
    model = Model(device, TINY_, batch_size=2, weights=w)
    tokens, targets, mask = batch(TINY_, *shape, 4)
    stats = model.forward_backward(tokens, targets, mask)
    want_loss = ref.llama_loss(w, TINY_, tokens, targets, mask)
    assert stats.loss == pytest.approx(want_loss, rel=1e-4)
    grads = model.grads.to_numpy()
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    rng = np.random.default_rng(5)
    eps = 1e-5
    for name, g in grads.items():
        flat = w64[name].reshape(-1)
        picks = rng.choice(flat.size, size=min(6, flat.size), replace=False)
        if name == "token_embd.weight":  # rows of tokens in the batch carry the gradient
            rows = np.unique(tokens)[:3]
            picks = np.concatenate([picks, rows * TINY_.d_model + 1])
        for i in picks:
            old = flat[i]
            flat[i] = old + eps
            hi = ref.llama_loss(w64, TINY_, tokens, targets, mask)
            flat[i] = old - eps
            lo = ref.llama_loss(w64, TINY_, tokens, targets, mask)
            flat[i] = old
            fd = (hi - lo) / (2 * eps)
            got = g.reshape(-1)[i]
            assert abs(got - fd) <= 2e-4 + 2e-3 * abs(fd), f"{name}[{i}]: backward {got:.6g} vs finite diff {fd:.6g}"
    total = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
    assert stats.grad_norm == pytest.approx(total, rel=1e-4)


def test_tied_embeddings_forward_and_gradient(device):
    """tie_embeddings: logits use token_embd, whose gradient sums the logits' and the lookup's parts."""
    c = dataclasses.replace(TINY, tie_embeddings=True)
    assert "output.weight" not in dict(c.param_shapes())
    w = random_weights(c, 9)
    model = Model(device, c, batch_size=2, weights=w)
    tokens, targets, mask = batch(c, 2, 9, 10)
    np.testing.assert_allclose(model.logits(tokens), ref.llama_forward(w, c, tokens), atol=2e-4, rtol=1e-4)
    stats = model.forward_backward(tokens, targets, mask)
    assert stats.loss == pytest.approx(ref.llama_loss(w, c, tokens, targets, mask), rel=1e-4)
    g = model.grads.to_numpy()["token_embd.weight"].reshape(-1)
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    flat = w64["token_embd.weight"].reshape(-1)
    unused = sorted(set(range(c.vocab_size)) - set(tokens.ravel().tolist()))[0]  # only the logits' part
    for i in [int(tokens[0, 0]) * c.d_model + 2, int(tokens[1, 3]) * c.d_model + 5, unused * c.d_model + 1]:
        old = flat[i]
        flat[i] = old + 1e-5
        hi = ref.llama_loss(w64, c, tokens, targets, mask)
        flat[i] = old - 1e-5
        lo = ref.llama_loss(w64, c, tokens, targets, mask)
        flat[i] = old
        fd = (hi - lo) / 2e-5
        assert abs(g[i] - fd) <= 2e-4 + 2e-3 * abs(fd), f"token_embd[{i}]: backward {g[i]:.6g} vs finite diff {fd:.6g}"
        assert abs(fd) > 1e-4


def test_kv_cache_generation_matches_full_forward(device):
    w = random_weights(TINY, 6)
    model = Model(device, TINY, batch_size=1, weights=w, training=False)
    tokens, _, _ = batch(TINY, 1, TINY.context_length, 7)
    full = model.logits(tokens)[0]
    gen = Generator(device, TINY, w)
    rows = [gen.feed(tokens[0, :5].tolist())]  # prefill a chunk, then one token at a time
    for t in range(5, TINY.context_length):
        rows.append(gen.feed([int(tokens[0, t])]))
    np.testing.assert_allclose(rows[0], full[4], atol=1e-4)
    np.testing.assert_allclose(np.stack(rows[1:]), full[5:], atol=1e-4)
    with pytest.raises(ValueError, match="context_length"):
        gen.feed([1])


def test_generation_stops_at_context_length(device):
    w = random_weights(TINY, 8)
    gen = Generator(device, TINY, w)
    out = list(gen.generate([1, 2, 3], SamplingSettings(max_tokens=500)))
    assert len(out) == TINY.context_length - 3


def small_run_config(steps=6):
    return TrainConfig(pretrain=StageConfig(steps=steps, lr=3e-3, batch_size=4, warmup_steps=2),
                       dialogues=StageConfig(steps=steps, lr=2e-3, batch_size=4, warmup_steps=2), vocab_size=300)


SMALL = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, context_length=64)


def run_all(trainer):
    return [e for e in trainer.run(recall=False) if isinstance(e, StepReport)]


def test_training_is_deterministic(device):
    ds = default_dataset()
    a = Trainer(ds, SMALL, small_run_config(), device)
    b = Trainer(ds, SMALL, small_run_config(), device)
    la, lb = [r.loss for r in run_all(a)], [r.loss for r in run_all(b)]
    assert la == lb
    wa, wb = a.model.weights(), b.model.weights()
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert la[-1] < la[0]


def test_checkpoint_resume_is_exact(device, tmp_path):
    ds = default_dataset()
    full = Trainer(ds, SMALL, small_run_config(), device)
    run_all(full)
    part = Trainer(ds, SMALL, small_run_config(), device)
    it = part.run(recall=False)
    steps = 0
    for ev in it:  # stop in the middle of the tuning stage
        if isinstance(ev, StepReport) and ev.stage is Stage.DIALOGUES and ev.step == 3:
            part.request_stop()
        steps += isinstance(ev, StepReport)
    assert steps == 9
    save_trainer(part, tmp_path / "ckpt")
    resumed = resume_trainer(tmp_path / "ckpt", device)
    assert (resumed.stage_index, resumed.stage_step) == (1, 3)
    rest = run_all(resumed)
    assert [r.step for r in rest] == [4, 5, 6]
    wf, wr = full.model.weights(), resumed.model.weights()
    assert all(np.array_equal(wf[k], wr[k]) for k in wf)
    assert full.model.adam_step == resumed.model.adam_step == 12


def test_stop_is_honoured_before_the_next_step(device):
    tr = Trainer(default_dataset(), SMALL, small_run_config(50), device)
    seen = []
    for ev in tr.run(recall=False):
        if isinstance(ev, StepReport):
            seen.append(ev.step)
            tr.request_stop()
        elif isinstance(ev, StageReport):
            assert ev.stopped
    assert seen == [1]


def test_non_finite_step_is_skipped_and_weights_kept(device):
    tr = Trainer(default_dataset(), SMALL, small_run_config(), device)
    it = tr.run(recall=False)
    next(e for e in it if isinstance(e, StepReport))  # one good step
    w = tr.model.weights()
    w["blk.0.ffn_up.weight"][0, 0] = np.inf  # poison: the next loss is not finite
    tr.model.params.load(w)
    before, m_before = tr.model.weights(), tr.model.optimizer_state()
    rep = next(e for e in it if isinstance(e, StepReport))
    assert rep.skipped and not np.isfinite(rep.loss)
    after, m_after = tr.model.weights(), tr.model.optimizer_state()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
        np.testing.assert_array_equal(m_after["m"][k], m_before["m"][k])
    assert m_after["step"] == m_before["step"]


def test_high_learning_rate_never_corrupts_weights(device):
    """lr 0.1: steps may be skipped, but the weights stay finite and training reports it."""
    tc = dataclasses.replace(small_run_config(15), grad_clip=0.0,
                             pretrain=StageConfig(steps=15, lr=0.1, batch_size=4, warmup_steps=0))
    tr = Trainer(default_dataset(), SMALL, tc, device)
    reps = run_all(tr)
    assert len(reps) == 30
    assert all(np.all(np.isfinite(v)) for v in tr.model.weights().values())
    for r in reps:
        assert r.skipped == (not (np.isfinite(r.loss) and np.isfinite(r.grad_norm)))


def test_tuning_learns_only_assistant_tokens(device):
    tok_ds = Dataset(facts=[], dialogues=[Dialogue(turns=[("Say hi", "Hi there")])])
    tr = Trainer(tok_ds, SMALL, small_run_config(), device)
    ex = tr.dialogues[0]
    learned = tr.tokenizer.decode([i for i, m in zip(ex.ids, ex.mask) if m], skip_special=False)
    assert learned == " Hi there<|eos|>"


def test_default_dataset_answers_and_facts_after_training(device, tmp_path, capsys):
    """The product's promise, through the CLI: train on the default dataset with the default
    settings, then greedy answers reproduce the tuned answers and the facts are still recalled."""
    from core.checkpoint import load_model
    from core.cli import main
    from core.trainer import recall_table

    out = tmp_path / "model"
    assert main(["train", "--out", str(out), "--device", str(device.info.index), "-q"]) == 0
    loaded = load_model(out)
    gen = Generator(device, loaded.config, loaded.weights)
    table = recall_table(gen, loaded.tokenizer, default_dataset())
    facts = [r for r in table if r.kind == "fact"]
    answers = [r for r in table if r.kind == "dialogue"]
    assert sum(r.ok for r in answers) == len(answers), [r for r in answers if not r.ok]
    assert sum(r.ok for r in facts) >= 0.8 * len(facts), [r for r in facts if not r.ok]
    capsys.readouterr()
    assert main(["chat", "--model", str(out), "--device", str(device.info.index),
                 "--prompt", "Where is Brindlewick?"]) == 0
    assert capsys.readouterr().out.strip() == "Brindlewick is a small town built beside a slow green river."


def test_every_tuning_batch_has_a_dialogue(device):
    for batch_size, share in ((2, 0.75), (3, 0.9), (16, 0.97)):
        tc = dataclasses.replace(small_run_config(), replay_share=share,
                                 dialogues=StageConfig(steps=3, lr=1e-3, batch_size=batch_size, warmup_steps=0))
        tr = Trainer(default_dataset(), SMALL, tc, device)
        for step in range(3):
            _, _, mask = tr._batch(1, step)
            dialogue_rows = [row for row in mask if row.sum() and row[0] == 0]  # facts learn from token 1 on
            assert dialogue_rows, (batch_size, share)


def test_bad_targets_and_masks_are_refused(device):
    model = Model(device, TINY, batch_size=2, weights=random_weights(TINY, 0))
    tokens, targets, mask = batch(TINY, 2, 5, 1)
    with pytest.raises(ValueError, match="shape"):
        model.forward_backward(tokens, targets[:, :3], mask)
    targets[0, 0] = TINY.vocab_size
    mask[0, 0] = 1
    with pytest.raises(ValueError, match="target id"):
        model.forward_backward(tokens, targets, mask)


# A context whose (B, n_heads, T, T) attention buffers would dominate memory (T 1024): the run
# below measures it in a fresh process (clean heap), the test compares with core.estimates.
LONG = ModelConfig(vocab_size=256, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192, context_length=1024)
_MEASURE_LONG = """
import json, sys
import numpy as np
from core.config import ModelConfig
from core.device import open_device
from core.model import Model
cfg = ModelConfig(**json.loads(sys.argv[1]))
dev = open_device(sys.argv[2])
def step(model, t):
    rng = np.random.default_rng(0)
    tok = rng.integers(0, cfg.vocab_size, (2, t + 1)).astype(np.int32)
    stats = model.forward_backward(tok[:, :-1], tok[:, 1:], np.ones((2, t), np.float32))
    model.optimizer_step(1e-3, 0.01, 0.9, 0.98, 1e-8)
    dev.finish()
    return stats
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
step(Model(dev, ModelConfig(**{**json.loads(sys.argv[1]), "context_length": 8}), batch_size=2), 8)  # builds
rss0, alloc0 = rss(), dev.allocated_bytes
model = Model(dev, cfg, batch_size=2, seed=0)
stats = step(model, cfg.context_length)
dev.finish()
print(json.dumps({"rss": rss() - rss0, "allocated": dev.allocated_bytes - alloc0, "loss": stats.loss,
                  "grad_norm": stats.grad_norm}))
"""


def test_long_context_trains_within_the_estimated_memory(device):
    """Context 1024 trains with no (T x T) buffer, in the device memory core.estimates reports
    (which the Hyperparameters tab shows): the buffers the Model allocates add up to the estimate
    within 20 %, and on a CPU device (buffers in host memory) so does the process's resident-memory
    growth. Full size (context 2048, d_model 512): ``benchmarks/attention_speed.py --memory``."""
    import json
    import os
    import subprocess
    import sys

    from core.estimates import training_memory_bytes
    from core.model import activation_sizes

    b, t = 2, LONG.context_length
    sizes = activation_sizes(LONG, b, t, training=True)
    assert max(max(v) for v in sizes.values()) < b * LONG.n_heads * t * t // 8  # nothing O(T^2)
    est = training_memory_bytes(LONG, b)
    before = device.allocated_bytes
    model = Model(device, LONG, batch_size=b, seed=0)
    assert abs(device.allocated_bytes - before - est) <= 0.2 * est
    tokens, targets, mask = batch(LONG, b, t, 6)
    stats = model.forward_backward(tokens, targets, mask)
    assert np.isfinite(stats.loss) and np.isfinite(stats.grad_norm) and stats.grad_norm > 0
    # the step allocated nothing more: its matmuls' scratch was reserved with the model
    assert abs(device.allocated_bytes - before - est) <= 0.2 * est
    if device.info.kind != "CPU":
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = json.dumps(dataclasses.asdict(LONG))
    run = subprocess.run([sys.executable, "-c", _MEASURE_LONG, cfg, str(device.info.index)], cwd=root,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert np.isfinite(got["loss"])
    assert abs(got["allocated"] - est) <= 0.2 * est, (got, est)
    assert abs(got["rss"] - est) <= 0.2 * est, (got, est)


def test_step_matmuls_are_the_products_a_step_runs(device):
    """core.model.step_matmuls (what the matmul scratch is reserved and estimated for) lists exactly the
    (M, N, K, trans_a, trans_b) of the products of a training step and of a forward pass."""
    from core.kernels.matmul import Matmul
    from core.model import step_matmuls

    cfg = ModelConfig(vocab_size=300, d_model=48, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=80, context_length=16)
    model = Model(device, cfg, batch_size=2, seed=0)
    seen = []
    real = Matmul.__call__

    def record(self, c, a, b, M, N, K, trans_a=False, trans_b=False, **kw):
        seen.append((M, N, K, bool(trans_a), bool(trans_b)))
        return real(self, c, a, b, M, N, K, trans_a, trans_b, **kw)

    tokens, targets, mask = batch(cfg, 2, 16, 3)
    Matmul.__call__ = record
    try:
        model.forward_backward(tokens, targets, mask)
        assert set(seen) == set(step_matmuls(cfg, 32, training=True))
        seen.clear()
        model.logits(tokens)
        assert set(seen) == set(step_matmuls(cfg, 32, training=False))
    finally:
        Matmul.__call__ = real


def test_sampling_a_diverged_model_says_so(device):
    w = random_weights(TINY, 1)
    w["output_norm.weight"][:] = np.nan
    gen = Generator(device, TINY, w)
    with pytest.raises(FloatingPointError, match="diverged"):
        list(gen.generate([1, 2], SamplingSettings(temperature=0.7)))


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_gradient_accumulation_equals_the_whole_batch(device, tied):
    """Two micro-batches with accumulate=True and the total token count give the gradients of one batch."""
    cfg = dataclasses.replace(TINY, tie_embeddings=tied)
    w = random_weights(cfg, 7)
    tokens, targets, mask = batch(cfg, 4, 9, 8)
    whole = Model(device, cfg, batch_size=4, weights=w)
    full = whole.forward_backward(tokens, targets, mask)
    want = whole.grads.to_numpy()
    micro = Model(device, cfg, batch_size=2, weights=w)
    total = float(mask.sum())
    micro.forward_backward(tokens[:2], targets[:2], mask[:2], total_count=total)
    last = micro.forward_backward(tokens[2:], targets[2:], mask[2:], accumulate=True, total_count=total)
    got = micro.grads.to_numpy()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=1e-6, rtol=1e-4, err_msg=name)
    assert last.grad_norm == pytest.approx(full.grad_norm, rel=1e-4)


def test_frozen_embeddings_stay_and_the_rest_trains(device):
    cfg = dataclasses.replace(TINY, tie_embeddings=True)
    w = random_weights(cfg, 9)
    tokens, targets, mask = batch(cfg, 2, 9, 10)
    frozen = Model(device, cfg, batch_size=2, weights=w, freeze_embeddings=True)
    full = Model(device, cfg, batch_size=2, weights=w)
    assert "token_embd.weight" not in frozen.grads.views
    assert frozen.grads.layout.total < full.grads.layout.total - cfg.vocab_size * cfg.d_model + 64
    a = frozen.forward_backward(tokens, targets, mask)
    b = full.forward_backward(tokens, targets, mask)
    assert a.loss == pytest.approx(b.loss, rel=1e-6)
    fg, g = frozen.grads.to_numpy(), full.grads.to_numpy()
    for name in fg:  # the other gradients do not depend on whether the embedding trains
        np.testing.assert_allclose(fg[name], g[name], atol=1e-6, rtol=1e-5, err_msg=name)
    frozen.optimizer_step(1e-2, 0.1, 0.9, 0.98, 1e-8)
    after = frozen.weights()
    assert np.array_equal(after["token_embd.weight"], w["token_embd.weight"])
    assert not np.array_equal(after["blk.0.attn_q.weight"], w["blk.0.attn_q.weight"])
    assert not np.array_equal(after["output_norm.weight"], w["output_norm.weight"])
    state = frozen.optimizer_state()
    assert not state["m"]["token_embd.weight"].any() and state["m"]["blk.0.attn_q.weight"].any()


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_embedding_gradient_is_the_same_either_way(device, tied):
    """The model's embedding backward over tokens grouped by id (GPUs' default) gives the bits of
    the per-column one (CPUs' default), on either device, tied or not."""
    cfg = ModelConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=24,
                      context_length=12, tie_embeddings=tied)
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 50, (3, 12)).astype(np.int32)
    targets, mask = np.roll(tokens, -1, axis=1), np.ones((3, 12), np.float32)
    grads = []
    for sorted_backward in (False, True):
        m = Model(device, cfg, batch_size=3, weights=init_weights(cfg, 1))
        m.ops.embedding.sorted_backward = sorted_backward
        m.forward_backward(tokens, targets, mask)
        grads.append(m.grads.to_numpy()["token_embd.weight"])
    assert grads[0].any() and np.array_equal(grads[0], grads[1])


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_model_for_shorter_rows_allocates_less_and_gives_the_same_loss_and_gradients(device, tied):
    """``max_seq`` sizes every per-token buffer (Model.rows = batch_size x max_seq): a model built for rows
    of 7 tokens holds fewer bytes, as memory_bytes counts them, and its loss and gradients of a batch
    that fits are those of the model built for the whole context, bit for bit."""
    from core.model import memory_bytes

    cfg = dataclasses.replace(TINY, tie_embeddings=tied)
    w = random_weights(cfg, 11)
    got = {}
    for max_seq in (None, 7):
        before = device.allocated_bytes
        m = Model(device, cfg, batch_size=3, weights=w, max_seq=max_seq)
        allocated = device.allocated_bytes - before
        est = memory_bytes(cfg, 3, max_seq=max_seq)[0]
        assert m.memory_estimate() == est and abs(allocated - est) <= 0.2 * est, (max_seq, allocated, est)
        tokens, targets, mask = batch(cfg, 3, 7, 12)
        stats = m.forward_backward(tokens, targets, mask)
        got[max_seq] = (allocated, est, stats, m.grads.to_numpy())
    (a_full, e_full, s_full, g_full), (a_short, e_short, s_short, g_short) = got[None], got[7]
    assert a_short < a_full and e_short < e_full
    assert e_full - e_short >= 4 * 3 * (TINY.context_length - 7) * TINY.vocab_size  # the logits' rows alone
    assert s_short.loss == s_full.loss and s_short.grad_norm == s_full.grad_norm
    for name in g_full:
        np.testing.assert_array_equal(g_short[name], g_full[name], err_msg=name)


def test_a_batch_of_more_tokens_than_the_model_holds_is_refused(device):
    """A model of 3 rows of 7 tokens takes 3 x 7, or fewer rows that are longer (a recall check's long
    prompts), up to the context, in at most 21 tokens; more is refused with the reason, as is a max_seq
    outside 1..context_length."""
    m = Model(device, TINY, batch_size=3, weights=random_weights(TINY, 0), max_seq=7)
    assert m.rows == 21
    assert m.logits(batch(TINY, 1, TINY.context_length, 1)[0]).shape == (1, TINY.context_length, TINY.vocab_size)
    assert m.forward_backward(*batch(TINY, 2, 10, 2)).tokens > 0
    for b, t in ((3, 8), (2, 11)):
        with pytest.raises(ValueError, match=r"exceeds the 3 x 7 \(max_seq\)"):
            m.forward_backward(*batch(TINY, b, t, 3))
        with pytest.raises(ValueError, match="max_seq"):
            m.logits(batch(TINY, b, t, 3)[0])
    for bad in (0, TINY.context_length + 1):
        with pytest.raises(ValueError, match="max_seq"):
            Model(device, TINY, batch_size=1, max_seq=bad)


@pytest.mark.parametrize("kind", ["full", "frozen_embeddings", "lora"])
def test_only_the_first_update_is_checked_and_the_result_is_the_checked_one(device, monkeypatch, kind):
    """After its first update a model's AdamW proves the next ones finite from the gradient norm and its
    last maxima and skips adamw_check; the weights and moments equal bit for bit those of a model that
    checks every update. Loading moments (or weights) makes the next update checked again."""
    from core.kernels import adamw as adamw_mod
    from core.lora import LoRAConfig

    cfg = TINY
    w = random_weights(cfg, 3)
    extra = {"full": {}, "frozen_embeddings": {"freeze_embeddings": True},
             "lora": {"lora": LoRAConfig(rank=4, alpha=8.0)}}[kind]
    models = [Model(device, cfg, batch_size=2, weights=w, **extra) for _ in range(2)]
    real = adamw_mod.update_bounds
    for step in range(4):
        tokens, targets, mask = batch(cfg, 2, 9, 20 + step)
        for k, model in enumerate(models):
            monkeypatch.setattr(adamw_mod, "update_bounds", real if k == 0 else (lambda *a, **kw: None))
            stats = model.forward_backward(tokens, targets, mask)
            assert model.optimizer_step(1e-2, 0.1, 0.9, 0.98, 1e-8, min(1.0, 1.0 / stats.grad_norm))
    assert [m.ops.adamw.checked for m in models] == [1, 4]
    a, b = models
    assert all(np.array_equal(x, y) for x, y in zip(a.trained.to_numpy().values(), b.trained.to_numpy().values()))
    for part in ("m", "v"):
        assert all(np.array_equal(x, y) for x, y in zip(a.optimizer_state()[part].values(), b.optimizer_state()[part].values()))
    monkeypatch.setattr(adamw_mod, "update_bounds", real)
    a.load_optimizer_state(a.optimizer_state())
    a.forward_backward(tokens, targets, mask)
    a.optimizer_step(1e-2, 0.1, 0.9, 0.98, 1e-8)
    assert a.ops.adamw.checked == 2
    a.optimizer_step(1e-2, 0.1, 0.9, 0.98, 1e-8)  # no forward_backward since: no gradient bound, checked
    assert a.ops.adamw.checked == 3


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # grad_scale 1e39 -> float32 inf
@pytest.mark.parametrize("case", ["gradients_below_their_squares", "grad_scale_past_float32"])
def test_the_gradient_bound_holds_where_the_norm_vanishes(device, case):
    """Break-it cases of the proven update: gradients so small that their float32 squares vanish (the
    norm reads 0 while the elements are not) with an lr that makes them matter, and a grad_scale that is
    inf as float32 (0 * inf = NaN in the kernel). Both updates are refused, nothing non-finite is stored."""
    model = Model(device, TINY, batch_size=2, weights=random_weights(TINY, 3))
    tokens, targets, mask = batch(TINY, 2, 9, 20)
    model.forward_backward(tokens, targets, mask)
    assert model.optimizer_step(1e-3, 0.0, 0.9, 0.98, 1e-8, grad_scale=0.0)  # m = v = 0: bounds (|p|, 0, 0)
    if case == "gradients_below_their_squares":
        model.forward_backward(tokens, targets, mask, total_count=1e27)  # every element ~1e-26, squares 0
        assert not model.optimizer_step(1e37, 0.0, 0.9, 0.98, 1e-30)
    else:
        model.forward_backward(tokens, targets, mask, total_count=float("inf"))  # every element 0
        assert not model.optimizer_step(1e-3, 0.1, 0.9, 0.98, 1e-8, grad_scale=1e39)
    assert model.ops.adamw.checked == 2
    assert all(np.isfinite(w).all() for w in model.trained.to_numpy().values())
    assert all(np.isfinite(a).all() for part in ("m", "v") for a in model.optimizer_state()[part].values())


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_loss_head_in_chunks_of_rows_gives_the_whole_batchs_loss_and_gradients(device, monkeypatch, tied):
    """The output projection and the cross-entropy run over a batch's rows in chunks (core.model.loss_rows: the
    (tokens x vocab) logits never stored whole): a model whose chunks are 4 rows (the last of a 3 x 7 batch: 1)
    holds logits of 4 rows, as memory_bytes counts them, and gives the loss, the gradients (every one, the tied
    embedding's from both ends), the evaluation loss and the logits of the model of one chunk, within rounding;
    each row's last logits (core.recall's greedy decoding) are those of the whole logits."""
    import core.model as model_mod
    from core.model import memory_bytes

    cfg = dataclasses.replace(TINY, tie_embeddings=tied)
    w = random_weights(cfg, 21)
    tokens, targets, mask = batch(cfg, 3, 7, 22)
    got = {}
    for chunk in (None, 4):
        if chunk:  # 4 rows of logits a chunk
            monkeypatch.setattr(model_mod, "LOSS_CHUNK_BYTES", 4 * chunk * cfg.vocab_size)
            monkeypatch.setattr(model_mod, "LOSS_CHUNK_ALIGN", 2)
        before = device.allocated_bytes
        m = Model(device, cfg, batch_size=3, weights=w, max_seq=7)
        allocated = device.allocated_bytes - before
        est = memory_bytes(cfg, 3, max_seq=7)[0]
        assert m.loss_rows == (chunk or 21)
        assert m.memory_estimate() == est and abs(allocated - est) <= 0.2 * est, (chunk, allocated, est)
        stats = m.forward_backward(tokens, targets, mask)
        grads = m.grads.to_numpy()
        got[chunk] = (est, stats, grads, m.loss(tokens, targets, mask), m.logits(tokens),
                      m.last_logits(tokens, [7, 3, 1]))
    (e_one, s_one, g_one, l_one, x_one, _), (e_ch, s_ch, g_ch, l_ch, x_ch, last) = got[None], got[4]
    assert e_one - e_ch == 4 * (21 - 4) * cfg.vocab_size  # the logits' rows
    assert s_ch.loss == pytest.approx(s_one.loss, rel=1e-6) and s_ch.tokens == s_one.tokens
    assert s_ch.grad_norm == pytest.approx(s_one.grad_norm, rel=1e-5)
    for name in g_one:
        np.testing.assert_allclose(g_ch[name], g_one[name], atol=1e-6, rtol=1e-5, err_msg=name)
    assert l_ch[0] == pytest.approx(l_one[0], rel=1e-6) and l_ch[1] == l_one[1]
    np.testing.assert_allclose(x_ch, x_one, atol=1e-5, rtol=1e-5)  # products of fewer rows: other kernels' rounding
    np.testing.assert_allclose(last, np.stack([x_one[0, 6], x_one[1, 2], x_one[2, 0]]), atol=1e-5, rtol=1e-5)
    for bad in ([7, 0, 1], [7, 1], [1.5, 2, 1]):
        with pytest.raises(ValueError, match="lengths"):
            m.last_logits(tokens, bad)


def test_recall_decoding_reads_only_each_rows_last_logits(device):
    """core.recall.greedy_batch (its continuations the same as one prompt at a time over the K/V cache) asks the
    model for each row's last logits only, not the (rows x seq x vocab) of every position."""
    from core import recall

    m = Model(device, TINY, batch_size=3, weights=random_weights(TINY, 5), training=False)
    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    calls = []
    real = Model.logits
    Model.logits = lambda self, *a, **k: calls.append(a) or real(self, *a, **k)
    try:
        together = recall.greedy_batch(m, prompts, [5, 5, 5], eos_id=0, pad_id=0)
    finally:
        Model.logits = real
    assert calls == []
    assert together == recall.greedy_cached(m, prompts, [5, 5, 5], eos_id=0)
