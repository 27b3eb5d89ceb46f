// AdamW update with decoupled weight decay (Loshchilov & Hutter 2019, "Decoupled Weight Decay
// Regularization", Algorithm 2; Adam moments from Kingma & Ba 2015):
//   g = grads * grad_scale                    (grad_scale = the gradient-clipping factor)
//   m = beta1 m + (1 - beta1) g
//   v = beta2 v + (1 - beta2) g^2
//   p -= lr * ((m / bias_correction1) / (sqrt(v / bias_correction2) + eps) + weight_decay * p)
// with bias_correction1 = 1 - beta1^t, bias_correction2 = 1 - beta2^t computed on the host.

// grads (n) -> params (n), m (n), v (n) updated in place
__kernel void adamw_step(__global float* params, __global float* m, __global float* v,
                         __global const float* grads, const int n, const float lr,
                         const float beta1, const float beta2, const float eps,
                         const float weight_decay, const float bias_correction1,
                         const float bias_correction2, const float grad_scale) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = params[i];
    const float update = (mi / bias_correction1) / (sqrt(vi / bias_correction2) + eps);
    params[i] = p - lr * (update + weight_decay * p);
}
