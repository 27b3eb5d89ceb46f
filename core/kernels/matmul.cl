// Matrix multiply: C(M,N) = op(A)(M,K) @ op(B)(K,N), or C += ... when `accumulate` != 0.
//
// a: (M,K) row-major, or (K,M) when TRANS_A is defined
// b: (K,N) row-major, or (N,K) when TRANS_B is defined
// c: (M,N) row-major
// Offsets (in elements) are applied to a, b and c before indexing. Any M, N, K >= 1.
//
// Compile-time tiling, picked by the launcher (matmul.py) from the device's limits:
//   TSM, TSN    rows / columns of C computed by one work-group (the C tile)
//   WPTM, WPTN  rows / columns of C computed by one work-item (its register tile)
//   TSK         depth of the A and B tiles staged in local memory per step of the K loop
//   LOCAL_TILES 1: stage A and B tiles in local memory (devices with on-chip local memory:
//                  GPUs). 0: every work-item reads its rows of A and columns of B straight from
//                  global memory (CPUs, where "local" memory is ordinary cached RAM; there the
//                  caches do the tiling, and a kernel without barriers keeps its accumulators in
//                  registers -- PoCL spills everything that lives across a barrier to memory).
// Work-group: (TSN/WPTN, TSM/WPTM) work-items, dimension 0 along N. Work-item (tn, tm) owns the
// WPTM x WPTN block of C at rows m + i, columns n + j (m = tile row + tm*WPTM, n likewise): its
// WPTN columns are contiguous, so the compiler can use vector loads for a row of B.
// Ragged edges: rows/columns past M/N are read clamped (or as 0.0f in the tiles) and never
// stored; K needs no tile multiple. Register tiling after CNugteren's "myGEMM" tutorial.

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
#ifndef LOCAL_TILES
#define LOCAL_TILES 1
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

// One step k of the register tile: acc[i][j] += op(A)[row i][k] * op(B)[k][col j].
#define MAC_STEP(A_EXPR, B_EXPR)                                                   \
    {                                                                              \
        float bv[WPTN];                                                            \
        _Pragma("unroll") for (int j = 0; j < WPTN; j++) bv[j] = (B_EXPR);         \
        _Pragma("unroll") for (int i = 0; i < WPTM; i++) {                         \
            const float av = (A_EXPR);                                             \
            _Pragma("unroll") for (int j = 0; j < WPTN; j++) acc[i][j] += av * bv[j]; \
        }                                                                          \
    }

// a, b as above -> c (M,N), overwritten, or accumulated into when accumulate != 0
__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void matmul_forward(__global float* c, __global const float* a, __global const float* b,
                    const int M, const int N, const int K, const int accumulate,
                    const int a_offset, const int b_offset, const int c_offset) {
    const int tn = get_local_id(0);
    const int tm = get_local_id(1);
    const int m = get_group_id(1) * TSM + tm * WPTM;  // first C row of this work-item
    const int n = get_group_id(0) * TSN + tn * WPTN;  // first C column of this work-item
    a += a_offset;
    b += b_offset;
    c += c_offset;

    float acc[WPTM][WPTN];
    _Pragma("unroll") for (int i = 0; i < WPTM; i++)
        _Pragma("unroll") for (int j = 0; j < WPTN; j++) acc[i][j] = 0.0f;

#if LOCAL_TILES
    __local float Asub[TSK][TSM];  // Asub[k][r] = op(A)[m0 + r][k0 + k], 0.0f outside
    __local float Bsub[TSK][TSN];  // Bsub[k][s] = op(B)[k0 + k][n0 + s], 0.0f outside
    const int m0 = get_group_id(1) * TSM;
    const int n0 = get_group_id(0) * TSN;
    const int tid = tm * RTSN + tn;
    for (int k0 = 0; k0 < K; k0 += TSK) {
        // Stage the tiles. Element e of a tile goes to the work-item tid = e % (RTSM*RTSN), and
        // consecutive e run along the stored layout's contiguous axis (coalesced reads).
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
        for (int k = 0; k < TSK; k++)
            MAC_STEP(Asub[k][tm * WPTM + i], Bsub[k][tn * WPTN + j])
        barrier(CLK_LOCAL_MEM_FENCE);  // all work-items are done with the tiles before reloading
    }
#else
    // Clamp rows and columns past the edge onto the last valid one: the loads stay in bounds
    // and the results for those rows/columns are dropped at the store.
    int row[WPTM];
    _Pragma("unroll") for (int i = 0; i < WPTM; i++) row[i] = min(m + i, M - 1);
    if (n + WPTN <= N) {  // full block: contiguous columns, so loads of a B row vectorise
        for (int k = 0; k < K; k++) MAC_STEP(A_AT(row[i], k), B_AT(k, n + j))
    } else {
        for (int k = 0; k < K; k++) MAC_STEP(A_AT(row[i], k), B_AT(k, min(n + j, N - 1)))
    }
#endif

    _Pragma("unroll") for (int i = 0; i < WPTM; i++) {
        if (m + i < M) {
            _Pragma("unroll") for (int j = 0; j < WPTN; j++) {
                if (n + j < N) {
                    const int idx = (m + i) * N + n + j;
                    c[idx] = accumulate ? c[idx] + acc[i][j] : acc[i][j];
                }
            }
        }
    }
}
