// What matmul.cl and qmatmul.cl share; core/device.py pastes this file in place of
// `#include "matmul_common.h"` before building.

#define UNROLL _Pragma("unroll")

// c[idx] = value, or c[idx] += value when accumulating
#define STORE_C(idx, value) c[idx] = accumulate ? c[idx] + (value) : (value)

#ifdef TSM  // the tiled kernels (matmul_tiled, qmatmul_tiled): TSM x TSN of C per work-group
#define RTSM (TSM / WPTM)  // work-items along M
#define RTSN (TSN / WPTN)  // work-items along N
#define THREADS (RTSM * RTSN)
#endif

#ifdef GEMV_M
// The last step of the GEMV kernels (matmul_gemv, qmatmul_gemv): work-item l holds the partial sums
// sum[GEMV_M][GEMV_ROWS] of its share of K; the work-group adds them in a tree in local memory
// `part` (GEMV_M * GEMV_ROWS x GEMV_WG floats, a barrier after every level; GEMV_WG a power of two;
// unused when it is 1), then work-item 0 stores the totals as c (M, N)[i][n0 + j], rows < M and
// columns < N only (STORE_C: overwritten, or added when accumulating). Every work-item calls it.
inline void gemv_finish(__global float* c, float sum[GEMV_M][GEMV_ROWS],
                        __local float part[GEMV_M * GEMV_ROWS][GEMV_WG], const int accumulate, const int M,
                        const int N, const int n0, const int l) {
#if GEMV_WG > 1
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
                if (i < M && n0 + j < N) STORE_C((size_t)i * N + n0 + j, sum[i][j]);
    }
}
#endif
