// SwiGLU gate of the llama feed-forward block: out = silu(gate) * up, silu(x) = x * sigmoid(x).
// Backward: d_up = d_out * silu(gate),
//           d_gate = d_out * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate))).
// The sigmoid is computed from exp(-|x|), which never overflows, so x = +-100 (or +-1e30) gives
// finite results.
// Memory-bound: a grid-stride loop over float4 groups (vload4/vstore4 need only float alignment,
// so any buffer offset works), then the last n % 4 elements one by one.

float4 stable_sigmoid4(const float4 x) {
    const float4 e = exp(-fabs(x));  // in (0, 1]
    return select(e, (float4)(1.0f), x >= 0.0f) / (1.0f + e);
}

float stable_sigmoid(const float x) {
    const float e = exp(-fabs(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

// gate (n), up (n) -> out (n)
__kernel void swiglu_forward(__global float* out, __global const float* gate,
                             __global const float* up, const int n) {
    const int stride = get_global_size(0);
    const int n4 = n / 4;
    for (int i = get_global_id(0); i < n4; i += stride) {
        const float4 g = vload4(i, gate);
        vstore4(g * stable_sigmoid4(g) * vload4(i, up), i, out);
    }
    for (int i = 4 * n4 + get_global_id(0); i < n; i += stride) {
        const float g = gate[i];
        out[i] = g * stable_sigmoid(g) * up[i];
    }
}

// d_out (n), gate (n), up (n) -> d_gate (n), d_up (n), both overwritten
__kernel void swiglu_backward(__global float* d_gate, __global float* d_up,
                              __global const float* d_out, __global const float* gate,
                              __global const float* up, const int n) {
    const int stride = get_global_size(0);
    const int n4 = n / 4;
    for (int i = get_global_id(0); i < n4; i += stride) {
        const float4 g = vload4(i, gate), u = vload4(i, up), d = vload4(i, d_out);
        const float4 s = stable_sigmoid4(g);
        vstore4(d * u * s * (1.0f + g * (1.0f - s)), i, d_gate);
        vstore4(d * g * s, i, d_up);
    }
    for (int i = 4 * n4 + get_global_id(0); i < n; i += stride) {
        const float g = gate[i], u = up[i], d = d_out[i];
        const float s = stable_sigmoid(g);
        d_gate[i] = d * u * s * (1.0f + g * (1.0f - s));
        d_up[i] = d * g * s;
    }
}
