#!/usr/bin/env python3
"""bench/RESULTS.md and its plots, from peer_bench's JSON lines.

    python3 bench/peers/plot.py [--out DIR] [--no-plots] RESULTS.jsonl...

Reads every file given (bench/peers/run.sh writes one results.jsonl for all
backends) and writes DIR/RESULTS.md (default DIR: bench/) with the machine,
date, commit, command and a table per workload, and, with matplotlib,
DIR/peers_pairs.png (ns per pair by size), DIR/peers_threads.png (Mpairs/s
by threads) and DIR/peers_traces.png (per trace, us/op against peak
reserved over peak live: each peer a point, streamarena's footprint curve,
the default and its streamarena-ft<target> points, joined). Also prints the
tables. Nothing in RESULTS.md is written by hand: regenerate it from the
raw output.
"""
import argparse
import json
import os
import sys

ORDER = ["streamarena", "streamarena-ft1.2", "streamarena-ft1.5", "streamarena-ft2",
         "cudaMallocAsync", "rmm-pool", "rmm-arena", "rmm-async", "rmm-streamarena", "torch",
         "torch-expandable"]
DEFAULT_TARGET = 1 + 1 / 64  # footprint_target's default (SA_FOOTPRINT_TIGHT)
CURVE_PREFIX = "streamarena-ft"
# The configuration streamarena.torch.install() gives PyTorch: compared with
# each peer beside the curve's points (a configuration streamarena ships).
TORCH_CONFIG = "streamarena-torch"


def curve_target(backend):
    """The footprint_target of a point of streamarena's curve (the default
    configuration is one), None for any other backend."""
    if backend == "streamarena":
        return DEFAULT_TARGET
    if backend.startswith(CURVE_PREFIX):
        try:
            return float(backend[len(CURVE_PREFIX):])
        except ValueError:
            return None
    return None


def is_peer(backend):
    """Another allocator: not streamarena in any configuration."""
    return "streamarena" not in backend
PAIR_CASES = ["256B", "1KiB", "4KiB", "16KiB", "64KiB", "256KiB", "1MiB", "4MiB", "16MiB",
              "mixed", "mixed-16MiB"]
PAIR_BYTES = {c: 256 << (2 * i) for i, c in enumerate(PAIR_CASES[:9])}


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    sys.exit(f"plot.py: {p}:{n}: not JSON: {e}")
    return rows


def backends_of(rows):
    seen = []
    for r in rows:
        b = r.get("backend")
        if r.get("type") in ("result", "backend") and b and b not in seen:
            seen.append(b)
    return sorted(seen, key=lambda b: (ORDER.index(b) if b in ORDER else len(ORDER), b))


def table(header, body, text=False):
    """A Markdown table: the first column left-aligned, the others right
    (numbers) or, with text, left."""
    rest = "---" if text else "---:"
    out = ["| " + " | ".join(header) + " |",
           "| " + " | ".join(["---"] + [rest] * (len(header) - 1)) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(out)


def fmt(v, digits=1):
    return "–" if v is None else f"{v:,.{digits}f}"


def result(res, backend, workload, case, **match):
    for r in res:
        if r["backend"] == backend and r["workload"] == workload and r["case"] == case and all(
                r.get(k) == v for k, v in match.items()):
            return r
    return None


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def trace_summary(res, backend, case):
    """A backend's replays of one trace, one per round: the median us per
    op with its range, the highest footprint and OOM count of the rounds."""
    rs = [r for r in res if r["backend"] == backend and r["workload"] == "trace"
          and r["case"] == case]
    if not rs:
        return None
    us = [r["us_per_op"] for r in rs]
    # The instance's construction is not in us_per_op (older results lack it).
    made = [r["create_seconds"] for r in rs if "create_seconds" in r]
    create = median(made) if made else None
    return {"n": len(us), "us": median(us), "lo": min(us), "hi": max(us), "ops": rs[0]["ops"],
            "peak_live": rs[0]["peak_live"], "ratio": max(r["ratio"] for r in rs),
            "ooms": max(r["ooms"] for r in rs), "create": create}


def random_summary(res, backend, case, run):
    """A backend's results of one random case and run, one per process
    (run.sh --after-rounds runs the random workloads in several): the median
    us per allocation, and the median with the instance's construction added;
    truncated or failed where any process was."""
    rs = [r for r in res if r["backend"] == backend and r["workload"] == "random"
          and r["case"] == case and r.get("run") == run]
    if not rs:
        return None
    made = [(r["seconds"] + r["create_seconds"]) * 1e6 / r["allocs"] for r in rs
            if "create_seconds" in r and r["allocs"]]
    return {"n": len(rs), "us": median(r["us_per_alloc"] for r in rs),
            "lo": min(r["us_per_alloc"] for r in rs), "hi": max(r["us_per_alloc"] for r in rs),
            "with_create": median(made) if len(made) == len(rs) else None,
            "truncated": next((r for r in rs if r.get("truncated")), None),
            "failed": max(r.get("failed", 0) for r in rs)}


def sections(rows):
    res = [r for r in rows if r.get("type") == "result"]
    bks = backends_of(rows)
    out = []

    pairs = [c for c in PAIR_CASES if any(r["workload"] == "pairs" and r["case"] == c for r in res)]
    if pairs:
        body = []
        for c in pairs:
            cells = [result(res, b, "pairs", c) for b in bks]
            body.append([c] + [fmt(r and r["ns_per_pair"]) for r in cells])
        out.append(("alloc+free pairs, one thread: ns per alloc+free pair (median; lower is "
                    "better)", table(["size"] + bks, body), "peers_pairs.png"))

    thr = sorted({(r["case"], r["threads"]) for r in res if r["workload"] == "threads"},
                 key=lambda k: (k[0] != "4KiB", k[1]))
    if thr:
        body = []
        for c, t in thr:
            cells = [result(res, b, "threads", c, threads=t) for b in bks]
            body.append([c, t] + [fmt(r and r["mpairs_per_s"], 2) for r in cells])
        out.append(("T threads, each on its own stream: Mpairs/s, all threads together (higher "
                    "is better)", table(["case", "threads"] + bks, body), "peers_threads.png"))

    rnd = sorted({(r["case"], r["run"]) for r in res if r["workload"] == "random"})
    if rnd:
        body = []
        for c, run in rnd:
            cells, both = [], []  # both: what a new process pays, construction and run 1
            for b in bks:
                r = random_summary(res, b, c, run)
                cell = fmt(r and r["us"], 2)
                if r and r["n"] > 1:  # processes: the median and their range
                    cell += f" ({r['lo']:.2f}-{r['hi']:.2f}, {r['n']} processes)"
                if r and r["truncated"]:
                    cell += f" (stopped after {r['truncated']['allocs']} allocs)"
                if r and r["failed"]:  # a failed allocation frees instead: another sequence
                    cell += f" ({r['failed']} failed)"
                cells.append(cell)
                cell = fmt(r and r["with_create"], 2)
                if r and r["with_create"] is not None and r["truncated"]:
                    cell += f" (stopped after {r['truncated']['allocs']} allocs)"
                both.append(cell)
            after = c.endswith("-after")  # the instance ran other work first
            label = ("first after other work" if after else "cold") if run == 1 else \
                f"warm ({run})"
            body.append([c, label] + cells)
            if run == 1 and not after:
                body.append([c, "cold, with construction"] + both)
        out.append(("RMM's random allocations (N=100000 up to 1 MiB, N=1000 up to 4 GiB, live "
                    "capped at 16000 MiB; random-4GiB-after: on an instance that first replayed "
                    "the traces and ran the pairs and threads): us per allocation (lower is "
                    "better)",
                    table(["case", "run"] + bks, body), None))

    pc = [result(res, b, "prodcons", "mixed") for b in bks]
    if any(pc):
        body = [["ns per pair"] + [fmt(r and r["ns_per_pair"]) for r in pc],
                ["Mpairs/s"] + [fmt(r and r["mpairs_per_s"], 3) for r in pc]]
        out.append(("producer/consumer: allocated on one thread and stream, freed on another "
                    "(sizes 256 B..1 MiB)", table([""] + bks, body), None))

    traces = list(dict.fromkeys(r["case"] for r in res if r["workload"] == "trace"))
    if traces:
        body, rounds = [], 1
        for t in traces:
            cells = [trace_summary(res, b, t) for b in bks]
            any_r = next(r for r in cells if r)
            rounds = max([rounds] + [r["n"] for r in cells if r])
            fastest = min(r["us"] for r in cells if r)
            smallest = min(round(r["ratio"], 3) for r in cells if r)
            row = [t, f"{any_r['ops']:,}", f"{any_r['peak_live'] / 2**30:.2f}"]
            for r in cells:
                if r is None:
                    row.append("–")
                    continue
                us = f"{r['us']:.2f}"
                if r["n"] > 1:
                    us += f" ({r['lo']:.2f}-{r['hi']:.2f})"
                if r["us"] == fastest:
                    us = f"**{us}**"
                ratio = f"{r['ratio']:.3f}"
                if round(r["ratio"], 3) == smallest:
                    ratio = f"**{ratio}**"
                cell = f"{us} / {ratio}"
                # An allocator that takes its memory when it is made (RMM's
                # arena) pays there what the others pay in the replay.
                if r["create"] is not None:
                    made_us = r["create"] * 1e6 / r["ops"]
                    if made_us >= 0.1 * r["us"]:
                        cell += f" (with construction {r['us'] + made_us:.2f})"
                if r["ooms"]:
                    cell += f" ({r['ooms']} OOM)"
                row.append(cell)
            body.append(row)
        how = (f"median us per op of {rounds} rounds (min-max), the backends interleaved in "
               "each round; the highest footprint of the rounds" if rounds > 1 else
               "us per op / peak reserved over peak live")
        how += "; the allocator's construction not timed, shown where it adds 10% or more"
        out.append(("trace replay, a fresh allocator per trace: " + how + " (lower is better for "
                    "both; the best of a row in bold)",
                    table(["trace", "ops", "peak live GiB"] + bks, body), "peers_traces.png"))

    if traces:
        out += curve_section(res, bks, traces)
    out += goals_section(res, bks, traces)

    fails = [r for r in rows if r.get("type") == "error"]
    skips = [r for r in rows if r.get("type") == "skip"]
    if fails or skips:
        body = [[r["backend"], r["workload"], "FAILED: " + r["error"].split("\n")[0]] for r in fails]
        body += [[r["backend"], r["workload"], "skipped: " + r["why"]] for r in skips]
        out.append(("failures and skips", table(["backend", "workload", "what"], body, text=True),
                    None))
    return out


# The targets streamarena holds itself to (README, "Benchmarks"), each
# checked on one run's figures as the tables above give them.
EXPANDABLE, POOL = "torch-expandable", "rmm-pool"
SMALL_PAIR_NS = 25.0   # one thread's 256 B alloc+free pair, at most
RANDOM_OF_BEST = 2.0   # RMM's random up to 4 GiB: at most this x the best peer's


def met(ok):
    return "met" if ok else "**not met**"


def footprint_at_most(ours, theirs):
    """Is footprint ratio ours at or below theirs, as the tables show them
    (three decimals)? A verdict the reader cannot see in the figures beside
    it would read as a mistake."""
    return round(ours, 3) <= round(theirs, 3)


def goals_section(res, bks, traces):
    """A row per target: streamarena's figure, the reference it is held to,
    and whether it holds (traces: medians of the rounds, footprints to three
    decimals as shown)."""
    body = []
    peers = [b for b in bks if is_peer(b)]
    for t in traces:
        e = trace_summary(res, EXPANDABLE, t)
        # The default, and the configuration a PyTorch program gets from
        # streamarena.torch.install() where the run has it.
        for b, what in (("streamarena", "the default"), (TORCH_CONFIG, TORCH_CONFIG)):
            s = trace_summary(res, b, t)
            if s and e:
                ok = s["us"] <= e["us"] and footprint_at_most(s["ratio"], e["ratio"])
                body.append([f"{t}: {what} at most expandable segments' us/op and footprint",
                             f"{s['us']:.2f} / {s['ratio']:.3f}",
                             f"{e['us']:.2f} / {e['ratio']:.3f}", met(ok)])
        p = trace_summary(res, POOL, t)
        if p:
            fit = [x for x in curve_points(res, bks, t)
                   if footprint_at_most(x[2]["ratio"], p["ratio"])]
            cell, ok = "no point at that footprint", False
            if fit:
                _, b, r = min(fit, key=lambda x: x[2]["us"])
                cell, ok = f"{b}: {r['us']:.2f} / {r['ratio']:.3f}", r["us"] <= p["us"]
            body.append([f"{t}: the curve at RMM pool's footprint or below, at most its us/op",
                         cell, f"{p['us']:.2f} / {p['ratio']:.3f}", met(ok)])
    for case, key, what in (("random-4GiB", "with_create", "fresh, with construction"),
                            ("random-4GiB-after", "us", "first after other work")):
        s = random_summary(res, "streamarena", case, 1)
        ref = [(random_summary(res, b, case, 1), b) for b in peers]
        ref = [(r[key], b) for r, b in ref if r and r[key] is not None]
        if s and s[key] is not None and ref:
            best, b = min(ref)
            body.append([f"RMM's random up to 4 GiB, {what}: at most {RANDOM_OF_BEST:g} x the "
                         f"best peer's us/alloc", f"{s[key]:.2f} ({s[key] / best:.2f} x)",
                         f"{b}: {best:.2f}", met(s[key] <= RANDOM_OF_BEST * best)])
    s = result(res, "streamarena", "pairs", "16MiB")
    ref = [(r["ns_per_pair"], b) for r, b in ((result(res, b, "pairs", "16MiB"), b)
                                               for b in peers) if r]
    if s and ref:
        best, b = min(ref)
        body.append(["16 MiB alloc+free pair: at most the best peer's ns",
                     f"{s['ns_per_pair']:.1f}", f"{b}: {best:.1f}", met(s["ns_per_pair"] <= best)])
    s = result(res, "streamarena", "pairs", "256B")
    if s:
        body.append([f"256 B alloc+free pair, one thread: at most {SMALL_PAIR_NS:g} ns",
                     f"{s['ns_per_pair']:.1f}", f"{SMALL_PAIR_NS:g}",
                     met(s["ns_per_pair"] <= SMALL_PAIR_NS)])
    if not body:
        return []
    return [("streamarena against its targets, on this run's figures (medians as above)",
             table(["target", "streamarena", "held to", "holds"], body, text=True), None)]


def curve_points(res, bks, trace):
    """streamarena's curve on one trace: (target, backend, summary), by
    target."""
    pts = []
    for b in bks:
        t, r = curve_target(b), trace_summary(res, b, trace)
        if t is not None and r:
            pts.append((t, b, r))
    return sorted(pts, key=lambda p: p[0])


def curve_section(res, bks, traces):
    """Per trace: streamarena's curve (a row per point), then per peer the
    fastest of the curve's points and TORCH_CONFIG at that peer's footprint
    or below, against the peer."""
    body, versus = [], []
    for t in traces:
        pts = curve_points(res, bks, t)
        for target, b, r in pts:
            body.append([t, b, f"{target:.3f}", f"{r['us']:.2f}", f"{r['ratio']:.3f}",
                         r["ooms"]])
        shipped = list(pts)
        tr = trace_summary(res, TORCH_CONFIG, t) if TORCH_CONFIG in bks else None
        if tr:
            shipped.append((None, TORCH_CONFIG, tr))
        for p in (b for b in bks if is_peer(b)):
            pr = trace_summary(res, p, t)
            if not pr or not shipped:
                continue
            fit = [x for x in shipped if footprint_at_most(x[2]["ratio"], pr["ratio"])]
            if not fit:
                versus.append([t, p, f"{pr['us']:.2f} / {pr['ratio']:.3f}", "none", "–"])
                continue
            target, b, r = min(fit, key=lambda x: x[2]["us"])
            verdict = "faster" if r["us"] < pr["us"] else "level" if r["us"] == pr["us"] \
                else f"slower ({r['us'] / pr['us']:.2f}x)"
            versus.append([t, p, f"{pr['us']:.2f} / {pr['ratio']:.3f}",
                           f"{b}: {r['us']:.2f} / {r['ratio']:.3f}", verdict])
    out = []
    if body:
        out.append(("streamarena's footprint curve (footprint_target; the default is "
                    f"{DEFAULT_TARGET:.3f}): median us per op / peak reserved over peak live",
                    table(["trace", "curve point", "footprint_target", "us/op",
                           "peak reserved / peak live", "OOM"], body), None))
    if versus:
        out.append(("each peer against streamarena's fastest curve point (or streamarena-torch, "
                    "the configuration streamarena.torch.install() gives) at the peer's footprint "
                    "or below (us per op / peak reserved over peak live)",
                    table(["trace", "peer", "peer", "streamarena at that footprint or below",
                           "streamarena is"], versus, text=True), None))
    return out


def header(rows):
    run = next((r for r in rows if r.get("type") == "run"), {})
    meta = next((r for r in rows if r.get("type") == "meta"), {})
    about = {}
    for r in rows:
        if r.get("type") == "backend":
            about.setdefault(r["backend"], r)
    lines = []
    if run.get("quick"):
        lines.append("> **Smoke run (`--quick`): small counts on a shared machine, to check "
                     "that everything runs; not figures to compare.**\n")
    info = [
        ("machine", run.get("machine") or f"{meta.get('device', '?')}; {meta.get('cpu', '?')}, "
         f"{meta.get('cpus', '?')} CPUs"),
        ("date", run.get("date") or meta.get("date", "?")),
        ("commit", run.get("commit", "?")),
        ("command", f"`{run['command']}`" if run.get("command") else f"`{meta.get('command', '?')}`"),
    ]
    if run.get("torch"):
        info.append(("torch", run["torch"]))
    lines.append(table(["", ""], info, text=True))
    lines.append("\nBackends, as run (peak reserved is each allocator's own figure):\n")
    lines.append(table(["backend", "what runs", "peak reserved from"],
                       [[b, about[b]["about"], about[b]["reserved"]] for b in backends_of(rows)
                        if b in about], text=True))
    return "\n".join(lines)


def plots(rows, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py: no matplotlib: tables only", file=sys.stderr)
        return []
    res = [r for r in rows if r.get("type") == "result"]
    bks = backends_of(rows)
    made = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for b in bks:
        pts = [(PAIR_BYTES[r["case"]], r["ns_per_pair"]) for r in res
               if r["backend"] == b and r["workload"] == "pairs" and r["case"] in PAIR_BYTES]
        if pts:
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=b)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("ns per alloc+free pair (one thread)")
    ax.set_title("alloc+free pair cost by size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "peers_pairs.png"), dpi=120)
    made.append("peers_pairs.png")
    plt.close(fig)

    cases = sorted({r["case"] for r in res if r["workload"] == "threads"})
    if cases:
        fig, axes = plt.subplots(1, len(cases), figsize=(6 * len(cases), 4.5), squeeze=False)
        for ax, c in zip(axes[0], cases):
            for b in bks:
                pts = sorted((r["threads"], r["mpairs_per_s"]) for r in res if r["backend"] == b
                             and r["workload"] == "threads" and r["case"] == c)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=b)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("threads (each on its own stream)")
            ax.set_ylabel("Mpairs/s, all threads")
            ax.set_title(f"throughput by threads: {c}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "peers_threads.png"), dpi=120)
        made.append("peers_threads.png")
        plt.close(fig)

    tr = [r for r in res if r["workload"] == "trace"]
    if tr:
        # One panel per trace: each peer a point, streamarena's curve points
        # (the default and streamarena-ft<target>) joined by a line.
        traces = list(dict.fromkeys(r["case"] for r in tr))
        cols = min(3, len(traces))
        rows_n = (len(traces) + cols - 1) // cols
        fig, axes = plt.subplots(rows_n, cols, figsize=(5.5 * cols, 4.2 * rows_n),
                                 squeeze=False)
        others = [b for b in bks if curve_target(b) is None]
        colors = {b: f"C{(i + 1) % 10}" for i, b in enumerate(others)}
        markers = "osD^v<>ph*X"
        for ax, t in zip(axes.flat, traces):
            pts = curve_points(res, bks, t)
            if pts:
                ax.plot([p[2]["ratio"] for p in pts], [p[2]["us"] for p in pts], color="C0",
                        marker="o", lw=2, label="streamarena (footprint_target curve)")
                for target, _, r in pts:
                    label = "default" if target == DEFAULT_TARGET else f"{target:g}"
                    ax.annotate(label, (r["ratio"], r["us"]), fontsize=7,
                                textcoords="offset points", xytext=(4, 4), color="C0")
            for i, b in enumerate(others):
                r = trace_summary(res, b, t)
                if r:
                    ax.scatter(r["ratio"], r["us"], color=colors[b], s=45,
                               marker=markers[i % len(markers)], label=b)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("peak reserved / peak live (footprint)")
            ax.set_ylabel("us per operation")
            ax.set_title(t, fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
        for ax in list(axes.flat)[len(traces):]:
            ax.axis("off")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        seen = dict(zip(labels, handles))
        for ax in axes.flat:
            for h, l in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(l, h)
        fig.legend(list(seen.values()), list(seen.keys()), fontsize=7, loc="lower center",
                   ncol=min(4, len(seen)))
        fig.suptitle("trace replay: time against footprint (lower left is better)")
        fig.tight_layout(rect=(0, 0.08, 1, 0.96))
        fig.savefig(os.path.join(out_dir, "peers_traces.png"), dpi=120)
        made.append("peers_traces.png")
        plt.close(fig)
    return made


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="peer_bench --json output (JSON lines)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                    help="folder for RESULTS.md and the PNGs (default: bench/)")
    ap.add_argument("--no-plots", action="store_true", help="tables only")
    args = ap.parse_args()
    rows = load(args.files)
    if not any(r.get("type") == "result" for r in rows):
        sys.exit("plot.py: no results in " + ", ".join(args.files))
    os.makedirs(args.out, exist_ok=True)
    made = [] if args.no_plots else plots(rows, args.out)
    doc = ["# streamarena and its peers: results", "",
           "<!-- Generated by bench/peers/plot.py from the JSON lines of bench/peers/run.sh; "
           "regenerate, do not edit. -->", "", header(rows), ""]
    for title, tab, png in sections(rows):
        doc += [f"## {title}", "", tab, ""]
        if png in made:
            doc += [f"![{title}]({png})", ""]
        print(f"\n{title}\n{tab}")
    doc += ["## How to run", "",
            "On a machine with a GPU (CUDA 13, python3 with torch for the PyTorch rows), from "
            "a checkout where `bench/peers/build.sh` staged the program and its plug-ins:", "",
            "```sh",
            "bash .gpu/peers/run.sh            # writes results.jsonl, RESULTS.md and the plots",
            "python3 bench/peers/plot.py results.jsonl   # this page again, from the raw output",
            "```", "",
            "Without a GPU, `bazel run //bench/peers:peer_bench -- --quick bench/traces/*.csv` "
            "runs streamarena on the host simulator.", ""]
    with open(os.path.join(args.out, "RESULTS.md"), "w") as f:
        f.write("\n".join(doc))
    print(f"\nwrote {os.path.join(args.out, 'RESULTS.md')}"
          + (f" and {', '.join(made)}" if made else ""))


if __name__ == "__main__":
    main()
