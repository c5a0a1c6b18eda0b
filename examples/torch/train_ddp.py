#!/usr/bin/env python3
"""Data-parallel training (DistributedDataParallel, NCCL) of train.py's model,
one process per GPU, on streamarena and on PyTorch's default allocator.

    python3 examples/torch/train_ddp.py [--allocator streamarena,default] [--nproc N]
        [--steps 200] [train.py's model and data options]

For each allocator in turn it starts N worker processes (default: every
GPU), each with the allocator installed before CUDA starts, so DDP's
gradient buckets, and the all-reduce that NCCL runs on them, live in that
allocator's memory. Each rank trains on its own data (same sequence lengths
on every rank, so the ranks stay in step), with train.py's data threads,
streams and record_stream. It prints, per allocator and rank, step time,
peak reserved and peak allocated, and the loss averaged over the ranks;
then whether the two allocators' losses agree. One GPU works too.

Under torchrun (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)
it is a worker with a single --allocator:
    torchrun --nproc-per-node 2 examples/torch/train_ddp.py --allocator streamarena

NVLink SHARP (NVLS) and symmetric-memory multicast stay off
(NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1): the GPU machines
this was measured on do not support multicast objects.
"""
import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import allocators  # noqa: E402
import train  # noqa: E402  (imports no torch at module level)

GiB = float(1 << 30)
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--allocator", default="streamarena,default",
                   help="comma-separated; a worker takes one")
    p.add_argument("--nproc", type=int, default=0, help="processes (GPUs); 0: every GPU")
    p.add_argument("--bucket-mb", type=int, default=25, help="DDP's gradient bucket size")
    known, rest = p.parse_known_args(argv)
    targs = train.parse_args(rest + ["--allocator", "default"])  # model, data, loop options
    return known, targs


def gpu_count():
    """Devices the CUDA driver sees (without importing torch)."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        if cu.cuInit(0) == 0 and cu.cuDeviceGetCount(ctypes.byref(n)) == 0:
            return n.value
    except OSError:
        pass
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(known, targs):
    os.environ.update(ENV)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    name = known.allocator
    if name not in ("streamarena", "default", "expandable"):
        raise SystemExit(f"a worker takes one allocator, not {name!r}")
    targs.allocator, targs.rank = name, rank
    allocators.prepare(name)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    cuda = targs.device != "cpu"  # cpu: a dry run on gloo
    plugin = None
    if cuda:
        plugin = allocators.install(name, targs.conf, targs.check)
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    from model import LM

    torch.manual_seed(targs.seed)  # the same initial weights on every rank
    model = LM(targs.vocab, targs.d_model, targs.heads, targs.layers, targs.max_seq).to(device)
    ddp = DDP(model, device_ids=[local] if cuda else None, bucket_cap_mb=known.bucket_mb)
    r = train.loop(targs, ddp, device, show_progress=rank == 0 and not targs.no_progress)
    if cuda:
        train.add_memory(r, plugin, device)
    mine = {k: r.get(k, 0) for k in ("step_ms", "peak_reserved", "peak_requested",
                                      "final_loss", "findings")}
    mine["rank"] = rank
    per_rank = [None] * world
    dist.all_gather_object(per_rank, mine)
    losses = torch.tensor(r["losses"], device=device)
    dist.all_reduce(losses)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        out = {"allocator": name, "world": world, "steps": targs.steps, "ranks": per_rank,
               "losses": (losses / world).tolist()}
        out["final_loss"] = sum(out["losses"][-10:]) / len(out["losses"][-10:])
        print("RESULT " + json.dumps(out), flush=True)
    return 1 if r["findings"] else 0


def launch(known, rest, name, nproc):
    """nproc workers of this script for allocator name; rank 0's result."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(nproc), **ENV)
    procs = []
    for rank in range(nproc):
        e = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
        cmd = [sys.executable, os.path.abspath(__file__), "--allocator", name] + rest
        procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE if rank == 0 else None,
                                      text=True))
    result = None
    for line in procs[0].stdout:
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
        else:
            sys.stdout.write(line)
    codes = [p.wait() for p in procs]
    if any(c not in (0, 1) for c in codes) or result is None:
        print(f"== {name}: workers exited with {codes}")
        return None
    return result


def report(results):
    print("\n| allocator | rank | step ms | peak reserved GiB | peak allocated GiB | "
          "reserved/allocated | final loss (mean of ranks) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        if r is None:
            print(f"| {name} | failed | | | | | |")
            continue
        for q in r["ranks"]:
            print(f"| {name} | {q['rank']} | {q['step_ms']:.1f} | {q['peak_reserved'] / GiB:.3f} |"
                  f" {q['peak_requested'] / GiB:.3f} | "
                  f"{q['peak_reserved'] / max(1, q['peak_requested']):.4f} | "
                  f"{r['final_loss']:.4f} |")
    ok = [r for r in results.values() if r is not None]
    if len(ok) == 2:
        a, b = ok
        gap = train_gap(a["losses"], b["losses"])
        final = abs(a["final_loss"] - b["final_loss"]) / b["final_loss"]
        print(f"\nlosses {a['allocator']} vs {b['allocator']}: {100 * gap:.2f}% mean gap, final "
              f"{100 * final:.2f}% apart: {'agree' if max(gap, final) <= 0.02 else 'DIFFER'}")
    for r in ok:
        for q in r["ranks"]:
            for f in q["findings"]:
                print(f"finding ({r['allocator']}, rank {q['rank']}): {f}")


def train_gap(a, b):
    n = min(len(a), len(b))
    return sum(abs(x - y) for x, y in zip(a[:n], b[:n])) / n / (sum(b[:n]) / n) if n else 1.0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    known, targs = parse_args(argv)
    if "RANK" in os.environ:
        return worker(known, targs)
    nproc = known.nproc or gpu_count()
    if nproc < 1:
        print("train_ddp.py: no GPU found")
        return 1
    # The workers get the same arguments but one allocator and no --nproc.
    cleaned, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--allocator", "--nproc"):
            skip = True
            continue
        if a.startswith(("--allocator=", "--nproc=")):
            continue
        cleaned.append(a)
    rest = cleaned
    print(f"train_ddp: {nproc} processes, allocators {known.allocator}, {targs.steps} steps; "
          f"{' '.join(f'{k}={v}' for k, v in ENV.items())}", flush=True)
    results = {name: launch(known, rest, name, nproc) for name in known.allocator.split(",")}
    report(results)
    bad = any(r is None or any(q["findings"] for q in r["ranks"]) for r in results.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
