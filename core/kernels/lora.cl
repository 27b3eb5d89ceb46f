// Column blocks of row-major matrices, for LoRA on a fused projection (Hu et al. 2021): the
// adapter of attn_q writes columns [0, d) of the fused [q | k | v] rows, the one of attn_k
// columns [d, d + kv), ... Our matmul has no leading dimension, so the adapter's product is made
// contiguous (n_rows, width) and added into, or taken out of, the wide rows here.
// Memory-bound: a 2-D launch, dimension 0 along the columns (coalesced on GPUs, vectorised by PoCL
// on CPUs), dimension 1 the rows; items past the width do nothing.

// src (n_rows, width) -> out (n_rows, ld): out[r, col0 + j] += scale * src[r, j]
__kernel void lora_cols_add(__global float* out, __global const float* src, const int n_rows,
                            const int ld, const int col0, const int width, const float scale) {
    const int j = (int)get_global_id(0), r = (int)get_global_id(1);
    if (j < width && r < n_rows) {
        out[(size_t)r * ld + col0 + j] += scale * src[(size_t)r * width + j];
    }
}

// src (n_rows, ld) -> dst (n_rows, width), overwritten: dst[r, j] = scale * src[r, col0 + j]
__kernel void lora_cols_take(__global float* dst, __global const float* src, const int n_rows,
                             const int ld, const int col0, const int width, const float scale) {
    const int j = (int)get_global_id(0), r = (int)get_global_id(1);
    if (j < width && r < n_rows) {
        dst[(size_t)r * width + j] = scale * src[(size_t)r * ld + col0 + j];
    }
}
