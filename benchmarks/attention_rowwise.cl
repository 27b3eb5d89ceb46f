// The row-wise attention kernel that core/kernels/attention.cl replaced (one work-group per query
// row, the full (B, n_heads, T, T) probabilities in global memory). Kept for
// benchmarks/attention_speed.py only, as the "old" side of its comparison.

// Causal multi-head attention with grouped-query attention (GQA), forward and backward.
//   S = scale * Q K^T (scale = 1/sqrt(head_dim)), masked so that query i (absolute position
//   q_pos_start + i) sees key j iff j <= q_pos_start + i;  P = softmax(S) row-wise;  O = P V.
// Vaswani et al. 2017, "Attention Is All You Need", eq. 1. Backward as in Dao et al. 2022,
// "FlashAttention", Appendix B.2 (eqs. for dV, dP, dS, dQ, dK):
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),  dQ = scale dS K,  dK = scale dS^T Q.
// Query head h reads kv head h / (n_heads / n_kv_heads); dK, dV of a kv head sum over its group.
// Reductions are tree reductions in local memory with barriers, valid for any power-of-two
// work-group size. No atomics: every output element is written by exactly one work-item.

#include "group_reduce.h"

// q (B, seq_q, n_heads, head_dim), k (B, seq_k, n_kv_heads, head_dim), v (same as k)
// -> out (B, seq_q, n_heads, head_dim), probs (B, n_heads, seq_q, seq_k) (0 for masked keys)
// One work-group per query row (b, h, i), group id = (b * n_heads + h) * seq_q + i.
// Local: scores (seq_k), qrow (head_dim), red (local size). A fully masked row gives zeros.
__kernel void attention_forward(__global float* out, __global float* probs,
                                __global const float* q, __global const float* k,
                                __global const float* v, const int seq_q, const int seq_k,
                                const int q_pos_start, const int n_heads, const int n_kv_heads,
                                const int head_dim, const float scale, __local float* scores,
                                __local float* qrow, __local float* red) {
    const int row = get_group_id(0);
    const int lid = get_local_id(0);
    const int L = get_local_size(0);
    const int i = row % seq_q;
    const int h = (row / seq_q) % n_heads;
    const int b = row / (seq_q * n_heads);
    const int kvh = h / (n_heads / n_kv_heads);
    const int n_valid = clamp(q_pos_start + i + 1, 0, seq_k);  // keys 0 .. n_valid-1 are visible

    const size_t q_off = (((size_t)b * seq_q + i) * n_heads + h) * head_dim;
    const size_t kv_stride = (size_t)n_kv_heads * head_dim;  // between consecutive keys
    const size_t kv_base = (size_t)b * seq_k * kv_stride + (size_t)kvh * head_dim;
    __global float* prow = probs + (size_t)row * seq_k;

    for (int d = lid; d < head_dim; d += L) qrow[d] = q[q_off + d];
    barrier(CLK_LOCAL_MEM_FENCE);

    // scores and their max (each item owns keys j = lid, lid + L, ...)
    float m = -INFINITY;
    for (int j = lid; j < n_valid; j += L) {
        __global const float* kr = k + kv_base + j * kv_stride;
        float s = 0.0f;
        for (int d = 0; d < head_dim; d++) s += qrow[d] * kr[d];
        s *= scale;
        scores[j] = s;
        m = fmax(m, s);
    }
    m = group_max(red, m);

    float sum = 0.0f;
    for (int j = lid; j < n_valid; j += L) {
        const float e = exp(scores[j] - m);
        scores[j] = e;
        sum += e;
    }
    sum = group_sum(red, sum);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // sum == 0 only when n_valid == 0

    for (int j = lid; j < seq_k; j += L) {
        float p = 0.0f;
        if (j < n_valid) {
            p = scores[j] * inv;
            scores[j] = p;
        }
        prow[j] = p;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    // out[d] = sum_j P[j] V[j, d]; each item owns dims d = lid, lid + L, ...
    for (int d = lid; d < head_dim; d += L) {
        float acc = 0.0f;
        for (int j = 0; j < n_valid; j++) acc += scores[j] * v[kv_base + j * kv_stride + d];
        out[q_off + d] = acc;
    }
}

// Backward, kernel 1 of 2 (training: seq_q = seq_k = seq, q_pos_start = 0).
// d_out (B, seq, n_heads, head_dim), k, v (B, seq, n_kv_heads, head_dim),
// probs (B, n_heads, seq, seq) -> d_scores (B, n_heads, seq, seq) = dS (without the scale; 0 above
// the diagonal), d_q (B, seq, n_heads, head_dim) = scale dS K (overwritten).
// One work-group per query row (b, h, i), group id = (b * n_heads + h) * seq + i.
// Local: ds (seq), dorow (head_dim), red (local size).
__kernel void attention_backward(__global float* d_q, __global float* d_scores,
                                 __global const float* d_out, __global const float* k,
                                 __global const float* v, __global const float* probs,
                                 const int seq, const int n_heads, const int n_kv_heads,
                                 const int head_dim, const float scale, __local float* ds,
                                 __local float* dorow, __local float* red) {
    const int row = get_group_id(0);
    const int lid = get_local_id(0);
    const int L = get_local_size(0);
    const int i = row % seq;
    const int h = (row / seq) % n_heads;
    const int b = row / (seq * n_heads);
    const int kvh = h / (n_heads / n_kv_heads);
    const int n_valid = i + 1;

    const size_t q_off = (((size_t)b * seq + i) * n_heads + h) * head_dim;
    const size_t kv_stride = (size_t)n_kv_heads * head_dim;
    const size_t kv_base = (size_t)b * seq * kv_stride + (size_t)kvh * head_dim;
    __global const float* prow = probs + (size_t)row * seq;
    __global float* dsrow = d_scores + (size_t)row * seq;

    for (int d = lid; d < head_dim; d += L) dorow[d] = d_out[q_off + d];
    barrier(CLK_LOCAL_MEM_FENCE);

    // dP[j] = dO_i . V_j, kept in ds; and rowsum(P * dP)
    float acc = 0.0f;
    for (int j = lid; j < n_valid; j += L) {
        __global const float* vr = v + kv_base + j * kv_stride;
        float dp = 0.0f;
        for (int d = 0; d < head_dim; d++) dp += dorow[d] * vr[d];
        ds[j] = dp;
        acc += prow[j] * dp;
    }
    const float rowsum = group_sum(red, acc);

    for (int j = lid; j < seq; j += L) {
        float g = 0.0f;
        if (j < n_valid) {
            g = prow[j] * (ds[j] - rowsum);
            ds[j] = g;
        }
        dsrow[j] = g;
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int d = lid; d < head_dim; d += L) {
        float a = 0.0f;
        for (int j = 0; j < n_valid; j++) a += ds[j] * k[kv_base + j * kv_stride + d];
        d_q[q_off + d] = scale * a;
    }
}

// Backward, kernel 2 of 2. d_scores, probs (B, n_heads, seq, seq), q, d_out (B, seq, n_heads,
// head_dim) -> d_k, d_v (B, seq, n_kv_heads, head_dim) (overwritten):
//   d_k[j] = scale * sum_{h in group} sum_{i >= j} dS[h, i, j] q[i, h],
//   d_v[j] =         sum_{h in group} sum_{i >= j} P[h, i, j] d_out[i, h].
// One work-group per key row (b, kvh, j), group id = (b * n_kv_heads + kvh) * seq + j; items own
// dims d = lid, lid + L, ... No barriers, so any work-group size works.
__kernel void attention_backward_kv(__global float* d_k, __global float* d_v,
                                    __global const float* d_scores, __global const float* probs,
                                    __global const float* q, __global const float* d_out,
                                    const int seq, const int n_heads, const int n_kv_heads,
                                    const int head_dim, const float scale) {
    const int row = get_group_id(0);
    const int lid = get_local_id(0);
    const int L = get_local_size(0);
    const int j = row % seq;
    const int kvh = (row / seq) % n_kv_heads;
    const int b = row / (seq * n_kv_heads);
    const int group = n_heads / n_kv_heads;
    const size_t q_stride = (size_t)n_heads * head_dim;  // between consecutive queries

    for (int d = lid; d < head_dim; d += L) {
        float dk = 0.0f;
        float dv = 0.0f;
        for (int hh = 0; hh < group; hh++) {
            const int h = kvh * group + hh;
            const size_t s_base = ((size_t)b * n_heads + h) * seq * seq + j;  // [b, h, 0, j]
            const size_t q_base = (size_t)b * seq * q_stride + (size_t)h * head_dim + d;
            for (int i = j; i < seq; i++) {
                const size_t s = s_base + (size_t)i * seq;
                const size_t qi = q_base + (size_t)i * q_stride;
                dk += d_scores[s] * q[qi];
                dv += probs[s] * d_out[qi];
            }
        }
        const size_t kv_off = (((size_t)b * seq + j) * n_kv_heads + kvh) * head_dim + d;
        d_k[kv_off] = scale * dk;
        d_v[kv_off] = dv;
    }
}
