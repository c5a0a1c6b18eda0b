/* See cuda_loader.h. */
#include "cuda_loader.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

sa_cu_t sa_cu;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int load_result = -1;

static void load(void) {
  /* RTLD_LOCAL, as the library: libcuda's symbols stay out of the global
   * namespace. The handle stays open for the life of the process. */
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "cuda_loader: libcuda.so.1 not found\n");
    return;
  }
  PFN_cuGetProcAddress_v12000 get;
  *(void **)&get = dlsym(lib, "cuGetProcAddress_v2");
  if (get == NULL) {
    fprintf(stderr, "cuda_loader: no cuGetProcAddress_v2 (driver older than CUDA 12)\n");
    return;
  }
  int ok = 1;
#define SA_CU_TEST_RESOLVE(name, ver)                                                     \
  {                                                                                       \
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;          \
    if (get("cu" #name, (void **)&sa_cu.name, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM,   \
            &found) != CUDA_SUCCESS ||                                                    \
        found != CU_GET_PROC_ADDRESS_SUCCESS || sa_cu.name == NULL) {                     \
      fprintf(stderr, "cuda_loader: cannot resolve cu" #name "\n");                      \
      ok = 0;                                                                             \
    }                                                                                     \
  }
  SA_CU_TEST_ENTRY_POINTS(SA_CU_TEST_RESOLVE)
#undef SA_CU_TEST_RESOLVE
  if (!ok) return;
  CUresult r = sa_cu.Init(0);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "cuda_loader: cuInit failed: %s\n", sa_cu_error_name(r));
    return;
  }
  load_result = 0;
}

int sa_cu_load(void) {
  if (pthread_once(&once, load) != 0) return -1;
  return load_result;
}

const char *sa_cu_error_name(CUresult r) {
  const char *name = NULL;
  if (sa_cu.GetErrorName == NULL || sa_cu.GetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
    return "unknown CUresult";
  return name;
}

const char sa_cu_mad_words_ptx[] =
    ".version 7.0\n"
    ".target sm_75\n" /* Turing and newer: CUDA 13 dropped older targets */
    ".address_size 64\n"
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
    "  mov.u32 %r4, %ctaid.x;\n"
    "  mov.u32 %r5, %ntid.x;\n"
    "  mov.u32 %r6, %tid.x;\n"
    "  mad.lo.s32 %r7, %r4, %r5, %r6;\n"
    "  mov.u32 %r8, %nctaid.x;\n"
    "  mul.lo.s32 %r9, %r8, %r5;\n"
    "LOOP:\n"
    "  setp.ge.u32 %q1, %r7, %r1;\n"
    "  @%q1 bra DONE;\n"
    "  mul.wide.u32 %rd3, %r7, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.u32 %r10, [%rd4];\n"
    "  mad.lo.s32 %r11, %r10, %r2, %r3;\n"
    "  st.global.u32 [%rd4], %r11;\n"
    "  add.s32 %r7, %r7, %r9;\n"
    "  bra LOOP;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

const char sa_cu_check_words_ptx[] =
    ".version 7.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
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
    "  mov.u32 %r4, %ctaid.x;\n"
    "  mov.u32 %r5, %ntid.x;\n"
    "  mov.u32 %r6, %tid.x;\n"
    "  mad.lo.s32 %r7, %r4, %r5, %r6;\n"
    "  mov.u32 %r8, %nctaid.x;\n"
    "  mul.lo.s32 %r9, %r8, %r5;\n"
    "LOOP:\n"
    "  setp.ge.u32 %q1, %r7, %r1;\n"
    "  @%q1 bra DONE;\n"
    "  mul.wide.u32 %rd3, %r7, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.u32 %r10, [%rd4];\n"
    "  setp.eq.u32 %q2, %r10, %r2;\n"
    "  @%q2 bra NEXT;\n"
    "  atom.global.add.u64 %rd7, [%rd6], 1;\n"
    "NEXT:\n"
    "  add.s32 %r7, %r7, %r9;\n"
    "  bra LOOP;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";
