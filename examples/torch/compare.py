#!/usr/bin/env python3
"""Runs examples/torch/train.py per allocator, each in its own process with
the same arguments and seed, for several rounds, then a short streamarena
run with --check, and prints the comparison and the targets.

    python3 examples/torch/compare.py [--steps 300] [--rounds 3]
        [--check-steps 60] [--memory-history default.pickle]
        [--trace streamarena.csv] [--out DIR] [--progress]
        [-- more train.py arguments]

The allocators take turns: round r runs them in the order rotated by r, so
that each runs first, in the middle and last once in three rounds (a run's
position alone moved its step time by 5-19% on the H200). The table gives
each allocator's median step time over the rounds and its largest peaks.

Table columns: step time (after the warm-up steps), peak reserved (what the
allocator held from the device), peak allocated (bytes PyTorch asked for,
live at once: the same program, so the same for every allocator up to the
timing of frees), their ratio, and the final loss (mean of the last 10
steps). The targets: streamarena's step time at most the faster PyTorch
configuration's; its peak reserved at most 1.02 x its peak allocated and at
most expandable segments'; its loss curve within noise of PyTorch's; the
check run finds nothing. Exit status 1 when a run failed (a target missed is
reported, not an error).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ORDER = ("streamarena", "default", "expandable")
GiB = float(1 << 30)
LOSS_TOLERANCE = 0.02  # relative: the loss curves agree within noise


def run(name, extra, tmp, logf, show_progress):
    """One train.py process; its output goes to logf (and, but for the
    progress bar, to the terminal). Returns its result, or None."""
    path = os.path.join(tmp, f"{name}.json")
    cmd = [sys.executable, os.path.join(HERE, "train.py"), "--allocator", name.split("+")[0],
           "--json", path] + extra
    head = f"== {name}: {' '.join(cmd[1:])}\n"
    sys.stdout.write(head)
    sys.stdout.flush()
    logf.write(head)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:
        progress = "step/s" in line or "s/step" in line
        if not progress:
            logf.write(line)
        if show_progress or not (progress or line.startswith("RESULT")):
            sys.stdout.write(line)
    rc = p.wait()
    logf.flush()
    if rc not in (0, 1) or not os.path.exists(path):
        print(f"== {name}: failed (exit {rc})")
        return None
    with open(path) as f:
        return json.load(f)


def curve_gap(a, b):
    """Mean |a - b| over the steps both ran, relative to b's mean."""
    n = min(len(a), len(b))
    if n == 0:
        return float("inf")
    return sum(abs(x - y) for x, y in zip(a[:n], b[:n])) / n / (sum(b[:n]) / n)


def rotated(names, r):
    """The order of round r: names rotated left by r."""
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def aggregate(runs):
    """One allocator's rounds as one result: the median step time (the
    lower middle of an even count), every round's step time, and the
    largest peaks; the rest from the round of the median. None when any
    round failed."""
    if not runs or any(r is None for r in runs):
        return None
    ranked = sorted(runs, key=lambda r: r["step_ms"])
    mid = dict(ranked[(len(ranked) - 1) // 2])
    mid["step_ms_rounds"] = [r["step_ms"] for r in runs]
    for key in ("peak_reserved", "peak_requested"):
        if all(key in r for r in runs):
            mid[key] = max(r[key] for r in runs)
    return mid


def table(results):
    head = ("| allocator | step ms (median) | rounds | peak reserved GiB | peak allocated GiB"
            " | reserved/allocated | final loss |")
    lines = [head, "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for name, r in results.items():
        if r is None:
            lines.append(f"| {name} | failed | | | | | |")
            continue
        res, req = r.get("peak_reserved", 0), r.get("peak_requested", 0)  # none on a CPU
        rounds = " ".join(f"{t:.1f}" for t in r.get("step_ms_rounds", [r["step_ms"]]))
        lines.append(f"| {name} | {r['step_ms']:.1f} | {rounds} | {res / GiB:.3f} | "
                     f"{req / GiB:.3f} | {res / max(1, req):.4f} | {r['final_loss']:.4f} |")
    return "\n".join(lines)


def targets(results):
    sa, de, ex = (results.get(k) for k in ORDER)
    out = []
    if sa is None or "peak_reserved" not in sa:
        return ["no streamarena run on a GPU: no target can be judged"]

    def line(ok, text):
        out.append(f"[{'met' if ok else 'MISSED'}] {text}")

    torch_runs = [r for r in (de, ex) if r is not None]
    if torch_runs:
        fastest = min(torch_runs, key=lambda r: r["step_ms"])
        line(sa["step_ms"] <= fastest["step_ms"],
             f"step time: streamarena {sa['step_ms']:.1f} ms, fastest PyTorch "
             f"({fastest['allocator']}) {fastest['step_ms']:.1f} ms "
             f"({100 * (sa['step_ms'] / fastest['step_ms'] - 1):+.1f}%; medians)")
    if de is not None:
        line(sa["step_ms"] <= de["step_ms"],
             f"step time: streamarena {sa['step_ms']:.1f} ms, PyTorch's default allocator "
             f"{de['step_ms']:.1f} ms ({100 * (sa['step_ms'] / de['step_ms'] - 1):+.1f}%)")
    ratio = sa["peak_reserved"] / max(1, sa["peak_requested"])
    line(ratio <= 1.02, f"peak reserved / peak allocated: streamarena {ratio:.4f} (<= 1.02)")
    if ex is not None:
        line(sa["peak_reserved"] <= ex["peak_reserved"],
             f"peak reserved: streamarena {sa['peak_reserved'] / GiB:.3f} GiB, expandable "
             f"segments {ex['peak_reserved'] / GiB:.3f} GiB")
    if de is not None:
        gap = curve_gap(sa["losses"], de["losses"])
        noise = curve_gap(ex["losses"], de["losses"]) if ex is not None else 0.0
        final = abs(sa["final_loss"] - de["final_loss"]) / de["final_loss"]
        line(gap <= LOSS_TOLERANCE and final <= LOSS_TOLERANCE,
             f"loss curves: streamarena vs default {100 * gap:.2f}% mean gap, final "
             f"{100 * final:.2f}% apart (expandable vs default: {100 * noise:.2f}%; "
             f"tolerance {100 * LOSS_TOLERANCE:.0f}%)")
    chk = results.get("streamarena+check")
    if chk is not None:
        line(not chk["findings"],
             f"--check ({chk['steps']} steps, {chk['allocator_stats'].get('check_fills', 0)} "
             f"frees filled): {len(chk['findings'])} findings")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds, the allocators' order rotated each round (default 3)")
    p.add_argument("--check-steps", type=int, default=60,
                   help="steps of the streamarena --check run (0: none)")
    p.add_argument("--allocators", default=",".join(ORDER))
    p.add_argument("--memory-history", metavar="PICKLE",
                   help="the default allocator's run saves PyTorch's memory history here")
    p.add_argument("--trace", metavar="CSV", help="the streamarena run writes its trace here")
    p.add_argument("--out", help="folder for compare.json (every run's result) and "
                   "compare.log (their output); default: a temporary one")
    p.add_argument("--progress", action="store_true", help="show the runs' progress bars")
    p.add_argument("train_args", nargs="*", help="passed to train.py (after --)")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    out_dir = args.out or tempfile.mkdtemp(prefix="compare-")
    os.makedirs(out_dir, exist_ok=True)
    common = ["--steps", str(args.steps)] + args.train_args
    results = {}
    with tempfile.TemporaryDirectory() as tmp, \
            open(os.path.join(out_dir, "compare.log"), "w") as logf:
        names = args.allocators.split(",")
        runs = {name: [] for name in names}
        for r in range(args.rounds):
            for name in rotated(names, r):
                extra = list(common)
                # The memory history and the trace of the first round only.
                if r == 0 and name == "default" and args.memory_history:
                    extra += ["--memory-history", args.memory_history]
                if r == 0 and name == "streamarena" and args.trace:
                    extra += ["--trace", args.trace]
                runs[name].append(run(name, extra, tmp, logf, args.progress))
        for name in names:
            results[name] = aggregate(runs[name])
        if args.check_steps > 0 and "streamarena" in args.allocators.split(","):
            extra = args.train_args + ["--steps", str(args.check_steps), "--check"]
            results["streamarena+check"] = run("streamarena+check", extra, tmp, logf,
                                               args.progress)
    judged = targets(results)
    met = sum(line.startswith("[met]") for line in judged)
    summary = "\n" + table({k: v for k, v in results.items() if k in ORDER}) + "\n\n" + \
        "\n".join(judged) + f"\nresult: {met} of {len(judged)} targets met\n"
    print(summary, end="")
    with open(os.path.join(out_dir, "compare.log"), "a") as logf:
        logf.write(summary)
    with open(os.path.join(out_dir, "compare.json"), "w") as f:
        json.dump(results, f)
    print(f"\nresults and output: {out_dir}/compare.json, {out_dir}/compare.log")
    return 1 if any(v is None for v in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
