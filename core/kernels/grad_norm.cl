// Deterministic two-pass reductions (sum of squares, sum) and in-place scaling, for the global
// gradient L2 norm, gradient clipping and the loss sum.
// Pass 1: n_groups work-groups; each item sums a grid-stride slice of x privately, then the group
// reduces in local memory to partials[group]. Pass 2: one work-group reduces the partials into
// out[out_index]. The summation order depends only on n, n_groups and the local size, never on
// timing: no atomics. Tree reductions are valid for any power-of-two work-group size.

#include "group_reduce.h"

// x (n) -> partials (n_groups): partial sums of x^2; red (local size)
__kernel void sum_squares_partial(__global float* partials, __global const float* x, const int n,
                                  __local float* red) {
    float acc = 0.0f;
    for (int i = get_global_id(0); i < n; i += get_global_size(0)) acc += x[i] * x[i];
    acc = group_sum(red, acc);
    if (get_local_id(0) == 0) partials[get_group_id(0)] = acc;
}

// x (n) -> partials (n_groups): partial sums of x; red (local size)
__kernel void sum_partial(__global float* partials, __global const float* x, const int n,
                          __local float* red) {
    float acc = 0.0f;
    for (int i = get_global_id(0); i < n; i += get_global_size(0)) acc += x[i];
    acc = group_sum(red, acc);
    if (get_local_id(0) == 0) partials[get_group_id(0)] = acc;
}

// partials (n_partials) -> out[out_index] = sum (overwritten); one work-group; red (local size)
__kernel void sum_final(__global float* out, const int out_index, __global const float* partials,
                        const int n_partials, __local float* red) {
    float acc = 0.0f;
    for (int i = get_local_id(0); i < n_partials; i += get_local_size(0)) acc += partials[i];
    acc = group_sum(red, acc);
    if (get_local_id(0) == 0) out[out_index] = acc;
}

// x (n) *= factor, in place (gradient clipping)
__kernel void scale(__global float* x, const int n, const float factor) {
    const int i = get_global_id(0);
    if (i < n) x[i] *= factor;
}
