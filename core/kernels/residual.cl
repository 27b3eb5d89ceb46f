// Residual connection: out = a + b, and the matching gradient accumulation.
// Backward of out = a + b is d_a += d_out and d_b += d_out, so one kernel (residual_backward)
// serves both inputs. Also used to add gradients from two paths into one buffer.

// a (n), b (n) -> out (n)
__kernel void residual_forward(__global float* out, __global const float* a,
                               __global const float* b, const int n) {
    int i = get_global_id(0);
    if (i < n) out[i] = a[i] + b[i];
}

// d_out (n) -> d_in (n), accumulated: d_in += d_out
__kernel void residual_backward(__global float* d_in, __global const float* d_out, const int n) {
    int i = get_global_id(0);
    if (i < n) d_in[i] += d_out[i];
}
