// Residual connection: out = a + b, and the matching gradient accumulation.
// Backward of out = a + b is d_a += d_out and d_b += d_out, so one kernel (residual_backward)
// serves both inputs. Also used to add gradients from two paths into one buffer.
// Memory-bound: float4 groups shared out as grid.h says, then the last n % 4 elements one by one.

#include "grid.h"
#include "inline_math.h"

// a (n), b (n) -> out (n)
__kernel void residual_forward(__global float* out, __global const float* a,
                               __global const float* b, const int n,
                               const int contiguous) {
    const int n4 = n / 4;
    for (int i = unit_first(n4, contiguous); i < unit_end(n4, contiguous); i += unit_step(contiguous)) STORE4(LOAD4(i, a) + LOAD4(i, b), i, out);
    for (int t = unit_first(n - 4 * n4, contiguous); t < unit_end(n - 4 * n4, contiguous); t += unit_step(contiguous)) out[4 * n4 + t] = a[4 * n4 + t] + b[4 * n4 + t];
}

// d_out (n) -> d_in (n), accumulated: d_in += d_out
__kernel void residual_backward(__global float* d_in, __global const float* d_out, const int n,
                                const int contiguous) {
    const int n4 = n / 4;
    for (int i = unit_first(n4, contiguous); i < unit_end(n4, contiguous); i += unit_step(contiguous)) STORE4(LOAD4(i, d_in) + LOAD4(i, d_out), i, d_in);
    for (int t = unit_first(n - 4 * n4, contiguous); t < unit_end(n - 4 * n4, contiguous); t += unit_step(contiguous)) d_in[4 * n4 + t] += d_out[4 * n4 + t];
}
