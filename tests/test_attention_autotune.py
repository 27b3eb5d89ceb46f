"""The attention forward chosen by measurement (core/kernels/attention_autotune.py): every candidate timed once
per device and shape and checked against the per-row forward, the winner cached, a wrong or failing candidate
never chosen, a damaged cache timed again, and a Model training through the chosen forward as through the
per-row one. The device's attention is tiled as a GPU's here (staged kernels; PoCL runs them as well)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from core.config import ModelConfig
from core.kernels import attention, attention_autotune, matmul_autotune
from core.kernels.attention import AttentionTiles
from core.model import Model

GPU_LIKE = AttentionTiles(items=16, rows=1, keys=8, kv_rows=1, vector=4, stage_kv=True, bwd_tile=8, bwd_items=16)
SHAPE = (2, 40, 4, 2, 16)  # batch, seq, n_heads, n_kv_heads, head_dim
NAME = "2x40 heads 4/2 head_dim 16"


@pytest.fixture
def tuning(tmp_path, monkeypatch):
    """Tuning on, an empty cache folder, and attention tiled as on a GPU; returns the cache file's path."""
    monkeypatch.setenv(matmul_autotune.ENV_VAR, "1")
    monkeypatch.setenv("OPENCL_LLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(attention_autotune, "_memo", {})
    monkeypatch.setattr(attention, "default_tiles", lambda dev, head_dim, max_items=None: GPU_LIKE)
    return tmp_path / attention_autotune.CACHE_FILE


def _entry(device, path):
    return json.loads(path.read_text())[matmul_autotune.device_key(device, "attention")][NAME]


def test_forward_blocks_times_every_candidate_once_and_caches_the_fastest(device, tuning, monkeypatch):
    blocks = attention_autotune.forward_blocks(device, *SHAPE)
    candidates = attention_autotune.candidates(device, SHAPE[-1])
    assert candidates[0] == (0, 0) and len(candidates) == 1 + attention_autotune.CANDIDATES and blocks in candidates
    entry = _entry(device, tuning)
    timed = {f"{r}x{k}" for r, k in candidates}  # all (llvmpipe: a compiled 64x32 needs more local memory)
    assert "0x0" in entry["ms"] and len(entry["ms"]) >= 3 and set(entry["ms"]) <= timed
    assert (entry["fwd_rows"], entry["fwd_keys"]) == blocks
    assert entry["ms"][f"{blocks[0]}x{blocks[1]}"] == min(entry["ms"].values())

    monkeypatch.setattr(attention_autotune, "_memo", {})  # as a new process would: read the file
    monkeypatch.setattr(matmul_autotune, "best_seconds", lambda *a, **k: pytest.fail("timed again"))
    assert attention_autotune.forward_blocks(device, *SHAPE) == blocks


def test_a_wrong_or_failing_candidate_is_never_chosen(device, tuning, monkeypatch):
    """The staged candidates are timed fastest, but one writes a wrong output and the others fail to build:
    the per-row forward is chosen."""
    real_forward, real_kernels = attention.Attention.forward, attention.Attention._kernels

    def wrong(self, out, lse, *args, **kwargs):
        real_forward(self, out, lse, *args, **kwargs)
        if self.tiles(SHAPE[-1]).fwd_rows == 64:  # off by a little everywhere
            n = SHAPE[0] * SHAPE[1] * SHAPE[2] * SHAPE[4]
            self.dev.upload(self.dev.download(out, (n,)) + np.float32(1e-3), out)

    def failing(self, head_dim):
        if self._forced is not None and self._forced.fwd_rows == 32:
            raise attention.KernelLimitError("too many registers")
        return real_kernels(self, head_dim)

    monkeypatch.setattr(attention.Attention, "forward", wrong)
    monkeypatch.setattr(attention.Attention, "_kernels", failing)
    monkeypatch.setattr(matmul_autotune, "best_seconds",
                        lambda dev, launch, min_s, rounds=3: (launch(), 1.0)[1])
    assert attention_autotune.forward_blocks(device, *SHAPE) == (0, 0)
    assert set(_entry(device, tuning)["ms"]) == {"0x0"}


@pytest.mark.parametrize("damage", [{"fwd_rows": 64}, {"fwd_rows": 48, "fwd_keys": 32}, {"fwd_rows": 64.0, "fwd_keys": 32},
                                    {"fwd_rows": 1024, "fwd_keys": 1024}, "64x32", None])
def test_a_damaged_cache_entry_is_timed_again(device, tuning, damage):
    key = matmul_autotune.device_key(device, "attention")
    tuning.write_text(json.dumps({key: {NAME: damage, "1x1 heads 1/1 head_dim": {}}, "other device": {"x": 1}}))
    blocks = attention_autotune.forward_blocks(device, *SHAPE)
    data = json.loads(tuning.read_text())
    assert data["other device"] == {"x": 1} and list(data[key]) == [NAME]
    assert (data[key][NAME]["fwd_rows"], data[key][NAME]["fwd_keys"]) == blocks and len(data[key][NAME]["ms"]) >= 3


def test_cpus_and_tuning_off_keep_the_per_row_forward_untimed(device, tuning, monkeypatch):
    monkeypatch.setattr(matmul_autotune, "best_seconds", lambda *a, **k: pytest.fail("timed"))
    monkeypatch.setenv(matmul_autotune.ENV_VAR, "0")
    assert attention_autotune.forward_blocks(device, *SHAPE) == (0, 0)
    assert attention_autotune.expected_seconds(device, 2.0) == 0.0
    monkeypatch.setenv(matmul_autotune.ENV_VAR, "1")
    monkeypatch.undo()  # the device's own tiling: a CPU's has no staged kernels
    if not attention.default_tiles(device, 16).bwd_tile:
        assert attention_autotune.candidates(device, 16) == [(0, 0)]


def test_a_model_trains_through_the_chosen_forward_as_through_the_per_row_one(device, tuning, monkeypatch):
    cfg = ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, context_length=40)
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, cfg.vocab_size, (2, 40))
    targets, mask = np.roll(tokens, -1, axis=1), np.ones((2, 40), np.float32)
    results = []
    for blocks in ((0, 0), (16, 8)):
        monkeypatch.setattr(attention_autotune, "forward_blocks", lambda *a, b=blocks: b)
        model = Model(device, cfg, batch_size=2, seed=5)
        assert model.ops.attention.tiles(cfg.head_dim).fwd_rows == blocks[0]
        stats = model.forward_backward(tokens, targets, mask)
        results.append((stats.loss, model.dev.download(model.grads.flat, (model.grads.layout.total,)).copy()))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-5)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-3, atol=1e-5)


def test_a_chosen_forward_that_does_not_fit_falls_back_without_shrinking_the_backward(device, tuning, monkeypatch):
    """A cached choice whose compiled kernel allows fewer work-items than the staged backward's (another
    driver's registers): the per-row forward runs, and the backward keeps its work-groups."""
    real = type(device).work_group_size
    monkeypatch.setattr(type(device), "work_group_size",
                        lambda self, kn: 4 if kn.function_name == "attention_forward_tiled" else real(self, kn))
    op = attention.Attention(device)
    op.use_forward_blocks(16, (16, 8))
    t = op.tiles(16)
    assert (t.fwd_rows, t.fwd_keys) == (0, 0) and t.backward_items == GPU_LIKE.backward_items
    op.use_forward_blocks(16, (0, 0))  # and back: rebuilt
    assert op.tiles(16).fwd_rows == 0
    monkeypatch.setattr(type(device), "work_group_size", real)
    op.use_forward_blocks(16, (16, 8))
    assert op.tiles(16).fwd_rows == 16
    op.use_forward_blocks(16, (48, 8))  # not a block shape: ignored
    assert op.tiles(16).fwd_rows == 0


def test_the_first_timing_is_counted_in_the_first_run_estimate_once(device, tuning):
    assert attention_autotune.expected_seconds(device, 2.0) == pytest.approx(2.0 * attention_autotune.CANDIDATES + 1.0)
    attention_autotune.forward_blocks(device, *SHAPE)
    assert attention_autotune.expected_seconds(device, 2.0) == 0.0
