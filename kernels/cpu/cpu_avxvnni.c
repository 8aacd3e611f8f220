/* cpu_avxvnni.c - the x86 kernels with AVX-VNNI integer dots (Makefile: AVX2 flags + -mavxvnni). */
#define FY_X86_TABLE fy_cpu_kernels_avxvnni
#define FY_X86_NAME "avxvnni"
#define FY_X86_VNNI 1
#include "kernels/cpu/cpu_x86.h"
