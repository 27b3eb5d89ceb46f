// Work-group reductions shared by the row kernels (attention, cross_entropy, rmsnorm, sums).
// Tree reductions in local memory with a barrier after every level: correct for any power-of-two
// work-group size, never assuming lock-step execution. `red` holds get_local_size(0) floats.
// Every work-item of the group must call them (no early return before), and every work-item gets
// the result. Each ends with a barrier, so `red` may be reused right after.
// core/device.py pastes this file in place of `#include "group_reduce.h"` before building.

inline float group_sum(__local float* red, float v) {
    const int lid = get_local_id(0);
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = get_local_size(0) / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] += red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

inline float group_max(__local float* red, float v) {
    const int lid = get_local_id(0);
    red[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = get_local_size(0) / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] = fmax(red[lid], red[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
