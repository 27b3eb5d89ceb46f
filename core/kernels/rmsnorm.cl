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

// d_out, x (n_rows, dim), weight (dim), rstd (n_rows) -> d_x (n_rows, dim), overwritten (+= when accumulate)
// global (n_rows * L), local (L): work-group r handles row r.
__kernel void rmsnorm_backward_input(__global float* d_x, __global const float* d_out,
                                     __global const float* x, __global const float* weight,
                                     __global const float* rstd, const int n_rows,
                                     const int dim, const int accumulate,
                                     __local float* scratch) {
    const int row = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    __global const float* xr = x + row * dim;
    __global const float* gr = d_out + row * dim;
    float dot = 0.0f;
    for (int i = lid; i < dim; i += L) dot += gr[i] * weight[i] * xr[i];
    dot = group_sum(scratch, dot);
    const float r = rstd[row];
    const float coef = r * r * dot / (float)dim;
    for (int i = lid; i < dim; i += L) {
        const float v = r * (gr[i] * weight[i] - xr[i] * coef);
        d_x[row * dim + i] = accumulate ? d_x[row * dim + i] + v : v;
    }
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

// ---- one work-item per row (CPUs): no local memory, no barriers; float4 loads with a scalar tail.
// PoCL runs each barrier region of a work-group as a loop over its items, so the tree reductions
// above cost several passes per row; a whole row per item is one pass. Rows shared out as grid.h
// says.

#include "grid.h"

inline float row_sum_squares(__global const float* xr, const int dim) {
    float4 acc = (float4)(0.0f);
    const int d4 = dim / 4;
    for (int j = 0; j < d4; j++) {
        const float4 v = vload4(j, xr);
        acc += v * v;
    }
    float ss = (acc.x + acc.y) + (acc.z + acc.w);
    for (int j = 4 * d4; j < dim; j++) ss += xr[j] * xr[j];
    return ss;
}

inline void row_scale(__global float* outr, __global const float* xr, __global const float* weight,
                      const float r, const int dim) {
    const int d4 = dim / 4;
    for (int j = 0; j < d4; j++) vstore4(vload4(j, xr) * r * vload4(j, weight), j, outr);
    for (int j = 4 * d4; j < dim; j++) outr[j] = xr[j] * r * weight[j];
}

// x (n_rows, dim), weight (dim) -> out (n_rows, dim), rstd (n_rows)
__kernel void rmsnorm_forward_rows(__global float* out, __global float* rstd,
                                   __global const float* x, __global const float* weight,
                                   const int n_rows, const int dim, const float eps,
                                   const int contiguous) {
    for (int row = unit_first(n_rows, contiguous); row < unit_end(n_rows, contiguous); row += unit_step(contiguous)) {
        __global const float* xr = x + (size_t)row * dim;
        const float r = 1.0f / sqrt(row_sum_squares(xr, dim) / (float)dim + eps);
        rstd[row] = r;
        row_scale(out + (size_t)row * dim, xr, weight, r, dim);
    }
}

// Residual add fused with the next RMSNorm: x_sum = a + b, out = rmsnorm(x_sum) * weight, rstd.
// a, b (n_rows, dim), weight (dim) -> x_sum (n_rows, dim), out (n_rows, dim), rstd (n_rows)
__kernel void rmsnorm_residual_forward_rows(__global float* x_sum, __global float* out,
                                            __global float* rstd, __global const float* a,
                                            __global const float* b, __global const float* weight,
                                            const int n_rows, const int dim, const float eps,
                                            const int contiguous) {
    const int d4 = dim / 4;
    for (int row = unit_first(n_rows, contiguous); row < unit_end(n_rows, contiguous); row += unit_step(contiguous)) {
        const size_t o = (size_t)row * dim;
        __global float* xr = x_sum + o;
        for (int j = 0; j < d4; j++) vstore4(vload4(j, a + o) + vload4(j, b + o), j, xr);
        for (int j = 4 * d4; j < dim; j++) xr[j] = a[o + j] + b[o + j];
        const float r = 1.0f / sqrt(row_sum_squares(xr, dim) / (float)dim + eps);
        rstd[row] = r;
        row_scale(out + o, xr, weight, r, dim);
    }
}

// d_out, x (n_rows, dim), weight (dim), rstd (n_rows) -> d_x (n_rows, dim), overwritten (+= when accumulate)
__kernel void rmsnorm_backward_input_rows(__global float* d_x, __global const float* d_out,
                                          __global const float* x, __global const float* weight,
                                          __global const float* rstd, const int n_rows,
                                          const int dim, const int accumulate,
                                          const int contiguous) {
    const int d4 = dim / 4;
    for (int row = unit_first(n_rows, contiguous); row < unit_end(n_rows, contiguous); row += unit_step(contiguous)) {
        const size_t o = (size_t)row * dim;
        __global const float* xr = x + o;
        __global const float* gr = d_out + o;
        float4 acc = (float4)(0.0f);
        for (int j = 0; j < d4; j++) acc += vload4(j, gr) * vload4(j, weight) * vload4(j, xr);
        float dot = (acc.x + acc.y) + (acc.z + acc.w);
        for (int j = 4 * d4; j < dim; j++) dot += gr[j] * weight[j] * xr[j];
        const float r = rstd[row];
        const float coef = r * r * dot / (float)dim;
        __global float* dr = d_x + o;
        for (int j = 0; j < d4; j++) {
            const float4 val = r * (vload4(j, gr) * vload4(j, weight) - vload4(j, xr) * coef);
            vstore4(accumulate ? vload4(j, dr) + val : val, j, dr);
        }
        for (int j = 4 * d4; j < dim; j++) {
            const float val = r * (gr[j] * weight[j] - xr[j] * coef);
            dr[j] = accumulate ? dr[j] + val : val;
        }
    }
}

// ---- one work-group per row (GPUs): the residual add fused with the group kernel above.
// a, b (n_rows, dim), weight (dim) -> x_sum, out (n_rows, dim), rstd (n_rows)
__kernel void rmsnorm_residual_forward(__global float* x_sum, __global float* out,
                                       __global float* rstd, __global const float* a,
                                       __global const float* b, __global const float* weight,
                                       const int n_rows, const int dim, const float eps,
                                       __local float* scratch) {
    const int row = get_group_id(0);
    const int lid = get_local_id(0), L = get_local_size(0);
    const size_t o = (size_t)row * dim;
    float ss = 0.0f;
    for (int i = lid; i < dim; i += L) {
        const float v = a[o + i] + b[o + i];
        x_sum[o + i] = v;
        ss += v * v;
    }
    ss = group_sum(scratch, ss);
    const float r = 1.0f / sqrt(ss / (float)dim + eps);
    if (lid == 0) rstd[row] = r;
    // each item reads back only the x_sum elements it wrote itself: no barrier needed
    for (int i = lid; i < dim; i += L) out[o + i] = x_sum[o + i] * r * weight[i];
}

// ---- d_weight in two passes (GPUs): rmsnorm_backward_weight gives a GPU only `dim` work-items,
// each walking every row; here pass 1 splits the rows into chunks of `chunk` rows (work-item
// (i, c) sums column i over chunk c, in row order) and pass 2 adds the chunks' sums in chunk
// order: still a fixed order, so deterministic.
// d_out, x (n_rows, dim), rstd (n_rows) -> partial (n_chunks, dim), overwritten
__kernel void rmsnorm_backward_weight_partial(__global float* partial, __global const float* d_out,
                                              __global const float* x, __global const float* rstd,
                                              const int n_rows, const int dim, const int chunk) {
    const int i = get_global_id(0), c = get_global_id(1);
    if (i >= dim) return;
    const int end = (c + 1) * chunk < n_rows ? (c + 1) * chunk : n_rows;
    float acc = 0.0f;
    for (int row = c * chunk; row < end; row++) acc += d_out[(size_t)row * dim + i] * x[(size_t)row * dim + i] * rstd[row];
    partial[(size_t)c * dim + i] = acc;
}

// partial (n_chunks, dim) -> d_weight (dim), accumulated
__kernel void rmsnorm_backward_weight_final(__global float* d_weight, __global const float* partial,
                                            const int n_chunks, const int dim) {
    const int i = get_global_id(0);
    if (i >= dim) return;
    float acc = 0.0f;
    for (int c = 0; c < n_chunks; c++) acc += partial[(size_t)c * dim + i];
    d_weight[i] += acc;
}
