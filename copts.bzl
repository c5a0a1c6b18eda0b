"""Compiler flags shared by streamarena's own targets.

External repositories (ck, cmocka, CUDA headers) never see these, so
warnings are fatal only for the project's own code.
"""

SA_DEFAULT_COPTS = [
    "-std=c11",
    # POSIX and GNU interfaces used on purpose: memfd_create, MAP_FIXED,
    # pthread, dlopen.
    "-D_GNU_SOURCE",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wshadow",
    "-Wstrict-prototypes",
    # Every cross-file function is declared in a header (its file's own).
    "-Wmissing-prototypes",
    "-Wpointer-arith",
    "-Wundef",
    "-Wvla",
    "-Wimplicit-fallthrough",
    # Driver operations share one signature; many ignore the driver pointer.
    "-Wno-unused-parameter",
    "-fno-strict-aliasing",
]

# Unit tests define many file-local helpers and cmocka callbacks; requiring
# prototypes for them is noise.
SA_TEST_COPTS = SA_DEFAULT_COPTS + ["-Wno-missing-prototypes"]

# Examples, benchmarks and tools: same as tests.
SA_EXAMPLE_COPTS = SA_TEST_COPTS

# What the project's C++ is compiled with, whichever standard it needs.
_SA_CXX_WARNINGS = [
    "-D_GNU_SOURCE",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wshadow",
    "-Wpointer-arith",
    "-Wundef",
    "-Wvla",
    "-Wimplicit-fallthrough",
    "-Wno-unused-parameter",
]

# The peer benchmark (bench/peers) is C++20: it calls RMM's and PyTorch's C++
# allocators through plug-ins and shares their interface header.
SA_BENCH_CXX_COPTS = ["-std=c++20"] + _SA_CXX_WARNINGS

# The PyTorch native backend's core (plugins/torch/native/core): C++17, the
# standard PyTorch 2.x extensions are built with.
SA_NATIVE_CXX_COPTS = ["-std=c++17"] + _SA_CXX_WARNINGS
