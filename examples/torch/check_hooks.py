#!/usr/bin/env python3
"""Checks, on a GPU, every PyTorch hook the pluggable plugin gets from
streamarena.torch.install(native=False) and the limits docs/TORCH.md states
for it (examples/torch/check_native.py checks the native backend). One line
per check, then a summary line `check_hooks: N passed, M failed`; exit
status 1 on any failure.

    python3 examples/torch/check_hooks.py [--conf SPEC]
"""
import argparse
import os
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # allocators.py; checks.py (examples/)
import allocators  # noqa: E402
from checks import check, expect, summary  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conf", default=allocators.DEFAULT_CONF)
    args = p.parse_args()

    # Installing after CUDA started must fail with the reason (another process).
    code = ("import sys; sys.path.insert(0, %r); import torch, allocators; "
            "torch.zeros(1, device='cuda')\n"
            "try:\n  allocators.install('streamarena', native=False)\n"
            "except RuntimeError as e:\n  print('refused:', e); sys.exit(0)\n"
            "sys.exit(1)") % HERE
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    check("install() after CUDA started is refused",
          lambda: (expect(r.returncode == 0 and "before PyTorch initializes CUDA" in r.stdout,
                          r.stdout + r.stderr), r.stdout.strip()[:90])[1])

    import torch

    plugin = allocators.install("streamarena", args.conf, native=False)
    import streamarena.torch as sat

    dev = torch.device("cuda", 0)

    def allocation_goes_through_the_plugin():
        before = plugin.stats(0)["alloc_count"]
        x = torch.empty(1 << 20, device=dev)
        expect(plugin.stats(0)["alloc_count"] == before + 1, "alloc_count did not move")
        expect(torch.cuda.memory_allocated(dev) >= x.numel() * 4, "memory_allocated")
        del x
        return f"conf {os.environ.get('STREAMARENA_CONF')!r}"

    check("a CUDA tensor is allocated by streamarena", allocation_goes_through_the_plugin)
    check("install() again returns the same plugin",
          lambda: expect(sat.install() is plugin, "another plugin"))

    def record_stream_orders_reuse():
        """x is made on a side stream, read on the main stream behind a long
        sleep, recorded there and dropped; the side stream then reuses its
        size at once. Without the hook the reuse overwrites x before the read."""
        side, main = torch.cuda.Stream(dev), torch.cuda.current_stream(dev)
        n = 1 << 22
        bad = 0
        for _ in range(5):
            with torch.cuda.stream(side):
                x = torch.ones(n, device=dev)
            main.wait_stream(side)
            torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time on the main stream
            total = x.sum()
            x.record_stream(main)
            del x
            with torch.cuda.stream(side):
                y = torch.full((n,), 2.0, device=dev)
            torch.cuda.synchronize()
            bad += int(total.item() != n)
            del y
        expect(bad == 0, f"{bad} of 5 reads saw the next tensor's data")
        return f"{plugin.stats(0)['record_count']} record_stream calls reached the plugin"

    check("tensor.record_stream delays reuse", record_stream_orders_reuse)

    def empty_cache_trims():
        x = torch.empty(1 << 28, device=dev)  # 1 GiB
        del x
        torch.cuda.synchronize()
        held = plugin.stats(0)["reserved_bytes"]
        torch.cuda.empty_cache()
        after = plugin.stats(0)["reserved_bytes"]
        expect(after < held, f"reserved {held} -> {after}")
        return f"reserved {held / 2**20:.0f} -> {after / 2**20:.0f} MiB"

    check("torch.cuda.empty_cache gives memory back", empty_cache_trims)

    def stats_answer():
        x = torch.empty(1 << 24, device=dev)
        s = torch.cuda.memory_stats(dev)
        expect(s["allocated_bytes.all.current"] >= 1 << 26, "allocated_bytes")
        expect(torch.cuda.max_memory_reserved(dev) >= torch.cuda.memory_reserved(dev) > 0,
               "reserved")
        torch.cuda.reset_peak_memory_stats(dev)
        expect(torch.cuda.max_memory_allocated(dev) == torch.cuda.memory_allocated(dev),
               "reset_peak_memory_stats")
        summary = torch.cuda.memory_summary(dev)
        del x
        return f"memory_summary {len(summary)} chars"

    check("torch.cuda memory statistics read the plugin", stats_answer)

    def fraction_warns():
        torch.cuda.set_per_process_memory_fraction(0.5, dev)  # a warning on stderr, no error

    check("set_per_process_memory_fraction is accepted (not enforced)", fraction_warns)

    def threads_on_streams():
        errors = []

        def work(k):
            try:
                s = torch.cuda.Stream(dev)
                with torch.cuda.stream(s):
                    for i in range(500):
                        t = torch.empty(1024 * (1 + (i * 37 + k) % 4096), device=dev)
                        t.fill_(1.0)
                        del t
                s.synchronize()
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        expect(not errors and plugin.errors() == 0, f"{errors} / {plugin.errors()} errors")
        return f"fast-path ratio {plugin.stats(0)['fast_path_ratio']:.3f}"

    check("four threads allocate on their own streams", threads_on_streams)

    def memory_history_is_pytorchs():
        try:
            torch.cuda.memory._record_memory_history("all", context=None)
        except RuntimeError as e:
            return f"raises as documented ({str(e)[:60]}...)"
        torch.cuda.memory._record_memory_history(None)
        return "accepted by this PyTorch"

    check("memory history under a pluggable allocator", memory_history_is_pytorchs)
    check("no failed hook", lambda: expect(plugin.errors() == 0, f"{plugin.errors()} errors"))

    def graph_capture_is_refused():
        # docs/TORCH.md: capture CUDA graphs with PyTorch's own allocator. A
        # block allocated during the capture would go to other tensors while
        # the graph replays on it, so the hooks refuse a capturing stream.
        x = torch.randn(512, 512, device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            (x @ x).sum()  # warm-up, as torch.cuda.graph wants
        torch.cuda.current_stream().wait_stream(side)
        errors, graph = plugin.errors(), torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                y = x @ x
            raise AssertionError("the capture allocated through the plugin")
        except RuntimeError as e:
            refused = plugin.errors() - errors
            expect(refused > 0, f"no hook refused: {e}")
        z = (x @ x).sum()  # and the allocator serves afterwards
        torch.cuda.synchronize()
        expect(bool(torch.isfinite(z)), "a result after the capture")
        return f"{refused} hook calls refused, PyTorch raised RuntimeError"

    check("torch.cuda.graph is refused, the allocator still serves", graph_capture_is_refused)
    return summary("check_hooks")


if __name__ == "__main__":
    sys.exit(main())
