// Matrix multiply: C(M,N) = op(A)(M,K) @ op(B)(K,N), or C += ... when `accumulate` != 0.
// Serves forward and backward alike (the backward passes are the same product with transposes).
//
// a: (M,K) row-major, or (K,M) when TRANS_A is defined
// b: (K,N) row-major, or (N,K) when TRANS_B is defined
// c: (M,N) row-major
// Offsets (in elements) are applied to a, b and c before indexing. Any M, N, K >= 1 (K = 0 gives
// zeros). Every size and layout is a -D build option chosen by matmul.py (tuned by matmul_tune.py),
// after CLBlast's xgemm (Nugteren 2018, "CLBlast: A Tuned OpenCL BLAS Library"):
//
//   matmul_tiled    devices with on-chip local memory (GPUs). A TSM x TSN tile of C per work-group
//                   of (TSN/WPTN, TSM/WPTM) work-items, WPTM x WPTN outputs per work-item held in
//                   registers. TSK-deep tiles of op(A) and op(B) are staged in local memory with
//                   VW-wide coalesced global loads (aligned vector loads when ALIGNED), optionally
//                   double-buffered (DBUF=1: one barrier per K tile, the next tile loads while this
//                   one is used) and padded by PAD floats per row against bank conflicts (DBUF=2: the
//                   next tile's global loads go to registers before this tile's products and to local
//                   memory after them). Work-item (tn, tm) owns VW-wide groups of columns strided by
//                   RTSN*VW (CLBlast's STRN=1), so a warp reads consecutive local vectors.
//                   Split K (few tiles of C for the GPU's compute units, e.g. weight gradients:
//                   M, N = a layer's sizes, K = the batch's tokens): work-group z of dimension 2
//                   takes K elements k_split*z .. of the sum; part 0 goes into C (overwritten or added
//                   to) and part z > 0 into slice z - 1 of a scratch buffer (partial);
//                   matmul_reduce_splits then adds the slices in order to C (deterministic: the
//                   same sums in the same order as C + part 0 + part 1 + ...).
//   matmul_packed   CPUs (local memory is cached RAM; PoCL keeps anything live across a barrier in
//                   memory, so a barrier-free kernel is the only way to keep accumulators in
//                   registers). op(B) is first packed by matmul_pack_b into zero-padded panels of NR
//                   = VW*NB columns, each panel K rows of NR contiguous floats; an A stored (K,M)
//                   optionally (PACK_A) into panels of MR rows, K columns of MR contiguous floats. Each work-item
//                   then computes one MR x NR block of C with MR*NB vector accumulators, streaming
//                   both panels with unit stride (the BLAS "micro-kernel" of Goto & van de Geijn,
//                   2008). Consecutive work-items take consecutive row blocks of one column panel,
//                   in super-rows of SUPER blocks, so a B panel is reused from L1 and the A rows of a
//                   super-row stay in L2. Packing also removes the power-of-two strides that alias
//                   in the L1 cache and turns all four transpose cases into one kernel.
//   matmul_gemv     M <= 8 rows with b stored (N,K) (decode: x @ W.T): a work-group of GEMV_WG
//                   work-items computes GEMV_ROWS outputs, each work-item a strided share of K in
//                   GEMV_VW-wide chunks, combined by a local-memory tree reduction.
//
// PoCL does not inline builtins (vloadN, min), so vectors are built from scalar loads (LLVM merges
// contiguous ones into one vector load) and fixed loops carry unroll pragmas: without them the
// accumulators stay in memory and the kernel runs 5x slower.

// Element (row, k) of op(A) and (k, col) of op(B) in global memory.
#ifdef TRANS_A
#define A_AT(row, k) a[(k) * M + (row)]
#else
#define A_AT(row, k) a[(row) * K + (k)]
#endif
#ifdef TRANS_B
#define B_AT(k, col) b[(col) * K + (k)]
#else
#define B_AT(k, col) b[(k) * N + (col)]
#endif

#include "matmul_common.h"

// floatV: a vector of VW floats; LOADV(p) reads p[0 .. VW-1] (any alignment of p); EXTRACT(v, q)
// its component q (q a compile-time constant after unrolling).
#ifndef VW
#define VW 4
#endif
#if VW == 1
#define floatV float
#define LOADV(p) ((p)[0])
#elif VW == 2
#define floatV float2
#define LOADV(p) ((float2)((p)[0], (p)[1]))
#elif VW == 4
#define floatV float4
#define LOADV(p) ((float4)((p)[0], (p)[1], (p)[2], (p)[3]))
#elif VW == 8
#define floatV float8
#define LOADV(p) ((float8)((p)[0], (p)[1], (p)[2], (p)[3], (p)[4], (p)[5], (p)[6], (p)[7]))
#elif VW == 16
#define floatV float16
#define LOADV(p) ((float16)((p)[0], (p)[1], (p)[2], (p)[3], (p)[4], (p)[5], (p)[6], (p)[7], \
                            (p)[8], (p)[9], (p)[10], (p)[11], (p)[12], (p)[13], (p)[14], (p)[15]))
#endif
typedef union { floatV v; float s[VW]; } vec_parts;

// LOADG(p): a global vector read of a whole tile. With ALIGNED (matmul.py builds it when every such
// address is a multiple of VW floats: the offsets and the row lengths of the contiguous axes are) it is
// one aligned vector load; otherwise LOADV's scalar reads (NVIDIA's compiler cannot merge those without
// knowing the alignment: 37.5 -> 41.3 TFLOP/s at 4096^3 NT on the H200).
#ifdef ALIGNED
#define LOADG(p) (*(__global const floatV*)(p))
#else
#define LOADG(p) LOADV(p)
#endif

// =============================================================================== matmul_tiled
#ifdef TSM
#ifndef PAD
#define PAD 0
#endif
#ifndef DBUF
#define DBUF 0
#endif
#define NBUF (DBUF ? 2 : 1)
#define LDA ((TSM + PAD) / VW)  // row length of the local tiles, in vectors
#define LDB ((TSN + PAD) / VW)

// Stage the K tile starting at k0 of op(A) (TSM x TSK) into As[k][r] and of op(B) (TSK x TSN)
// into Bs[k][s], 0.0f outside the matrices. Consecutive work-items take consecutive vectors along
// the stored layout's contiguous axis, so global reads coalesce.
// Columns k >= k_end (the end of this work-group's K range) read as 0.0f too.
inline void load_tiles(__local floatV* As, __local floatV* Bs, __global const float* a,
                       __global const float* b, const int M, const int N, const int K,
                       const int m0, const int n0, const int k0, const int k_end, const int tid) {
    __local float* as = (__local float*)As;
    __local float* bs = (__local float*)Bs;
    const bool full_a = m0 + TSM <= M && k0 + TSK <= k_end;
    const bool full_b = n0 + TSN <= N && k0 + TSK <= k_end;
#ifdef TRANS_A  // a stored (K,M): vectors along m, copied as they are
    for (int e = tid; e < TSK * (TSM / VW); e += THREADS) {
        const int k = e / (TSM / VW), r = (e % (TSM / VW)) * VW;
        if (full_a) {
            As[k * LDA + r / VW] = LOADG(&A_AT(m0 + r, k0 + k));
        } else {
            UNROLL for (int q = 0; q < VW; q++)
                as[k * LDA * VW + r + q] = (m0 + r + q < M && k0 + k < k_end) ? A_AT(m0 + r + q, k0 + k) : 0.0f;
        }
    }
#else  // a stored (M,K): vectors along k, written transposed
    for (int e = tid; e < TSM * (TSK / VW); e += THREADS) {
        const int r = e / (TSK / VW), k = (e % (TSK / VW)) * VW;
        if (full_a) {
            vec_parts v = {LOADG(&A_AT(m0 + r, k0 + k))};
            UNROLL for (int q = 0; q < VW; q++) as[(k + q) * LDA * VW + r] = v.s[q];
        } else {
            UNROLL for (int q = 0; q < VW; q++)
                as[(k + q) * LDA * VW + r] = (m0 + r < M && k0 + k + q < k_end) ? A_AT(m0 + r, k0 + k + q) : 0.0f;
        }
    }
#endif
#ifdef TRANS_B  // b stored (N,K): vectors along k, written transposed
    for (int e = tid; e < TSN * (TSK / VW); e += THREADS) {
        const int s = e / (TSK / VW), k = (e % (TSK / VW)) * VW;
        if (full_b) {
            vec_parts v = {LOADG(&B_AT(k0 + k, n0 + s))};
            UNROLL for (int q = 0; q < VW; q++) bs[(k + q) * LDB * VW + s] = v.s[q];
        } else {
            UNROLL for (int q = 0; q < VW; q++)
                bs[(k + q) * LDB * VW + s] = (n0 + s < N && k0 + k + q < k_end) ? B_AT(k0 + k + q, n0 + s) : 0.0f;
        }
    }
#else  // b stored (K,N): vectors along n, copied as they are
    for (int e = tid; e < TSK * (TSN / VW); e += THREADS) {
        const int k = e / (TSN / VW), s = (e % (TSN / VW)) * VW;
        if (full_b) {
            Bs[k * LDB + s / VW] = LOADG(&B_AT(k0 + k, n0 + s));
        } else {
            UNROLL for (int q = 0; q < VW; q++)
                bs[k * LDB * VW + s + q] = (n0 + s + q < N && k0 + k < k_end) ? B_AT(k0 + k, n0 + s + q) : 0.0f;
        }
    }
#endif
}

#if DBUF == 2
// DBUF 2: the next K tile is fetched from global memory into registers (fetch_tiles) before this tile's
// products, and stored into the other local buffer after them (store_tiles), so its loads are in flight
// while the work-item computes (the prefetch of CUDA SGEMM kernels; one barrier per K tile). The same
// elements and layout as load_tiles; work-item tid takes elements tid, tid + THREADS, ...
#define A_VECS (TSM * TSK / VW)  // vectors of a tile of op(A) / op(B)
#define B_VECS (TSN * TSK / VW)
#define A_PER ((A_VECS + THREADS - 1) / THREADS)
#define B_PER ((B_VECS + THREADS - 1) / THREADS)

inline void fetch_tiles(vec_parts* ra, vec_parts* rb, __global const float* a, __global const float* b,
                        const int M, const int N, const int K, const int m0, const int n0, const int k0,
                        const int k_end, const int tid) {
    const bool full_a = m0 + TSM <= M && k0 + TSK <= k_end;
    const bool full_b = n0 + TSN <= N && k0 + TSK <= k_end;
    UNROLL for (int t = 0; t < A_PER; t++) {
        const int e = tid + t * THREADS;
#ifdef TRANS_A  // vectors along m
        const int k = e / (TSM / VW), r = (e % (TSM / VW)) * VW;
        if (full_a && e < A_VECS) {
            ra[t].v = LOADG(&A_AT(m0 + r, k0 + k));
        } else {
            UNROLL for (int q = 0; q < VW; q++)
                ra[t].s[q] = (e < A_VECS && m0 + r + q < M && k0 + k < k_end) ? A_AT(m0 + r + q, k0 + k) : 0.0f;
        }
#else  // vectors along k
        const int r = e / (TSK / VW), k = (e % (TSK / VW)) * VW;
        if (full_a && e < A_VECS) {
            ra[t].v = LOADG(&A_AT(m0 + r, k0 + k));
        } else {
            UNROLL for (int q = 0; q < VW; q++)
                ra[t].s[q] = (e < A_VECS && m0 + r < M && k0 + k + q < k_end) ? A_AT(m0 + r, k0 + k + q) : 0.0f;
        }
#endif
    }
    UNROLL for (int t = 0; t < B_PER; t++) {
        const int e = tid + t * THREADS;
#ifdef TRANS_B  // vectors along k
        const int s = e / (TSK / VW), k = (e % (TSK / VW)) * VW;
        if (full_b && e < B_VECS) {
            rb[t].v = LOADG(&B_AT(k0 + k, n0 + s));
        } else {
            UNROLL for (int q = 0; q < VW; q++)
                rb[t].s[q] = (e < B_VECS && n0 + s < N && k0 + k + q < k_end) ? B_AT(k0 + k + q, n0 + s) : 0.0f;
        }
#else  // vectors along n
        const int k = e / (TSN / VW), s = (e % (TSN / VW)) * VW;
        if (full_b && e < B_VECS) {
            rb[t].v = LOADG(&B_AT(k0 + k, n0 + s));
        } else {
            UNROLL for (int q = 0; q < VW; q++)
                rb[t].s[q] = (e < B_VECS && n0 + s + q < N && k0 + k < k_end) ? B_AT(k0 + k, n0 + s + q) : 0.0f;
        }
#endif
    }
}

inline void store_tiles(__local floatV* As, __local floatV* Bs, const vec_parts* ra, const vec_parts* rb,
                        const int tid) {
    __local float* as = (__local float*)As;
    __local float* bs = (__local float*)Bs;
    UNROLL for (int t = 0; t < A_PER; t++) {
        const int e = tid + t * THREADS;
        if (e < A_VECS) {
#ifdef TRANS_A
            const int k = e / (TSM / VW), r = (e % (TSM / VW)) * VW;
            As[k * LDA + r / VW] = ra[t].v;
#else
            const int r = e / (TSK / VW), k = (e % (TSK / VW)) * VW;
            UNROLL for (int q = 0; q < VW; q++) as[(k + q) * LDA * VW + r] = ra[t].s[q];
#endif
        }
    }
    UNROLL for (int t = 0; t < B_PER; t++) {
        const int e = tid + t * THREADS;
        if (e < B_VECS) {
#ifdef TRANS_B
            const int s = e / (TSK / VW), k = (e % (TSK / VW)) * VW;
            UNROLL for (int q = 0; q < VW; q++) bs[(k + q) * LDB * VW + s] = rb[t].s[q];
#else
            const int k = e / (TSN / VW), s = (e % (TSN / VW)) * VW;
            Bs[k * LDB + s / VW] = rb[t].v;
#endif
        }
    }
}
#endif  // DBUF == 2

// a, b as above -> c (M,N), overwritten, or accumulated into when accumulate != 0; with several work-groups
// along dimension 2 (split K) group z sums k in k_split * z .. k_split * (z + 1) - 1 (k < K): z = 0 into c as
// above, z > 0 overwriting slice z - 1 of partial (partial + (z - 1) * M * N; unused without split).
// Work-item (tn, tm) owns rows m0 + (i / VW) * RTSM * VW + tm * VW + i % VW (i < WPTM) and the
// columns likewise; rows/columns past M/N are computed on zeros and never stored.
__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void matmul_tiled(__global float* c, __global float* partial, __global const float* a, __global const float* b,
                  const int M, const int N, const int K, const int accumulate_c,
                  const int a_offset, const int b_offset, const int c_offset, const int k_split) {
    const int tn = get_local_id(0), tm = get_local_id(1);
    const int tid = tm * RTSN + tn;
    const int m0 = get_group_id(1) * TSM, n0 = get_group_id(0) * TSN;  // the tile's corner
    const int z = get_group_id(2);
    const int k_begin = z * k_split, k_end = k_begin + k_split < K ? k_begin + k_split : K;
    a += a_offset;
    b += b_offset;
    const int accumulate = z ? 0 : accumulate_c;  // (STORE_C's)
    c = z ? partial + (size_t)(z - 1) * M * N : c + c_offset;
    __local floatV As[NBUF][TSK * LDA];  // As[buf][k * LDA + r / VW] = op(A)[m0 + r][k0 + k]
    __local floatV Bs[NBUF][TSK * LDB];  // Bs[buf][k * LDB + s / VW] = op(B)[k0 + k][n0 + s]

    float acc[WPTM][WPTN];
    UNROLL for (int i = 0; i < WPTM; i++)
        UNROLL for (int j = 0; j < WPTN; j++) acc[i][j] = 0.0f;

#if DBUF == 2
    vec_parts ra[A_PER], rb[B_PER];  // the next K tile, on its way from global memory
    fetch_tiles(ra, rb, a, b, M, N, K, m0, n0, k_begin, k_end, tid);
    store_tiles(As[0], Bs[0], ra, rb, tid);
#else
    load_tiles(As[0], Bs[0], a, b, M, N, K, m0, n0, k_begin, k_end, tid);
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
    int buf = 0;
    for (int k0 = k_begin; k0 < k_end; k0 += TSK) {
#if DBUF == 2  // loads issued now, stored after this tile's products
        if (k0 + TSK < k_end) fetch_tiles(ra, rb, a, b, M, N, K, m0, n0, k0 + TSK, k_end, tid);
#elif DBUF  // fill the other buffer now; everyone finished reading it before the last barrier
        if (k0 + TSK < k_end) load_tiles(As[buf ^ 1], Bs[buf ^ 1], a, b, M, N, K, m0, n0, k0 + TSK, k_end, tid);
#endif
        __local const floatV* as = As[buf];
        __local const floatV* bs = Bs[buf];
        UNROLL for (int k = 0; k < TSK; k++) {
            vec_parts av[WPTM / VW], bv[WPTN / VW];
            UNROLL for (int i = 0; i < WPTM / VW; i++) av[i].v = as[k * LDA + i * RTSM + tm];
            UNROLL for (int j = 0; j < WPTN / VW; j++) bv[j].v = bs[k * LDB + j * RTSN + tn];
            UNROLL for (int i = 0; i < WPTM; i++)
                UNROLL for (int j = 0; j < WPTN; j++)
                    acc[i][j] += av[i / VW].s[i % VW] * bv[j / VW].s[j % VW];
        }
#if DBUF == 2  // the other buffer: everyone finished reading it before the last barrier
        if (k0 + TSK < k_end) store_tiles(As[buf ^ 1], Bs[buf ^ 1], ra, rb, tid);
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
#if DBUF
        buf ^= 1;
#else
        if (k0 + TSK < k_end) {
            load_tiles(As[0], Bs[0], a, b, M, N, K, m0, n0, k0 + TSK, k_end, tid);
            barrier(CLK_LOCAL_MEM_FENCE);
        }
#endif
    }

    UNROLL for (int i = 0; i < WPTM; i++) {
        const int row = m0 + (i / VW) * RTSM * VW + tm * VW + i % VW;
        if (row < M) {
            UNROLL for (int j = 0; j < WPTN; j++) {
                const int col = n0 + (j / VW) * RTSN * VW + tn * VW + j % VW;
                if (col < N) STORE_C(row * N + col, acc[i][j]);
            }
        }
    }
}

// c[c_offset ..] (n) += the slices of partial (slices, n), in order. One work-item per element.
__kernel void matmul_reduce_splits(__global float* c, __global const float* partial, const int n,
                                   const int slices, const int c_offset) {
    const int i = get_global_id(0);
    if (i >= n) return;
    float s = c[c_offset + i];
    for (int z = 0; z < slices; z++) s += partial[(size_t)z * n + i];
    c[c_offset + i] = s;
}
#endif  // TSM

// ============================================================================== matmul_packed
#ifdef MR
#define NR (VW * NB)  // columns of a B panel
#ifndef SUM_KB
#define SUM_KB 64  // terms summed in registers before they are added to the block's total (see matmul_packed)
#endif

// Rows k0 .. k0 + kc - 1 of op(B) (K,N) -> bp: panel p (columns p*NR ..) is kc rows of NR
// contiguous floats, 0.0f past N. Work-item (k, p); b stored as above, from b_offset.
__kernel void matmul_pack_b(__global float* bp, __global const float* b, const int N, const int K,
                            const int b_offset, const int k0, const int kc) {
    const int kk = get_global_id(0), p = get_global_id(1);
    if (kk >= kc) return;
    const int k = k0 + kk;
    b += b_offset;
    __global float* out = bp + ((size_t)p * kc + kk) * NR;
    const int n0 = p * NR;
#ifndef TRANS_B
    if (n0 + NR <= N) {  // a contiguous run of b: vector copy
        UNROLL for (int jb = 0; jb < NB; jb++)  // out is VW-aligned: bp is a fresh buffer
            *(__global floatV*)(out + jb * VW) = LOADV(&B_AT(k, n0 + jb * VW));
        return;
    }
#endif
    UNROLL for (int j = 0; j < NR; j++) out[j] = n0 + j < N ? B_AT(k, n0 + j) : 0.0f;
}

// Columns k0 .. k0 + kc - 1 of op(A) (M,K), a stored (K,M) -> ap: panel q (rows q*MR ..) is kc columns of MR
// contiguous floats, 0.0f past M. Work-item (q, kb) copies PACK_KB columns of one panel, so that
// neighbouring work-items (q + 1) read the rest of the same cache lines right away: a panel walking all of
// k alone would touch one line per k, 4 KiB apart when M is a power of two, which thrashes the cache sets.
// (An A stored (M,K) is read in place by matmul_packed: its MR row pointers stream along k.)
#ifndef PACK_KB
#define PACK_KB 16  // the launcher passes its own (matmul.py PACK_KB)
#endif
#ifdef TRANS_A
__kernel void matmul_pack_a(__global float* ap, __global const float* a, const int M, const int K,
                            const int a_offset, const int k0, const int kc) {
    const int q = get_global_id(0);
    if (q * MR >= M) return;  // the launch rounds the panels up to whole work-groups
    a += a_offset;
    const int m0 = q * MR;
    const int kb = get_global_id(1) * PACK_KB;
    const int k_end = min(kc, kb + PACK_KB);
    __global float* out = ap + ((size_t)q * kc + kb) * MR;
    if (m0 + MR <= M) {
        for (int kk = kb; kk < k_end; kk++, out += MR)
            UNROLL for (int i = 0; i < MR; i++) out[i] = A_AT(m0 + i, k0 + kk);
    } else {
        for (int kk = kb; kk < k_end; kk++, out += MR)
            UNROLL for (int i = 0; i < MR; i++) out[i] = m0 + i < M ? A_AT(m0 + i, k0 + kk) : 0.0f;
    }
}
#endif

// bp (op(B) rows k0 .. k0 + kc - 1, packed), a (or ap: its columns k0 .. packed, when PACK_A) ->
// c (M,N) = the product over that K chunk, overwritten, or accumulated into when accumulate != 0.
// The launcher packs and multiplies K in chunks (so the panels stay cache-sized and the scratch
// bounded) and accumulates every chunk after the first. One MR x NR block of C per work-item,
// 1-D launch over ceil(M/MR) * ceil(N/NR) blocks (rounded up to the work-group size).
__kernel void matmul_packed(__global float* c, __global const float* a,
                            __global const floatV* bp, const int M, const int N, const int K,
                            const int accumulate, const int a_offset, const int c_offset,
                            const int k0, const int kc) {
    const int nq = (M + MR - 1) / MR, np = (N + NR - 1) / NR;
    const int idx = get_global_id(0);
    if (idx >= nq * np) return;  // no barriers here, so an early return is allowed
    // super-rows of SUPER row blocks; inside one, consecutive work-items walk down a B panel
    const int sr = idx / (SUPER * np), r = idx % (SUPER * np);
    const int rows = min(SUPER, nq - sr * SUPER);
    const int p = r / rows, q = sr * SUPER + r % rows;
    const int m0 = q * MR, n0 = p * NR;
    __global const floatV* B = bp + (size_t)p * kc * NB;
    c += c_offset;

    floatV acc[MR][NB];
    UNROLL for (int i = 0; i < MR; i++)
        UNROLL for (int jb = 0; jb < NB; jb++) acc[i][jb] = (floatV)(0.0f);
    // pointers walk along k (no index arithmetic in the loop): element (i, k) of op(A) is
    // ak[a_row[i]] after k steps of a_step
#ifdef PACK_A
    __global const float* ak = a + (size_t)q * kc * MR;
    const int a_step = MR;
#define A_ROW(i) (i)
#else
    a += a_offset;
    __global const float* ak = a;
    long a_row[MR];  // rows past M read row M - 1 (and are not stored)
    UNROLL for (int i = 0; i < MR; i++) {
        const long r = m0 + i < M ? m0 + i : M - 1;
#ifdef TRANS_A
        a_row[i] = r;
#else
        a_row[i] = r * K;
#endif
    }
#ifdef TRANS_A
    const int a_step = M;
#else
    const int a_step = 1;
#endif
    ak += (size_t)k0 * a_step;
#define A_ROW(i) a_row[i]
#endif
    __global const floatV* bk = B;
    // blocked summation: the registers sum SUM_KB terms at a time, added into tot (which the compiler keeps
    // on the stack: it is touched once per block). Rounding error then grows with SUM_KB + kc / SUM_KB
    // terms, not kc (Higham 2002, "Accuracy and Stability of Numerical Algorithms", sec. 4.2)
    floatV tot[MR][NB];
    UNROLL for (int i = 0; i < MR; i++)
        UNROLL for (int jb = 0; jb < NB; jb++) tot[i][jb] = (floatV)(0.0f);
    for (int kb = 0; kb < kc; kb += SUM_KB) {
        const int k_end = min(kc, kb + SUM_KB);
        for (int k = kb; k < k_end; k++, ak += a_step, bk += NB) {
            floatV bv[NB];
            UNROLL for (int jb = 0; jb < NB; jb++) bv[jb] = bk[jb];
            UNROLL for (int i = 0; i < MR; i++) {
                const float av = ak[A_ROW(i)];
                UNROLL for (int jb = 0; jb < NB; jb++) acc[i][jb] += av * bv[jb];
            }
        }
        UNROLL for (int i = 0; i < MR; i++)
            UNROLL for (int jb = 0; jb < NB; jb++) {
                tot[i][jb] += acc[i][jb];
                acc[i][jb] = (floatV)(0.0f);
            }
    }

    if (n0 + NR <= N) {  // a whole panel: unconditional row stores (LLVM makes them vector stores)
        UNROLL for (int i = 0; i < MR; i++) {
            if (m0 + i < M) {
                __global float* cr = c + (size_t)(m0 + i) * N + n0;
                UNROLL for (int jb = 0; jb < NB; jb++) {
                    vec_parts out = {accumulate ? tot[i][jb] + LOADV(cr + jb * VW) : tot[i][jb]};
                    UNROLL for (int j = 0; j < VW; j++) cr[jb * VW + j] = out.s[j];
                }
            }
        }
        return;
    }
    UNROLL for (int i = 0; i < MR; i++) {
        if (m0 + i < M) {
            UNROLL for (int jb = 0; jb < NB; jb++) {
                vec_parts out = {tot[i][jb]};
                UNROLL for (int j = 0; j < VW; j++) {
                    const int col = n0 + jb * VW + j;
                    if (col < N) STORE_C((m0 + i) * N + col, out.s[j]);
                }
            }
        }
    }
}
#endif  // MR

// ================================================================================ matmul_gemv
#ifdef GEMV_M
#if defined(TRANS_A) || !defined(TRANS_B)
#error "matmul_gemv serves a (M,K) @ b(N,K).T only"
#endif

// a (M,K) with 1 <= M <= GEMV_M, b (N,K) -> c (M,N) = a @ b^T, overwritten, or accumulated into when
// accumulate != 0 (rows M .. GEMV_M - 1 read row M - 1 and are not stored: one program serves
// several M, see matmul.py's gemv_rows). Work-group g computes columns g*GEMV_ROWS ..; work-item l sums the chunks
// k = (l + t*GEMV_WG) * VW of K, then the work-group adds its GEMV_WG partial sums in a tree.
__kernel __attribute__((reqd_work_group_size(GEMV_WG, 1, 1)))
void matmul_gemv(__global float* c, __global const float* a, __global const float* b,
                 const int M, const int N, const int K, const int accumulate,
                 const int a_offset, const int b_offset, const int c_offset) {
    const int l = get_local_id(0);
    const int n0 = get_group_id(0) * GEMV_ROWS;
    a += a_offset;
    b += b_offset;
    c += c_offset;
    __global const float* brow[GEMV_ROWS];  // columns past N read column N - 1 (not stored)
    UNROLL for (int j = 0; j < GEMV_ROWS; j++) brow[j] = b + (n0 + j < N ? n0 + j : N - 1) * K;
    __global const float* arow[GEMV_M];  // rows past M read row M - 1 (not stored)
    UNROLL for (int i = 0; i < GEMV_M; i++) arow[i] = a + (i < M ? i : M - 1) * K;

    floatV acc[GEMV_M][GEMV_ROWS];
    UNROLL for (int i = 0; i < GEMV_M; i++)
        UNROLL for (int j = 0; j < GEMV_ROWS; j++) acc[i][j] = (floatV)(0.0f);
    const int k_vec = (K / VW) * VW;
    for (int k = l * VW; k < k_vec; k += GEMV_WG * VW) {
        floatV w[GEMV_ROWS];
        UNROLL for (int j = 0; j < GEMV_ROWS; j++) w[j] = LOADV(brow[j] + k);
        UNROLL for (int i = 0; i < GEMV_M; i++) {
            const floatV x = LOADV(arow[i] + k);
            UNROLL for (int j = 0; j < GEMV_ROWS; j++) acc[i][j] += x * w[j];
        }
    }
    float sum[GEMV_M][GEMV_ROWS];
    UNROLL for (int i = 0; i < GEMV_M; i++) {
        UNROLL for (int j = 0; j < GEMV_ROWS; j++) {
            vec_parts v = {acc[i][j]};
            float s = 0.0f;
            UNROLL for (int q = 0; q < VW; q++) s += v.s[q];
            for (int k = k_vec + l; k < K; k += GEMV_WG) s += arow[i][k] * brow[j][k];  // K % VW tail
            sum[i][j] = s;
        }
    }
    __local float part[GEMV_M * GEMV_ROWS][GEMV_WG];  // the group's partial sums
    gemv_finish(c, sum, part, accumulate, M, N, n0, l);
}
#endif  // GEMV_M
