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
// Pass 1: work-group c -> partials[c] = sum of x^2 over chunk c. contiguous != 0 (CPUs): each work-item
// sums its own slice of the chunk (four streams side by side, blocks of 16, then the slice's last elements),
// through consecutive memory (a PoCL work-item runs its whole loop before the next: the interleaved loop
// there strides, 3x slower; the launcher gives a chunk one work-item, whose slice is the whole chunk); contiguous == 0 (GPUs): work-item l takes elements l, l + L, ... (coalesced).
// Branch-free in contiguous, as grid.h explains.
__kernel void sum_squares_chunks(__global float* partials, __global const float* x,
                                 __global const int* chunks, __local float* red, const int contiguous) {
    const int c = get_group_id(0);
    const int cont = contiguous != 0;
    const int start = chunks[2 * c], end = chunks[2 * c + 1];
    const int L = get_local_size(0), lid = get_local_id(0);
    const int per = ((end - start + L - 1) / L + 15) / 16 * 16;  // a slice: whole blocks of 16 but the chunk's last
    const int lo = start + lid * per;
    const int hi = lo + per < end ? lo + per : end;
    // the slice as four streams of whole 16-float blocks read side by side (a core keeps four reads of memory
    // in flight, not one: 64M floats on PoCL, 2-core Xeon: 12.7 -> 17.5 GB/s), then the rest in blocks of 16
    const int q = cont * (hi > lo ? (hi - lo) / 64 : 0) * 16;  // floats per stream; none when interleaved
    __global const float* b0 = x + lo;
    float4 s0 = (float4)(0.0f), s1 = (float4)(0.0f), s2 = (float4)(0.0f), s3 = (float4)(0.0f);
    for (int k = 0; k < q; k += 4) {  // four independent sums: an add's latency is not the limit
        const float4 a0 = vload4(0, b0 + k), a1 = vload4(0, b0 + q + k), a2 = vload4(0, b0 + 2 * q + k),
                     a3 = vload4(0, b0 + 3 * q + k);
        s0 += a0 * a0;
        s1 += a1 * a1;
        s2 += a2 * a2;
        s3 += a3 * a3;
    }
    const int rest = lo + 4 * q;
    const int n16 = cont * (hi > rest ? (hi - rest) / 16 : 0);
    for (int k = 0; k < n16; k++) {
        __global const float* b = x + rest + 16 * k;
        const float4 a0 = vload4(0, b), a1 = vload4(1, b), a2 = vload4(2, b), a3 = vload4(3, b);
        s0 += a0 * a0;
        s1 += a1 * a1;
        s2 += a2 * a2;
        s3 += a3 * a3;
    }
    const float4 acc4 = (s0 + s1) + (s2 + s3);
    const int step = cont + (1 - cont) * L;
    const int stop = cont * hi + (1 - cont) * end;
    float acc0 = 0.0f, acc1 = 0.0f;
    int i = cont * (rest + 16 * n16) + (1 - cont) * (start + lid);
    for (; i + step < stop; i += 2 * step) {  // two independent sums keep two loads in flight
        const float a = x[i], b = x[i + step];
        acc0 += a * a;
        acc1 += b * b;
    }
    if (i < stop) acc0 += x[i] * x[i];
    const float acc = group_sum(red, (acc0 + acc1) + ((acc4.x + acc4.y) + (acc4.z + acc4.w)));
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
