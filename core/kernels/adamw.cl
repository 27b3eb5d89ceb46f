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

#include "grid.h"
#include "inline_math.h"

// grads (n) -> params (n), m (n), v (n) updated in place
__kernel void adamw_step(__global float* params, __global float* m, __global float* v,
                         __global const float* grads, const int n, const int n_decay,
                         const float lr, const float beta1, const float beta2, const float eps,
                         const float weight_decay, const float bias_correction1,
                         const float bias_correction2, const float grad_scale,
                         const int contiguous) {
    const int n4 = n / 4;
    for (int i = unit_first(n4, contiguous); i < unit_end(n4, contiguous); i += unit_step(contiguous)) {
        const float4 g = LOAD4(i, grads) * grad_scale;
        const float4 mi = beta1 * LOAD4(i, m) + (1.0f - beta1) * g;
        const float4 vi = beta2 * LOAD4(i, v) + (1.0f - beta2) * g * g;
        STORE4(mi, i, m);
        STORE4(vi, i, v);
        const float4 p = LOAD4(i, params);
        const int4 idx = (int4)(4 * i) + (int4)(0, 1, 2, 3);
        const float4 wd = idx < n_decay ? weight_decay : 0.0f;  // a ternary, not select(): see inline_math.h
        const float4 update = (mi / bias_correction1) / (sqrt(vi / bias_correction2) + eps);
        STORE4(p - lr * (update + wd * p), i, params);
    }
    for (int t = unit_first(n - 4 * n4, contiguous); t < unit_end(n - 4 * n4, contiguous); t += unit_step(contiguous)) {
        const int i = 4 * n4 + t;
        const float g = grads[i] * grad_scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * g;
        const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float p = params[i];
        const float wd = i < n_decay ? weight_decay : 0.0f;
        const float update = (mi / bias_correction1) / (sqrt(vi / bias_correction2) + eps);
        params[i] = p - lr * (update + wd * p);
    }
}
