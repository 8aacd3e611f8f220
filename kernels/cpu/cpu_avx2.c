/* cpu_avx2.c - the x86 kernels for AVX2 + FMA + F16C (Makefile: -mavx2 -mfma -mf16c). */
#define FY_X86_TABLE fy_cpu_kernels_avx2
#define FY_X86_NAME "avx2"
#define FY_X86_VNNI 0
#include "kernels/cpu/cpu_x86.h"
