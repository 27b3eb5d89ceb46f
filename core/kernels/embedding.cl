// Token embedding lookup and its backward (a deterministic scatter-add, no atomics).
// Token ids outside [0, vocab_size) are skipped: forward writes a zero row for them and backward
// adds nothing for them (so a bad id can never read or write out of bounds).

// tokens (n_tokens) int32, weight (vocab_size, d_model) -> out (n_tokens, d_model)
// global (round_up(d_model), n_tokens): one work-item per output element.
__kernel void embedding_forward(__global float* out, __global const int* tokens,
                                __global const float* weight, const int n_tokens,
                                const int vocab_size, const int d_model) {
    const int c = get_global_id(0);
    const int n = get_global_id(1);
    if (c >= d_model || n >= n_tokens) return;
    const int t = tokens[n];
    out[n * d_model + c] = (t >= 0 && t < vocab_size) ? weight[t * d_model + c] : 0.0f;
}

// d_out (n_tokens, d_model), tokens (n_tokens) -> d_weight (vocab_size, d_model), accumulated:
// d_weight[tokens[n]] += d_out[n] for every n. One work-item per column c walks the tokens in
// order, so repeated ids add up in a fixed order without races: deterministic.
__kernel void embedding_backward(__global float* d_weight, __global const float* d_out,
                                 __global const int* tokens, const int n_tokens,
                                 const int vocab_size, const int d_model) {
    const int c = get_global_id(0);
    if (c >= d_model) return;
    for (int n = 0; n < n_tokens; n++) {
        const int t = tokens[n];
        if (t >= 0 && t < vocab_size) d_weight[t * d_model + c] += d_out[n * d_model + c];
    }
}

// The same sums with the tokens grouped by id on the host (GPUs: embedding_backward gives a GPU
// only d_model work-items, each walking every token). order (n_tokens): token positions sorted
// by id, stably (each id's positions ascending); starts (n_unique + 1): where each id's run
// begins in order; ids (n_unique): the id of each run, all in [0, vocab_size). Work-item (c, u)
// adds run u's rows of column c in token order: the additions of embedding_backward, so the
// result is the same to the bit.
__kernel void embedding_backward_sorted(__global float* d_weight, __global const float* d_out,
                                        __global const int* order, __global const int* starts,
                                        __global const int* ids, const int n_unique, const int d_model) {
    const int c = get_global_id(0), u = get_global_id(1);
    if (c >= d_model || u >= n_unique) return;
    const size_t w = (size_t)ids[u] * d_model + c;
    float acc = d_weight[w];
    for (int p = starts[u]; p < starts[u + 1]; p++) acc += d_out[(size_t)order[p] * d_model + c];
    d_weight[w] = acc;
}
