// SwiGLU gate of the llama feed-forward block: out = silu(gate) * up, silu(x) = x * sigmoid(x).
// Backward: d_up = d_out * silu(gate),
//           d_gate = d_out * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate))).
// The sigmoid is computed from exp(-|x|), which never overflows, so x = +-100 (or +-1e30) gives
// finite results.

float stable_sigmoid(float x) {
    const float e = exp(-fabs(x));  // in (0, 1]
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

// gate (n), up (n) -> out (n)
__kernel void swiglu_forward(__global float* out, __global const float* gate,
                             __global const float* up, const int n) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const float g = gate[i];
    out[i] = g * stable_sigmoid(g) * up[i];
}

// d_out (n), gate (n), up (n) -> d_gate (n), d_up (n), both overwritten
__kernel void swiglu_backward(__global float* d_gate, __global float* d_up,
                              __global const float* d_out, __global const float* gate,
                              __global const float* up, const int n) {
    const int i = get_global_id(0);
    if (i >= n) return;
    const float g = gate[i], u = up[i], d = d_out[i];
    const float s = stable_sigmoid(g);
    d_gate[i] = d * u * s * (1.0f + g * (1.0f - s));
    d_up[i] = d * g * s;
}
