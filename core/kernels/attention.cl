// Causal multi-head attention with grouped-query attention (GQA), flash-style: forward with an
// online softmax over key chunks, backward recomputing the probabilities from the saved per-row
// log-sum-exp. No (seq_q x seq_k) buffer anywhere (attention_tiled.h's stored dS, DS_STORE, is bounded by the
// launcher to a multiple of Q's size).
//   S = scale * Q K^T (scale = 1/sqrt(head_dim)), masked so that query i (absolute position
//   q_pos_start + i) sees key j iff j <= q_pos_start + i;  P = softmax(S) row-wise;  O = P V;
//   lse_i = log sum_j exp(S_ij).
// Vaswani et al. 2017, "Attention Is All You Need", eq. 1. Online softmax and backward after
// Dao et al. 2022 ("FlashAttention", Algorithms 1 and 4) and Dao 2023 ("FlashAttention-2",
// Algorithms 1 and 2):
//   P_ij = exp(S_ij - lse_i),  D_i = rowsum(dO_i * O_i),  dV_j = sum_i P_ij dO_i,
//   dP_ij = dO_i . V_j,  dS_ij = P_ij (dP_ij - D_i),  dQ_i = scale sum_j dS_ij K_j,
//   dK_j = scale sum_i dS_ij Q_i.
// Query head h reads kv head h / (n_heads / n_kv_heads); dK, dV of a kv head sum over its group
// inside one work-item (or, split on GPUs, per query head into partials that attention_backward_kv_sum adds
// in head order). No atomics: every output element is written by exactly one work-item.
//
// Layouts: q, out, d_q, d_out (B, seq_q, n_heads, HD); k, v, d_k, d_v (B, seq_k, n_kv_heads, HD)
// (a KV cache of larger capacity works: only keys 0 .. seq_k-1 are read); lse, d_sum
// (B, n_heads, seq_q). The work-item grid is (query or key blocks, B * heads).
//
// Build options (attention.py chooses them from the device's limits):
//   HD   head_dim (any >= 1); VW vector width of the dot products and row updates (4 or 8); rows
//        are handled as NV = ceil(HD / VW) vectors, lanes past HD read as 0.0f and never stored.
//   WG   work-items per work-group (reqd_work_group_size).
//   BQ   query rows per work-item (forward, dQ); BK keys per chunk of the online softmax (forward,
//        dQ); BKV keys per work-item (dK/dV). BK, BKV in 1, 2, 4, 8, 16 (a vector exp each).
//   STAGE_KV  (forward) the work-group stages each chunk of BK keys and values in local memory
//        (GPUs); without it every work-item reads them straight from global memory (CPUs: PoCL
//        keeps values that live across a barrier in memory, so a barrier-free kernel keeps its
//        accumulators in registers, as matmul.cl's matmul_packed does).
// PoCL does not inline builtins such as min or vloadN, so vectors are built from scalar loads
// (LLVM merges contiguous ones) and clamps are ternaries.

#include "inline_math.h"

#ifndef HD
#define HD 32
#endif
#ifndef VW
#define VW 4
#endif
#ifndef WG
#define WG 1
#endif
#ifndef BQ
#define BQ 4
#endif
#ifndef BK
#define BK 8
#endif
#ifndef BKV
#define BKV 4
#endif
#define NV ((HD + VW - 1) / VW)  // vectors per row
#define HDP (NV * VW)            // padded row length

#if VW == 4
#define floatV float4
#define HSUM(x) (((x).s0 + (x).s1) + ((x).s2 + (x).s3))
#define VBUILD(F) ((float4)(F(0), F(1), F(2), F(3)))
#elif VW == 8
#define floatV float8
#define HSUM(x) ((((x).s0 + (x).s4) + ((x).s1 + (x).s5)) + (((x).s2 + (x).s6) + ((x).s3 + (x).s7)))
#define VBUILD(F) ((float8)(F(0), F(1), F(2), F(3), F(4), F(5), F(6), F(7)))
#else
#error "VW must be 4 or 8"
#endif

// The vector type of N floats (N in 1, 2, 4, 8, 16), for one exp call per chunk.
#define VEC_1 float
#define VEC_2 float2
#define VEC_4 float4
#define VEC_8 float8
#define VEC_16 float16
#define VEC_(n) VEC_##n
#define VEC(n) VEC_(n)
#define VLOAD_(n) vload##n
#define VLOAD__(n) VLOAD_(n)
#define VLOAD VLOAD__(VW)
#define floatK VEC(BK)
#define floatKV VEC(BKV)
#ifndef KV_ROWS
#define KV_ROWS 2  // query rows per pass of attention_backward_dkdv over its dK, dV
#endif

// Vector c of the row at p (lanes past HD are 0.0f): c is a compile-time constant after
// unrolling, so the guards fold away.
#define LANE(e) ((c) * VW + (e) < HD ? row[(c) * VW + (e)] : 0.0f)
inline void load_row(floatV* dst, const __global float* row) {
    _Pragma("unroll") for (int c = 0; c < NV; c++) dst[c] = VBUILD(LANE);
}
inline void load_row_scaled(floatV* dst, const __global float* row, const float s) {
    _Pragma("unroll") for (int c = 0; c < NV; c++) dst[c] = VBUILD(LANE) * s;
}
inline void store_row(__global float* row, const floatV* src, const float s) {
    _Pragma("unroll") for (int c = 0; c < NV; c++) {
        union { floatV v; float a[VW]; } u = {src[c] * s};
        _Pragma("unroll") for (int e = 0; e < VW; e++)
            if (c * VW + e < HD) row[c * VW + e] = u.a[e];
    }
}
inline float dot_row(const floatV* a, const floatV* b) {
    floatV t = a[0] * b[0];
    _Pragma("unroll") for (int c = 1; c < NV; c++) t += a[c] * b[c];
    return HSUM(t);
}

// One chunk of a row's online softmax (the forward's): s holds the chunk's N scores (a union of a vector .v and
// its lanes .a), m, l the row's running max and sum, acc its NV accumulator vectors; s becomes the chunk's
// probabilities (times exp(-m)), acc and l are rescaled to the new max. A macro: s is of one of two unions.
#define SOFTMAX_CHUNK(s, N, m, l, acc) do { \
        float cm_ = (s).a[0]; \
        _Pragma("unroll") for (int e_ = 1; e_ < (N); e_++) cm_ = (s).a[e_] > cm_ ? (s).a[e_] : cm_; \
        const float mn_ = cm_ > (m) ? cm_ : (m); \
        const float ms_ = mn_ == -INFINITY ? 0.0f : mn_;  /* nothing visible yet: all p are 0 */ \
        (s).v = EXPV((s).v - ms_); \
        const float alpha_ = exp((m) - ms_); \
        float ps_ = 0.0f; \
        _Pragma("unroll") for (int e_ = 0; e_ < (N); e_++) ps_ += (s).a[e_]; \
        (l) = (l) * alpha_ + ps_; \
        (m) = mn_; \
        _Pragma("unroll") for (int c_ = 0; c_ < NV; c_++) (acc)[c_] *= alpha_; \
    } while (0)

// A forward row's output acc / l at o and its log-sum-exp m + log(l) at lse_at; a row that saw no key: 0, -inf.
inline void finish_row(__global float* o, __global float* lse_at, const floatV* acc, const float m, const float l) {
    store_row(o, acc, l > 0.0f ? 1.0f / l : 0.0f);
    *lse_at = l > 0.0f ? m + LOG_SUM(l) : -INFINITY;
}

// ---------------------------------------------------------------------------------- forward
// q (B, seq_q, n_heads, HD), k, v (B, >= seq_k, n_kv_heads, HD) -> out (B, seq_q, n_heads, HD),
// lse (B, n_heads, seq_q). Work-item (x, bh) owns query rows x*BQ .. x*BQ+BQ-1 of (b, h) =
// (bh / n_heads, bh % n_heads). A row that sees no key gets out 0 and lse -INFINITY.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attention_forward(__global float* out, __global float* lse, __global const float* q,
                       __global const float* k, __global const float* v, const int seq_q,
                       const int seq_k, const int q_pos_start, const int n_heads,
                       const int n_kv_heads, const float scale) {
    const int bh = get_global_id(1);
    const int h = bh % n_heads, b = bh / n_heads;
    const int kvh = h / (n_heads / n_kv_heads);
    const int i0 = get_global_id(0) * BQ;
    const size_t q_stride = (size_t)n_heads * HD, kv_stride = (size_t)n_kv_heads * HD;
    const __global float* qb = q + (size_t)b * seq_q * q_stride + (size_t)h * HD;
    const __global float* kb = k + (size_t)b * seq_k * kv_stride + (size_t)kvh * HD;
    const __global float* vb = v + (size_t)b * seq_k * kv_stride + (size_t)kvh * HD;

    floatV qr[BQ][NV], acc[BQ][NV];
    float m[BQ], l[BQ];
    _Pragma("unroll") for (int r = 0; r < BQ; r++) {
        const int i = i0 + r < seq_q ? i0 + r : seq_q - 1;  // rows past seq_q: computed, not stored
        load_row_scaled(qr[r], qb + i * q_stride, scale);
        _Pragma("unroll") for (int c = 0; c < NV; c++) acc[r][c] = (floatV)(0.0f);
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    // keys 0 .. n_keys-1 are visible to the last row of this work-item (or work-group)
#ifdef STAGE_KV
    const int last = (get_group_id(0) + 1) * WG * BQ;
#else
    const int last = i0 + BQ;
#endif
    const int n_vis = q_pos_start + (last < seq_q ? last : seq_q);
    const int n_keys = n_vis < 0 ? 0 : (n_vis < seq_k ? n_vis : seq_k);
#ifdef STAGE_KV
    __local float ks[BK * HDP], vs[BK * HDP];
    const int lid = get_local_id(0);
#endif

    for (int j0 = 0; j0 < n_keys; j0 += BK) {
        union { floatK v; float a[BK]; } s[BQ];  // scores, then probabilities, of this chunk
#ifdef STAGE_KV
        barrier(CLK_LOCAL_MEM_FENCE);  // everyone is done with the previous chunk
        for (int e = lid; e < BK * HDP; e += WG) {
            const int jj = e / HDP, d = e % HDP, j = j0 + jj;
            const bool ok = j < n_keys && d < HD;
            ks[e] = ok ? kb[j * kv_stride + d] : 0.0f;
            vs[e] = ok ? vb[j * kv_stride + d] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#define KROW(jj) (ks + (jj) * HDP)
#define VROW(jj) (vs + (jj) * HDP)
#define LOAD_KV(dst, p) _Pragma("unroll") for (int c = 0; c < NV; c++) dst[c] = VLOAD(c, p)
#else
#define KROW(jj) (kb + (j0 + (jj) < n_keys ? j0 + (jj) : n_keys - 1) * kv_stride)
#define VROW(jj) (vb + (j0 + (jj) < n_keys ? j0 + (jj) : n_keys - 1) * kv_stride)
#define LOAD_KV(dst, p) load_row(dst, p)
#endif
        _Pragma("unroll") for (int jj = 0; jj < BK; jj++) {
            floatV kk[NV];
            LOAD_KV(kk, KROW(jj));
            const int j = j0 + jj;
            _Pragma("unroll") for (int r = 0; r < BQ; r++) {
                const float sc = dot_row(qr[r], kk);
                s[r].a[jj] = (j < n_keys && j <= q_pos_start + i0 + r) ? sc : -INFINITY;
            }
        }
        _Pragma("unroll") for (int r = 0; r < BQ; r++) SOFTMAX_CHUNK(s[r], BK, m[r], l[r], acc[r]);
        _Pragma("unroll") for (int jj = 0; jj < BK; jj++) {
            floatV vv[NV];
            LOAD_KV(vv, VROW(jj));
            _Pragma("unroll") for (int r = 0; r < BQ; r++) {
                const float p = s[r].a[jj];
                _Pragma("unroll") for (int c = 0; c < NV; c++) acc[r][c] += p * vv[c];
            }
        }
#undef KROW
#undef VROW
#undef LOAD_KV
    }

    _Pragma("unroll") for (int r = 0; r < BQ; r++)
        if (i0 + r < seq_q)
            finish_row(out + (size_t)b * seq_q * q_stride + (i0 + r) * q_stride + (size_t)h * HD,
                       lse + (size_t)bh * seq_q + i0 + r, acc[r], m[r], l[r]);
}

// ---------------------------------------------------------------------------------- backward
// Training only: seq_q = seq_k = seq, q_pos_start = 0. Three kernels, in this order.

// What the dK/dV and dQ kernels of both layouts take after their outputs, in this order: q (B, seq,
// n_heads, HD), k, v (B, seq, n_kv_heads, HD), d_out (B, seq, n_heads, HD), lse, d_sum (B, n_heads,
// seq), then the sizes and scale = 1/sqrt(HD).
#define BACKWARD_INPUTS __global const float* q, __global const float* k, __global const float* v, \
    __global const float* d_out, __global const float* lse, __global const float* d_sum, const int seq, \
    const int n_heads, const int n_kv_heads, const float scale

// 1 of 3. d_out, out (B, seq, n_heads, HD) -> d_sum (B, n_heads, seq) = rowsum(d_out * out).
// BQ rows per work-item, work-item (x, bh) (CPUs: a work-group of one item per row cost more to
// schedule than its dot product).
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attention_backward_dsum(__global float* d_sum, __global const float* d_out,
                             __global const float* out, const int seq, const int n_heads) {
    const int bh = get_global_id(1);
    const int h = bh % n_heads, b = bh / n_heads;
    for (int i = get_global_id(0) * BQ; i < (get_global_id(0) + 1) * BQ && i < seq; i++) {
        const size_t off = (((size_t)b * seq + i) * n_heads + h) * HD;
        floatV x[NV], y[NV];
        load_row(x, d_out + off);
        load_row(y, out + off);
        d_sum[(size_t)bh * seq + i] = dot_row(x, y);
    }
}

// 2 of 3. q, d_out (B, seq, n_heads, HD), k, v (B, seq, n_kv_heads, HD), lse, d_sum
// (B, n_heads, seq) -> d_k, d_v (B, seq, n_kv_heads, HD), overwritten. Work-item (x, bkv) owns
// keys x*BKV .. x*BKV+BKV-1 of (b, kvh) = (bkv / n_kv_heads, bkv % n_kv_heads) and loops over
// every query row i >= its first key of every query head of the group. The keys are the lanes of
// floatKV vectors: the block's K and V are held transposed (kt[d] = lane l: scale * K[j0 + l][d]), so a
// query row's scores and dP over the BKV keys are HD multiply-adds of a broadcast element and a
// vector (no horizontal sums), one vector exp, and dK, dV (transposed the same way) HD more each;
// the transposed arrays (4 x HD vectors) live in the work-item's memory, L1 on CPUs.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attention_backward_dkdv(__global float* d_k, __global float* d_v, BACKWARD_INPUTS) {
    const int bkv = get_global_id(1);
    const int kvh = bkv % n_kv_heads, b = bkv / n_kv_heads;
    const int group = n_heads / n_kv_heads;
    const int j0 = get_global_id(0) * BKV;
    if (j0 >= seq) return;  // no barriers here
    const size_t q_stride = (size_t)n_heads * HD, kv_stride = (size_t)n_kv_heads * HD;
    const size_t kv_base = (size_t)b * seq * kv_stride + (size_t)kvh * HD;

    union kv_lanes { floatKV v; float a[BKV]; };
    union kv_lanes kt[HD], vt[HD];  // lanes: keys j0 .. j0 + BKV - 1 (past seq: 0.0f, never visible)
    floatKV dkt[HD], dvt[HD];
    _Pragma("unroll") for (int l = 0; l < BKV; l++) {
        const bool in = j0 + l < seq;
        const __global float* kr = k + kv_base + (size_t)(in ? j0 + l : j0) * kv_stride;
        const __global float* vr = v + kv_base + (size_t)(in ? j0 + l : j0) * kv_stride;
        for (int d = 0; d < HD; d++) {
            kt[d].a[l] = in ? kr[d] * scale : 0.0f;
            vt[d].a[l] = in ? vr[d] : 0.0f;
        }
    }
    for (int d = 0; d < HD; d++) dkt[d] = dvt[d] = (floatKV)(0.0f);
    union kv_lanes key;  // the lanes' key positions
    _Pragma("unroll") for (int l = 0; l < BKV; l++) key.a[l] = (float)(j0 + l);
    for (int hh = 0; hh < group; hh++) {
        const int h = kvh * group + hh;
        const __global float* qb = q + (size_t)b * seq * q_stride + (size_t)h * HD;
        const __global float* dob = d_out + (size_t)b * seq * q_stride + (size_t)h * HD;
        const __global float* lb = lse + ((size_t)b * n_heads + h) * seq;
        const __global float* db = d_sum + ((size_t)b * n_heads + h) * seq;
        for (int i0 = j0; i0 < seq; i0 += KV_ROWS) {  // KV_ROWS query rows at a time: one pass over dK, dV
            floatKV p[KV_ROWS], ds[KV_ROWS];
            const __global float* qi[KV_ROWS];
            const __global float* doi[KV_ROWS];
            _Pragma("unroll") for (int r = 0; r < KV_ROWS; r++) {
                const int i = i0 + r < seq ? i0 + r : seq - 1;  // rows past seq: p = 0 below
                qi[r] = qb + i * q_stride;
                doi[r] = dob + i * q_stride;
                floatKV s = (floatKV)(0.0f), dp = (floatKV)(0.0f);
                _Pragma("unroll") for (int d = 0; d < HD; d++) {
                    s += qi[r][d] * kt[d].v;
                    dp += doi[r][d] * vt[d].v;
                }
                // keys past row i0 + r (or past seq), and rows past seq, get p = 0: exp(-inf)
                const float lim = i0 + r < seq ? (float)(i0 + r) : -1.0f;
                p[r] = EXPV(key.v <= lim ? s - lb[i] : (floatKV)(-INFINITY));
                ds[r] = p[r] * (dp - db[i]);
            }
            _Pragma("unroll") for (int d = 0; d < HD; d++) {
                floatKV dv = dvt[d], dk = dkt[d];
                _Pragma("unroll") for (int r = 0; r < KV_ROWS; r++) {
                    dv += doi[r][d] * p[r];
                    dk += qi[r][d] * ds[r];
                }
                dvt[d] = dv;
                dkt[d] = dk;
            }
        }
    }
    _Pragma("unroll") for (int l = 0; l < BKV; l++) {
        if (j0 + l < seq) {
            __global float* dkr = d_k + kv_base + (size_t)(j0 + l) * kv_stride;
            __global float* dvr = d_v + kv_base + (size_t)(j0 + l) * kv_stride;
            for (int d = 0; d < HD; d++) {
                union kv_lanes a = {dkt[d]}, c = {dvt[d]};
                dkr[d] = a.a[l] * scale;
                dvr[d] = c.a[l];
            }
        }
    }
}

// 2 of 3, with split (the staged and blocked dK/dV kernels of GPUs, attention_tiled.h's DKDV_SPLIT): parts
// (rows, n_heads, 2 HD), each query head's partial dK then dV -> d_k, d_v (rows, n_kv_heads, HD) = the sums over
// each kv head's group of query heads, in head order. rows = B * seq; work-item x owns element x of d_k and d_v
// (elements 4x .. 4x + 3, as one float4, where HD is a multiple of 4: KV_SUM_W).
#define KV_SUM_W (HD % 4 == 0 ? 4 : 1)
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attention_backward_kv_sum(__global float* d_k, __global float* d_v, __global const float* parts,
                               const int rows, const int n_heads, const int n_kv_heads) {
    const size_t x = get_global_id(0) * KV_SUM_W;
    if (x >= (size_t)rows * n_kv_heads * HD) return;
    const int group = n_heads / n_kv_heads;
    const size_t r = x / ((size_t)n_kv_heads * HD);
    const int kvh = (int)(x / HD % n_kv_heads), d = (int)(x % HD);
    const __global float* p = parts + (r * n_heads + (size_t)kvh * group) * 2 * HD + d;
#if HD % 4 == 0
    float4 sk = (float4)(0.0f), sv = (float4)(0.0f);
    for (int hh = 0; hh < group; hh++) {
        sk += vload4(0, p + hh * 2 * HD);
        sv += vload4(0, p + hh * 2 * HD + HD);
    }
    vstore4(sk, 0, d_k + x);
    vstore4(sv, 0, d_v + x);
#else
    float sk = 0.0f, sv = 0.0f;
    for (int hh = 0; hh < group; hh++) {
        sk += p[hh * 2 * HD];
        sv += p[hh * 2 * HD + HD];
    }
    d_k[x] = sk;
    d_v[x] = sv;
#endif
}

// 3 of 3. q, d_out (B, seq, n_heads, HD), k, v (B, seq, n_kv_heads, HD), lse, d_sum
// (B, n_heads, seq) -> d_q (B, seq, n_heads, HD), overwritten. Work-item (x, bh) owns query rows
// x*BQ .. x*BQ+BQ-1 of (b, h) and loops over their visible keys in chunks of BK.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attention_backward_dq(__global float* d_q, BACKWARD_INPUTS) {
    const int bh = get_global_id(1);
    const int h = bh % n_heads, b = bh / n_heads;
    const int kvh = h / (n_heads / n_kv_heads);
    const int i0 = get_global_id(0) * BQ;
    if (i0 >= seq) return;  // no barriers here
    const size_t q_stride = (size_t)n_heads * HD, kv_stride = (size_t)n_kv_heads * HD;
    const size_t q_base = (size_t)b * seq * q_stride + (size_t)h * HD;
    const __global float* kb = k + (size_t)b * seq * kv_stride + (size_t)kvh * HD;
    const __global float* vb = v + (size_t)b * seq * kv_stride + (size_t)kvh * HD;

    floatV qr[BQ][NV], dor[BQ][NV], dq[BQ][NV];
    float li[BQ], di[BQ];
    _Pragma("unroll") for (int r = 0; r < BQ; r++) {
        const int i = i0 + r < seq ? i0 + r : seq - 1;
        load_row_scaled(qr[r], q + q_base + i * q_stride, scale);
        load_row(dor[r], d_out + q_base + i * q_stride);
        li[r] = lse[(size_t)bh * seq + i];
        di[r] = d_sum[(size_t)bh * seq + i];
        _Pragma("unroll") for (int c = 0; c < NV; c++) dq[r][c] = (floatV)(0.0f);
    }
    const int n_keys = i0 + BQ < seq ? i0 + BQ : seq;
    for (int j0 = 0; j0 < n_keys; j0 += BK) {
        union { floatK v; float a[BK]; } p[BQ];
        _Pragma("unroll") for (int jj = 0; jj < BK; jj++) {
            floatV kk[NV];
            const int j = j0 + jj;
            load_row(kk, kb + (j < n_keys ? j : n_keys - 1) * kv_stride);
            _Pragma("unroll") for (int r = 0; r < BQ; r++)
                p[r].a[jj] = j <= i0 + r ? dot_row(qr[r], kk) - li[r] : -INFINITY;
        }
        _Pragma("unroll") for (int r = 0; r < BQ; r++) p[r].v = EXPV(p[r].v);
        _Pragma("unroll") for (int jj = 0; jj < BK; jj++) {
            floatV vv[NV];
            const int j = j0 + jj;
            load_row(vv, vb + (j < n_keys ? j : n_keys - 1) * kv_stride);
            _Pragma("unroll") for (int r = 0; r < BQ; r++)
                p[r].a[jj] *= dot_row(dor[r], vv) - di[r];  // dS (without the scale)
        }
        _Pragma("unroll") for (int jj = 0; jj < BK; jj++) {
            floatV kk[NV];
            const int j = j0 + jj;
            load_row(kk, kb + (j < n_keys ? j : n_keys - 1) * kv_stride);
            _Pragma("unroll") for (int r = 0; r < BQ; r++) {
                const float ds = p[r].a[jj];
                _Pragma("unroll") for (int c = 0; c < NV; c++) dq[r][c] += ds * kk[c];
            }
        }
    }
    _Pragma("unroll") for (int r = 0; r < BQ; r++)
        if (i0 + r < seq) store_row(d_q + q_base + (i0 + r) * q_stride, dq[r], scale);
}

// ------------------------------------------------------- keys as lanes (CPUs with wide SIMD)
// The forward and dQ with a query row's scores over BKT keys as the lanes of one vector: K (and V, for dQ's
// dP) transposed once per layer into kvt (attention_transpose_kv), so that a row's scores are HD multiply-adds
// of a broadcast element of the row and a vector of BKT consecutive keys' elements (no horizontal sums, as
// attention_backward_dkdv's). Measured on PoCL (2-core Xeon, AVX-512, BKT 16): SmolLM2's forward
// (head_dim 64, 256 rows, 9/3 heads) about 1.4x the kernels above. Built with -DBKT=8 or 16.
#ifdef BKT
#define floatT VEC(BKT)
union t_lanes { floatT v; float a[BKT]; };

// BKT consecutive floats at p (any alignment): scalar loads LLVM merges (PoCL does not inline vloadN)
inline floatT load_lanes(const __global float* p) {
    union t_lanes u;
    _Pragma("unroll") for (int e = 0; e < BKT; e++) u.a[e] = p[e];
    return u.v;
}

// acc[r] += w[r].a[e] * (row e of x) for the chunk's keys e < nj, rows of x stride floats apart: the forward's
// P V and dQ's dS K, the weights of a chunk being lanes.
inline void add_lane_rows(floatV acc[BQ][NV], const union t_lanes* w, const __global float* x, const size_t stride,
                          const int nj) {
    for (int e = 0; e < nj; e++) {
        floatV xe[NV];
        load_row(xe, x + (size_t)e * stride);
        _Pragma("unroll") for (int r = 0; r < BQ; r++) {
            const float we = w[r].a[e];
            _Pragma("unroll") for (int c = 0; c < NV; c++) acc[r][c] += we * xe[c];
        }
    }
}

// k, v (B, >= seq_k, n_kv_heads, HD) -> kvt: K^T (B, n_kv_heads, HD, S) and, with both, V^T after it (at
// B * n_kv_heads * HD * S); S >= seq_k, a multiple of BKT; 0.0f at keys past seq_k. Work-item (x, bkv): keys
// x*16 .. x*16+15 of (b, kvh) = (bkv / n_kv_heads, bkv % n_kv_heads).
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attention_transpose_kv(__global float* kvt, __global const float* k, __global const float* v,
                            const int seq_k, const int S, const int n_kv_heads, const int both) {
    const int bkv = get_global_id(1);
    const int kvh = bkv % n_kv_heads, b = bkv / n_kv_heads;
    const int j0 = get_global_id(0) * 16;
    if (j0 >= S) return;  // no barriers here
    const size_t kv_stride = (size_t)n_kv_heads * HD, plane = (size_t)get_global_size(1) * HD * S;
    // the 16 keys' rows (a key past seq_k reads key 0 and stores 0.0f); per element d, 16 contiguous floats
    const __global float* kr[16];
    const __global float* vr[16];
    _Pragma("unroll") for (int e = 0; e < 16; e++) {
        const size_t row = ((size_t)b * seq_k + (j0 + e < seq_k ? j0 + e : 0)) * kv_stride + (size_t)kvh * HD;
        kr[e] = k + row;
        vr[e] = v + row;
    }
    __global float* kt = kvt + (size_t)bkv * HD * S + j0;
    for (int d = 0; d < HD; d++) {
        _Pragma("unroll") for (int e = 0; e < 16; e++) kt[(size_t)d * S + e] = j0 + e < seq_k ? kr[e][d] : 0.0f;
        if (both)
            _Pragma("unroll") for (int e = 0; e < 16; e++)
                kt[plane + (size_t)d * S + e] = j0 + e < seq_k ? vr[e][d] : 0.0f;
    }
}

// As attention_forward (same arguments and results), with K^T from attention_transpose_kv (kvt, S) instead of k.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attention_forward_lanes(__global float* out, __global float* lse, __global const float* q,
                             __global const float* kvt, __global const float* v, const int seq_q,
                             const int seq_k, const int S, const int q_pos_start, const int n_heads,
                             const int n_kv_heads, const float scale) {
    const int bh = get_global_id(1);
    const int h = bh % n_heads, b = bh / n_heads;
    const int kvh = h / (n_heads / n_kv_heads);
    const int i0 = get_global_id(0) * BQ;
    const size_t q_stride = (size_t)n_heads * HD, kv_stride = (size_t)n_kv_heads * HD;
    const __global float* qb = q + (size_t)b * seq_q * q_stride + (size_t)h * HD;
    const __global float* kt = kvt + ((size_t)b * n_kv_heads + kvh) * HD * S;
    const __global float* vb = v + (size_t)b * seq_k * kv_stride + (size_t)kvh * HD;

    float qs[BQ][HD];
    floatV acc[BQ][NV];
    float m[BQ], l[BQ];
    _Pragma("unroll") for (int r = 0; r < BQ; r++) {
        const int i = i0 + r < seq_q ? i0 + r : seq_q - 1;  // rows past seq_q: computed, not stored
        for (int d = 0; d < HD; d++) qs[r][d] = qb[i * q_stride + d] * scale;
        _Pragma("unroll") for (int c = 0; c < NV; c++) acc[r][c] = (floatV)(0.0f);
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    const int last = i0 + BQ;
    const int n_vis = q_pos_start + (last < seq_q ? last : seq_q);
    const int n_keys = n_vis < 0 ? 0 : (n_vis < seq_k ? n_vis : seq_k);
    union t_lanes pos;  // the lanes' key offsets in a chunk
    _Pragma("unroll") for (int e = 0; e < BKT; e++) pos.a[e] = (float)e;
    for (int j0 = 0; j0 < n_keys; j0 += BKT) {
        union t_lanes s[BQ];
        _Pragma("unroll") for (int r = 0; r < BQ; r++) s[r].v = (floatT)(0.0f);
        for (int d = 0; d < HD; d++) {
            const floatT kd = load_lanes(kt + (size_t)d * S + j0);
            _Pragma("unroll") for (int r = 0; r < BQ; r++) s[r].v += qs[r][d] * kd;
        }
        _Pragma("unroll") for (int r = 0; r < BQ; r++) {
            // key j0 + e is visible to row i0 + r iff j0 + e <= q_pos_start + i0 + r and j0 + e < n_keys
            const int vis = q_pos_start + i0 + r < n_keys - 1 ? q_pos_start + i0 + r : n_keys - 1;
            s[r].v = pos.v <= (floatT)((float)(vis - j0)) ? s[r].v : (floatT)(-INFINITY);
            SOFTMAX_CHUNK(s[r], BKT, m[r], l[r], acc[r]);
        }
        add_lane_rows(acc, s, vb + (size_t)j0 * kv_stride, kv_stride, n_keys - j0 < BKT ? n_keys - j0 : BKT);  // P V
    }
    _Pragma("unroll") for (int r = 0; r < BQ; r++)
        if (i0 + r < seq_q)
            finish_row(out + (size_t)b * seq_q * q_stride + (i0 + r) * q_stride + (size_t)h * HD,
                       lse + (size_t)bh * seq_q + i0 + r, acc[r], m[r], l[r]);
}

// As attention_backward_dq (3 of 3; same results), with K^T and V^T from attention_transpose_kv (kvt, S, both)
// for the scores and dP; k (row-major) for dQ's sum.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attention_backward_dq_lanes(__global float* d_q, __global const float* kvt, const int S, BACKWARD_INPUTS) {
    const int bh = get_global_id(1);
    const int h = bh % n_heads, b = bh / n_heads;
    const int kvh = h / (n_heads / n_kv_heads);
    const int i0 = get_global_id(0) * BQ;
    if (i0 >= seq) return;  // no barriers here
    const size_t q_stride = (size_t)n_heads * HD, kv_stride = (size_t)n_kv_heads * HD;
    const size_t q_base = (size_t)b * seq * q_stride + (size_t)h * HD;
    const size_t plane = (size_t)get_global_size(1) / n_heads * n_kv_heads * HD * S;  // B * n_kv_heads * HD * S
    const __global float* kt = kvt + ((size_t)b * n_kv_heads + kvh) * HD * S;
    const __global float* vt = kt + plane;
    const __global float* kb = k + (size_t)b * seq * kv_stride + (size_t)kvh * HD;

    float qs[BQ][HD], dos[BQ][HD], li[BQ], di[BQ];
    floatV dq[BQ][NV];
    _Pragma("unroll") for (int r = 0; r < BQ; r++) {
        const int i = i0 + r < seq ? i0 + r : seq - 1;
        for (int d = 0; d < HD; d++) {
            qs[r][d] = q[q_base + i * q_stride + d] * scale;
            dos[r][d] = d_out[q_base + i * q_stride + d];
        }
        li[r] = lse[(size_t)bh * seq + i];
        di[r] = d_sum[(size_t)bh * seq + i];
        _Pragma("unroll") for (int c = 0; c < NV; c++) dq[r][c] = (floatV)(0.0f);
    }
    union t_lanes pos;
    _Pragma("unroll") for (int e = 0; e < BKT; e++) pos.a[e] = (float)e;
    const int n_keys = i0 + BQ < seq ? i0 + BQ : seq;
    for (int j0 = 0; j0 < n_keys; j0 += BKT) {
        union t_lanes p[BQ];
        floatT dp[BQ];
        _Pragma("unroll") for (int r = 0; r < BQ; r++) p[r].v = dp[r] = (floatT)(0.0f);
        for (int d = 0; d < HD; d++) {
            const floatT kd = load_lanes(kt + (size_t)d * S + j0), vd = load_lanes(vt + (size_t)d * S + j0);
            _Pragma("unroll") for (int r = 0; r < BQ; r++) {
                p[r].v += qs[r][d] * kd;
                dp[r] += dos[r][d] * vd;
            }
        }
        _Pragma("unroll") for (int r = 0; r < BQ; r++) {  // dS (without the scale); keys past row i0 + r: 0
            const floatT sc = pos.v <= (floatT)((float)(i0 + r - j0)) ? p[r].v - li[r] : (floatT)(-INFINITY);
            p[r].v = EXPV(sc) * (dp[r] - di[r]);
        }
        add_lane_rows(dq, p, kb + (size_t)j0 * kv_stride, kv_stride, n_keys - j0 < BKT ? n_keys - j0 : BKT);  // dS K
    }
    _Pragma("unroll") for (int r = 0; r < BQ; r++)
        if (i0 + r < seq) store_row(d_q + q_base + (i0 + r) * q_stride, dq[r], scale);
}
#endif  // BKT

// the staged forward and backward and the blocked backward (local-memory tiles, chosen on GPUs by
// core/kernels/attention_autotune.py): built with -DBT (and -DFQ or -DBR), in attention_tiled.h
#include "attention_tiled.h"
