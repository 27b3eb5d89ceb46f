// Inline stand-ins for OpenCL builtins on hot paths, for PoCL's CPU driver.
//
// PoCL (3.0 here) calls its builtins as functions instead of inlining them: every vload4, vstore4,
// fmax, fabs, select and min in a loop is a call (seen in the kernels' disassembly), which costs
// more than the arithmetic of an element-wise kernel. On a CPU device (core/device.py builds with
// -DCPU_DEVICE) these helpers are plain loads, stores and comparisons that LLVM inlines and merges
// into vector instructions; elsewhere they are the builtins themselves, so GPU code is unchanged.
// (exp stays the builtin: PoCL's vector exp is one call per 4 elements and faster than an inline
// polynomial measured here.)
//   LOAD4(i, p) / STORE4(v, i, p)   vload4 / vstore4 (p any float alignment)
//   LOAD2(i, p) / STORE2(v, i, p)   vload2 / vstore2
//   MAXF(a, b)                      the larger of two floats or float vectors; a NaN b is dropped
//                                   (fmax drops a NaN operand; callers pass the running max as a)
//   EXPV(x)                         exp of a float or float2/4/8/16 vector
//   CONVERT_FLOAT16(x)              convert_float16 of a 16-lane integer vector
// core/device.py pastes this file in place of `#include "inline_math.h"`.
//
// On CPU devices no builtin is called on a 16-float (or 16-lane) vector: EXPV and CONVERT_FLOAT16 take such
// a vector in two 8-lane halves. pip's PoCL (3.0, LLVM 14) cannot compile a 16-wide builtin call on an AVX-512
// CPU its LLVM does not know (AMD Zen 4: target znver3 with AVX-512's features): "LLVM ERROR: Cannot select",
// "Do not know how to scalarize this operator's operand" or a segfault in X86's TranslateX86CC, each of
// which kills the process at the kernel's first launch. 8-wide builtins and 16-wide arithmetic compile there.

#ifdef CPU_DEVICE

inline float4 load4_inline(const size_t i, const __global float* p) {
    p += 4 * i;
    return (float4)(p[0], p[1], p[2], p[3]);
}
inline void store4_inline(const float4 v, const size_t i, __global float* p) {
    p += 4 * i;
    p[0] = v.x;
    p[1] = v.y;
    p[2] = v.z;
    p[3] = v.w;
}
inline float2 load2_inline(const size_t i, const __global float* p) {
    p += 2 * i;
    return (float2)(p[0], p[1]);
}
inline void store2_inline(const float2 v, const size_t i, __global float* p) {
    p += 2 * i;
    p[0] = v.x;
    p[1] = v.y;
}

#define LOAD4(i, p) load4_inline((i), (p))
#define STORE4(v, i, p) store4_inline((v), (i), (p))
#define LOAD2(i, p) load2_inline((i), (p))
#define STORE2(v, i, p) store2_inline((v), (i), (p))
#define MAXF(a, b) ((b) > (a) ? (b) : (a))

inline float __attribute__((overloadable)) expv(const float x) { return exp(x); }
inline float2 __attribute__((overloadable)) expv(const float2 x) { return exp(x); }
inline float4 __attribute__((overloadable)) expv(const float4 x) { return exp(x); }
inline float8 __attribute__((overloadable)) expv(const float8 x) { return exp(x); }
inline float16 __attribute__((overloadable)) expv(const float16 x) { return (float16)(exp(x.lo), exp(x.hi)); }
#define EXPV(x) expv(x)
#define CONVERT_FLOAT16(x) ((float16)(convert_float8((x).lo), convert_float8((x).hi)))

#else

#define LOAD4(i, p) vload4((i), (p))
#define STORE4(v, i, p) vstore4((v), (i), (p))
#define LOAD2(i, p) vload2((i), (p))
#define STORE2(v, i, p) vstore2((v), (i), (p))
#define MAXF(a, b) fmax((a), (b))
#define EXPV(x) exp(x)
#define CONVERT_FLOAT16(x) convert_float16(x)

#endif

// LOG_SUM(x): the natural log of a sum of exponentials (x >= 1 in a softmax's sum; any x works:
// 0 -> -INFINITY, INFINITY -> INFINITY, NaN -> NaN), branch-free on every device. libclc's log()
// branches inside, and Mesa's llvmpipe (rusticl) then reads the kernel arguments used after it in a
// loop "in control flow", which it treats as uniform with a warning. x = 2^e m, m in [sqrt(1/2),
// sqrt(2)): log m = 2 atanh(z) = 2 (z + z^3/3 + ... + z^9/9), z = (m - 1) / (m + 1), |z| < 0.172
// (Abramowitz & Stegun 4.1.27; the series' remainder < 2e-9), ln 2 split in two for e ln 2.
inline float log_sum(const float x) {
    const int bits = as_int(x);
    const float m1 = as_float((bits & 0x007fffff) | 0x3f800000);  // [1, 2)
    const int big = m1 > 1.41421356f;
    const float m = big ? 0.5f * m1 : m1;
    const float e = (float)(((bits >> 23) & 0xff) - 127 + big);
    const float z = (m - 1.0f) / (m + 1.0f), z2 = z * z;
    const float p = z * (2.0f + z2 * (0.666666667f + z2 * (0.4f + z2 * (0.285714286f + z2 * 0.222222222f))));
    const float r = (e * 0.693145751953125f + p) + e * 1.428606765330187e-06f;
    const float normal = x >= 1.17549435e-38f && x < INFINITY ? r : x;  // NaN, INFINITY as they are
    return x == 0.0f ? -INFINITY : normal;
}
#define LOG_SUM(x) log_sum(x)
