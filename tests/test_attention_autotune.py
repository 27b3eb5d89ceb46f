"""The attention kernels chosen by measurement (core/kernels/attention_autotune.py): every option timed once
per device and shape and checked against the reference option, the winners cached, a wrong or failing option
never chosen, a damaged cache timed again, and a Model training through the chosen kernels as through the
references. The device's attention is tiled as a GPU's here (staged kernels; PoCL runs them as well)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from core.config import ModelConfig
from core.kernels import attention, attention_autotune, matmul_autotune
from core.kernels.attention import TUNED_FIELDS, AttentionTiles
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


def test_tiling_times_every_option_once_and_caches_the_fastest(device, tuning, monkeypatch):
    choice = attention_autotune.tiling(device, *SHAPE)
    fwd, bwd = attention_autotune.options(device, SHAPE[-1])
    assert len(fwd) == 1 + attention_autotune.FORWARD_CANDIDATES * len(attention_autotune.FORWARD_ITEM_SHARES)
    assert len(bwd) == 2 * (2 + len(attention.BWD_BLOCKS))
    assert {o["fwd_items"] for o in fwd[1:]} == {GPU_LIKE.bwd_items // s for s in attention_autotune.FORWARD_ITEM_SHARES}
    assert [o["bwd_split"] for o in bwd] == [0] * (len(bwd) // 2) + [1] * (len(bwd) // 2)  # each unsplit and split
    assert sum(o["bwd_store"] for o in bwd) == 2  # the staged one storing dS, unsplit and split
    assert set(choice) == set(TUNED_FIELDS)
    assert {f: choice[f] for f in fwd[0]} in fwd and {f: choice[f] for f in bwd[0]} in bwd
    entry = _entry(device, tuning)
    assert entry["choice"] == choice
    labels = [attention_autotune.label(o) for o in fwd + bwd]
    # all timed (llvmpipe: the compiled 64x32 forward and 32x32 backward need more local memory than it has: skipped)
    assert {"forward per-row", "backward staged", "backward staged split", "backward staged store",
            "backward staged store split"} <= set(entry["ms"]) <= set(labels)
    assert sum(k.startswith("forward") for k in entry["ms"]) >= 2 and sum(k.startswith("backward") for k in entry["ms"]) >= 2
    for part in (fwd, bwd):
        times = {attention_autotune.label(o): entry["ms"][attention_autotune.label(o)] for o in part
                 if attention_autotune.label(o) in entry["ms"]}
        assert times[attention_autotune.label({f: choice[f] for f in part[0]})] == min(times.values())

    monkeypatch.setattr(attention_autotune, "_memo", {})  # as a new process would: read the file
    monkeypatch.setattr(matmul_autotune, "best_seconds", lambda *a, **k: pytest.fail("timed again"))
    assert attention_autotune.tiling(device, *SHAPE) == choice


def test_split_and_store_are_timed_only_where_they_run(device, tuning):
    """n_heads == n_kv_heads: a split dK/dV kernel would run the same work-groups as the unsplit one; a context whose
    stored dS would pass attention.DS_STORE_MAX floats per element of Q: the store does not run."""
    choice = attention_autotune.tiling(device, 2, 40, 4, 4, 16)
    assert choice["bwd_split"] == 0
    table = json.loads(tuning.read_text())[matmul_autotune.device_key(device, "attention")]
    ms = table["2x40 heads 4/4 head_dim 16"]["ms"]
    assert {"backward staged", "backward staged store"} <= set(ms) and not any(k.endswith("split") for k in ms)
    assert attention.Attention.store_floats(1, 200, 2, 4) == 0 < attention.Attention.store_floats(1, 200, 2, 64)
    choice = attention_autotune.tiling(device, 1, 200, 2, 1, 4)
    assert choice["bwd_store"] == 0
    ms = json.loads(tuning.read_text())[matmul_autotune.device_key(device, "attention")]["1x200 heads 2/1 head_dim 4"]["ms"]
    assert "backward staged split" in ms and not any("store" in k for k in ms)


def test_a_wrong_or_failing_option_is_never_chosen(device, tuning, monkeypatch):
    """Every option is timed equally fast, but the 64x32 forward, the 32x32 backward and the split and storing staged
    backwards write wrong results and the others fail to build: the references are chosen."""
    real_forward, real_backward, real_kernels = (attention.Attention.forward, attention.Attention.backward,
                                                 attention.Attention._kernels)

    def off(self, buf, n):
        self.dev.upload(self.dev.download(buf, (n,)) + np.float32(1e-2), buf)

    def wrong_forward(self, out, lse, *args, **kwargs):
        real_forward(self, out, lse, *args, **kwargs)
        if self.tiles(SHAPE[-1]).fwd_rows == 64:
            off(self, out, SHAPE[0] * SHAPE[1] * SHAPE[2] * SHAPE[4])

    def wrong_backward(self, d_q, *args, **kwargs):
        real_backward(self, d_q, *args, **kwargs)
        if self.tiles(SHAPE[-1]).bwd_rows == 32 or self.tiles(SHAPE[-1]).bwd_split or self.tiles(SHAPE[-1]).bwd_store:
            off(self, d_q, SHAPE[0] * SHAPE[1] * SHAPE[2] * SHAPE[4])

    def failing(self, head_dim):
        chosen = self._choices.get(head_dim, {})
        if chosen.get("fwd_rows", 0) not in (0, 64) or chosen.get("bwd_rows", 0) not in (0, 32):
            raise attention.KernelLimitError("too many registers")
        return real_kernels(self, head_dim)

    monkeypatch.setattr(attention.Attention, "forward", wrong_forward)
    monkeypatch.setattr(attention.Attention, "backward", wrong_backward)
    monkeypatch.setattr(attention.Attention, "_kernels", failing)
    monkeypatch.setattr(matmul_autotune, "best_seconds", lambda dev, launch, min_s, rounds=3: (launch(), 1.0)[1])
    assert attention_autotune.tiling(device, *SHAPE) == {f: 0 for f in TUNED_FIELDS}
    assert set(_entry(device, tuning)["ms"]) == {"forward per-row", "backward staged"}


@pytest.mark.parametrize("damage", [{"choice": {"fwd_rows": 64}}, {"choice": {f: 0 for f in TUNED_FIELDS} | {"fwd_rows": 48}},
                                    {"choice": {f: 0 for f in TUNED_FIELDS} | {"bwd_items": 64.0}},
                                    {"choice": {f: 0 for f in TUNED_FIELDS} | {"bwd_rows": 1024, "bwd_keys": 1024}},
                                    {"choice": "64x32"}, None, {"ms": {}}])
def test_a_damaged_cache_entry_is_timed_again(device, tuning, damage):
    key = matmul_autotune.device_key(device, "attention")
    tuning.write_text(json.dumps({key: {NAME: damage, "1x1 heads 1/1 head_dim": {}}, "other device": {"x": 1}}))
    choice = attention_autotune.tiling(device, *SHAPE)
    data = json.loads(tuning.read_text())
    assert data["other device"] == {"x": 1} and list(data[key]) == [NAME]
    assert data[key][NAME]["choice"] == choice and len(data[key][NAME]["ms"]) >= 4


def test_cpus_and_tuning_off_keep_the_references_untimed(device, tuning, monkeypatch):
    monkeypatch.setattr(matmul_autotune, "best_seconds", lambda *a, **k: pytest.fail("timed"))
    monkeypatch.setenv(matmul_autotune.ENV_VAR, "0")
    assert attention_autotune.tiling(device, *SHAPE) == {}
    assert attention_autotune.expected_seconds(device, 2.0) == 0.0
    monkeypatch.undo()  # the device's own tiling: a CPU's has no staged kernels
    if not attention.default_tiles(device, 16).bwd_tile:
        assert attention_autotune.options(device, 16) == ([{"fwd_rows": 0, "fwd_keys": 0, "fwd_items": 0}],
                                                          [{"bwd_rows": 0, "bwd_keys": 0, "bwd_items": 0, "bwd_split": 0,
                                                            "bwd_store": 0}])


def test_the_first_timing_is_counted_in_the_first_run_estimate_once(device, tuning):
    fwd, bwd = attention_autotune.options(device, 64)
    builds = len(fwd) + sum(not o["bwd_split"] for o in bwd) - 2  # a split option runs its unsplit one's build
    assert attention_autotune.expected_seconds(device, 2.0) == pytest.approx(2.0 * builds + 2.0)
    attention_autotune.tiling(device, *SHAPE)
    assert attention_autotune.expected_seconds(device, 2.0) == 0.0


def test_a_model_trains_through_the_chosen_kernels_as_through_the_references(device, tuning, monkeypatch):
    cfg = ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, context_length=40)
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, cfg.vocab_size, (2, 40))
    targets, mask = np.roll(tokens, -1, axis=1), np.ones((2, 40), np.float32)
    results = []
    chosen = {"fwd_rows": 16, "fwd_keys": 8, "fwd_items": 8, "bwd_rows": 16, "bwd_keys": 8, "bwd_items": 12}
    for choice in ({}, chosen):
        monkeypatch.setattr(attention_autotune, "tiling", lambda *a, c=choice, **k: c)
        model = Model(device, cfg, batch_size=2, seed=5)
        t = model.ops.attention.tiles(cfg.head_dim)
        assert all(getattr(t, f) == choice.get(f, getattr(GPU_LIKE, f)) for f in TUNED_FIELDS)
        stats = model.forward_backward(tokens, targets, mask)
        results.append((stats.loss, model.dev.download(model.grads.flat, (model.grads.layout.total,)).copy()))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-5)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-3, atol=1e-5)


def test_a_chosen_tiling_that_does_not_fit_shrinks_or_falls_back_without_touching_the_rest(device, tuning, monkeypatch):
    """A cached choice whose staged forward allows fewer work-items than chosen (another driver's registers):
    it runs with fewer, and the chosen backward keeps its own; sizes that are no tiling or do not fit are
    ignored."""
    real = type(device).work_group_size
    monkeypatch.setattr(type(device), "work_group_size",
                        lambda self, kn: 4 if kn.function_name == "attention_forward_tiled" else real(self, kn))
    op = attention.Attention(device)
    choice = {"fwd_rows": 16, "fwd_keys": 8, "fwd_items": 16, "bwd_rows": 8, "bwd_keys": 8, "bwd_items": 16}
    op.use_tiling(16, choice)
    t = op.tiles(16)
    assert (t.fwd_rows, t.forward_items, t.bwd_rows, t.backward_items) == (16, 4, 8, 16)
    monkeypatch.setattr(type(device), "work_group_size", real)
    op.use_tiling(16, {})  # and back: rebuilt
    assert (op.tiles(16).fwd_rows, op.tiles(16).bwd_rows) == (0, 0)
    op.use_tiling(16, choice)
    assert (op.tiles(16).fwd_rows, op.tiles(16).bwd_rows) == (16, 8)
    op.use_tiling(16, {**choice, "fwd_rows": 48, "bwd_rows": 4096, "bwd_keys": 4096})  # no tiling / too large
    assert (op.tiles(16).fwd_rows, op.tiles(16).bwd_rows) == (0, 0)


def test_options_are_timed_as_a_model_runs_them_where_kernels_allow_fewer_work_items(device, tuning, monkeypatch):
    """Compiled kernels that allow 8 work-items per group (GPU_LIKE asks 16; an iGPU under register pressure):
    the references run with 8, as a Model's attention does; options that cannot run as timed are skipped."""
    real = type(device).work_group_size
    monkeypatch.setattr(type(device), "work_group_size",
                        lambda self, kn: min(8, real(self, kn)) if kn.function_name.startswith("attention") else real(self, kn))
    choice = attention_autotune.tiling(device, *SHAPE)
    entry = _entry(device, tuning)
    assert entry["choice"] == choice and {"forward per-row", "backward staged"} <= set(entry["ms"])
    assert attention.Attention(device).tiles(16).backward_items == 8


def test_a_chosen_part_that_does_not_build_or_fit_falls_back_alone(device, tuning, monkeypatch):
    choice = {"fwd_rows": 16, "fwd_keys": 8, "fwd_items": 16, "bwd_rows": 8, "bwd_keys": 8, "bwd_items": 16}
    real_size, real_kernel = type(device).work_group_size, type(device).kernel

    def blocked_too_big(self, kn):
        if kn.function_name == "attention_backward_dkdv_blocked":
            raise attention.KernelLimitError("the compiled kernel attention_backward_dkdv_blocked needs 99999 bytes")
        return real_size(self, kn)

    monkeypatch.setattr(type(device), "work_group_size", blocked_too_big)
    op = attention.Attention(device)
    op.use_tiling(16, choice)
    t = op.tiles(16)
    assert (t.fwd_rows, t.bwd_rows, t.backward_items) == (16, 0, GPU_LIKE.backward_items)
    monkeypatch.setattr(type(device), "work_group_size", real_size)

    def no_build(self, name, kernel, options=()):
        if any(o.startswith("-DFQ=") for o in options):
            raise attention.KernelBuildError("ptxas error (simulated)")
        return real_kernel(self, name, kernel, options)

    monkeypatch.setattr(type(device), "kernel", no_build)
    op = attention.Attention(device)
    op.use_tiling(16, choice)
    assert op.tiles(16).fwd_rows == 0  # the program with the staged forward does not build: the per-row one


@pytest.mark.parametrize("junk", ["16", 16.0, None, -4, True, float("nan")])
def test_use_tiling_refuses_what_is_no_size(device, junk):
    with pytest.raises(ValueError, match="fwd_rows"):
        attention.Attention(device).use_tiling(16, {"fwd_rows": junk, "fwd_keys": 8})
    with pytest.raises(ValueError, match="dict"):
        attention.Attention(device).use_tiling(16, None)


def test_items_apply_with_their_blocks_and_within_local_size(device, tuning):
    op = attention.Attention(device)
    op.use_tiling(16, {"bwd_items": 3, "fwd_items": 5})  # no blocks chosen: the staged backward keeps its items
    t = op.tiles(16)
    assert (t.fwd_rows, t.bwd_rows, t.backward_items) == (0, 0, GPU_LIKE.backward_items)
    capped = attention.Attention(device, local_size=8)  # chosen work-groups larger than the cap are left out
    capped.use_tiling(16, {"fwd_rows": 16, "fwd_keys": 8, "fwd_items": 16, "bwd_rows": 8, "bwd_keys": 8, "bwd_items": 16})
    assert (capped.tiles(16).fwd_rows, capped.tiles(16).bwd_rows) == (0, 0)


def test_a_model_that_never_trains_times_the_forward_only(device, tuning, monkeypatch):
    choice = attention_autotune.tiling(device, *SHAPE, backward=False)
    data = json.loads(tuning.read_text())[matmul_autotune.device_key(device, "attention")]
    assert list(data) == ["2x40 heads 4/2 forward head_dim 16"]
    assert all(k.startswith("forward") for k in data["2x40 heads 4/2 forward head_dim 16"]["ms"])
    assert choice["bwd_rows"] == 0
    full = attention_autotune.tiling(device, *SHAPE)  # a training model of the shape times both
    monkeypatch.setattr(matmul_autotune, "best_seconds", lambda *a, **k: pytest.fail("timed again"))
    assert attention_autotune.tiling(device, *SHAPE, backward=False) == {**full, **{f: 0 for f in TUNED_FIELDS
                                                                                  if f.startswith("bwd")}}


def test_a_deeply_nested_cache_file_is_ignored(device, tuning):
    tuning.write_text("[" * 100000 + "]" * 100000)
    assert set(attention_autotune.tiling(device, *SHAPE)) == set(TUNED_FIELDS)


def test_a_kernel_the_choice_does_not_change_that_fails_raises_instead_of_looping(device, tuning, monkeypatch):
    """The staged backward does not fit while a staged forward is chosen (llvmpipe's compiled kernels at
    head_dim 64), or the chosen blocked backward and then the staged one do not: the error is raised, as
    without a choice."""
    real = type(device).work_group_size

    def staged_too_big(self, kn):
        if kn.function_name in ("attention_backward_dkdv_tiled", "attention_backward_dkdv_blocked"):
            raise attention.KernelLimitError(f"the compiled kernel {kn.function_name} needs 99999 bytes")
        return real(self, kn)

    monkeypatch.setattr(type(device), "work_group_size", staged_too_big)
    for choice in ({"fwd_rows": 16, "fwd_keys": 8, "fwd_items": 16},
                   {"fwd_rows": 16, "fwd_keys": 8, "fwd_items": 16, "bwd_rows": 8, "bwd_keys": 8, "bwd_items": 16}):
        op = attention.Attention(device)
        op.use_tiling(16, choice)
        with pytest.raises(attention.KernelLimitError, match="dkdv_tiled"):
            op.tiles(16)


def test_a_staged_forward_whose_kernel_allows_fewer_work_items_runs_with_fewer(device, tuning, monkeypatch):
    real = type(device).work_group_size
    monkeypatch.setattr(type(device), "work_group_size",
                        lambda self, kn: 4 if kn.function_name == "attention_forward_tiled" else real(self, kn))
    op = attention.Attention(device)
    op.use_tiling(16, {"fwd_rows": 16, "fwd_keys": 8, "fwd_items": 16})
    assert (op.tiles(16).fwd_rows, op.tiles(16).forward_items) == (16, 4)
    choice = attention_autotune.tiling(device, *SHAPE)  # and the tuner times the staged forwards so
    assert sum(k.startswith("forward ") and "per-row" not in k for k in _entry(device, tuning)["ms"]) >= 1
    assert set(choice) == set(TUNED_FIELDS)
