// Softmax cross-entropy over the vocabulary, one row per token, with a per-row mask.
//   lse = max + log(sum_j exp(logits[j] - max))          (stable log-sum-exp)
//   losses[r]   = mask[r] * (lse - logits[target[r]])    (= mask * -log softmax[target])
//   d_logits[r] = (softmax - onehot(target[r])) * mask[r] * grad_scale
// (the gradient of softmax cross-entropy; e.g. Goodfellow et al. 2016, "Deep Learning", 6.2.2.3).
// A row with mask 0 gets loss 0 and gradient 0 and its target is never read (it may be out of
// range). A row with mask != 0 and a target outside [0, vocab_size) gets loss NaN (a data bug made
// visible) and gradient softmax * mask * grad_scale.
// One work-group per row; tree reductions in local memory, any power-of-two work-group size.
// The backward may write d_logits over logits (the same buffer: the trainer keeps no logits after the
// loss): every read of a row comes before the writes to it.
// row0: the logits are rows row0 .. of the batch (the Model's loss head runs in chunks of rows): targets,
// mask and losses are read and written from element row0 on; logits and d_logits from their start.

#include "group_reduce.h"
#include "inline_math.h"

// Row max and sum_j exp(row[j] - max), identical in every item of the group.
inline float2 row_softmax_stats(__global const float* row, const int vocab_size,
                                __local float* red) {
    const int lid = get_local_id(0);
    const int L = get_local_size(0);
    float m = -INFINITY;
    for (int j = lid; j < vocab_size; j += L) m = fmax(m, row[j]);
    m = group_max(red, m);
    float s = 0.0f;
    for (int j = lid; j < vocab_size; j += L) s += exp(row[j] - m);
    s = group_sum(red, s);
    return (float2)(m, s);
}

// The target's logit; branch-free (no kernel argument is read behind an `if`: Mesa's llvmpipe warns that
// it treats such reads as uniform): an out-of-range target reads row[0] (and row_loss gives NaN).
inline float target_logit(__global const float* row, const int t, const int vocab_size) {
    return row[t >= 0 && t < vocab_size ? t : 0];
}

inline float row_loss(const float row_t, const int t, const int vocab_size, const float mk, const float2 st) {
    const int ok = t >= 0 && t < vocab_size;
    return ok ? mk * (st.x + LOG_SUM(st.y) - row_t) : NAN;
}

// logits (n_rows, vocab_size), targets (n_rows) int, mask (n_rows) -> losses (n_rows)
// One work-group per row; red (local size).
__kernel void cross_entropy_forward(__global float* losses, __global const float* logits,
                                    __global const int* targets, __global const float* mask,
                                    const int vocab_size, const int row0, __local float* red) {
    const int r = get_group_id(0);
    const float mk = mask[row0 + r];
    __global const float* row = logits + (size_t)r * vocab_size;
    // stats for every row, masked or not: barriers never sit behind a branch (an early return of
    // the whole group before the barriers hung PoCL 3.0 on a CPU)
    const float2 st = row_softmax_stats(row, vocab_size, red);
    // every argument read outside branches (Mesa's llvmpipe warns about kernel arguments read in them)
    const int t = targets[row0 + r];
    const float loss = row_loss(target_logit(row, t, vocab_size), t, vocab_size, mk, st);
    __global float* out = losses + row0 + r;
    if (get_local_id(0) == 0) *out = mk == 0.0f ? 0.0f : loss;
}

// logits (n_rows, vocab_size), targets (n_rows) int, mask (n_rows)
// -> losses (n_rows), d_logits (n_rows, vocab_size) (overwritten; may be logits)
// One work-group per row; red (local size).
__kernel void cross_entropy_backward(__global float* losses, __global float* d_logits,
                                     __global const float* logits, __global const int* targets,
                                     __global const float* mask, const int vocab_size,
                                     const float grad_scale, const int row0, __local float* red) {
    const int r = get_group_id(0);
    const int lid = get_local_id(0);
    const int L = get_local_size(0);
    const float mk = mask[row0 + r];
    __global const float* row = logits + (size_t)r * vocab_size;
    __global float* drow = d_logits + (size_t)r * vocab_size;
    // stats for every row, masked or not: barriers never sit behind a branch (an early return of
    // the whole group before the barriers hung PoCL 3.0 on a CPU)
    const float2 st = row_softmax_stats(row, vocab_size, red);
    // a masked row (mk == 0) gets zeros; no early return: every argument is read outside branches
    // (Mesa's llvmpipe warns about kernel arguments read in them)
    const int t = targets[row0 + r];
    const float g = mk * grad_scale, loss = row_loss(target_logit(row, t, vocab_size), t, vocab_size, mk, st);
    const float inv = 1.0f / st.y;
    __global float* out = losses + row0 + r;
    if (lid == 0) *out = mk == 0.0f ? 0.0f : loss;
    barrier(CLK_GLOBAL_MEM_FENCE);  // every item has read the row (and row[t]) before any writes over it
    for (int j = lid; j < vocab_size; j += L) {
        const float p = exp(row[j] - st.x) * inv;
        drow[j] = mk == 0.0f ? 0.0f : (p - (j == t ? 1.0f : 0.0f)) * g;
    }
}

// ---- whole rows per work-item (CPUs): no local memory, no barriers, float4 loads with a scalar
// tail; rows shared out as grid.h says. Same formulas as above.

#include "grid.h"
inline float2 row_softmax_stats_item(__global const float* row, const int vocab_size) {
    const int v4 = vocab_size / 4;
    float4 m4 = (float4)(-INFINITY);
    for (int j = 0; j < v4; j++) m4 = MAXF(m4, LOAD4(j, row));
    float m = MAXF(MAXF(m4.x, m4.y), MAXF(m4.z, m4.w));
    for (int j = 4 * v4; j < vocab_size; j++) m = MAXF(m, row[j]);
    float4 s4 = (float4)(0.0f);
    for (int j = 0; j < v4; j++) s4 += exp(LOAD4(j, row) - m);
    float s = (s4.x + s4.y) + (s4.z + s4.w);
    for (int j = 4 * v4; j < vocab_size; j++) s += exp(row[j] - m);
    return (float2)(m, s);
}

// logits (n_rows, vocab_size), targets (n_rows) int, mask (n_rows) -> losses (n_rows)
// A masked row's loops run 0 times (n = 0) instead of being skipped by an `if` (see row_loss).
__kernel void cross_entropy_forward_rows(__global float* losses, __global const float* logits,
                                         __global const int* targets, __global const float* mask,
                                         const int n_rows, const int vocab_size, const int row0,
                                         const int contiguous) {
    for (int r = unit_first(n_rows, contiguous); r < unit_end(n_rows, contiguous); r += unit_step(contiguous)) {
        const float mk = mask[row0 + r];
        __global const float* row = logits + (size_t)r * vocab_size;
        const int n = (mk != 0.0f) * vocab_size;
        const int t = targets[row0 + r];
        const float loss = row_loss(target_logit(row, t, vocab_size), t, vocab_size, mk, row_softmax_stats_item(row, n));
        losses[row0 + r] = mk == 0.0f ? 0.0f : loss;
    }
}

// logits (n_rows, vocab_size), targets (n_rows) int, mask (n_rows)
// -> losses (n_rows), d_logits (n_rows, vocab_size) (overwritten; may be logits: the target's logit is
// read first) One exp per element: the row's exp(logits - max) go into d_logits while they are summed (the
// same float4 partial sums as row_softmax_stats_item, so the loss is the forward's), then the row
// (in L1 by then) is scaled in place. A masked row's loops run 0 times (n = 0) and its zeros are
// written by the last loop, instead of an `if` (see row_loss).
__kernel void cross_entropy_backward_rows(__global float* losses, __global float* d_logits,
                                          __global const float* logits, __global const int* targets,
                                          __global const float* mask, const int n_rows,
                                          const int vocab_size, const float grad_scale, const int row0,
                                          const int contiguous) {
    for (int r = unit_first(n_rows, contiguous); r < unit_end(n_rows, contiguous); r += unit_step(contiguous)) {
        const float mk = mask[row0 + r];
        const int t = targets[row0 + r];
        __global const float* row = logits + (size_t)r * vocab_size;
        __global float* drow = d_logits + (size_t)r * vocab_size;
        const int n = (mk != 0.0f) * vocab_size, n4 = n / 4;
        const float row_t = target_logit(row, t, vocab_size);
        float4 m4 = (float4)(-INFINITY);
        for (int j = 0; j < n4; j++) m4 = MAXF(m4, LOAD4(j, row));
        float m = MAXF(MAXF(m4.x, m4.y), MAXF(m4.z, m4.w));
        for (int j = 4 * n4; j < n; j++) m = MAXF(m, row[j]);
        float4 s4 = (float4)(0.0f);
        for (int j = 0; j < n4; j++) {
            const float4 e = exp(LOAD4(j, row) - m);
            STORE4(e, j, drow);
            s4 += e;
        }
        float s = (s4.x + s4.y) + (s4.z + s4.w);
        for (int j = 4 * n4; j < n; j++) {
            const float e = exp(row[j] - m);
            drow[j] = e;
            s += e;
        }
        const float loss = row_loss(row_t, t, vocab_size, mk, (float2)(m, s));
        losses[row0 + r] = mk == 0.0f ? 0.0f : loss;
        const float g = mk * grad_scale;
        const float ig = g / s;
        for (int j = 0; j < n4; j++) STORE4(LOAD4(j, drow) * ig, j, drow);
        for (int j = 4 * n4; j < n; j++) drow[j] *= ig;
        for (int j = n; j < vocab_size; j++) drow[j] = 0.0f;  // a masked row: zeros
        const int ok = n > 0 && t >= 0 && t < vocab_size;
        drow[ok ? t : 0] -= ok ? g : 0.0f;
    }
}
