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

// Branch-free: a ternary on `contiguous` around get_global_id()/get_global_size() compiles to an `if`,
// and Mesa's llvmpipe (rusticl) then loads the kernel argument inside control flow, which it treats
// as uniform with a warning ("Treating load_kernel_arg in control flow as uniform"); arithmetic on
// c = (contiguous != 0) keeps every builtin call and argument load unconditional.

inline int unit_per_item(const int n) {
    const int G = (int)get_global_size(0);
    return (n + G - 1) / G;
}

inline int unit_first(const int n, const int contiguous) {
    const int c = contiguous != 0;
    return (int)get_global_id(0) * (c * unit_per_item(n) + 1 - c);
}

inline int unit_end(const int n, const int contiguous) {
    const int c = contiguous != 0;
    const int end = ((int)get_global_id(0) + 1) * unit_per_item(n);
    return c * (end < n ? end : n) + (1 - c) * n;  // a ternary of plain values, not min(): PoCL calls builtins
}

inline int unit_step(const int contiguous) {
    const int c = contiguous != 0;
    return c + (1 - c) * (int)get_global_size(0);
}
