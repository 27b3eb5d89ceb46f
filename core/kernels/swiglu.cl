// SwiGLU gate of the llama feed-forward block: out = silu(gate) * up, silu(x) = x * sigmoid(x).
// Backward: d_up = d_out * silu(gate),
//           d_gate = d_out * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate))).
// The sigmoid is computed from exp(-|x|), which never overflows, so x = +-100 (or +-1e30) gives
// finite results.
// Memory-bound: float4 groups (vload4/vstore4 need only float alignment, so any buffer offset
// works) shared out as grid.h says, then the last f % 4 elements of each row one by one.

#include "grid.h"
#include "inline_math.h"

float4 stable_sigmoid4(const float4 x) {
    const float4 e = exp(x >= 0.0f ? -x : x);  // exp(-|x|), in (0, 1]; fabs() would be a call (inline_math.h)
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

float stable_sigmoid(const float x) {
    const float e = exp(x >= 0.0f ? -x : x);
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

// ---- on the output of the fused gate|up matmul: row r of gu (n_rows, 2 f) is [gate_r | up_r].
// float4 groups of each row first (f / 4 per row), then the last f % 4 elements of every row.

// gu (n_rows, 2 f) -> out (n_rows, f)
__kernel void swiglu_fused_forward(__global float* out, __global const float* gu, const int n_rows,
                                   const int f, const int contiguous) {
    const int f4 = f / 4, tail = f - 4 * (f / 4);
    for (int g = unit_first(n_rows * f4, contiguous); g < unit_end(n_rows * f4, contiguous); g += unit_step(contiguous)) {
        const int r = g / f4, c = g - r * f4;
        __global const float* row = gu + (size_t)r * 2 * f;
        const float4 x = LOAD4(c, row);
        STORE4(x * stable_sigmoid4(x) * LOAD4(c, row + f), c, out + (size_t)r * f);
    }
    for (int g = unit_first(n_rows * tail, contiguous); g < unit_end(n_rows * tail, contiguous); g += unit_step(contiguous)) {
        const int r = g / tail, j = 4 * f4 + (g - r * tail);
        __global const float* row = gu + (size_t)r * 2 * f;
        const float x = row[j];
        out[(size_t)r * f + j] = x * stable_sigmoid(x) * row[f + j];
    }
}

// d_out (n_rows, f), gu (n_rows, 2 f) -> d_gu (n_rows, 2 f) = [d_gate | d_up] per row, overwritten
__kernel void swiglu_fused_backward(__global float* d_gu, __global const float* d_out,
                                    __global const float* gu, const int n_rows, const int f,
                                    const int contiguous) {
    const int f4 = f / 4, tail = f - 4 * (f / 4);
    for (int g = unit_first(n_rows * f4, contiguous); g < unit_end(n_rows * f4, contiguous); g += unit_step(contiguous)) {
        const int r = g / f4, c = g - r * f4;
        __global const float* row = gu + (size_t)r * 2 * f;
        __global float* drow = d_gu + (size_t)r * 2 * f;
        const float4 x = LOAD4(c, row), u = LOAD4(c, row + f), d = LOAD4(c, d_out + (size_t)r * f);
        const float4 s = stable_sigmoid4(x);
        STORE4(d * u * s * (1.0f + x * (1.0f - s)), c, drow);
        STORE4(d * x * s, c, drow + f);
    }
    for (int g = unit_first(n_rows * tail, contiguous); g < unit_end(n_rows * tail, contiguous); g += unit_step(contiguous)) {
        const int r = g / tail, j = 4 * f4 + (g - r * tail);
        __global const float* row = gu + (size_t)r * 2 * f;
        __global float* drow = d_gu + (size_t)r * 2 * f;
        const float x = row[j], u = row[f + j], d = d_out[(size_t)r * f + j];
        const float s = stable_sigmoid(x);
        drow[j] = d * u * s * (1.0f + x * (1.0f - s));
        drow[f + j] = d * x * s;
    }
}

// ---- the same on whole rows per work-item (CPUs): rows shared out as grid.h says, each row's
// float4 groups and then its f % 4 tail in order (no division per group).

// gu (n_rows, 2 f) -> out (n_rows, f)
__kernel void swiglu_fused_forward_rows(__global float* out, __global const float* gu, const int n_rows,
                                        const int f, const int contiguous) {
    const int f4 = f / 4;
    for (int r = unit_first(n_rows, contiguous); r < unit_end(n_rows, contiguous); r += unit_step(contiguous)) {
        __global const float* row = gu + (size_t)r * 2 * f;
        __global float* o = out + (size_t)r * f;
        for (int c = 0; c < f4; c++) {
            const float4 x = LOAD4(c, row);
            STORE4(x * stable_sigmoid4(x) * LOAD4(c, row + f), c, o);
        }
        for (int j = 4 * f4; j < f; j++) o[j] = row[j] * stable_sigmoid(row[j]) * row[f + j];
    }
}

// d_out (n_rows, f), gu (n_rows, 2 f) -> d_gu (n_rows, 2 f) = [d_gate | d_up] per row, overwritten
__kernel void swiglu_fused_backward_rows(__global float* d_gu, __global const float* d_out,
                                         __global const float* gu, const int n_rows, const int f,
                                         const int contiguous) {
    const int f4 = f / 4;
    for (int r = unit_first(n_rows, contiguous); r < unit_end(n_rows, contiguous); r += unit_step(contiguous)) {
        __global const float* row = gu + (size_t)r * 2 * f;
        __global const float* dr = d_out + (size_t)r * f;
        __global float* drow = d_gu + (size_t)r * 2 * f;
        for (int c = 0; c < f4; c++) {
            const float4 x = LOAD4(c, row), u = LOAD4(c, row + f), d = LOAD4(c, dr);
            const float4 s = stable_sigmoid4(x);
            STORE4(d * u * s * (1.0f + x * (1.0f - s)), c, drow);
            STORE4(d * x * s, c, drow + f);
        }
        for (int j = 4 * f4; j < f; j++) {
            const float x = row[j], u = row[f + j], d = dr[j];
            const float s = stable_sigmoid(x);
            drow[j] = d * u * s * (1.0f + x * (1.0f - s));
            drow[f + j] = d * x * s;
        }
    }
}
