// RMSNorm as in llama.cpp (ggml_rms_norm, then a multiply by the weight):
//   y = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps)   (per row of `dim` elements)
// Backward, with g = d_out * w and dot = sum_j g_j x_j over the row:
//   d_x = rstd * (g - x * rstd^2 * dot / dim),   d_w += sum over rows of d_out * x * rstd
// Row reductions: one work-group per row, a tree in local memory with barriers. The work-group
// size must be a power of two (any, 1 included); `scratch` holds one float per work-item.

#include "group_reduce.h"

// x (n_rows, dim), weight (dim) -> out (n_rows, dim), rstd (n_rows)
// global (n_rows * L), local (L): work-group r normalises row r.
__kernel void rmsnorm_forward(__global float* out, __global float* rstd,
                              __global const float* x, __global const float* weight,
                              const int n_rows, const int dim, const float eps,
                              __local float* scratch) {
    const int row = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    __global const float* xr = x + row * dim;
    float ss = 0.0f;
    for (int i = lid; i < dim; i += L) ss += xr[i] * xr[i];
    ss = group_sum(scratch, ss);
    const float r = 1.0f / sqrt(ss / (float)dim + eps);
    if (lid == 0) rstd[row] = r;
    for (int i = lid; i < dim; i += L) out[row * dim + i] = xr[i] * r * weight[i];
}

// d_out, x (n_rows, dim), weight (dim), rstd (n_rows) -> d_x (n_rows, dim), overwritten
// global (n_rows * L), local (L): work-group r handles row r.
__kernel void rmsnorm_backward_input(__global float* d_x, __global const float* d_out,
                                     __global const float* x, __global const float* weight,
                                     __global const float* rstd, const int n_rows,
                                     const int dim, __local float* scratch) {
    const int row = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    __global const float* xr = x + row * dim;
    __global const float* gr = d_out + row * dim;
    float dot = 0.0f;
    for (int i = lid; i < dim; i += L) dot += gr[i] * weight[i] * xr[i];
    dot = group_sum(scratch, dot);
    const float r = rstd[row];
    const float coef = r * r * dot / (float)dim;
    for (int i = lid; i < dim; i += L) d_x[row * dim + i] = r * (gr[i] * weight[i] - xr[i] * coef);
}

// d_out, x (n_rows, dim), rstd (n_rows) -> d_weight (dim), accumulated
// global (round_up(dim)): one work-item per column sums over the rows in order (deterministic).
__kernel void rmsnorm_backward_weight(__global float* d_weight, __global const float* d_out,
                                      __global const float* x, __global const float* rstd,
                                      const int n_rows, const int dim) {
    const int i = get_global_id(0);
    if (i >= dim) return;
    float acc = 0.0f;
    for (int row = 0; row < n_rows; row++) acc += d_out[row * dim + i] * x[row * dim + i] * rstd[row];
    d_weight[i] += acc;
}
