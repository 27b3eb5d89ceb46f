// Residual connection: out = a + b, and the matching gradient accumulation.
// Backward of out = a + b is d_a += d_out and d_b += d_out, so one kernel (residual_backward)
// serves both inputs. Also used to add gradients from two paths into one buffer.
// Memory-bound: a grid-stride loop over float4 groups, then the last n % 4 elements one by one.

// a (n), b (n) -> out (n)
__kernel void residual_forward(__global float* out, __global const float* a,
                               __global const float* b, const int n) {
    const int stride = get_global_size(0);
    const int n4 = n / 4;
    for (int i = get_global_id(0); i < n4; i += stride) vstore4(vload4(i, a) + vload4(i, b), i, out);
    for (int i = 4 * n4 + get_global_id(0); i < n; i += stride) out[i] = a[i] + b[i];
}

// d_out (n) -> d_in (n), accumulated: d_in += d_out
__kernel void residual_backward(__global float* d_in, __global const float* d_out, const int n) {
    const int stride = get_global_size(0);
    const int n4 = n / 4;
    for (int i = get_global_id(0); i < n4; i += stride) vstore4(vload4(i, d_in) + vload4(i, d_out), i, d_in);
    for (int i = 4 * n4 + get_global_id(0); i < n; i += stride) d_in[i] += d_out[i];
}
