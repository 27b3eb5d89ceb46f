// Matrix multiply: C(M,N) = op(A)(M,K) @ op(B)(K,N), or C += ... when `accumulate` != 0.
// Serves forward and backward alike (the backward passes are the same product with transposes).
//
// a: (M,K) row-major, or (K,M) when TRANS_A is defined
// b: (K,N) row-major, or (N,K) when TRANS_B is defined
// c: (M,N) row-major
// Offsets (in elements) are applied to a, b and c before indexing. Any M, N, K >= 1.
//
// Three kernels, one per kind of device; the launcher (matmul.py) picks one and its sizes:
//   matmul_tiled      GPUs (on-chip local memory): A and B tiles staged in local memory, 2-D
//                     register tile per work-item.
//   matmul_direct     CPUs (local memory is ordinary cached RAM): no local memory, no barriers;
//                     each work-item streams its rows of op(A) and columns of op(B) from global
//                     memory and the caches do the tiling. PoCL keeps anything that lives across
//                     a barrier in memory, so on a CPU the tiled kernel cannot keep its
//                     accumulators in registers.
//   matmul_direct_nt  the CPU kernel for b stored (N,K) and a stored (M,K) (linear layers'
//                     forward): both operands are contiguous along k, so it vectorises along k.
// Build options:
//   TSM, TSN    rows / columns of C per work-group; WPTM, WPTN rows / columns per work-item.
//               Work-group = (TSN/WPTN, TSM/WPTM) work-items, dimension 0 along N.
//   TSK         depth of the local-memory tiles (matmul_tiled only).
// Work-item (tn, tm) owns the WPTM x WPTN block of C at rows m + i, columns n + j, where
// m = group_row * TSM + tm * WPTM and n likewise. Rows/columns past M/N are read clamped (or as
// 0.0f in the tiles) and never stored. Register tiling after CNugteren's "myGEMM" tutorial.
// PoCL does not inline builtins (vloadN, min), so the CPU kernels build vectors from scalar loads
// (LLVM merges contiguous ones into one vector load) and clamp with ternaries.

#ifndef TSM
#define TSM 64
#endif
#ifndef TSN
#define TSN 64
#endif
#ifndef TSK
#define TSK 16
#endif
#ifndef WPTM
#define WPTM 4
#endif
#ifndef WPTN
#define WPTN 4
#endif
#define RTSM (TSM / WPTM)  // work-items along M
#define RTSN (TSN / WPTN)  // work-items along N

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

// floatW: the WPTN columns of a work-item as one vector; VECW(F) = (floatW)(F(0), .., F(WPTN-1)).
#if WPTN == 1
#define floatW float
#define VECW(F) (F(0))
#elif WPTN == 2
#define floatW float2
#define VECW(F) ((float2)(F(0), F(1)))
#elif WPTN == 4
#define floatW float4
#define VECW(F) ((float4)(F(0), F(1), F(2), F(3)))
#elif WPTN == 8
#define floatW float8
#define VECW(F) ((float8)(F(0), F(1), F(2), F(3), F(4), F(5), F(6), F(7)))
#elif WPTN == 16
#define floatW float16
#define VECW(F) ((float16)(F(0), F(1), F(2), F(3), F(4), F(5), F(6), F(7), \
                           F(8), F(9), F(10), F(11), F(12), F(13), F(14), F(15)))
#endif

// One step k of a register tile: acc[i] += op(A)[row i][k] * (op(B)[k][col j] for every j).
#define MAC_STEP(A_OF_I, B_OF_J)                                                   \
    {                                                                              \
        const floatW bv = VECW(B_OF_J);                                            \
        _Pragma("unroll") for (int i = 0; i < WPTM; i++) acc[i] += (A_OF_I(i)) * bv; \
    }

// Write the register tile acc[i] (row m + i, columns n .. n + WPTN - 1), skipping the edges.
#define STORE_TILE()                                                               \
    _Pragma("unroll") for (int i = 0; i < WPTM; i++) {                             \
        if (m + i < M) {                                                           \
            union { floatW v; float s[WPTN]; } out = {acc[i]};                     \
            _Pragma("unroll") for (int j = 0; j < WPTN; j++) {                     \
                const int idx = (m + i) * N + n + j;                               \
                if (n + j < N) c[idx] = accumulate ? c[idx] + out.s[j] : out.s[j]; \
            }                                                                      \
        }                                                                          \
    }

#ifdef floatW  // the two kernels below need WPTN to be a vector width (not so for 4x3 NT tiles)

// a, b as above -> c (M,N), overwritten, or accumulated into when accumulate != 0
__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void matmul_tiled(__global float* c, __global const float* a, __global const float* b,
                  const int M, const int N, const int K, const int accumulate,
                  const int a_offset, const int b_offset, const int c_offset) {
    const int tn = get_local_id(0), tm = get_local_id(1);
    const int m0 = get_group_id(1) * TSM, n0 = get_group_id(0) * TSN;  // the tile's corner
    const int m = m0 + tm * WPTM, n = n0 + tn * WPTN;                  // this work-item's
    const int tid = tm * RTSN + tn;
    a += a_offset;
    b += b_offset;
    c += c_offset;
    __local float Asub[TSK][TSM];  // Asub[k][r] = op(A)[m0 + r][k0 + k], 0.0f outside
    __local float Bsub[TSK][TSN];  // Bsub[k][s] = op(B)[k0 + k][n0 + s], 0.0f outside

    floatW acc[WPTM];
    _Pragma("unroll") for (int i = 0; i < WPTM; i++) acc[i] = (floatW)(0.0f);

    for (int k0 = 0; k0 < K; k0 += TSK) {
        // Stage the tiles: consecutive work-items take consecutive elements along the stored
        // layout's contiguous axis, so global reads coalesce.
        for (int e = tid; e < TSM * TSK; e += RTSM * RTSN) {
#ifdef TRANS_A  // a stored (K,M): contiguous along m
            const int r = e % TSM, k = e / TSM;
#else           // a stored (M,K): contiguous along k
            const int k = e % TSK, r = e / TSK;
#endif
            Asub[k][r] = (m0 + r < M && k0 + k < K) ? A_AT(m0 + r, k0 + k) : 0.0f;
        }
        for (int e = tid; e < TSN * TSK; e += RTSM * RTSN) {
#ifdef TRANS_B  // b stored (N,K): contiguous along k
            const int k = e % TSK, s = e / TSK;
#else           // b stored (K,N): contiguous along n
            const int s = e % TSN, k = e / TSN;
#endif
            Bsub[k][s] = (n0 + s < N && k0 + k < K) ? B_AT(k0 + k, n0 + s) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#define A_TILE(i) Asub[k][tm * WPTM + (i)]
#define B_TILE(j) Bsub[k][tn * WPTN + (j)]
        for (int k = 0; k < TSK; k++) MAC_STEP(A_TILE, B_TILE)
        barrier(CLK_LOCAL_MEM_FENCE);  // all work-items are done with the tiles before reloading
    }
    STORE_TILE()
}

// a, b as above -> c (M,N), overwritten, or accumulated into when accumulate != 0
__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void matmul_direct(__global float* c, __global const float* a, __global const float* b,
                   const int M, const int N, const int K, const int accumulate,
                   const int a_offset, const int b_offset, const int c_offset) {
    const int m = get_group_id(1) * TSM + get_local_id(1) * WPTM;
    const int n = get_group_id(0) * TSN + get_local_id(0) * WPTN;
    if (m >= M || n >= N) return;  // a block wholly outside C (no barriers here, so allowed)
    a += a_offset;
    b += b_offset;
    c += c_offset;

    floatW acc[WPTM];
    _Pragma("unroll") for (int i = 0; i < WPTM; i++) acc[i] = (floatW)(0.0f);

    int row[WPTM];  // rows past M read row M - 1 (and are not stored)
    _Pragma("unroll") for (int i = 0; i < WPTM; i++) row[i] = m + i < M ? m + i : M - 1;
#define A_ROW(i) A_AT(row[i], k)
#define B_COL(j) B_AT(k, n + (j))
#define B_COL_CLAMPED(j) B_AT(k, n + (j) < N ? n + (j) : N - 1)
    if (n + WPTN <= N) {  // full block: contiguous columns, so a row of B is one vector load
        for (int k = 0; k < K; k++) MAC_STEP(A_ROW, B_COL)
    } else {
        for (int k = 0; k < K; k++) MAC_STEP(A_ROW, B_COL_CLAMPED)
    }
    STORE_TILE()
}

#endif  // floatW

#if defined(TRANS_B) && !defined(TRANS_A)

#define VEC8(p) ((float8)((p)[0], (p)[1], (p)[2], (p)[3], (p)[4], (p)[5], (p)[6], (p)[7]))

// a (M,K), b (N,K) -> c (M,N) = a @ b^T, overwritten, or accumulated into when accumulate != 0.
// Dot-product form: acc[i][j] holds 8 partial sums of row m+i of a times row n+j of b over k.
__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void matmul_direct_nt(__global float* c, __global const float* a, __global const float* b,
                      const int M, const int N, const int K, const int accumulate,
                      const int a_offset, const int b_offset, const int c_offset) {
    const int m = get_group_id(1) * TSM + get_local_id(1) * WPTM;
    const int n = get_group_id(0) * TSN + get_local_id(0) * WPTN;
    if (m >= M || n >= N) return;  // a block wholly outside C (no barriers here, so allowed)
    a += a_offset;
    b += b_offset;
    c += c_offset;

    __global const float* arow[WPTM];  // rows past M / N read the last row (and are not stored)
    __global const float* brow[WPTN];
    _Pragma("unroll") for (int i = 0; i < WPTM; i++) arow[i] = a + (m + i < M ? m + i : M - 1) * K;
    _Pragma("unroll") for (int j = 0; j < WPTN; j++) brow[j] = b + (n + j < N ? n + j : N - 1) * K;

    float8 acc[WPTM][WPTN];
    _Pragma("unroll") for (int i = 0; i < WPTM; i++)
        _Pragma("unroll") for (int j = 0; j < WPTN; j++) acc[i][j] = (float8)(0.0f);
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        float8 av[WPTM], bv[WPTN];
        _Pragma("unroll") for (int i = 0; i < WPTM; i++) av[i] = VEC8(arow[i] + k);
        _Pragma("unroll") for (int j = 0; j < WPTN; j++) bv[j] = VEC8(brow[j] + k);
        _Pragma("unroll") for (int i = 0; i < WPTM; i++)
            _Pragma("unroll") for (int j = 0; j < WPTN; j++) acc[i][j] += av[i] * bv[j];
    }
    _Pragma("unroll") for (int i = 0; i < WPTM; i++) {
        _Pragma("unroll") for (int j = 0; j < WPTN; j++) {
            const float8 v = acc[i][j];
            const float4 v4 = v.lo + v.hi;
            const float2 v2 = v4.lo + v4.hi;
            float sum = v2.x + v2.y;
            for (int kk = k; kk < K; kk++) sum += arow[i][kk] * brow[j][kk];  // K % 8 tail
            const int idx = (m + i) * N + n + j;
            if (m + i < M && n + j < N) c[idx] = accumulate ? c[idx] + sum : sum;
        }
    }
}

#endif  // TRANS_B && !TRANS_A
