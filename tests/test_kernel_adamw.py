import numpy as np
import pytest

from core.kernels.adamw import AdamW
from core.kernels import adamw_ref as ref
from tests.opcheck import assert_selfcheck, assert_close, from_device, to_device

HP = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)


@pytest.mark.parametrize("n", [1, 7, 257, 10_000])
@pytest.mark.parametrize("local", [1, 64, 256])
def test_adamw_several_steps(device, rng, n, local):
    op = AdamW(device, local_size=local)
    p = rng.standard_normal(n).astype(np.float32)
    zeros = np.zeros(n, np.float32)
    P, M, V, G = to_device(device, p, zeros, zeros, zeros)
    p_ref, m_ref, v_ref = p.astype(np.float64), np.zeros(n), np.zeros(n)
    for step in range(1, 6):
        g = (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 1, n)).astype(np.float32)
        grad_scale = [1.0, 0.5, 1.0, 0.25, 1.0][step - 1]
        device.upload(g, G)
        assert op.step(P, G, M, V, n, step=step, grad_scale=grad_scale, **HP)
        p_ref, m_ref, v_ref = ref.adamw_step(p_ref, g, m_ref, v_ref, step=step,
                                             grad_scale=grad_scale, **HP)
        assert_close(from_device(device, M, p), m_ref, atol=1e-7, rtol=1e-5, what=f"m step {step}")
        assert_close(from_device(device, V, p), v_ref, atol=1e-9, rtol=1e-5, what=f"v step {step}")
        assert_close(from_device(device, P, p), p_ref, atol=1e-6, rtol=1e-5, what=f"p step {step}")
    assert_close(from_device(device, G, g), g, atol=0, rtol=0, what="grads untouched")


def test_adamw_first_step_is_sign_step():
    """Reference sanity: with bias correction the first update is lr * sign(g) (+ decay)."""
    p, m, v = ref.adamw_step(np.ones(3), np.array([2.0, -0.5, 1e-3]), np.zeros(3), np.zeros(3),
                             lr=0.1, beta1=0.9, beta2=0.999, eps=0.0, weight_decay=0.0, step=1)
    np.testing.assert_allclose(p, [0.9, 1.1, 0.9])


def test_adamw_rejects_step_zero(device):
    op = AdamW(device)
    buf = device.alloc(1)
    with pytest.raises(ValueError, match="1-based"):
        op.step(buf, buf, buf, buf, 1, step=0, **HP)


@pytest.mark.parametrize("n, n_decay", [(5, 3), (1030, 517), (40_003, 40_000), (9, 0)])
@pytest.mark.parametrize("local", [1, 32, 256])
@pytest.mark.parametrize("contiguous", [False, True], ids=["interleaved", "blocks"])
def test_adamw_one_launch_decay_mask(device, rng, n, n_decay, local, contiguous):
    """One launch over a flat buffer: decay on the first n_decay elements only (matrices), none on the
    rest (norm weights); odd sizes exercise the float4 loop's scalar tail."""
    op = AdamW(device, local_size=local, contiguous=contiguous)
    p = rng.standard_normal(n).astype(np.float32)
    zeros = np.zeros(n, np.float32)
    P, M, V, G = to_device(device, p, zeros, zeros, zeros)
    p_ref, m_ref, v_ref = p.astype(np.float64), np.zeros(n), np.zeros(n)
    for step in range(1, 4):
        g = rng.standard_normal(n).astype(np.float32)
        device.upload(g, G)
        op.step(P, G, M, V, n, step=step, grad_scale=0.5, n_decay=n_decay, **HP)
        hp_no_decay = HP | {"weight_decay": 0.0}
        a = ref.adamw_step(p_ref[:n_decay], g[:n_decay], m_ref[:n_decay], v_ref[:n_decay], step=step,
                           grad_scale=0.5, **HP)
        b = ref.adamw_step(p_ref[n_decay:], g[n_decay:], m_ref[n_decay:], v_ref[n_decay:], step=step,
                           grad_scale=0.5, **hp_no_decay)
        p_ref, m_ref, v_ref = (np.concatenate([x, y]) for x, y in zip(a, b))
        assert_close(from_device(device, M, p), m_ref, atol=1e-7, rtol=1e-5, what=f"m step {step}")
        assert_close(from_device(device, V, p), v_ref, atol=1e-9, rtol=1e-5, what=f"v step {step}")
        assert_close(from_device(device, P, p), p_ref, atol=1e-6, rtol=1e-5, what=f"p step {step}")
    # the mask matters: without decay the decayed part would differ by about lr * wd * p per step
    undecayed = ref.adamw_step(p.astype(np.float64), g, np.zeros(n), np.zeros(n), step=1,
                               **(HP | {"weight_decay": 0.0}))[0]
    if n_decay:
        assert not np.allclose(p_ref[:n_decay], undecayed[:n_decay], rtol=0, atol=1e-7)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # lr 1e39 -> float32 inf
@pytest.mark.parametrize("n, bad_at", [(1, 0), (7, 6), (257, 3), (10_000, 9_998)])
@pytest.mark.parametrize("local", [1, 64])
@pytest.mark.parametrize("how", ["grad", "lr", "weight"])
def test_an_update_that_would_not_be_finite_changes_nothing(device, rng, n, bad_at, local, how):
    """One element whose new weight or moment would be inf or NaN (a gradient of 1e30 squared in v, an lr
    that overflows float32, a weight of 3e38 pushed past the largest float) and no element changes: the
    update is all or nothing (adamw_check, then adamw_step skipped); the next finite update applies."""
    op = AdamW(device, local_size=local)
    p = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    m, v = (0.1 * rng.standard_normal(n)).astype(np.float32), np.abs(0.1 * rng.standard_normal(n)).astype(np.float32)
    hp = dict(HP)
    if how == "grad":
        g[bad_at] = 1e30  # g^2 overflows: v inf, then the update 0/inf... m finite: p stays finite, v does not
    elif how == "lr":
        hp["lr"] = 1e39  # inf as float32
    else:
        p[bad_at], g[bad_at], hp["weight_decay"] = 3.4e38, -1.0, -1.0  # p - lr * (update + wd p) past FLT_MAX
    P, G, M, V = to_device(device, p, g, m, v)
    assert not op.step(P, G, M, V, n, step=2, **hp)
    for name, buf, want in (("p", P, p), ("m", M, m), ("v", V, v)):
        assert_close(from_device(device, buf, want), want, atol=0, rtol=0, what=f"{name} unchanged")
    g[bad_at] = 0.5
    device.upload(g, G)
    assert op.step(P, G, M, V, n, step=2, **HP)
    want = ref.adamw_step(p.astype(np.float64), g, m, v, step=2, **HP)[0]
    assert_close(from_device(device, P, p)[p != 3.4e38], want[p != 3.4e38], atol=1e-6, rtol=1e-5, what="applied")


def test_selfcheck(device):
    """The op's launches as the Device tab's check makes them (``ref.selfcheck``) match numpy here."""
    assert_selfcheck(ref.selfcheck(device))


@pytest.mark.parametrize("n", [1, 7, 10_000])
@pytest.mark.parametrize("local", [1, 64, 256])
@pytest.mark.parametrize("contiguous", [False, True], ids=["interleaved", "blocks"])
def test_bounds_hold_and_a_proven_update_equals_the_checked_one(device, rng, n, local, contiguous):
    """The check measures the state's maxima; the bounds after each update (AdamW.bounds) are at least the
    real maxima; given them and the gradient's norm the next update skips adamw_check and stores bit for
    bit what the checked update stores."""
    p = rng.standard_normal(n).astype(np.float32)
    zeros = np.zeros(n, np.float32)
    ops = [AdamW(device, local_size=local, contiguous=contiguous) for _ in range(2)]
    bufs = [to_device(device, p, zeros, zeros, zeros) for _ in ops]
    for step in range(1, 5):
        g = (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 1, n)).astype(np.float32)
        norm = float(np.sqrt(np.sum(g.astype(np.float64) ** 2)))
        for k, (op, (P, M, V, G)) in enumerate(zip(ops, bufs)):
            device.upload(g, G)
            known = op.bounds if k == 1 else None
            assert op.step(P, G, M, V, n, step=step, grad_scale=0.5, grad_bound=0.5 * norm, bounds=known, **HP)
            got = [from_device(device, b, p) for b in (P, M, V)]
            real = (np.abs(got[0]).max(), np.abs(got[1]).max(), got[2].max())
            assert op.bounds is not None and all(r <= b for r, b in zip(real, op.bounds)), (real, op.bounds)
        for b0, b1 in zip(bufs[0][:3], bufs[1][:3]):
            assert np.array_equal(from_device(device, b0, p), from_device(device, b1, p))
    assert [op.checked for op in ops] == [4, 1]


def test_the_check_measures_the_maxima(device, rng):
    """adamw_check's maxima of |p|, |m|, v are numpy's, whichever element holds them (the float4 groups,
    the scalar tail), with negative weights and moments; the bounds after the update follow from them."""
    from core.kernels.adamw import update_bounds

    for n, at in ((10, 9), (10, 0), (4099, 4097), (4099, 2000)):
        p, m = rng.standard_normal(n).astype(np.float32), (0.1 * rng.standard_normal(n)).astype(np.float32)
        v = np.abs(0.01 * rng.standard_normal(n)).astype(np.float32)
        p[at], m[at], v[at] = -7.5, -3.25, 2.5
        g = rng.standard_normal(n).astype(np.float32)
        op = AdamW(device)
        P, G, M, V = to_device(device, p, g, m, v)
        norm = float(np.sqrt(np.sum(g.astype(np.float64) ** 2)))
        assert op.step(P, G, M, V, n, step=3, grad_bound=norm, **HP)
        bc = (1 - 0.9 ** 3, 1 - 0.95 ** 3)
        assert op.bounds == update_bounds((7.5, 3.25, 2.5), norm, *(HP[k] for k in ("lr", "beta1", "beta2", "eps",
                                                                                    "weight_decay")), *bc)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_what_is_proven_finite_is_finite(device, rng):
    """update_bounds is sound: over 400 random settings across magnitudes (weights, moments, gradients,
    lr, eps, decay) with elements at the bounds (|m| at its largest with v 0, the largest weight, the
    gradient's norm in one element, both signs), whenever it proves the update finite, adamw_check finds
    every new value finite and the new maxima are within the bounds; and it proves the ordinary cases."""
    from core.kernels.adamw import update_bounds

    op, proved = AdamW(device), 0
    for _ in range(400):
        W, Mx, Vx, G = (10.0 ** rng.uniform(-3, 36) for _ in range(4))
        lr, eps = 10.0 ** rng.uniform(-40, 12), 10.0 ** rng.uniform(-12, 0)
        wd, step = rng.choice([0.0, 0.1, -1.0, 3e38, -1e30]), int(rng.integers(1, 50))
        hp = dict(lr=lr, beta1=0.9, beta2=0.999, eps=eps, weight_decay=wd)
        bc1, bc2 = 1 - 0.9 ** step, 1 - 0.999 ** step
        p = np.float32([W, -W, W, 0.0, 1.0, -1.0])
        m = np.float32([Mx, -Mx, 0.0, Mx, -Mx, 0.0])
        v = np.float32([0.0, 0.0, Vx, 0.0, 0.0, Vx])
        g = np.float32([G, -G, 0.0, G, -G, G]) / np.float32(np.sqrt(3.0))  # the norm is G
        if not np.all(np.isfinite(np.concatenate([p, m, v, g]))):
            continue
        norm = float(np.sqrt(np.sum(g.astype(np.float64) ** 2)))
        maxima = (float(np.abs(p).max()), float(np.abs(m).max()), float(v.max()))
        after = update_bounds(maxima, norm, bias_correction1=bc1, bias_correction2=bc2, **hp)
        if after is None:
            continue
        proved += 1
        P, M, V, Gd = to_device(device, p, m, v, g)
        assert op.step(P, Gd, M, V, 6, step=step, **hp), (maxima, norm, hp, step)  # checked: no bound given
        got = [from_device(device, b, p) for b in (P, M, V)]
        assert np.abs(got[0]).max() <= after[0] and np.abs(got[1]).max() <= after[1] and got[2].max() <= after[2]
    assert proved >= 40, proved
    hp = (1e-3, 0.9, 0.95, 1e-8, 0.1, 0.1, 0.05)
    assert update_bounds((1.0, 0.1, 0.01), 5.0, *hp) is not None
    assert update_bounds((1.0, 0.1, 0.01), 5.0, 1e39, *hp[1:]) is None  # lr inf as float32
    assert update_bounds((1.0, 0.1, 0.01), 1e20, *hp) is None  # g^2 past the limit
    assert update_bounds((3e38, 0.1, 0.01), 5.0, *hp) is None  # a weight near FLT_MAX
    assert update_bounds((1.0, 0.1, 0.01), 5.0, *hp[:3], 0.0, *hp[4:]) is None  # eps 0: 0/0 possible
    assert update_bounds((1.0, 0.1, float("nan")), 5.0, *hp) is None  # a NaN in the state
    assert update_bounds((3.5, 0.1, 0.01), 5.0, 1e-37, 0.9, 0.95, 1e-8, 3e38, 0.1, 0.05) is None  # wd * p overflows


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # lr 1e39 -> float32 inf
def test_a_refused_update_forgets_the_bounds(device, rng):
    """After a refused update the bounds are unknown (None), and without a gradient bound too: the next
    call must check."""
    op = AdamW(device)
    p, g = rng.standard_normal(9).astype(np.float32), rng.standard_normal(9).astype(np.float32)
    P, G, M, V = to_device(device, p, g, np.zeros(9, np.float32), np.zeros(9, np.float32))
    assert op.step(P, G, M, V, 9, step=1, grad_bound=10.0, **HP) and op.bounds is not None
    assert not op.step(P, G, M, V, 9, step=2, grad_bound=10.0, bounds=op.bounds, **(HP | {"lr": 1e39}))
    assert op.bounds is None
    assert op.step(P, G, M, V, 9, step=2, **HP) and op.bounds is None
