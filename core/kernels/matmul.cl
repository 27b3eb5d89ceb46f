// Tiled matrix multiply: C(M,N) = op(A)(M,K) @ op(B)(K,N), or C += ... when `accumulate` != 0.
//
// a: (M,K) row-major, or (K,M) when TRANS_A is defined
// b: (K,N) row-major, or (N,K) when TRANS_B is defined
// c: (M,N) row-major
// Offsets (in elements) are applied to a, b and c before indexing; sizes are runtime ints.
//
// Compile-time tiling (the launcher picks these from the device's limits, passed as -D):
//   TSM, TSN  rows / columns of C computed by one work-group (the C tile)
//   TSK       depth of the A and B tiles staged in local memory per step of the K loop
//   WPTM, WPTN  outputs per work-item along M and N (register tile of WPTM x WPTN accumulators)
// Work-group: (TSN/WPTN, TSM/WPTM) work-items; dimension 0 runs along N (contiguous in C and B),
// so neighbouring work-items read neighbouring addresses (coalesced on GPUs, vectorised across
// work-items by PoCL on CPUs). Work-item (tn, tm) owns C rows tm + i*RTSM and columns
// tn + j*RTSN of the tile (strided, so that the 2-D register tile stays coalesced too).
// Ragged edges: tile loads outside the matrix read 0.0f, stores outside the matrix are skipped,
// so any M, N, K >= 1 works. The launcher checks that (TSM*TSK) and (TSN*TSK) are multiples of
// the number of work-items, so every work-item loads the same number of tile elements.
// After CNugteren's "myGEMM" OpenCL tutorial (kernels 4-6: 2-D register tiling).

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

#define RTSM (TSM / WPTM)          // work-items along M
#define RTSN (TSN / WPTN)          // work-items along N
#define NTHREADS (RTSM * RTSN)
#define LPTA ((TSM * TSK) / NTHREADS)  // A-tile elements loaded per work-item
#define LPTB ((TSN * TSK) / NTHREADS)  // B-tile elements loaded per work-item

// a, b, c as above -> c (M,N) (= or += when accumulate != 0)
__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1)))
void matmul_forward(__global float* c, __global const float* a, __global const float* b,
                    const int M, const int N, const int K, const int accumulate,
                    const int a_offset, const int b_offset, const int c_offset) {
    const int tn = get_local_id(0);
    const int tm = get_local_id(1);
    const int tid = tm * RTSN + tn;
    const int n0 = get_group_id(0) * TSN;
    const int m0 = get_group_id(1) * TSM;
    a += a_offset;
    b += b_offset;
    c += c_offset;

    __local float Asub[TSK][TSM];  // Asub[k][m] = op(A)[m0 + m][k0 + k]
    __local float Bsub[TSK][TSN];  // Bsub[k][n] = op(B)[k0 + k][n0 + n]

    float acc[WPTM][WPTN];
    #pragma unroll
    for (int i = 0; i < WPTM; i++)
        #pragma unroll
        for (int j = 0; j < WPTN; j++) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += TSK) {
        // Stage the tiles; consecutive tids read consecutive addresses of the stored layout.
        #pragma unroll
        for (int l = 0; l < LPTA; l++) {
            const int e = tid + l * NTHREADS;
#ifdef TRANS_A  // a stored (K,M): contiguous along m
            const int m = e % TSM, k = e / TSM;
            const int gm = m0 + m, gk = k0 + k;
            Asub[k][m] = (gm < M && gk < K) ? a[gk * M + gm] : 0.0f;
#else           // a stored (M,K): contiguous along k
            const int k = e % TSK, m = e / TSK;
            const int gm = m0 + m, gk = k0 + k;
            Asub[k][m] = (gm < M && gk < K) ? a[gm * K + gk] : 0.0f;
#endif
        }
        #pragma unroll
        for (int l = 0; l < LPTB; l++) {
            const int e = tid + l * NTHREADS;
#ifdef TRANS_B  // b stored (N,K): contiguous along k
            const int k = e % TSK, n = e / TSK;
            const int gn = n0 + n, gk = k0 + k;
            Bsub[k][n] = (gn < N && gk < K) ? b[gn * K + gk] : 0.0f;
#else           // b stored (K,N): contiguous along n
            const int n = e % TSN, k = e / TSN;
            const int gn = n0 + n, gk = k0 + k;
            Bsub[k][n] = (gn < N && gk < K) ? b[gk * N + gn] : 0.0f;
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        #pragma unroll
        for (int k = 0; k < TSK; k++) {
            float breg[WPTN];
            #pragma unroll
            for (int j = 0; j < WPTN; j++) breg[j] = Bsub[k][tn + j * RTSN];
            #pragma unroll
            for (int i = 0; i < WPTM; i++) {
                const float areg = Asub[k][tm + i * RTSM];
                #pragma unroll
                for (int j = 0; j < WPTN; j++) acc[i][j] += areg * breg[j];
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);  // everyone is done with the tiles before they are reloaded
    }

    #pragma unroll
    for (int i = 0; i < WPTM; i++) {
        const int gm = m0 + tm + i * RTSM;
        if (gm >= M) break;
        #pragma unroll
        for (int j = 0; j < WPTN; j++) {
            const int gn = n0 + tn + j * RTSN;
            if (gn < N) {
                const int idx = gm * N + gn;
                c[idx] = accumulate ? c[idx] + acc[i][j] : acc[i][j];
            }
        }
    }
}
