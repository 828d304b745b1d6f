/*
 * x86_avx512.c - the AVX-512 ISA slot (built with -mavx512f/bw/vl/dq,
 * chosen only when cpuid reports them).
 *
 * For now this compiles the AVX2 kernels of x86_avx2.c with AVX-512
 * enabled (EVEX encoding, 32 vector registers, masked tails) under their
 * own table, so the dispatch, build and test plumbing for the ISA is real.
 * The reduction orders are those documented in x86_avx2.c. Native 16-lane
 * kernels are future work (docs/kernels.md).
 */
#define K3_KERN_AVX512_BUILD 1
#include "x86_avx2.c"
