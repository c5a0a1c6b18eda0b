#!/usr/bin/env bash
# Builds streamarena's RMM pieces that need RMM itself, which Bazel does
# not have (the build stays offline): the Python resource streamarena._rmm
# (_rmm.pyx, Cython, against the rmm-cu13 wheel's .pxd and librmm's
# headers) and the GPU test rmm_resource_test (nvcc). The C++ resource is
# header-only (streamarena/rmm_resource.hpp) and needs no build.
#
#   plugins/rmm/build.sh --rmm DIR --lib FILE --python PY --out DIR [--what ext,test]
#
#   --rmm     a folder holding librmm/, rapids_logger/ and rmm/ as the wheels
#             librmm-cu13, rapids-logger and rmm-cu13 unpack them (26.x)
#   --lib     libstreamarena_python.so (bazel build //plugins/python:all)
#   --python  the Python the extension is for, with Cython and cuda-bindings
#             (its .pxd files, which RMM's cimport) importable
#   --out     where _rmm.<abi>.so and rmm_resource_test go
#   --what    ext, test or both (default)
#   CUDA_HOME the CUDA toolkit (default /usr/local/cuda): headers, nvcc,
#             libcudart_static.a
# Both find librmm.so, librapids_logger.so and libstreamarena_python.so
# beside them ($ORIGIN) or already loaded (RMM's Python package loads
# librmm first).
set -euo pipefail

rmm="" lib="" py="" out="" what="ext,test"
while [ $# -gt 0 ]; do
  case "$1" in
    --rmm) rmm=$2; shift 2 ;;
    --lib) lib=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --what) what=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$rmm" ] && [ -n "$lib" ] && [ -n "$out" ] || { echo "build.sh: --rmm, --lib and --out are needed" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$out"
includes=(-I"$root/include" -I"$here" -isystem "$rmm/librmm/include/rapids"
          -isystem "$rmm/librmm/include" -isystem "$rmm/rapids_logger/include"
          -isystem "$cuda/include")
links=(-L"$rmm/librmm/lib64" -L"$rmm/rapids_logger/lib64" -lrmm -lrapids_logger
       -L"$(dirname "$lib")" -lstreamarena_python)

if [[ ",$what," == *,ext,* ]]; then
  [ -n "$py" ] || { echo "build.sh: --python is needed for the extension" >&2; exit 2; }
  # Cython needs rmm's and cuda.bindings' .pxd files: rmm from the folder,
  # cuda.bindings from wherever py imports it.
  bindings=$("$py" -c 'import os, cuda.bindings as b; print(os.path.dirname(os.path.dirname(os.path.dirname(b.__file__))))')
  suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  pyinc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  "$py" -m cython -3 --cplus --module-name streamarena._rmm -I "$rmm" -I "$bindings" \
    "$here/_rmm.pyx" -o "$out/_rmm.cpp"
  # The CUDA runtime goes in statically, as librmm.so carries its own.
  g++ -std=c++20 -O2 -fPIC -shared -fvisibility=hidden -Wno-deprecated-declarations \
    "${includes[@]}" -isystem "$pyinc" "$out/_rmm.cpp" -o "$out/_rmm$suffix" \
    "${links[@]}" -L"$cuda/lib64" -lcudart_static -ldl -lpthread -lrt \
    -Wl,-rpath,'$ORIGIN'
  rm -f "$out/_rmm.cpp"
  echo "build.sh: $out/_rmm$suffix"
fi

if [[ ",$what," == *,test,* ]]; then
  # Hopper's code and PTX for later devices.
  "$cuda/bin/nvcc" -std=c++20 -O2 -gencode arch=compute_90,code=sm_90 \
    -gencode arch=compute_90,code=compute_90 -Xcompiler -Wall,-Wextra "${includes[@]}" \
    "$here/rmm_resource_test.cu" -o "$out/rmm_resource_test" "${links[@]}" \
    -Xlinker -rpath,'$ORIGIN'
  echo "build.sh: $out/rmm_resource_test"
fi
