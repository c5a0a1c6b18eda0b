#!/usr/bin/env python3
"""Checks, on a GPU, streamarena's RMM resource from Python
(streamarena.rmm): the compiled resource as RMM's current device resource,
rmm.DeviceBuffer through it on the default stream and on a stream, out of
memory as MemoryError, zero bytes, CuPy on RMM (rmm_cupy_allocator) on
streamarena, and the ctypes resource. One line per check, then
`check_rmm: N passed, M failed`.

    python3 check_rmm.py
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # checks.py: examples/, or beside when staged
from checks import check, expect, summary  # noqa: E402

import rmm  # noqa: E402
import streamarena.rmm as sar  # noqa: E402


def main():
    check("the compiled resource (streamarena._rmm) loads",
          lambda: expect(sar.compiled(), "not compiled") or f"rmm {rmm.__version__}")
    made = []
    check("streamarena.rmm.resource() of the current device",
          lambda: made.append(sar.resource(compiled_only=True)))
    if not made:
        return summary("check_rmm")
    mr = made[0]

    def current():
        expect(isinstance(mr, rmm.mr.DeviceMemoryResource), type(mr))
        rmm.mr.set_current_device_resource(mr)
        expect(rmm.mr.get_current_device_resource() is mr, "not current")
        return type(mr).__name__

    check("rmm.mr.set_current_device_resource(streamarena.rmm.resource())", current)

    def buffer():
        before = mr.stats()["alloc_count"]
        data = bytes(range(256)) * 4096
        b = rmm.DeviceBuffer.to_device(data)
        expect(b.size == len(data), f"size {b.size}")
        expect(b.tobytes() == data, "contents")
        expect(mr.stats()["alloc_count"] > before, "not from streamarena")
        return f"{b.size} bytes at {b.ptr:#x}"

    check("rmm.DeviceBuffer through the current resource, copied there and back", buffer)

    def on_stream():
        from rmm.pylibrmm.stream import Stream

        s = Stream()
        b = rmm.DeviceBuffer(size=3 << 20, stream=s)
        s.synchronize()
        expect(b.ptr % 256 == 0, "alignment")
        del b
        s.synchronize()

    check("rmm.DeviceBuffer on a stream of its own", on_stream)

    def zero():
        b = rmm.DeviceBuffer(size=0)
        expect(b.size == 0, "size")

    check("zero bytes", zero)

    def oom():
        try:
            rmm.DeviceBuffer(size=1 << 50)
        except MemoryError as e:
            expect("out_of_memory" in str(e), str(e))
            return str(e)[:100]
        raise AssertionError("no error")

    check("1 PiB is MemoryError (rmm::out_of_memory)", oom)

    def cupy_on_rmm():
        import cupy
        from rmm.allocators.cupy import rmm_cupy_allocator

        before = mr.stats()["alloc_count"]
        with cupy.cuda.using_allocator(rmm_cupy_allocator):
            x = cupy.arange(1 << 20, dtype=cupy.float32)
            total = float(x.sum())
        expect(total == float((1 << 20) * ((1 << 20) - 1) / 2), f"sum {total}")
        expect(mr.stats()["alloc_count"] > before, "not from streamarena")
        return "CuPy -> RMM -> streamarena"

    check("CuPy through rmm_cupy_allocator", cupy_on_rmm)

    def ctypes_resource():
        cb = sar.callback_resource(sar._hooks.get(), mr.device)
        data = b"streamarena" * 1000
        b = rmm.DeviceBuffer(size=len(data), mr=cb)
        b.copy_from_host(data)
        expect(b.tobytes() == data, "contents")
        try:
            rmm.DeviceBuffer(size=1 << 50, mr=cb)
        except MemoryError:
            return "allocates, copies, out of memory as MemoryError"
        raise AssertionError("no error for 1 PiB")

    check("the ctypes resource (no compiled extension)", ctypes_resource)
    rmm.mr.set_current_device_resource(rmm.mr.CudaMemoryResource())
    s = mr.stats()
    print(f"streamarena: {s['alloc_count']} allocations, peak reserved "
          f"{s['reserved_bytes_peak'] >> 20} MiB")
    return summary("check_rmm")


if __name__ == "__main__":
    sys.exit(main())
