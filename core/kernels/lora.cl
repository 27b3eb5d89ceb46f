// The block-diagonal B of a fused projection's adapters, for LoRA (Hu et al. 2021). The adapters of
// [q | k | v] (or [gate | up]) share one input x, so their A's are stacked into one (P*r, n_in) matrix and
// their B's are laid out on the diagonal of one (n_out, P*r) matrix Bd: each direction of the adapters is
// then one matmul for the whole fused matrix (y += (x A^T) Bd^T, du = dy Bd, ...) instead of P products
// and P column copies (core/lora.py).
//
// b_cat (rows, r): the parts' B's stacked in part order, B_j (width_j, r) from row brow_j = width_0 + .. +
//     width_{j-1}; part j is the fused output's columns col0_j .. col0_j + width_j - 1
// bd (n_out, P*r): Bd[i][j*r + c] = scale * B_j[i - col0_j][c] for i in part j's columns, else 0.0f
// The parts are up to 3 (col0, width) pairs (a fused matrix has at most 3 targets), width 0 past n_parts.
// Memory-bound element-wise kernels: a 2-D launch, dimension 0 along a row (coalesced on GPUs, vectorised
// by PoCL on CPUs), dimension 1 the rows; items past the sizes do nothing. Every argument is read before
// any branch, in arithmetic (Mesa's rusticl warns about kernel arguments read in control flow: grid.h).

// b_cat -> bd (n_out, n_parts * rank), every element written
__kernel void lora_blockdiag(__global float* bd, __global const float* b_cat, const int n_out, const int rank,
                             const int n_parts, const int col0_0, const int width_0, const int col0_1,
                             const int width_1, const int col0_2, const int width_2, const float scale) {
    const int c = (int)get_global_id(0), i = (int)get_global_id(1);
    const int cols = n_parts * rank, j = c / rank, cc = c - j * rank;
    const int col0 = (j == 0) * col0_0 + (j == 1) * col0_1 + (j == 2) * col0_2;
    const int width = (j == 0) * width_0 + (j == 1) * width_1 + (j == 2) * width_2;
    const int brow = (j > 0) * width_0 + (j > 1) * width_1;
    const int row = i - col0;
    const float s = scale;
    const int inside = row >= 0 && row < width;
    if (c < cols && i < n_out) {
        bd[(size_t)i * cols + c] = inside ? s * b_cat[(size_t)(brow + row) * rank + cc] : 0.0f;
    }
}

// g (n_out, n_parts * rank) = dy^T u, the gradient of an unscaled Bd -> grad_b (rows, rank) += scale * its
// diagonal blocks: grad_b[brow_j + row][c] += scale * g[col0_j + row][j * rank + c]
__kernel void lora_blockdiag_grad(__global float* grad_b, __global const float* g, const int rank, const int n_parts,
                                  const int col0_0, const int width_0, const int col0_1, const int width_1,
                                  const int col0_2, const int width_2, const float scale) {
    const int c = (int)get_global_id(0), r = (int)get_global_id(1);
    const int end0 = width_0, end1 = width_0 + width_1, rows = end1 + width_2;
    const int j = (r >= end0) + (r >= end1);  // with r < rows; widths past n_parts are 0
    const int col0 = (j == 0) * col0_0 + (j == 1) * col0_1 + (j == 2) * col0_2;
    const int brow = (j > 0) * end0 + (j > 1) * width_1;
    const int cols = n_parts * rank;
    const float s = scale;
    if (c < rank && r < rows) {
        grad_b[(size_t)r * rank + c] += s * g[(size_t)(col0 + r - brow) * cols + j * rank + c];
    }
}
