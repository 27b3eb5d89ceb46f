// Matmuls with a frozen weight kept in its GGUF block bytes, dequantized inside the kernel.
//
// w: the GGUF tensor data of W (n_out, n_in), row-major: each row is n_in / QK blocks of QB bytes
//    (ggml's block layouts, `ggml-common.h`; gguf-py's `gguf.quants` is the numpy twin)
// Forward        y (M, n_out)  = x (M, n_in) . W^T       (FWD defined:  C = A . op(W), op(W) = W^T)
// Input gradient dx (M, n_in)  = dy (M, n_out) . W       (FWD undefined: op(W) = W)
// In both C (M,N) = A (M,K) . op(W) (K,N): forward K = n_in, N = n_out; input gradient K = n_out,
// N = n_in. a (M,K) and c (M,N) are float32 row-major (offsets in elements); `accumulate` != 0
// adds into c. n_in is a multiple of QK (GGUF requires it); M, n_out any >= 1.
//
// The weight format is one -D option: QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1,
// QTYPE_Q4_K, QTYPE_Q6_K, QTYPE_F16, QTYPE_BF16 or QTYPE_F32. Two dequantizers per format: dq(row, c)
// gives element c of a row (tiles, packing), dq_chunk(row, u, v) the 32 elements of chunk u (GEMV);
// both float32.
//
//   qmatmul_tiled   GPUs: a TSM x TSN tile of C per work-group of (TSN/WPTN, TSM/WPTM) work-items,
//                   TSK-deep tiles of A and of dequantized op(W) staged in local memory, WPTM x WPTN
//                   outputs per work-item in registers (matmul.cl's matmul_tiled without vectors).
//   qmatmul_pack_b  CPUs: op(W) rows k0 .. k0 + kc - 1 dequantized into the zero-padded NR-column
//                   panels that matmul.cl's matmul_packed micro-kernel reads (the same layout as its
//                   matmul_pack_b): the launcher runs matmul.cl's kernels for the rest, so only one
//                   K chunk of the weight is ever held as floats, in the shared scratch.
//   qmatmul_gemv    forward with M <= 8 (decode): a work-group of GEMV_WG work-items per GEMV_ROWS
//                   outputs, each work-item a strided share of the row's 32-element chunks,
//                   combined by a local-memory tree reduction (llama.cpp's mul_mat_vec shape). On
//                   CPUs the quantized formats, in their integer form (x = d * q + m per chunk, dq_int_*),
//                   multiply x by the integers and apply d and m once per chunk.

#include "matmul_common.h"
#include "inline_math.h"
#define QCH 32  // elements of a GEMV chunk: every format's (sub-)block holds a whole number of them

// a half at byte p (2-byte aligned: every block size and field offset below is even). CPUs: bit
// arithmetic (PoCL calls vload_half as a function, per element: packing ran 2x slower); GPUs: vload_half.
#ifdef CPU_DEVICE
// forces inlining where PoCL's inliner declines (Q6_K's dq_int_chunk was a call per row and chunk: 2x the GEMV)
#define CPU_INLINE __attribute__((always_inline))
inline float half_bits(const uint h) {
    const uint e = (h >> 10) & 31u, m = h & 1023u, sign = (h & 0x8000u) << 16;
    if (e == 0u) return as_float(as_uint((float)m * 5.96046448e-8f) | sign);  // zero, subnormal: m * 2^-24
    if (e == 31u) return as_float(sign | 0x7f800000u | (m << 13));            // inf, nan
    return as_float(sign | ((e + 112u) << 23) | (m << 13));                  // exponent bias 15 -> 127
}
inline float ld_half(__global const uchar* p) { return half_bits(*(__global const ushort*)p); }
#define HALF_AT(row, i) half_bits(((__global const ushort*)(row))[i])
#else
#define CPU_INLINE
inline float ld_half(__global const uchar* p) { return vload_half(0, (__global const half*)p); }
#define HALF_AT(row, i) vload_half(i, (__global const half*)(row))
#endif

// A 32-element chunk as two float16 vectors (elements 0-15, 16-31) or 32 floats.
typedef union { float16 h[2]; float s[QCH]; } chunk_t;
// 16 bytes from p widened to uint16, 16 floats from p: scalar loads, which LLVM merges into vector
// loads (PoCL calls vload16 as a function)
// 16 elements from p widened to uint16
#define W16(p) ((uint16)((p)[0], (p)[1], (p)[2], (p)[3], (p)[4], (p)[5], (p)[6], (p)[7], \
                         (p)[8], (p)[9], (p)[10], (p)[11], (p)[12], (p)[13], (p)[14], (p)[15]))
#define U16(p) u16_at((__global const ushort*)(p))
inline uint16 u16_at(__global const ushort* p) {  // p 2-byte aligned
    const uint16 w = (uint16)(p[0], p[0], p[1], p[1], p[2], p[2], p[3], p[3],
                              p[4], p[4], p[5], p[5], p[6], p[6], p[7], p[7]);
    return (w >> (uint16)(0u, 8u, 0u, 8u, 0u, 8u, 0u, 8u, 0u, 8u, 0u, 8u, 0u, 8u, 0u, 8u)) & 255u;
}
#define F16V(p) ((float16)((p)[0], (p)[1], (p)[2], (p)[3], (p)[4], (p)[5], (p)[6], (p)[7], \
                           (p)[8], (p)[9], (p)[10], (p)[11], (p)[12], (p)[13], (p)[14], (p)[15]))
// the floats of integers 0 <= u < 2^23 without a conversion call: the float 2^23 + u, less 2^23
#define UFLOAT(u) (as_float16((u) | (uint16)(0x4B000000u)) - 8388608.0f)

#ifdef CPU_DEVICE
// eight halves (the low 16 bits of each lane) as floats, exactly (zero, subnormal, inf, nan), without
// branches: the CPU GEMV decodes the scales of four rows at once with it
inline float8 half8_bits(const uint8 h) {
    // exponent and mantissa moved into a float's, times 2^112 to rebase the exponent (15 -> 127): a
    // subnormal half is a subnormal float there and comes out normal (CPUs keep subnormal floats;
    // tests/test_kernel_qmatmul.py's test_every_half_scale checks every half); exponent 31 (inf, nan)
    // is set to 255 apart
    const uint8 em = (h & 0x7fffu) << 13, sign = (h & 0x8000u) << 16;
    const uint8 scaled = as_uint8(as_float8(em) * 5.192296858534828e33f);  // 2^112
    const uint8 is_special = as_uint8(as_int8(em) > (int8)(0x0f7fffff));  // em < 2^31: a signed compare
    return as_float8(sign | scaled | (is_special & 0x7f800000u));
}
#endif
// 16 signed bytes from p widened to int16
#define C16(p) ((int16)((char)(p)[0], (char)(p)[1], (char)(p)[2], (char)(p)[3], (char)(p)[4], (char)(p)[5], \
                        (char)(p)[6], (char)(p)[7], (char)(p)[8], (char)(p)[9], (char)(p)[10], (char)(p)[11], \
                        (char)(p)[12], (char)(p)[13], (char)(p)[14], (char)(p)[15]))

// 16 bytes from p as a uchar16 (one 16-byte load; bit work on bytes is one 16-lane instruction on a CPU,
// where uint16 takes four)
#define B16(p) ((uchar16)((p)[0], (p)[1], (p)[2], (p)[3], (p)[4], (p)[5], (p)[6], (p)[7], (p)[8], (p)[9], \
                          (p)[10], (p)[11], (p)[12], (p)[13], (p)[14], (p)[15]))

// ------------------------------------------------------------------------------- formats
#if defined(QTYPE_Q8_0)  // block: half d, char qs[32]; x = d * q
#define QK 32
#define QB 34
inline float dq(__global const uchar* row, const int c) {
    __global const uchar* blk = row + (c / QK) * QB;
    return ld_half(blk) * (float)((char)blk[2 + c % QK]);
}
inline void dq_chunk(__global const uchar* row, const int u, chunk_t* v) {
    __global const uchar* blk = row + u * QB;
    const float d = ld_half(blk);  // q ^ 0x80 = q + 128 as a byte: 0 .. 255
    v->h[0] = d * (as_float16((U16(blk + 2) ^ (uint16)(0x80u)) | (uint16)(0x4B000000u)) - 8388736.0f);
    v->h[1] = d * (as_float16((U16(blk + 18) ^ (uint16)(0x80u)) | (uint16)(0x4B000000u)) - 8388736.0f);
}
// the integer form x = d * q + m of chunk sub (0 .. QK / QCH - 1) of block blk (the CPU GEMV), in every
// quantized format: SCALE_HALVES(blk) the halves of d and m in one word (low 16 bits d, high 16 m; 0 where
// there is no m), dq_int_scales the chunk's scales from their floats, dq_int_chunk the integers q
// (elements 0-15, 16-31) as floats
#define DQ_INT
#define DQ_NO_MIN  // m = 0
#define SCALE_HALVES(blk) ((uint)*(__global const ushort*)(blk))
inline void dq_int_scales(__global const uchar* blk, const int sub, float* d, float* m) { *m = 0.0f; }
inline void dq_int_chunk(__global const uchar* blk, const int sub, float16* q0, float16* q1) {
    *q0 = CONVERT_FLOAT16(C16(blk + 2));
    *q1 = CONVERT_FLOAT16(C16(blk + 18));
}
#elif defined(QTYPE_Q4_0)  // block: half d, uchar qs[16]; element t < 16 low nibble, t >= 16 high; x = d * (q - 8)
#define QK 32
#define QB 18
inline float dq(__global const uchar* row, const int c) {
    __global const uchar* blk = row + (c / QK) * QB;
    const int j = c % QK, q = blk[2 + (j & 15)];
    return ld_half(blk) * (float)((j < 16 ? q & 15 : q >> 4) - 8);
}
inline void dq_chunk(__global const uchar* row, const int u, chunk_t* v) {
    __global const uchar* blk = row + u * QB;
    const float d = ld_half(blk);
    const uint16 q = U16(blk + 2);
    v->h[0] = d * (UFLOAT(q & 15u) - 8.0f);
    v->h[1] = d * (UFLOAT(q >> 4) - 8.0f);
}
#define DQ_INT
#define SCALE_HALVES(blk) ((uint)*(__global const ushort*)(blk))
inline void dq_int_scales(__global const uchar* blk, const int sub, float* d, float* m) { *m = -8.0f * *d; }
inline void dq_int_chunk(__global const uchar* blk, const int sub, float16* q0, float16* q1) {
    const uint16 q = W16(blk + 2);
    *q0 = CONVERT_FLOAT16(as_int16(q & 15u));
    *q1 = CONVERT_FLOAT16(as_int16(q >> 4));
}
#elif defined(QTYPE_Q4_1)  // block: half d, half m, uchar qs[16]; x = d * q + m
#define QK 32
#define QB 20
inline float dq(__global const uchar* row, const int c) {
    __global const uchar* blk = row + (c / QK) * QB;
    const int j = c % QK, q = blk[4 + (j & 15)];
    return ld_half(blk) * (float)(j < 16 ? q & 15 : q >> 4) + ld_half(blk + 2);
}
inline void dq_chunk(__global const uchar* row, const int u, chunk_t* v) {
    __global const uchar* blk = row + u * QB;
    const float d = ld_half(blk), m = ld_half(blk + 2);
    const uint16 q = U16(blk + 4);
    v->h[0] = d * UFLOAT(q & 15u) + m;
    v->h[1] = d * UFLOAT(q >> 4) + m;
}
#define DQ_INT
#define SCALE_HALVES(blk) (*(__global const uint*)(blk))  // d, m (blocks of 20 bytes: 4-byte aligned)
inline void dq_int_scales(__global const uchar* blk, const int sub, float* d, float* m) {}
inline void dq_int_chunk(__global const uchar* blk, const int sub, float16* q0, float16* q1) {
    const uint16 q = W16(blk + 4);
    *q0 = CONVERT_FLOAT16(as_int16(q & 15u));
    *q1 = CONVERT_FLOAT16(as_int16(q >> 4));
}
#elif defined(QTYPE_Q5_0) || defined(QTYPE_Q5_1)
// Q5_0 block: half d, uchar qh[4], uchar qs[16]; x = d * (q - 16). Q5_1: half d, half m, uchar qh[4],
// uchar qs[16]; x = d * q + m. Element t < 16: low nibble of qs[t]; t >= 16: high nibble of qs[t - 16];
// bit t of qh (little-endian uint32) is bit 4 of q (ggml's dequantize_row_q5_0 / _q5_1)
#define QK 32
#ifdef QTYPE_Q5_0
#define QB 22
#define Q5_HEAD 2  // bytes before qh
#else
#define QB 24
#define Q5_HEAD 4
#endif
// the 5-bit q of elements 0-15 (q0) and 16-31 (q1) of block blk, as bytes: the bits are worked on as
// uchar16 (one 16-lane instruction each on a CPU; as uint16 the high bits doubled the CPU GEMV's time)
inline void q5_ints(__global const uchar* blk, uchar16* q0, uchar16* q1) {
    __global const uchar* h = blk + Q5_HEAD;
    const uchar16 q = B16(blk + Q5_HEAD + 4);
    const uchar16 bits = (uchar16)(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128);
    const uchar16 h0 = (uchar16)((uchar8)(h[0]), (uchar8)(h[1])), h1 = (uchar16)((uchar8)(h[2]), (uchar8)(h[3]));
    *q0 = (q & (uchar)15) | (as_uchar16((h0 & bits) != (uchar16)(0)) & (uchar)16);
    *q1 = (q >> (uchar)4) | (as_uchar16((h1 & bits) != (uchar16)(0)) & (uchar)16);
}
#ifdef QTYPE_Q5_0
#define Q5_MIN(blk, d) (-16.0f * (d))
#else
#define Q5_MIN(blk, d) ld_half((blk) + 2)
#endif
inline float dq(__global const uchar* row, const int c) {
    __global const uchar* blk = row + (c / QK) * QB;
    const int j = c % QK, q = blk[Q5_HEAD + 4 + (j & 15)];
    const int qh = blk[Q5_HEAD + j / 8];
    const float d = ld_half(blk);
    return d * (float)((j < 16 ? q & 15 : q >> 4) | (((qh >> (j % 8)) & 1) << 4)) + Q5_MIN(blk, d);
}
inline void dq_chunk(__global const uchar* row, const int u, chunk_t* v) {
    __global const uchar* blk = row + u * QB;
    uchar16 q0, q1;
    q5_ints(blk, &q0, &q1);
    const float d = ld_half(blk), m = Q5_MIN(blk, d);
    v->h[0] = d * CONVERT_FLOAT16(q0) + m;
    v->h[1] = d * CONVERT_FLOAT16(q1) + m;
}
#define DQ_INT
#ifdef QTYPE_Q5_0  // the integers q - 16 (signed bytes): no m
#define DQ_NO_MIN
#define SCALE_HALVES(blk) ((uint)*(__global const ushort*)(blk))
inline void dq_int_scales(__global const uchar* blk, const int sub, float* d, float* m) { *m = 0.0f; }
inline void dq_int_chunk(__global const uchar* blk, const int sub, float16* q0, float16* q1) {
    uchar16 v0, v1;
    q5_ints(blk, &v0, &v1);
    *q0 = CONVERT_FLOAT16(as_char16(v0 - (uchar)16));
    *q1 = CONVERT_FLOAT16(as_char16(v1 - (uchar)16));
}
#else
#define SCALE_HALVES(blk) (*(__global const uint*)(blk))  // d, m (blocks of 24 bytes: 4-byte aligned)
inline void dq_int_scales(__global const uchar* blk, const int sub, float* d, float* m) {}
inline void dq_int_chunk(__global const uchar* blk, const int sub, float16* q0, float16* q1) {
    uchar16 v0, v1;
    q5_ints(blk, &v0, &v1);
    *q0 = CONVERT_FLOAT16(v0);
    *q1 = CONVERT_FLOAT16(v1);
}
#endif
#elif defined(QTYPE_Q4_K)  // 256-element super-block: half d, half dmin, uchar scales[12], uchar qs[128]
#define QK 256
#define QB 144
// 6-bit scale and min of sub-block sb (0..7) (ggml's get_scale_min_k4)
inline float2 q4k_scale_min(__global const uchar* s, const int sb) {
    if (sb < 4) return (float2)((float)(s[sb] & 63), (float)(s[sb + 4] & 63));
    return (float2)((float)((s[sb + 4] & 15) | ((s[sb - 4] >> 6) << 4)),
                    (float)((s[sb + 4] >> 4) | ((s[sb] >> 6) << 4)));
}
// sub-block sb = j / 32: qs[(sb / 2) * 32 + j % 32], low nibble for even sb; x = d * sc * q - dmin * m
inline float dq(__global const uchar* row, const int c) {
    __global const uchar* blk = row + (c / QK) * QB;
    const int j = c % QK, sb = j / 32;
    const float2 sm = q4k_scale_min(blk + 4, sb);
    const int q = (blk[16 + (sb / 2) * 32 + j % 32] >> ((sb & 1) * 4)) & 15;
    return ld_half(blk) * sm.x * (float)q - ld_half(blk + 2) * sm.y;
}
inline void dq_chunk(__global const uchar* row, const int u, chunk_t* v) {
    __global const uchar* blk = row + (u / 8) * QB;
    const int sb = u % 8;
    const uint shift = (sb & 1) * 4;
    const float2 sm = q4k_scale_min(blk + 4, sb);
    const float d = ld_half(blk) * sm.x, m = ld_half(blk + 2) * sm.y;
    __global const uchar* qs = blk + 16 + (sb / 2) * 32;
    v->h[0] = d * UFLOAT((U16(qs) >> shift) & 15u) - m;
    v->h[1] = d * UFLOAT((U16(qs + 16) >> shift) & 15u) - m;
}
#define DQ_INT
#define SCALE_HALVES(blk) (*(__global const uint*)(blk))  // d, dmin (blocks of 144 bytes)
inline void dq_int_scales(__global const uchar* blk, const int sub, float* d, float* m) {
    const float2 sm = q4k_scale_min(blk + 4, sub);
    *m = -*m * sm.y;
    *d *= sm.x;
}
inline void dq_int_chunk(__global const uchar* blk, const int sub, float16* q0, float16* q1) {
    __global const uchar* qs = blk + 16 + (sub / 2) * 32;
    const uchar shift = (sub & 1) * 4;
    *q0 = CONVERT_FLOAT16((B16(qs) >> shift) & (uchar)15);
    *q1 = CONVERT_FLOAT16((B16(qs + 16) >> shift) & (uchar)15);
}
#elif defined(QTYPE_Q6_K)  // 256-element super-block: uchar ql[128], uchar qh[64], char scales[16], half d
#define QK 256
#define QB 210
// element j: half h = j / 128, quarter s = (j % 128) / 32, l = j % 32: 4 low bits from
// ql[h*64 + (s&1)*32 + l] (high nibble when s >= 2), 2 high bits (2*s) of qh[h*32 + l], scale
// scales[h*8 + 2*s + l/16]; x = d * scale * (q - 32)
inline float dq(__global const uchar* row, const int c) {
    __global const uchar* blk = row + (c / QK) * QB;
    const int j = c % QK, h = j / 128, s = (j % 128) / 32, l = j % 32;
    const int lo = (blk[h * 64 + (s & 1) * 32 + l] >> ((s / 2) * 4)) & 15;
    const int hi = (blk[128 + h * 32 + l] >> (2 * s)) & 3;
    const float sc = (float)((char)blk[192 + h * 8 + 2 * s + l / 16]);
    return ld_half(blk + 208) * sc * (float)((lo | (hi << 4)) - 32);
}
inline void dq_chunk(__global const uchar* row, const int u, chunk_t* v) {
    __global const uchar* blk = row + (u / 8) * QB;
    const int h = (u % 8) / 4, s = u % 4;
    __global const uchar* ql = blk + h * 64 + (s & 1) * 32;
    __global const uchar* qh = blk + 128 + h * 32;
    const uint ls = (s / 2) * 4, hs = 2 * s;
    const float d = ld_half(blk + 208);
    const float d0 = d * (float)((char)blk[192 + h * 8 + 2 * s]), d1 = d * (float)((char)blk[193 + h * 8 + 2 * s]);
    v->h[0] = d0 * (UFLOAT(((U16(ql) >> ls) & 15u) | (((U16(qh) >> hs) & 3u) << 4)) - 32.0f);
    v->h[1] = d1 * (UFLOAT(((U16(ql + 16) >> ls) & 15u) | (((U16(qh + 16) >> hs) & 3u) << 4)) - 32.0f);
}
// integer form: q - 32, scaled by d * scale per 16 elements: DQ_SPLIT, d is the scale of elements 0-15
// and m that of elements 16-31 (there is no offset)
#define DQ_INT
#define DQ_SPLIT
#define SCALE_HALVES(blk) ((uint)*(__global const ushort*)((blk) + 208))
inline void dq_int_scales(__global const uchar* blk, const int sub, float* d, float* m) {
    __global const char* sc = (__global const char*)blk + 192 + sub / 4 * 8 + 2 * (sub % 4);
    *m = *d * (float)sc[1];
    *d *= (float)sc[0];
}
CPU_INLINE inline void dq_int_chunk(__global const uchar* blk, const int sub, float16* q0, float16* q1) {
    const int h = sub / 4, s = sub % 4;
    __global const uchar* ql = blk + h * 64 + (s & 1) * 32;
    __global const uchar* qh = blk + 128 + h * 32;
    const uchar ls = (s / 2) * 4, hs = 2 * s;
    *q0 = CONVERT_FLOAT16(as_char16((((B16(ql) >> ls) & (uchar)15) | (((B16(qh) >> hs) & (uchar)3) << (uchar)4))
                                    - (uchar)32));
    *q1 = CONVERT_FLOAT16(as_char16((((B16(ql + 16) >> ls) & (uchar)15) | (((B16(qh + 16) >> hs) & (uchar)3)
                                                                          << (uchar)4)) - (uchar)32));
}
#elif defined(QTYPE_F16)
#define QK 1
#define QB 2
inline float dq(__global const uchar* row, const int c) { return HALF_AT(row, c); }
inline void dq_chunk(__global const uchar* row, const int u, chunk_t* v) {
    UNROLL for (int t = 0; t < QCH; t++) v->s[t] = HALF_AT(row, u * QCH + t);
}
#elif defined(QTYPE_BF16)  // the high 16 bits of a float32
#define QK 1
#define QB 2
inline float dq(__global const uchar* row, const int c) {
    return as_float((uint)((__global const ushort*)row)[c] << 16);
}
inline void dq_chunk(__global const uchar* row, const int u, chunk_t* v) {
    __global const ushort* p = (__global const ushort*)row + u * QCH;
    v->h[0] = as_float16(W16(p) << 16);
    v->h[1] = as_float16(W16(p + 16) << 16);
}
#elif defined(QTYPE_F32)
#define QK 1
#define QB 4
inline float dq(__global const uchar* row, const int c) { return ((__global const float*)row)[c]; }
inline void dq_chunk(__global const uchar* row, const int u, chunk_t* v) {
    __global const float* p = (__global const float*)row + u * QCH;
    v->h[0] = F16V(p);
    v->h[1] = F16V(p + 16);
}
#else
#error "qmatmul.cl needs one QTYPE_* option"
#endif

// bytes of a row of n elements
#define ROW_BYTES(n) ((size_t)((n) / QK) * QB)
// 32-element chunks per block of the quantized formats
#define QSUB (QK / QCH)

// =============================================================================== qmatmul_tiled
#ifdef TSM

// Stage K tile k0 of A (TSM x TSK) into As[k][r] and of op(W) (TSK x TSN) into Bs[k][s], 0.0f
// outside the matrices. Consecutive work-items take consecutive elements along the stored rows.
inline void load_tiles(__local float* As, __local float* Bs, __global const float* a,
                       __global const uchar* w, const int M, const int N, const int K,
                       const int m0, const int n0, const int k0, const int tid) {
    for (int e = tid; e < TSM * TSK; e += THREADS) {
        const int r = e / TSK, k = e % TSK;
        As[k * TSM + r] = (m0 + r < M && k0 + k < K) ? a[(size_t)(m0 + r) * K + k0 + k] : 0.0f;
    }
#ifdef FWD  // op(W)(k, n) = W[n][k]: W stored (N,K)
#if TSK % QCH == 0
    if (K % QCH == 0) {  // whole 32-element chunks of each row (k0 is a multiple of TSK)
        for (int e = tid; e < TSN * (TSK / QCH); e += THREADS) {
            const int s = e / (TSK / QCH), q = e % (TSK / QCH);
            chunk_t v;
            if (n0 + s < N && k0 + q * QCH < K) {
                dq_chunk(w + (size_t)(n0 + s) * ROW_BYTES(K), (k0 + q * QCH) / QCH, &v);
            } else {
                v.h[0] = v.h[1] = (float16)(0.0f);
            }
            UNROLL for (int t = 0; t < QCH; t++) Bs[(q * QCH + t) * TSN + s] = v.s[t];
        }
        return;
    }
#endif
    for (int e = tid; e < TSN * TSK; e += THREADS) {
        const int s = e / TSK, k = e % TSK;
        Bs[k * TSN + s] = (n0 + s < N && k0 + k < K) ? dq(w + (size_t)(n0 + s) * ROW_BYTES(K), k0 + k) : 0.0f;
    }
#else  // op(W)(k, n) = W[k][n]: W stored (K,N)
    for (int e = tid; e < TSK * TSN; e += THREADS) {
        const int k = e / TSN, s = e % TSN;
        Bs[k * TSN + s] = (k0 + k < K && n0 + s < N) ? dq(w + (size_t)(k0 + k) * ROW_BYTES(N), n0 + s) : 0.0f;
    }
#endif
}

// a (M,K), w -> c (M,N) = a . op(W) (see the top). Work-item (tn, tm) owns rows m0 + tm + i*RTSM
// (i < WPTM) and columns n0 + tn + j*RTSN (j < WPTN); those past M/N are computed on zeros, not stored.
__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void qmatmul_tiled(__global float* c, __global const float* a, __global const uchar* w,
                   const int M, const int N, const int K, const int accumulate,
                   const int a_offset, const int c_offset) {
    const int tn = get_local_id(0), tm = get_local_id(1);
    const int tid = tm * RTSN + tn;
    const int m0 = get_group_id(1) * TSM, n0 = get_group_id(0) * TSN;
    a += a_offset;
    c += c_offset;
    __local float As[TSK * TSM];  // As[k * TSM + r] = A[m0 + r][k0 + k]
    __local float Bs[TSK * TSN];  // Bs[k * TSN + s] = op(W)[k0 + k][n0 + s]
    float acc[WPTM][WPTN];
    UNROLL for (int i = 0; i < WPTM; i++)
        UNROLL for (int j = 0; j < WPTN; j++) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += TSK) {
        load_tiles(As, Bs, a, w, M, N, K, m0, n0, k0, tid);
        barrier(CLK_LOCAL_MEM_FENCE);
        UNROLL for (int k = 0; k < TSK; k++) {
            float av[WPTM], bv[WPTN];
            UNROLL for (int i = 0; i < WPTM; i++) av[i] = As[k * TSM + tm + i * RTSM];
            UNROLL for (int j = 0; j < WPTN; j++) bv[j] = Bs[k * TSN + tn + j * RTSN];
            UNROLL for (int i = 0; i < WPTM; i++)
                UNROLL for (int j = 0; j < WPTN; j++) acc[i][j] += av[i] * bv[j];
        }
        barrier(CLK_LOCAL_MEM_FENCE);  // everyone is done with the tiles before they are refilled
    }
    UNROLL for (int i = 0; i < WPTM; i++) {
        const int row = m0 + tm + i * RTSM;
        if (row < M) {
            UNROLL for (int j = 0; j < WPTN; j++) {
                const int col = n0 + tn + j * RTSN;
                if (col < N) STORE_C((size_t)row * N + col, acc[i][j]);
            }
        }
    }
}
#endif  // TSM

// ============================================================================== qmatmul_pack_b
#ifdef MR
#define NR (VW * NB)  // columns of a panel (matmul.cl's PackedConfig)

// Rows k0 .. k0 + kc - 1 of op(W) (K,N) -> bp: panel p (columns p*NR ..) is kc rows of NR
// contiguous floats, 0.0f past N (matmul.cl's matmul_pack_b layout and arguments; b_offset must
// be 0). TRANS_B (the forward), W stored (N,K): work-item (kb, p) fills rows kb*QCH .. + QCH - 1 of
// panel p, one 32-element chunk of each of its NR rows of W at a time (the launcher's grid is
// (ceil(kc / QCH), panels)). Else, W stored (K,N): work-item (kk, p) fills row kk, NR consecutive
// elements of row k0 + kk of W, by whole chunks when NR is a multiple of QCH.
__kernel void qmatmul_pack_b(__global float* bp, __global const uchar* w, const int N, const int K,
                             const int b_offset, const int k0, const int kc) {
    const int p = get_global_id(1), n0 = p * NR;
#ifdef TRANS_B
    const int kk0 = get_global_id(0) * QCH;
    if (kk0 >= kc) return;
    const int k = k0 + kk0;
    __global float* out = bp + ((size_t)p * kc + kk0) * NR;
    if (k % QCH == 0 && kk0 + QCH <= kc) {  // a whole chunk of each row
        for (int j = 0; j < NR; j++) {
            chunk_t v;
            if (n0 + j < N) {
                dq_chunk(w + (size_t)(n0 + j) * ROW_BYTES(K), k / QCH, &v);
            } else {
                v.h[0] = v.h[1] = (float16)(0.0f);
            }
            UNROLL for (int t = 0; t < QCH; t++) out[t * NR + j] = v.s[t];
        }
        return;
    }
    const int n_k = kc - kk0 < QCH ? kc - kk0 : QCH;  // a tail of K (float formats)
    for (int t = 0; t < n_k; t++)
        for (int j = 0; j < NR; j++)
            out[t * NR + j] = n0 + j < N ? dq(w + (size_t)(n0 + j) * ROW_BYTES(K), k + t) : 0.0f;
#else
    const int kk = get_global_id(0);
    if (kk >= kc) return;
    __global const uchar* row = w + (size_t)(k0 + kk) * ROW_BYTES(N);
    __global float* out = bp + ((size_t)p * kc + kk) * NR;
#if NR % QCH == 0
    if (n0 + NR <= N) {  // n0 is a multiple of QCH: whole chunks
        UNROLL for (int q = 0; q < NR / QCH; q++) {  // out is 128-byte aligned (NR * 4 bytes a row)
            chunk_t v;
            dq_chunk(row, n0 / QCH + q, &v);
            ((__global float16*)out)[2 * q] = v.h[0];
            ((__global float16*)out)[2 * q + 1] = v.h[1];
        }
        return;
    }
#endif
    UNROLL for (int j = 0; j < NR; j++) out[j] = n0 + j < N ? dq(row, n0 + j) : 0.0f;
#endif
}
#endif  // MR

// =============================================================================== qmatmul_gemv
#ifdef GEMV_M

// x (M, K) with M == GEMV_M, W (N, K) -> c (M, N) = x . W^T (or += when accumulate). Work-group g
// computes outputs g*GEMV_ROWS ..; work-item l takes chunks u = l, l + GEMV_WG, ... of each row,
// then the work-group adds its GEMV_WG partial sums in a tree (GEMV_WG a power of two).
__kernel __attribute__((reqd_work_group_size(GEMV_WG, 1, 1)))
void qmatmul_gemv(__global float* c, __global const float* a, __global const uchar* w,
                  const int M, const int N, const int K, const int accumulate,
                  const int a_offset, const int c_offset) {
    const int l = get_local_id(0);
    const int n0 = get_group_id(0) * GEMV_ROWS;
    a += a_offset;
    c += c_offset;
    __global const uchar* wrow[GEMV_ROWS];  // rows past N read row N - 1 (not stored)
    UNROLL for (int j = 0; j < GEMV_ROWS; j++) wrow[j] = w + (size_t)(n0 + j < N ? n0 + j : N - 1) * ROW_BYTES(K);
    const int n_chunks = K / QCH;
#if defined(CPU_DEVICE) && defined(DQ_INT)
    // CPUs, formats with an integer form (x = d * q + m per chunk): sum_t x_t w_t = d * sum_t x_t q_t
    // + m * sum_t x_t, so a chunk costs the products of x with the integers q, one multiply-add by d
    // and one by m (llama.cpp's ggml_vec_dot_q4_1_q8_1 splits it the same way, ggml-cpu/quants.c), and
    // the scales of four rows are decoded together (half8_bits), not one half at a time
    float8 acc[GEMV_M][GEMV_ROWS];  // d * sum x q, by lanes
    float macc[GEMV_M][GEMV_ROWS];  // m * sum x
    UNROLL for (int i = 0; i < GEMV_M; i++)
        UNROLL for (int j = 0; j < GEMV_ROWS; j++) {
            acc[i][j] = (float8)(0.0f);
            macc[i][j] = 0.0f;
        }
    // whole blocks (K-quants: 8 chunks, whose sub-block scales are then constant offsets into the block)
    for (int ub = l; ub < n_chunks / QSUB; ub += GEMV_WG) {
        __global const uchar* blk[GEMV_ROWS];
        UNROLL for (int j = 0; j < GEMV_ROWS; j++) blk[j] = wrow[j] + (size_t)ub * QB;
        float bd[GEMV_ROWS], bm[GEMV_ROWS];  // the block's half scales
        UNROLL for (int g = 0; g < GEMV_ROWS; g += 4) {  // the halves of rows g .. g + 3: d, m, d, m, ...
            uint hw[8];
            UNROLL for (int t = 0; t < 4; t++) {
                const uint w = g + t < GEMV_ROWS ? SCALE_HALVES(blk[g + t]) : 0u;
                hw[2 * t] = w & 0xffffu;
                hw[2 * t + 1] = w >> 16;
            }
            union { float8 v; float s[8]; } f;
            f.v = half8_bits((uint8)(hw[0], hw[1], hw[2], hw[3], hw[4], hw[5], hw[6], hw[7]));
            UNROLL for (int t = 0; t < 4 && g + t < GEMV_ROWS; t++) {
                bd[g + t] = f.s[2 * t];
                bm[g + t] = f.s[2 * t + 1];
            }
        }
        UNROLL for (int sub = 0; sub < QSUB; sub++) {
            const int u = ub * QSUB + sub;
            float d[GEMV_ROWS], m[GEMV_ROWS];
            UNROLL for (int j = 0; j < GEMV_ROWS; j++) {
                d[j] = bd[j];
                m[j] = bm[j];
                dq_int_scales(blk[j], sub, &d[j], &m[j]);
            }
#if !defined(DQ_SPLIT) && !defined(DQ_NO_MIN)
            float xs[GEMV_M];  // sum_t x_t of the chunk
            UNROLL for (int i = 0; i < GEMV_M; i++) {
                __global const float* x = a + (size_t)i * K + u * QCH;
                const float16 s16 = F16V(x) + F16V(x + 16);
                const float8 s8 = s16.lo + s16.hi;
                const float4 s4 = s8.lo + s8.hi;
                xs[i] = (s4.x + s4.y) + (s4.z + s4.w);
            }
#endif
            UNROLL for (int j = 0; j < GEMV_ROWS; j++) {
                float16 q0, q1;
                dq_int_chunk(blk[j], sub, &q0, &q1);
                UNROLL for (int i = 0; i < GEMV_M; i++) {
                    __global const float* x = a + (size_t)i * K + u * QCH;
#ifdef DQ_SPLIT  // d scales elements 0-15, m elements 16-31
                    const float16 t0 = F16V(x) * q0, t1 = F16V(x + 16) * q1;
                    acc[i][j] += d[j] * (t0.lo + t0.hi) + m[j] * (t1.lo + t1.hi);
#else
                    const float16 t = F16V(x) * q0 + F16V(x + 16) * q1;
                    acc[i][j] += d[j] * (t.lo + t.hi);
#ifndef DQ_NO_MIN
                    macc[i][j] += m[j] * xs[i];
#endif
#endif
                }
            }
        }
    }
    float sum[GEMV_M][GEMV_ROWS];
    UNROLL for (int i = 0; i < GEMV_M; i++) {
        UNROLL for (int j = 0; j < GEMV_ROWS; j++) {
            const float4 s4 = acc[i][j].lo + acc[i][j].hi;
            const float2 s2 = s4.lo + s4.hi;
            sum[i][j] = s2.x + s2.y + macc[i][j];
        }
    }
#else
    float16 acc[GEMV_M][GEMV_ROWS];
    UNROLL for (int i = 0; i < GEMV_M; i++)
        UNROLL for (int j = 0; j < GEMV_ROWS; j++) acc[i][j] = (float16)(0.0f);
    for (int u = l; u < n_chunks; u += GEMV_WG) {
        UNROLL for (int j = 0; j < GEMV_ROWS; j++) {
            chunk_t v;
            dq_chunk(wrow[j], u, &v);
            UNROLL for (int i = 0; i < GEMV_M; i++) {
                __global const float* x = a + (size_t)i * K + u * QCH;
                acc[i][j] += F16V(x) * v.h[0] + F16V(x + 16) * v.h[1];
            }
        }
    }
    float sum[GEMV_M][GEMV_ROWS];  // the vectors' components added in a tree
    UNROLL for (int i = 0; i < GEMV_M; i++) {
        UNROLL for (int j = 0; j < GEMV_ROWS; j++) {
            const float8 s8 = acc[i][j].lo + acc[i][j].hi;
            const float4 s4 = s8.lo + s8.hi;
            const float2 s2 = s4.lo + s4.hi;
            sum[i][j] = s2.x + s2.y;
        }
    }
#endif
    for (int k = n_chunks * QCH + l; k < K; k += GEMV_WG) {  // K % 32 tail (float formats only)
        UNROLL for (int j = 0; j < GEMV_ROWS; j++) {
            const float v = dq(wrow[j], k);
            UNROLL for (int i = 0; i < GEMV_M; i++) sum[i][j] += a[(size_t)i * K + k] * v;
        }
    }
    __local float part[GEMV_M * GEMV_ROWS][GEMV_WG];  // the group's partial sums
    gemv_finish(c, sum, part, accumulate, M, N, n0, l);
}
#endif  // GEMV_M
