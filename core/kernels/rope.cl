// Rotary position embedding (RoPE), ggml's "normal" mode: ADJACENT pairs (x[2i], x[2i+1]) of each
// head are rotated, as llama.cpp does for the llama architecture (LLAMA_ROPE_TYPE_NORM; see
// ggml_rope / ggml_rope_ext in ggml.h and rope_yarn + ggml_compute_forward_rope_f32 in
// ggml/src/ggml-cpu/ops.cpp, with freq_scale = 1 and ext_factor = 0). For pair i at position pos:
//   angle    = pos * theta^(-2i/head_dim)
//   y[2i]    = x[2i] cos(angle) - x[2i+1] sin(angle)
//   y[2i+1]  = x[2i] sin(angle) + x[2i+1] cos(angle)
// The rotation is orthogonal, so the backward is the inverse rotation (angle -> -angle), which is
// also how ggml's rope_back works (it negates the sine).
//
// Accuracy: a plain float product pos * inv_freq is off by up to half an ulp of the angle (~1e-4 rad
// at pos ~ 4000). The launcher passes inv_freq = theta^(-2i/head_dim) computed on the host in float64
// precision as a float pair hi + lo; the kernel forms the angle as an unevaluated sum a_hi + a_lo
// (the rounding error of pos * hi recovered exactly with fma) and applies a_lo to first order:
//   cos(a_hi + a_lo) ~ cos(a_hi) - sin(a_hi) a_lo,  sin(a_hi + a_lo) ~ sin(a_hi) + cos(a_hi) a_lo.
// |a_lo| is at most about half an ulp of a_hi (1.2e-4 for angles below 4096, 2e-3 below 65536), so
// the dropped second-order term a_lo^2/2 stays below 2e-6 for any realistic context.

#include "grid.h"
#include "inline_math.h"

// The angle of pair i at position pos as a cos/sin pair (sign -1: the inverse rotation), with the
// hi + lo frequency of the header; and the rotation of one pair.
inline void rope_angle(__global const float* inv_freq, const int n_freq, const int i, const float pos,
                       const float sign, float* c, float* s) {
    const float f_hi = inv_freq[i];
    const float f_lo = inv_freq[n_freq + i];
    const float a_hi = pos * f_hi;
    const float a_lo = fma(pos, f_hi, -a_hi) + pos * f_lo;
    float c_hi;
    const float s_hi = sincos(a_hi, &c_hi);
    *c = c_hi - s_hi * a_lo;
    *s = sign * (s_hi + c_hi * a_lo);
}

inline float2 rotate2(const float2 x, const float c, const float s) {
    return (float2)(x.x * c - x.y * s, x.x * s + x.y * c);
}

// Pair i of n heads (head_dim floats apart) at src -> dst, rotated by (c, s) (rotate) or copied: RH heads' loads
// issued before their stores. The buffers may alias as far as the compiler knows, so a loop of load-store pairs
// waits for each load in turn: a work unit's 32 heads at d1024's shape were 32 round trips to memory, 43 us a
// layer on an H100 (1.5 TB/s).
#define RH 8
inline void move_pairs(__global float* dst, __global const float* src, const int n, const int head_dim,
                       const float c, const float s, const int rotate) {
    for (int h0 = 0; h0 < n; h0 += RH) {
        float2 x[RH];
        _Pragma("unroll") for (int u = 0; u < RH; u++)
            x[u] = h0 + u < n ? LOAD2(0, src + (h0 + u) * head_dim) : (float2)(0.0f);
        _Pragma("unroll") for (int u = 0; u < RH; u++)
            if (h0 + u < n) STORE2(rotate ? rotate2(x[u], c, s) : x[u], 0, dst + (h0 + u) * head_dim);
    }
}

// The fused [q | k | v] rows of one QKV matmul, split into the q, k and v buffers with RoPE on
// q and k (forward), and the way back for the gradients (backward, inverse rotation).
// qkv (n_tokens, n_heads*head_dim + 2*n_kv_heads*head_dim); q (n_tokens, n_heads*head_dim);
// k, v: rows kv_row0 .. kv_row0 + n_tokens - 1 of (rows, n_kv_heads*head_dim) (the KV cache in
// generation, kv_row0 = 0 in training); inv_freq (2, head_dim/2) = [hi; lo]. Token row r has
// position pos_start + r % seq_len (rows are (B, T) flattened). Work units (row r, pair i), shared out
// as grid.h says: the angle (sincos) is computed once and applied to pair i of every q and k head.
// qkv -> q, k, v (q and k rotated by +angle)
__kernel void rope_split_qkv(__global float* q, __global float* k, __global float* v,
                             __global const float* qkv, __global const float* inv_freq,
                             const int n_tokens, const int seq_len, const int n_heads,
                             const int n_kv_heads, const int head_dim, const int pos_start,
                             const int kv_row0, const int contiguous) {
    const int n_freq = head_dim / 2, qd = n_heads * head_dim, kd = n_kv_heads * head_dim;
    const int total = n_tokens * n_freq;
    for (int g = unit_first(total, contiguous); g < unit_end(total, contiguous); g += unit_step(contiguous)) {
        const int i = g % n_freq, r = g / n_freq;
        float c, s;
        rope_angle(inv_freq, n_freq, i, (float)(pos_start + r % seq_len), 1.0f, &c, &s);
        __global const float* src = qkv + (size_t)r * (qd + 2 * kd) + 2 * i;
        const size_t kv_at = (size_t)(kv_row0 + r) * kd + 2 * i;
        move_pairs(q + (size_t)r * qd + 2 * i, src, n_heads, head_dim, c, s, 1);
        move_pairs(k + kv_at, src + qd, n_kv_heads, head_dim, c, s, 1);
        move_pairs(v + kv_at, src + qd + kd, n_kv_heads, head_dim, c, s, 0);
    }
}

// d_q, d_k, d_v (n_tokens rows each, kv_row0 = 0) -> d_qkv (d_q and d_k rotated by -angle)
__kernel void rope_join_qkv(__global float* d_qkv, __global const float* d_q,
                            __global const float* d_k, __global const float* d_v,
                            __global const float* inv_freq, const int n_tokens, const int seq_len,
                            const int n_heads, const int n_kv_heads, const int head_dim,
                            const int pos_start, const int contiguous) {
    const int n_freq = head_dim / 2, qd = n_heads * head_dim, kd = n_kv_heads * head_dim;
    const int total = n_tokens * n_freq;
    for (int g = unit_first(total, contiguous); g < unit_end(total, contiguous); g += unit_step(contiguous)) {
        const int i = g % n_freq, r = g / n_freq;
        float c, s;
        rope_angle(inv_freq, n_freq, i, (float)(pos_start + r % seq_len), -1.0f, &c, &s);
        __global float* dst = d_qkv + (size_t)r * (qd + 2 * kd) + 2 * i;
        const size_t kv_at = (size_t)r * kd + 2 * i;
        move_pairs(dst, d_q + (size_t)r * qd + 2 * i, n_heads, head_dim, c, s, 1);
        move_pairs(dst + qd, d_k + kv_at, n_kv_heads, head_dim, c, s, 1);
        move_pairs(dst + qd + kd, d_v + kv_at, n_kv_heads, head_dim, c, s, 0);
    }
}

// ---- whole rows per work-item with a cos/sin table (CPUs): the angles of every (position, pair)
// are computed once into cs (n_pos, head_dim/2, 2) = (cos, sin) by rope_table, with rope_angle as
// above (so the same floats), and the row kernels read them: no sincos per row and pair, and each
// work-item streams through its rows in order (rows shared out as grid.h says).

// inv_freq (2, n_freq) -> cs (n_pos, n_freq, 2); one work unit per (position, pair)
__kernel void rope_table(__global float* cs, __global const float* inv_freq, const int n_pos,
                         const int n_freq, const int contiguous) {
    const int total = n_pos * n_freq;
    for (int g = unit_first(total, contiguous); g < unit_end(total, contiguous); g += unit_step(contiguous)) {
        float c, s;
        rope_angle(inv_freq, n_freq, g % n_freq, (float)(g / n_freq), 1.0f, &c, &s);
        cs[2 * g] = c;
        cs[2 * g + 1] = s;
    }
}

// n heads of head_dim at src -> dst, pair i rotated by (cs[2i], sign * cs[2i+1])
inline void rotate_heads(__global float* dst, __global const float* src, __global const float* cs,
                         const int n, const int head_dim, const float sign) {
    for (int h = 0; h < n; h++) {
        for (int i = 0; i < head_dim / 2; i++) {
            const float c = cs[2 * i], s = sign * cs[2 * i + 1];
            const float x0 = src[h * head_dim + 2 * i], x1 = src[h * head_dim + 2 * i + 1];
            dst[h * head_dim + 2 * i] = x0 * c - x1 * s;
            dst[h * head_dim + 2 * i + 1] = x0 * s + x1 * c;
        }
    }
}

// rope_split_qkv with whole rows per work-item; cs from rope_table (positions pos_start .. present)
__kernel void rope_split_qkv_rows(__global float* q, __global float* k, __global float* v,
                                  __global const float* qkv, __global const float* cs,
                                  const int n_tokens, const int seq_len, const int n_heads,
                                  const int n_kv_heads, const int head_dim, const int pos_start,
                                  const int kv_row0, const int contiguous) {
    const int qd = n_heads * head_dim, kd = n_kv_heads * head_dim;
    for (int r = unit_first(n_tokens, contiguous); r < unit_end(n_tokens, contiguous); r += unit_step(contiguous)) {
        __global const float* t = cs + (size_t)(pos_start + r % seq_len) * head_dim;
        __global const float* src = qkv + (size_t)r * (qd + 2 * kd);
        const size_t kv_at = (size_t)(kv_row0 + r) * kd;
        rotate_heads(q + (size_t)r * qd, src, t, n_heads, head_dim, 1.0f);
        rotate_heads(k + kv_at, src + qd, t, n_kv_heads, head_dim, 1.0f);
        for (int j = 0; j < kd; j++) v[kv_at + j] = src[qd + kd + j];
    }
}

// rope_join_qkv with whole rows per work-item; cs from rope_table
__kernel void rope_join_qkv_rows(__global float* d_qkv, __global const float* d_q,
                                 __global const float* d_k, __global const float* d_v,
                                 __global const float* cs, const int n_tokens, const int seq_len,
                                 const int n_heads, const int n_kv_heads, const int head_dim,
                                 const int pos_start, const int contiguous) {
    const int qd = n_heads * head_dim, kd = n_kv_heads * head_dim;
    for (int r = unit_first(n_tokens, contiguous); r < unit_end(n_tokens, contiguous); r += unit_step(contiguous)) {
        __global const float* t = cs + (size_t)(pos_start + r % seq_len) * head_dim;
        __global float* dst = d_qkv + (size_t)r * (qd + 2 * kd);
        rotate_heads(dst, d_q + (size_t)r * qd, t, n_heads, head_dim, -1.0f);
        rotate_heads(dst + qd, d_k + (size_t)r * kd, t, n_kv_heads, head_dim, -1.0f);
        for (int j = 0; j < kd; j++) dst[qd + kd + j] = d_v[(size_t)r * kd + j];
    }
}
