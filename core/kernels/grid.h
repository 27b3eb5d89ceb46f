// How a 1-D launch shares n work units (elements, float4 groups, rows) among its work-items, for
// the element-wise and row-per-item kernels. Loop:
//   for (int u = unit_first(n, contiguous); u < unit_end(n, contiguous); u += unit_step(contiguous))
// contiguous != 0 (CPUs): work-item g takes the block of ceil(n / global size) consecutive units
//   from g * that; a PoCL work-item runs its whole loop before the next, so it streams through
//   consecutive memory (a strided loop there is about 5x slower on AdamW).
// contiguous == 0 (GPUs): units g, g + G, g + 2G, ... (G = global size): neighbouring work-items
//   touch neighbouring units at every step (coalesced).
// Any global size works; every unit is taken exactly once. core/device.py pastes this file in
// place of `#include "grid.h"`.

inline int unit_per_item(const int n) {
    const int G = (int)get_global_size(0);
    return (n + G - 1) / G;
}

inline int unit_first(const int n, const int contiguous) {
    return contiguous ? (int)get_global_id(0) * unit_per_item(n) : (int)get_global_id(0);
}

inline int unit_end(const int n, const int contiguous) {
    const int end = unit_first(n, 1) + unit_per_item(n);
    return contiguous ? (end < n ? end : n) : n;  // a ternary, not min(): PoCL calls builtins as functions
}

inline int unit_step(const int contiguous) {
    return contiguous ? 1 : (int)get_global_size(0);
}
