#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/arena_fuzz.c into fuzz/corpus/.

Each seed is a configuration byte and a list of operations in the target's
encoding (see LLVMFuzzerTestOneInput): one op byte, then its arguments.
Run it again after changing the encoding; the files are committed.
"""
import os
import struct

ALLOC, FREE, USE, STEP, VERIFY, TUNE, BAD, RELEASE, STATS = 0, 5, 8, 9, 11, 12, 13, 14, 15
# The further operations (0xc0 + n) and configuration bits.
ON_THREAD, WORKER_EXIT, ABANDON, UNDRAINED, SWEEP, BURST, SNAPSHOT, BAD_TUNE = range(0xC0, 0xC8)
CAPTURE = 0xC9  # a capture episode: stream, mode, count - 1, then its sub-operations
# A driver fault armed before a thread's or a stream's end: function, nth,
# sticky, then what ends (0: a worker exits, 1: op_thread, 2: a stream is
# destroyed, 3: destroyed undrained) and that operation's arguments.
FAULT_AT_END = 0xF9
CLEAR = 0x83  # the extended operation that clears a fault
# A graph pool's episode: stream, mode, count - 1, then 2 * count steps
# (those after the capture led by a stream), the streams of the final
# frees and the release's stream.
POOL = 0xEF
FN_EVENT_QUERY, FN_STREAM_ID = 10, 16
EP_ALLOC, EP_FREE, EP_USE = 0, 1, 2  # its sub-operations, each followed by its arguments
NO_BUDGET, OOM_CALLBACK, EXTENDED = 0x20, 0x40, 0x80


def alloc(stream, kind, v):
    return bytes([ALLOC, stream, kind]) + struct.pack("<H", v)


def free(i, stream):
    return bytes([FREE, i, stream])


def use(i, stream):
    return bytes([USE, i, stream])


def step(stream, n):
    return bytes([STEP, stream, n])


def op(code, *args):
    return bytes([code, *args])


seeds = {
    # small blocks on every stream, freed on their own and on other streams
    "small_cross_stream": bytes([0x00])
    + b"".join(alloc(s, 0, 100 + 37 * s) for s in range(4))
    + free(0, 2) + free(1, 1) + step(2, 4) + alloc(1, 0, 100)
    + op(VERIFY) + op(STATS),
    # large spans around the threshold, record_stream via use, trim
    "large_spans": bytes([0x05])
    + alloc(1, 2, 20000) + alloc(2, 3, 0) + alloc(3, 3, 4)
    + use(0, 3) + free(0, 1) + step(1, 8) + alloc(2, 2, 20000)
    + op(TUNE, 0) + op(VERIFY),
    # out of memory under the 8 MiB cap, then recovery through reclaim
    "oom_and_reclaim": bytes([0x00])
    + alloc(1, 5, 1) + alloc(1, 2, 30000) + alloc(2, 2, 30000)
    + free(0, 2) + alloc(3, 5, 1) + op(TUNE, 1) + op(VERIFY),
    # bad inputs between real work
    "bad_inputs": bytes([0x02])
    + alloc(0, 0, 500) + free(0, 0) + op(BAD, 0, 1) + alloc(1, 1, 700)
    + op(BAD, 1) + op(BAD, 2) + op(BAD, 3) + op(BAD, 4, 2) + alloc(0, 6, 1) + alloc(0, 6, 2),
    # a stream released with its blocks outstanding, freed elsewhere later
    "stream_release": bytes([0x13])
    + alloc(1, 0, 300) + alloc(1, 2, 9000) + use(0, 2) + op(RELEASE, 0)
    + free(1, 3) + step(3, 2) + free(0, 0) + op(VERIFY),
    # superblock size changes with an explicit threshold
    "tuning": bytes([0x1e])
    + alloc(2, 4, 0x0105) + op(TUNE, 2) + op(TUNE, 6) + op(TUNE, 14)
    + alloc(2, 3, 1) + alloc(1, 7, 9) + op(STATS) + op(VERIFY),
    # no budget (64 MiB of device memory): small first superblocks in slabs,
    # bursts of classes kept and freed, a snapshot, sizes tuning refuses
    "no_budget_slabs": bytes([NO_BUDGET | 0x01])
    + op(BURST, 1, 0, 40, 0) + op(BURST, 2, 8, 63, 1) + op(SNAPSHOT)
    + op(BAD_TUNE, 3) + op(TUNE, 1) + op(BURST, 4, 20, 30, 3) + op(VERIFY),
    # blocks of one worker freed by the other and by the main thread after
    # the first worker exited with its cache
    "workers": bytes([0x01])
    + op(ON_THREAD, 1) + alloc(1, 0, 300) + alloc(1, 1, 3000) + alloc(2, 0, 40)
    + free(2, 1) + op(ON_THREAD, 2) + free(0, 2) + use(0, 3) + alloc(3, 0, 900)
    + op(WORKER_EXIT, 0) + op(ON_THREAD, 0) + free(0, 1) + op(VERIFY),
    # a stream destroyed with a recorded free's event still queued, left
    # destroyed through a trim, then named again (a handle comes back)
    "undrained_destroy": bytes([0x00])
    + alloc(1, 0, 2000) + use(0, 2) + free(0, 3) + op(UNDRAINED, 1)
    + op(TUNE, 0) + alloc(2, 0, 2000) + step(3, 4) + op(VERIFY),
    # more streams than a thread cache has entries, without a budget
    "sweep_eviction": bytes([NO_BUDGET])
    + alloc(1, 0, 500) + op(SWEEP, 8, 0) + struct.pack("<H", 700)
    + free(0, 1) + op(VERIFY),
    # out of memory with a callback that frees, trims and asks again
    "oom_callback": bytes([OOM_CALLBACK])
    + alloc(1, 2, 12000) + alloc(2, 2, 12000) + alloc(3, 2, 12000)
    + bytes([0x0B, 0, 1]) + op(VERIFY),
    # stream 1 captured (global mode): blocks allocated on it and on stream
    # 2, a span freed on it (refused: its event would go into the graph), a
    # small block freed on it (into the cache), a block used on it (refused)
    # and one on stream 3; then freed and checked outside the capture
    "capture_episode": bytes([0x03])
    + alloc(1, 0, 300) + alloc(2, 0, 500) + alloc(1, 2, 9000)
    + op(CAPTURE, 0, 0, 5)
    + bytes([EP_ALLOC, 1, 0]) + struct.pack("<H", 200)
    + bytes([EP_ALLOC, 2, 7]) + struct.pack("<H", 3)
    + bytes([EP_FREE, 2, 1]) + bytes([EP_FREE, 0, 1]) + bytes([EP_USE, 1, 1])
    + bytes([EP_USE, 0, 3])
    + free(0, 1) + step(1, 8) + step(2, 8) + op(VERIFY),
    # a graph pool: stream 1 captured (global mode) allocates 3000 and 64000
    # bytes, frees the first and allocates 3000 again (reused in capture
    # order); after the capture blocks are allocated on streams 2 and 0
    # (filled, checked), freed across streams (recorded first), and the pool
    # is released on stream 1
    "pool_episode": bytes([0x03])
    + alloc(1, 0, 300) + alloc(2, 2, 9000)
    + op(POOL, 0, 0, 3)
    + bytes([1]) + struct.pack("<H", 3000) + bytes([2]) + struct.pack("<H", 2000)
    + bytes([0, 0]) + bytes([1]) + struct.pack("<H", 3000)
    + bytes([2, 1]) + struct.pack("<H", 500) + bytes([3, 0, 0, 2])
    + bytes([0, 4]) + struct.pack("<H", 100) + bytes([1, 0, 1, 3])
    + bytes([2, 3]) + bytes([1])
    + free(0, 1) + op(VERIFY),
    # a worker exits with cached blocks and an open batch while stream id
    # queries fail (sticky); stream 3 is destroyed while event queries
    # fail, and the next call naming it meets a new stream with its handle
    "faults_at_ends": bytes([0x01])
    + op(ON_THREAD, 1) + alloc(1, 0, 300) + alloc(2, 1, 3000) + alloc(1, 2, 9000)
    + free(0, 2) + free(2, 1) + op(ON_THREAD, 0)
    + op(FAULT_AT_END, FN_STREAM_ID, 1, 1, 0) + alloc(1, 0, 300) + op(CLEAR)
    + use(0, 2) + op(FAULT_AT_END, FN_EVENT_QUERY, 2, 1, 2, 2)
    + alloc(3, 2, 9000) + free(1, 3) + op(CLEAR) + op(VERIFY),
    # the arena destroyed with blocks live, a worker's cache and a trace
    "abandoned": bytes([EXTENDED, 0x00, 0x20])
    + op(ON_THREAD, 1) + alloc(1, 0, 100) + alloc(2, 2, 9000) + free(0, 1)
    + op(ON_THREAD, 0) + alloc(3, 1, 50) + op(ABANDON, 0),
    # footprint_target=2 without a budget (the third target, fast;
    # initial_physical 2 MiB): eight large blocks make the peak, six go,
    # and the small blocks of two streams after them get superblocks
    # carved in the free spans
    "carved_at_target_2": bytes([EXTENDED | NO_BUDGET | 0x03, 0x10, 0x80])
    + b"".join(alloc(1, 2, 40000) for _ in range(8))
    + b"".join(free(0, 1) for _ in range(6))
    + alloc(2, 0, 100) + alloc(3, 1, 3000) + alloc(2, 1, 9000)
    + op(VERIFY) + op(STATS),
}

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
os.makedirs(here, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(here, name), "wb") as f:
        f.write(data)
print(f"wrote {len(seeds)} seeds to {here}")
