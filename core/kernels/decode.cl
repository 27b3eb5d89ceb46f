// One llama layer's forward for ONE new token, in ONE work-group: decode of small models, where a
// launch costs more than the layer's arithmetic (core/kernels/decode.py says when it is used). The
// maths of core.model.layer_forward with one row, in its order, each phase ended by
// barrier(CLK_GLOBAL_MEM_FENCE) (one work-group: its global writes are then visible to all its items);
// for layer 0 (embed != 0) the embedding row and the first RMSNorm come first (core.model.forward's):
//   0. x_in = token_embd[tokens[0]] (d), attn_in = rmsnorm(x_in) * attn_norm               embedding.cl
//   1. qkv    = attn_in @ Wqkv^T                                   (d + 2 kv)       matmul
//   2. q, k, v: RoPE at position pos on q and k (adjacent pairs, cs: rope.cl's cos/sin table);
//               k, v written to row pos of the layer's KV cache                   rope.cl
//   3. att    = softmax(q . k_j * scale) v_j over keys j = 0 .. pos, per head (scores, then softmax, then values)
//               (GQA: head h reads kv head h / (n_heads / n_kv_heads))           attention.cl
//   4. x_out  = x_in + att @ Wo^T                                               (d)
//   5. ffn_in = rmsnorm(x_out) * ffn_norm                                       rmsnorm.cl
//   6. gu     = ffn_in @ [Wgate; Wup]^T                            (2 f)
//   7. h      = silu(gate) * up                                    (f)           swiglu.cl
//   8. x_out += h @ Wdown^T
//   9. out_norm = rmsnorm(x_out) * next_norm (the next layer's attn_norm, or output_norm)
// Shapes (float32, row-major): x_in, x_out, attn_in, out_norm, ffn_in, att, q, ffn_norm, next_norm (d);
// Wqkv (d + 2 kv, d); Wo (d, d); Wgu (2 f, d); Wdown (d, f); k_cache, v_cache (rows, kv) with row pos
// written; cs (positions, head_dim) [cos, sin] pairs; qkv (d + 2 kv), gu (2 f), h (f), scores
// (n_heads, pos + 1) scratch.
// x_in may be x_out, and attn_in may be ffn_in or out_norm (generation's buffers): each is read only in a
// phase before the one that writes it over. Work-item l takes rows l, l + L, ... of each product, units of
// RoPE, heads of attention. rmsnorm's sum of squares is computed by every work-item itself, in the same
// order (no reduction, identical values): d is small where this kernel is used.

#include "inline_math.h"

// sum of w[k] * v[k], k < n, in chunks of 16 (plain loads and stores: LLVM merges them into vector ones,
// and PoCL would call vload16 / vstore16 as functions, inline_math.h)
#define LOAD16(p) ((float16)((p)[0], (p)[1], (p)[2], (p)[3], (p)[4], (p)[5], (p)[6], (p)[7], \
                             (p)[8], (p)[9], (p)[10], (p)[11], (p)[12], (p)[13], (p)[14], (p)[15]))
#define STORE16(v, p) do { const float16 v_ = (v); (p)[0] = v_.s0; (p)[1] = v_.s1; (p)[2] = v_.s2; (p)[3] = v_.s3; \
    (p)[4] = v_.s4; (p)[5] = v_.s5; (p)[6] = v_.s6; (p)[7] = v_.s7; (p)[8] = v_.s8; (p)[9] = v_.s9; \
    (p)[10] = v_.sa; (p)[11] = v_.sb; (p)[12] = v_.sc; (p)[13] = v_.sd; (p)[14] = v_.se; (p)[15] = v_.sf; } while (0)
inline float hsum16(const float16 a) {
    const float8 a8 = a.lo + a.hi;
    const float4 a4 = a8.lo + a8.hi;
    return (a4.x + a4.y) + (a4.z + a4.w);
}
inline float dot_row(__global const float* w, __global const float* v, const int n) {
    float16 acc = (float16)(0.0f);
    int k = 0;
    for (; k + 16 <= n; k += 16) acc += LOAD16(w + k) * LOAD16(v + k);
    float s = hsum16(acc);
    for (; k < n; k++) s += w[k] * v[k];
    return s;
}

// out (n_out) = W (n_out, n_in) @ v, added to base (when given): x_out = x_in + ...; work-item l takes the
// blocks of 4 rows l, l + L, ... (v's chunks loaded once for 4 rows), the last block's rows past n_out
// read row n_out - 1 and are not stored
inline void rows_product(__global float* out, __global const float* base, __global const float* w,
                         __global const float* v, const int n_out, const int n_in) {
    const int l = get_local_id(0), L = get_local_size(0);
    for (int j = 4 * l; j < n_out; j += 4 * L) {
        __global const float* r[4];
        for (int i = 0; i < 4; i++) r[i] = w + (size_t)min(j + i, n_out - 1) * n_in;
        float16 acc0 = (float16)(0.0f), acc1 = acc0, acc2 = acc0, acc3 = acc0;
        int k = 0;
        for (; k + 16 <= n_in; k += 16) {
            const float16 x = LOAD16(v + k);
            acc0 += LOAD16(r[0] + k) * x;
            acc1 += LOAD16(r[1] + k) * x;
            acc2 += LOAD16(r[2] + k) * x;
            acc3 += LOAD16(r[3] + k) * x;
        }
        float s[4] = {hsum16(acc0), hsum16(acc1), hsum16(acc2), hsum16(acc3)};
        for (; k < n_in; k++) {
            const float x = v[k];
            for (int i = 0; i < 4; i++) s[i] += r[i][k] * x;
        }
        for (int i = 0; i < 4 && j + i < n_out; i++) out[j + i] = base ? base[j + i] + s[i] : s[i];
    }
}

// rows l, l + L, ... of out = x * rstd * g, rstd = 1 / sqrt(mean(x^2) + eps)
inline void rows_rmsnorm(__global float* out, __global const float* x, __global const float* g,
                         const int d, const float eps) {
    float ss = 0.0f;
    for (int k = 0; k < d; k++) ss += x[k] * x[k];
    const float r = 1.0f / sqrt(ss / (float)d + eps);
    for (int j = get_local_id(0); j < d; j += get_local_size(0)) out[j] = x[j] * r * g[j];
}

__kernel void decode_layer(__global float* x_out, __global float* out_norm,
                           __global float* k_cache, __global float* v_cache,
                           __global float* qkv, __global float* q, __global float* att,
                           __global float* ffn_in, __global float* gu, __global float* h, __global float* scores,
                           __global float* x_in, __global float* attn_in,
                           __global const int* tokens, __global const float* token_embd,
                           __global const float* attn_norm, const int embed,
                           __global const float* w_qkv, __global const float* w_o,
                           __global const float* ffn_norm, __global const float* w_gu,
                           __global const float* w_down, __global const float* next_norm,
                           __global const float* cs,
                           const int d, const int n_heads, const int n_kv_heads, const int head_dim,
                           const int ffn_dim, const int pos, const float eps, const float scale) {
    const int l = get_local_id(0), L = get_local_size(0);
    const int kd = n_kv_heads * head_dim, n_freq = head_dim / 2;
    // 0. (layer 0 only, embed != 0) x_in = token_embd[tokens[0]], attn_in = rmsnorm(x_in) * attn_norm
    if (embed) {
        for (int j = l; j < d; j += L) x_in[j] = token_embd[(size_t)tokens[0] * d + j];
        barrier(CLK_GLOBAL_MEM_FENCE);
        rows_rmsnorm(attn_in, x_in, attn_norm, d, eps);
        barrier(CLK_GLOBAL_MEM_FENCE);
    }
    // 1. qkv = attn_in @ Wqkv^T
    rows_product(qkv, 0, w_qkv, attn_in, d + 2 * kd, d);
    barrier(CLK_GLOBAL_MEM_FENCE);
    // 2. RoPE on the pairs of q's and k's heads, v copied; k, v into row pos of the cache
    __global const float* t = cs + (size_t)pos * head_dim;
    const int q_pairs = n_heads * n_freq, k_pairs = n_kv_heads * n_freq;
    for (int u = l; u < q_pairs + k_pairs + kd; u += L) {
        if (u < q_pairs + k_pairs) {
            const int p = u < q_pairs ? u : u - q_pairs, i = p % n_freq;
            __global const float* src = qkv + (u < q_pairs ? 0 : d) + 2 * p;
            __global float* dst = u < q_pairs ? q + 2 * p : k_cache + (size_t)pos * kd + 2 * p;
            const float c = t[2 * i], s = t[2 * i + 1], x0 = src[0], x1 = src[1];
            dst[0] = x0 * c - x1 * s;
            dst[1] = x0 * s + x1 * c;
        } else {
            const int e = u - q_pairs - k_pairs;
            v_cache[(size_t)pos * kd + e] = qkv[d + kd + e];
        }
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
    // 3. attention over keys 0 .. pos: scores (head, key) as work units into the scores rows, then per
    //    head its softmax in place, then out (head, element) = sum_j p_j v_j[element]
    const int n_keys = pos + 1, group = n_heads / n_kv_heads;
    for (int u = l; u < n_heads * n_keys; u += L) {
        const int hh = u / n_keys, j = u - hh * n_keys;
        scores[u] = dot_row(q + hh * head_dim, k_cache + (size_t)j * kd + (hh / group) * head_dim, head_dim) * scale;
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
    for (int hh = l; hh < n_heads; hh += L) {
        __global float* sh = scores + hh * n_keys;
        float m = sh[0];
        for (int j = 1; j < n_keys; j++) m = MAXF(m, sh[j]);
        float sum = 0.0f;
        for (int j = 0; j < n_keys; j++) {
            const float p = exp(sh[j] - m);
            sh[j] = p;
            sum += p;
        }
        const float inv = 1.0f / sum;
        for (int j = 0; j < n_keys; j++) sh[j] *= inv;
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
    // units (head, 16 elements from e0): 16-wide accumulators over the keys; a head_dim that 16 does not
    // divide ends with a scalar unit of the rest
    const int chunks = (head_dim + 15) / 16;
    for (int u = l; u < n_heads * chunks; u += L) {
        const int hh = u / chunks, e0 = 16 * (u - hh * chunks);
        __global const float* sh = scores + hh * n_keys;
        __global const float* vj = v_cache + (hh / group) * head_dim + e0;
        __global float* out = att + hh * head_dim + e0;
        if (e0 + 16 <= head_dim) {
            float16 acc = (float16)(0.0f);
            for (int j = 0; j < n_keys; j++) acc += sh[j] * LOAD16(vj + (size_t)j * kd);
            STORE16(acc, out);
        } else {
            for (int e = 0; e < head_dim - e0; e++) {
                float acc = 0.0f;
                for (int j = 0; j < n_keys; j++) acc += sh[j] * vj[(size_t)j * kd + e];
                out[e] = acc;
            }
        }
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
    // 4. x_out = x_in + att @ Wo^T
    rows_product(x_out, x_in, w_o, att, d, d);
    barrier(CLK_GLOBAL_MEM_FENCE);
    // 5. ffn_in = rmsnorm(x_out) * ffn_norm
    rows_rmsnorm(ffn_in, x_out, ffn_norm, d, eps);
    barrier(CLK_GLOBAL_MEM_FENCE);
    // 6. [gate | up] = ffn_in @ [Wgate; Wup]^T
    rows_product(gu, 0, w_gu, ffn_in, 2 * ffn_dim, d);
    barrier(CLK_GLOBAL_MEM_FENCE);
    // 7. h = silu(gate) * up, the sigmoid from exp(-|g|) (finite for any finite g, as swiglu.cl)
    for (int j = l; j < ffn_dim; j += L) {
        const float g = gu[j], e = exp(g >= 0.0f ? -g : g);
        const float sig = g >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
        h[j] = g * sig * gu[ffn_dim + j];
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
    // 8. x_out += h @ Wdown^T
    rows_product(x_out, x_out, w_down, h, d, ffn_dim);
    barrier(CLK_GLOBAL_MEM_FENCE);
    // 9. out_norm = rmsnorm(x_out) * next_norm
    rows_rmsnorm(out_norm, x_out, next_norm, d, eps);
}
