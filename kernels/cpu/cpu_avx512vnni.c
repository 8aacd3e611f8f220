/* cpu_avx512vnni.c - the x86 kernels with AVX512-VNNI integer dots on 256-bit
 * vectors (Makefile: AVX2 flags + -mavx512f -mavx512vl -mavx512bw -mavx512vnni). */
#define FY_X86_TABLE fy_cpu_kernels_avx512vnni
#define FY_X86_NAME "avx512vnni"
#define FY_X86_VNNI 2
#include "kernels/cpu/cpu_x86.h"
