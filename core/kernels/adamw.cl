// AdamW update with decoupled weight decay (Loshchilov & Hutter 2019, "Decoupled Weight Decay
// Regularization", Algorithm 2; Adam moments from Kingma & Ba 2015):
//   g = grads * grad_scale                    (grad_scale = the gradient-clipping factor)
//   m = beta1 m + (1 - beta1) g
//   v = beta2 v + (1 - beta2) g^2
//   p -= lr * ((m / bias_correction1) / (sqrt(v / bias_correction2) + eps) + wd_i * p)
// with bias_correction1 = 1 - beta1^t, bias_correction2 = 1 - beta2^t computed on the host, and
// wd_i = weight_decay for elements i < n_decay (the matrices, stored first), 0 after (norm weights).
// One launch covers the whole flat parameter buffer: float4 groups (vload4/vstore4 need only float
// alignment) shared out as grid.h says, then the last n % 4 elements one by one. Every
// element's arithmetic is the same whatever the work size: the result does not depend on it.
//
// The update is all or nothing (the trainer's guard, with no copy of weights or moments): adamw_check
// computes it without storing anything and sets state[0] when a new weight or moment would not be
// finite; adamw_step, given that flag, stores nothing when it is set. Both compute each element with the
// same inline function, so the check sees exactly the values the step would store. adamw_check also
// leaves the largest |p|, |m| and v in state[1..3]: from them and the gradient's norm the host bounds
// every later state and can prove later updates finite, skipping adamw_check, a whole pass over p, m,
// v and grads (adamw.py, update_bounds).

#include "grid.h"
#include "inline_math.h"

// the scalar arguments of both kernels, after their buffers
#define ADAMW_SCALARS                                                                                 \
    const int n, const int n_decay, const float lr, const float beta1, const float beta2, const float eps, \
    const float weight_decay, const float bias_correction1, const float bias_correction2,              \
    const float grad_scale, const int contiguous

// The new (m, v, p) of float4 group i, and of element i (the tail).
inline void adamw4(const int i, __global const float* params, __global const float* m, __global const float* v,
                   __global const float* grads, const int n_decay, const float lr, const float beta1,
                   const float beta2, const float eps, const float weight_decay, const float bc1, const float bc2,
                   const float grad_scale, float4* mo, float4* vo, float4* po) {
    const float4 g = LOAD4(i, grads) * grad_scale;
    const float4 mi = beta1 * LOAD4(i, m) + (1.0f - beta1) * g;
    const float4 vi = beta2 * LOAD4(i, v) + (1.0f - beta2) * g * g;
    const float4 p = LOAD4(i, params);
    const int4 idx = (int4)(4 * i) + (int4)(0, 1, 2, 3);
    const float4 wd = idx < n_decay ? weight_decay : 0.0f;  // a ternary, not select(): see inline_math.h
    const float4 update = (mi / bc1) / (sqrt(vi / bc2) + eps);
    *mo = mi;
    *vo = vi;
    *po = p - lr * (update + wd * p);
}

inline void adamw1(const int i, __global const float* params, __global const float* m, __global const float* v,
                   __global const float* grads, const int n_decay, const float lr, const float beta1,
                   const float beta2, const float eps, const float weight_decay, const float bc1, const float bc2,
                   const float grad_scale, float* mo, float* vo, float* po) {
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    const float p = params[i];
    const float wd = i < n_decay ? weight_decay : 0.0f;
    const float update = (mi / bc1) / (sqrt(vi / bc2) + eps);
    *mo = mi;
    *vo = vi;
    *po = p - lr * (update + wd * p);
}

// x - x is 0 for a finite x, NaN for an infinite or NaN one (isfinite would be a call on PoCL)
#define FINITE4(x) all(((x) - (x)) == (float4)(0.0f))
#define FINITE1(x) (((x) - (x)) == 0.0f)

// params, m, v, grads (n) -> state[0] = 1 if the update would make a weight or moment non-finite (else
// untouched); state[1..3] (zero before the launch) -> the largest |p|, |m|, v now, as the bits of a
// non-negative float (which order as ints; a NaN's bits order above inf's)
__kernel void adamw_check(__global int* state, __global const float* params, __global const float* m,
                          __global const float* v, __global const float* grads, ADAMW_SCALARS) {
    const int n4 = n / 4;
    int ok = 1;
    int4 p_max = (int4)(0), m_max = (int4)(0), v_max = (int4)(0);
    for (int i = unit_first(n4, contiguous); i < unit_end(n4, contiguous); i += unit_step(contiguous)) {
        float4 mi, vi, p;
        adamw4(i, params, m, v, grads, n_decay, lr, beta1, beta2, eps, weight_decay, bias_correction1,
               bias_correction2, grad_scale, &mi, &vi, &p);
        ok = ok && FINITE4(mi) && FINITE4(vi) && FINITE4(p);
        p_max = max(p_max, as_int4(LOAD4(i, params)) & 0x7fffffff);
        m_max = max(m_max, as_int4(LOAD4(i, m)) & 0x7fffffff);
        v_max = max(v_max, as_int4(LOAD4(i, v)) & 0x7fffffff);
    }
    for (int t = unit_first(n - 4 * n4, contiguous); t < unit_end(n - 4 * n4, contiguous); t += unit_step(contiguous)) {
        const int i = 4 * n4 + t;
        float mi, vi, p;
        adamw1(i, params, m, v, grads, n_decay, lr, beta1, beta2, eps, weight_decay, bias_correction1,
               bias_correction2, grad_scale, &mi, &vi, &p);
        ok = ok && FINITE1(mi) && FINITE1(vi) && FINITE1(p);
        p_max.x = max(p_max.x, as_int(params[i]) & 0x7fffffff);
        m_max.x = max(m_max.x, as_int(m[i]) & 0x7fffffff);
        v_max.x = max(v_max.x, as_int(v[i]) & 0x7fffffff);
    }
    if (!ok) atomic_or(state, 1);
    atomic_max(state + 1, max(max(p_max.x, p_max.y), max(p_max.z, p_max.w)));
    atomic_max(state + 2, max(max(m_max.x, m_max.y), max(m_max.z, m_max.w)));
    atomic_max(state + 3, max(max(v_max.x, v_max.y), max(v_max.z, v_max.w)));
}

// grads (n) -> params (n), m (n), v (n) updated in place, unless state[0] (adamw_check's flag) is set
__kernel void adamw_step(__global const int* state, __global float* params, __global float* m, __global float* v,
                         __global const float* grads, ADAMW_SCALARS) {
    // no early return: every argument is read outside branches (Mesa's rusticl warns otherwise, grid.h);
    // a skipped update runs its loops over no elements
    const int go = state[0] == 0;
    const int n4 = go * (n / 4), n_tail = go * (n - 4 * (n / 4));
    for (int i = unit_first(n4, contiguous); i < unit_end(n4, contiguous); i += unit_step(contiguous)) {
        float4 mi, vi, p;
        adamw4(i, params, m, v, grads, n_decay, lr, beta1, beta2, eps, weight_decay, bias_correction1,
               bias_correction2, grad_scale, &mi, &vi, &p);
        STORE4(mi, i, m);
        STORE4(vi, i, v);
        STORE4(p, i, params);
    }
    for (int t = unit_first(n_tail, contiguous); t < unit_end(n_tail, contiguous); t += unit_step(contiguous)) {
        const int i = 4 * (n / 4) + t;
        float mi, vi, p;
        adamw1(i, params, m, v, grads, n_decay, lr, beta1, beta2, eps, weight_decay, bias_correction1,
               bias_correction2, grad_scale, &mi, &vi, &p);
        m[i] = mi;
        v[i] = vi;
        params[i] = p;
    }
}
