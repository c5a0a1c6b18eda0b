/* See cuda_kernels.h. */
#include "cuda_kernels.h"

/* What the two kernels share: the module's header, and a grid-stride loop
 * over the n words at p (%rd2, n in %r1; the word's index in %r7, its
 * address in %rd4, its value in %r10) around each kernel's own body. */
#define PTX_MODULE                                                        \
  ".version 7.0\n"                                                        \
  ".target sm_75\n" /* Turing and newer: CUDA 13 dropped older targets */ \
  ".address_size 64\n"
#define PTX_LOOP_BEGIN                 \
  "  mov.u32 %r4, %ctaid.x;\n"         \
  "  mov.u32 %r5, %ntid.x;\n"          \
  "  mov.u32 %r6, %tid.x;\n"           \
  "  mad.lo.s32 %r7, %r4, %r5, %r6;\n" \
  "  mov.u32 %r8, %nctaid.x;\n"        \
  "  mul.lo.s32 %r9, %r8, %r5;\n"      \
  "LOOP:\n"                            \
  "  setp.ge.u32 %q1, %r7, %r1;\n"     \
  "  @%q1 bra DONE;\n"                 \
  "  mul.wide.u32 %rd3, %r7, 4;\n"     \
  "  add.s64 %rd4, %rd2, %rd3;\n"      \
  "  ld.global.u32 %r10, [%rd4];\n"
#define PTX_LOOP_END           \
  "  add.s32 %r7, %r7, %r9;\n" \
  "  bra LOOP;\n"              \
  "DONE:\n"                    \
  "  ret;\n"                   \
  "}\n"

const char sa_cu_mad_words_ptx[] =
    PTX_MODULE
    ".visible .entry mad_words(.param .u64 p, .param .u32 n, .param .u32 mul,\n"
    "                          .param .u32 add)\n"
    "{\n"
    "  .reg .pred %q<2>;\n"
    "  .reg .b32 %r<12>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [p];\n"
    "  ld.param.u32 %r1, [n];\n"
    "  ld.param.u32 %r2, [mul];\n"
    "  ld.param.u32 %r3, [add];\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    PTX_LOOP_BEGIN
    "  mad.lo.s32 %r11, %r10, %r2, %r3;\n"
    "  st.global.u32 [%rd4], %r11;\n"
    PTX_LOOP_END;

const char sa_cu_check_words_ptx[] =
    PTX_MODULE
    ".visible .entry check_words(.param .u64 p, .param .u32 n, .param .u32 value,\n"
    "                            .param .u64 bad)\n"
    "{\n"
    "  .reg .pred %q<3>;\n"
    "  .reg .b32 %r<12>;\n"
    "  .reg .b64 %rd<8>;\n"
    "  ld.param.u64 %rd1, [p];\n"
    "  ld.param.u32 %r1, [n];\n"
    "  ld.param.u32 %r2, [value];\n"
    "  ld.param.u64 %rd5, [bad];\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  cvta.to.global.u64 %rd6, %rd5;\n"
    PTX_LOOP_BEGIN
    "  setp.eq.u32 %q2, %r10, %r2;\n"
    "  @%q2 bra NEXT;\n"
    "  atom.global.add.u64 %rd7, [%rd6], 1;\n"
    "NEXT:\n"
    PTX_LOOP_END;
