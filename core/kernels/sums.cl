// Deterministic two-pass reductions (sum of squares, sum), for the gradient L2 norms, the
// finite-weights check and the loss sum.
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

// Sums of squares of many segments of one flat buffer (the per-tensor gradient norms) in two
// launches for all segments. The host cuts every segment into chunks of at most a fixed length;
// chunks (n_chunks, 2) int32 holds [start, end) of each chunk in x.
// Pass 1: work-group c -> partials[c] = sum of x^2 over chunk c.
__kernel void sum_squares_chunks(__global float* partials, __global const float* x,
                                 __global const int* chunks, __local float* red) {
    const int c = get_group_id(0);
    const int end = chunks[2 * c + 1];
    float acc0 = 0.0f, acc1 = 0.0f;
    const int L = get_local_size(0);
    int i = chunks[2 * c] + get_local_id(0);
    for (; i + L < end; i += 2 * L) {  // two independent sums keep two loads in flight
        const float a = x[i], b = x[i + L];
        acc0 += a * a;
        acc1 += b * b;
    }
    if (i < end) acc0 += x[i] * x[i];
    const float acc = group_sum(red, acc0 + acc1);
    if (get_local_id(0) == 0) partials[c] = acc;
}

// Pass 2: work-group s -> out[out_start + s] = sum of partials[first[s] .. first[s + 1]) (overwritten);
// first (n_segments + 1) int32 is the first chunk of every segment.
__kernel void sum_segments(__global float* out, const int out_start, __global const float* partials,
                           __global const int* first, __local float* red) {
    const int s = get_group_id(0);
    float acc = 0.0f;
    for (int i = first[s] + get_local_id(0); i < first[s + 1]; i += get_local_size(0)) acc += partials[i];
    acc = group_sum(red, acc);
    if (get_local_id(0) == 0) out[out_start + s] = acc;
}
