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
// The weight format is one -D option: QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q4_K, QTYPE_Q6_K,
// QTYPE_F16, QTYPE_BF16 or QTYPE_F32. Two dequantizers per format: dq(row, c) gives element c of a
// row (tiles, packing), dq_chunk(row, u, v) the 32 elements of chunk u (GEMV); both float32.
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
//                   combined by a local-memory tree reduction (llama.cpp's mul_mat_vec shape).

#define UNROLL _Pragma("unroll")
#define QCH 32  // elements of a GEMV chunk: every format's (sub-)block holds a whole number of them

// a half at byte p (2-byte aligned: every block size and field offset below is even)
inline float ld_half(__global const uchar* p) { return vload_half(0, (__global const half*)p); }

// ------------------------------------------------------------------------------- formats
#if defined(QTYPE_Q8_0)  // block: half d, char qs[32]; x = d * q
#define QK 32
#define QB 34
inline float dq(__global const uchar* row, const int c) {
    __global const uchar* blk = row + (c / QK) * QB;
    return ld_half(blk) * (float)((char)blk[2 + c % QK]);
}
inline void dq_chunk(__global const uchar* row, const int u, float* v) {
    __global const uchar* blk = row + u * QB;
    const float d = ld_half(blk);
    UNROLL for (int t = 0; t < QCH; t++) v[t] = d * (float)((char)blk[2 + t]);
}
#elif defined(QTYPE_Q4_0)  // block: half d, uchar qs[16]; element t < 16 low nibble, t >= 16 high; x = d * (q - 8)
#define QK 32
#define QB 18
inline float dq(__global const uchar* row, const int c) {
    __global const uchar* blk = row + (c / QK) * QB;
    const int j = c % QK, q = blk[2 + (j & 15)];
    return ld_half(blk) * (float)((j < 16 ? q & 15 : q >> 4) - 8);
}
inline void dq_chunk(__global const uchar* row, const int u, float* v) {
    __global const uchar* blk = row + u * QB;
    const float d = ld_half(blk);
    UNROLL for (int t = 0; t < 16; t++) {
        const int q = blk[2 + t];
        v[t] = d * (float)((q & 15) - 8);
        v[t + 16] = d * (float)((q >> 4) - 8);
    }
}
#elif defined(QTYPE_Q4_1)  // block: half d, half m, uchar qs[16]; x = d * q + m
#define QK 32
#define QB 20
inline float dq(__global const uchar* row, const int c) {
    __global const uchar* blk = row + (c / QK) * QB;
    const int j = c % QK, q = blk[4 + (j & 15)];
    return ld_half(blk) * (float)(j < 16 ? q & 15 : q >> 4) + ld_half(blk + 2);
}
inline void dq_chunk(__global const uchar* row, const int u, float* v) {
    __global const uchar* blk = row + u * QB;
    const float d = ld_half(blk), m = ld_half(blk + 2);
    UNROLL for (int t = 0; t < 16; t++) {
        const int q = blk[4 + t];
        v[t] = d * (float)(q & 15) + m;
        v[t + 16] = d * (float)(q >> 4) + m;
    }
}
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
inline void dq_chunk(__global const uchar* row, const int u, float* v) {
    __global const uchar* blk = row + (u / 8) * QB;
    const int sb = u % 8, shift = (sb & 1) * 4;
    const float2 sm = q4k_scale_min(blk + 4, sb);
    const float d = ld_half(blk) * sm.x, m = ld_half(blk + 2) * sm.y;
    __global const uchar* qs = blk + 16 + (sb / 2) * 32;
    UNROLL for (int t = 0; t < QCH; t++) v[t] = d * (float)((qs[t] >> shift) & 15) - m;
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
inline void dq_chunk(__global const uchar* row, const int u, float* v) {
    __global const uchar* blk = row + (u / 8) * QB;
    const int h = (u % 8) / 4, s = u % 4;
    __global const uchar* ql = blk + h * 64 + (s & 1) * 32;
    __global const uchar* qh = blk + 128 + h * 32;
    const int ls = (s / 2) * 4, hs = 2 * s;
    const float d = ld_half(blk + 208);
    const float d0 = d * (float)((char)blk[192 + h * 8 + 2 * s]), d1 = d * (float)((char)blk[193 + h * 8 + 2 * s]);
    UNROLL for (int t = 0; t < QCH; t++) {
        const int q = (((ql[t] >> ls) & 15) | (((qh[t] >> hs) & 3) << 4)) - 32;
        v[t] = (t < 16 ? d0 : d1) * (float)q;
    }
}
#elif defined(QTYPE_F16)
#define QK 1
#define QB 2
inline float dq(__global const uchar* row, const int c) { return vload_half(c, (__global const half*)row); }
inline void dq_chunk(__global const uchar* row, const int u, float* v) {
    UNROLL for (int t = 0; t < QCH; t++) v[t] = vload_half(u * QCH + t, (__global const half*)row);
}
#elif defined(QTYPE_BF16)  // the high 16 bits of a float32
#define QK 1
#define QB 2
inline float dq(__global const uchar* row, const int c) {
    return as_float((uint)((__global const ushort*)row)[c] << 16);
}
inline void dq_chunk(__global const uchar* row, const int u, float* v) {
    __global const ushort* p = (__global const ushort*)row + u * QCH;
    UNROLL for (int t = 0; t < QCH; t++) v[t] = as_float((uint)p[t] << 16);
}
#elif defined(QTYPE_F32)
#define QK 1
#define QB 4
inline float dq(__global const uchar* row, const int c) { return ((__global const float*)row)[c]; }
inline void dq_chunk(__global const uchar* row, const int u, float* v) {
    __global const float* p = (__global const float*)row + u * QCH;
    UNROLL for (int t = 0; t < QCH; t++) v[t] = p[t];
}
#else
#error "qmatmul.cl needs one QTYPE_* option"
#endif

// bytes of a row of n elements
#define ROW_BYTES(n) ((size_t)((n) / QK) * QB)
// c[idx] = value, or c[idx] += value when accumulating
#define STORE_C(idx, value) c[idx] = accumulate ? c[idx] + (value) : (value)

// =============================================================================== qmatmul_tiled
#ifdef TSM
#define RTSM (TSM / WPTM)  // work-items along M
#define RTSN (TSN / WPTN)  // work-items along N
#define THREADS (RTSM * RTSN)

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
// be 0). Work-item (kk, p). TRANS_B (the forward): W stored (N,K); else W stored (K,N).
__kernel void qmatmul_pack_b(__global float* bp, __global const uchar* w, const int N, const int K,
                             const int b_offset, const int k0, const int kc) {
    const int kk = get_global_id(0), p = get_global_id(1);
    if (kk >= kc) return;
    const int k = k0 + kk, n0 = p * NR;
    __global float* out = bp + ((size_t)p * kc + kk) * NR;
#ifdef TRANS_B
    UNROLL for (int j = 0; j < NR; j++)
        out[j] = n0 + j < N ? dq(w + (size_t)(n0 + j) * ROW_BYTES(K), k) : 0.0f;
#else
    __global const uchar* row = w + (size_t)k * ROW_BYTES(N);
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
    float sum[GEMV_M][GEMV_ROWS];
    UNROLL for (int i = 0; i < GEMV_M; i++)
        UNROLL for (int j = 0; j < GEMV_ROWS; j++) sum[i][j] = 0.0f;
    const int n_chunks = K / QCH;
    for (int u = l; u < n_chunks; u += GEMV_WG) {
        UNROLL for (int j = 0; j < GEMV_ROWS; j++) {
            float v[QCH];
            dq_chunk(wrow[j], u, v);
            UNROLL for (int i = 0; i < GEMV_M; i++) {
                __global const float* x = a + (size_t)i * K + u * QCH;
                float s = 0.0f;
                UNROLL for (int t = 0; t < QCH; t++) s += x[t] * v[t];
                sum[i][j] += s;
            }
        }
    }
    for (int k = n_chunks * QCH + l; k < K; k += GEMV_WG) {  // K % 32 tail (float formats only)
        UNROLL for (int j = 0; j < GEMV_ROWS; j++) {
            const float v = dq(wrow[j], k);
            UNROLL for (int i = 0; i < GEMV_M; i++) sum[i][j] += a[(size_t)i * K + k] * v;
        }
    }
#if GEMV_WG > 1
    __local float part[GEMV_M * GEMV_ROWS][GEMV_WG];
    UNROLL for (int i = 0; i < GEMV_M; i++)
        UNROLL for (int j = 0; j < GEMV_ROWS; j++) part[i * GEMV_ROWS + j][l] = sum[i][j];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int step = GEMV_WG / 2; step > 0; step /= 2) {
        if (l < step) {
            UNROLL for (int e = 0; e < GEMV_M * GEMV_ROWS; e++) part[e][l] += part[e][l + step];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0) {
        UNROLL for (int i = 0; i < GEMV_M; i++)
            UNROLL for (int j = 0; j < GEMV_ROWS; j++) sum[i][j] = part[i * GEMV_ROWS + j][0];
    }
#endif
    if (l == 0) {
        UNROLL for (int i = 0; i < GEMV_M; i++)
            UNROLL for (int j = 0; j < GEMV_ROWS; j++)
                if (n0 + j < N) STORE_C((size_t)i * N + n0 + j, sum[i][j]);
    }
}
#endif  // GEMV_M
