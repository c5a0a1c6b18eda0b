#!/usr/bin/env python3
"""Draw a streamarena snapshot (sa_snapshot_write JSON) as an SVG picture.

    python3 tools/render_snapshot.py SNAPSHOT.json [-o OUT.svg] [--columns N]
    python3 tools/render_snapshot.py SNAPSHOT.json --excess

With --excess it draws nothing and prints, as a Markdown table, where the
physical memory held above what is in use goes (superblocks' cached, free
and empty blocks, free spans, the chunk cache): what to look at when the
footprint is higher than expected.

The input may also be a file that holds the snapshot after other text, such
as stderr with an out-of-memory report: the first line that is just "{"
starts it. Standard library only; the SVG opens in any browser.

The picture, top to bottom:
  - the summary: total (the physical cap), reserved, in use, free, the
    largest free span and fragmentation, as numbers and as one bar;
  - the mapped part of the reserved virtual range, one cell per granule
    (2 MiB) in address order, wrapped into rows; unmapped gaps between
    mapped ranges are left out (a thin grey mark shows where). Superblocks
    are coloured by state, their fill shows the share of live blocks;
    spans are outlined as one piece; a stripe at the bottom of each cell
    names the stream that owns it (colour key in the legend);
  - the chunk cache: physical chunks held but not mapped.
Hovering a cell shows its details (an SVG <title>).
"""
import argparse
import json
import os
import sys
from xml.sax.saxutils import escape

MiB = 1 << 20

STATE_COLOURS = {
    # superblocks
    "active": "#3b6fb6",  # owned by a stream, some blocks live (fill = live share)
    "empty": "#a9c4e8",  # owned by a stream, no block in use
    "free": "#f2d15c",  # on the global free stack, ready for any stream
    "sb_awaiting_event": "#f0a04b",  # on the global stack, its event pending
    # spans
    "live": "#3c9a5f",  # a live large allocation
    "cached": "#a6dbb6",  # freed, still mapped (stream cache or clean)
    "awaiting_event": "#e07b39",  # freed on another stream, event pending
}
LEGEND = [
    ("active", "superblock with live blocks (dark part: live share)"),
    ("empty", "superblock kept empty by its stream"),
    ("free", "free superblock (global stack)"),
    ("sb_awaiting_event", "free superblock, event pending"),
    ("live", "live span (large allocation)"),
    ("cached", "freed span, still mapped"),
    ("awaiting_event", "freed span, event pending"),
]
STREAM_COLOURS = ["#8e44ad", "#16a085", "#c0392b", "#2c3e50", "#d35400", "#7f8c8d",
                  "#27ae60", "#2980b9", "#f39c12", "#e84393"]


def load(path):
    try:
        with open(path) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or e
        raise SystemExit(f"{path}: cannot be read: {why}")
    start = 0 if text.lstrip().startswith("{") else text.find("\n{\n") + 1
    if start <= 0 and not text.lstrip().startswith("{"):
        raise SystemExit(f"{path}: no snapshot found (a line that is just '{{')")
    try:
        snap = json.JSONDecoder().raw_decode(text[start:])[0]
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path}: the snapshot is not whole JSON ({e.msg} at line "
                         f"{text.count(chr(10), 0, start) + e.lineno}): cut short?")
    if not isinstance(snap, dict) or "summary" not in snap:
        raise SystemExit(f"{path}: not a streamarena snapshot (no \"summary\")")
    return snap


def mib(n):
    return f"{n / MiB:.1f} MiB" if n < 1 << 30 else f"{n / (1 << 30):.2f} GiB"


def pieces(snap):
    """Mapped descriptors sorted by address: dicts with base, size, kind."""
    out = []
    for sb in snap.get("superblocks", []):
        state = sb["state"]
        if state == "awaiting_event":
            state = "sb_awaiting_event"
        nblocks = len(sb.get("blocks", "")) or 1
        out.append({"base": int(sb["base"], 16), "size": sb["size"], "kind": "superblock",
                    "state": state, "stream": sb.get("stream"),
                    "live": sb.get("live", 0) / nblocks, "info": sb})
    for sp in snap.get("spans", []):
        out.append({"base": int(sp["base"], 16), "size": sp["size"], "kind": "span",
                    "state": sp["state"], "stream": sp.get("stream"), "live": 1.0, "info": sp})
    out.sort(key=lambda p: p["base"])
    for i, p in enumerate(out):
        p["index"] = i
    return out


def tooltip(p):
    i = p["info"]
    if p["kind"] == "span":
        return (f"span at {i['base']}: {mib(i['size'])} mapped, {i['request']} bytes requested, "
                f"{i['state']}, stream {i['stream']}")
    if i.get("stream") is None:
        return f"superblock at {i['base']}: {i['state']} (global stack)"
    return (f"superblock at {i['base']}: class {i['class']} ({i['block_size']} B blocks), "
            f"{i['live']} live, {i['cached']} in thread caches, {i['free']} free, "
            f"{i['awaiting_event']} awaiting an event; stream {i['stream']}")


def render(snap, columns):
    gran = snap.get("granularity", 2 * MiB)
    cell, gap = 14, 2
    streams = [s["stream"] for s in snap.get("streams", [])]
    for p in pieces(snap):
        if p["stream"] is not None and p["stream"] not in streams:
            streams.append(p["stream"])
    stream_colour = {s: STREAM_COLOURS[i % len(STREAM_COLOURS)] for i, s in enumerate(streams)}

    # Lay granules out in address order; a gap in the range costs one slot.
    slots = []  # (piece, index of granule within piece) or None for a gap
    prev_end = None
    for p in pieces(snap):
        if prev_end is not None and p["base"] > prev_end:
            slots.append(None)
        for k in range(max(1, p["size"] // gran)):
            slots.append((p, k))
        prev_end = p["base"] + p["size"]

    width = 40 + columns * (cell + gap)
    width = max(width, 760)
    body = []
    y = 20

    def text(x, yy, s, size=13, weight="normal", anchor="start"):
        body.append(f'<text x="{x}" y="{yy}" font-size="{size}" font-weight="{weight}" '
                    f'text-anchor="{anchor}">{escape(s)}</text>')

    # Summary and its bar.
    s = snap.get("summary", {})
    st = snap.get("stats", {})
    total = s.get("total", snap.get("physical_cap", 0)) or 1
    text(20, y + 4, f"streamarena snapshot: {snap.get('backend', '?')} backend, "
         f"granularity {mib(gran)}, superblock {mib(snap.get('superblock_size', gran))}",
         15, "bold")
    y += 24
    if s:
        text(20, y, f"total {mib(s['total'])} | reserved {mib(s['reserved'])} | in use "
             f"{mib(s['in_use'])} | free {mib(s['free'])} | largest free span "
             f"{mib(s['largest_free_span'])} | fragmentation {100 * s['fragmentation']:.1f}%")
        y += 8
        barw = width - 40
        in_use = s["in_use"] / total * barw
        reserved_free = max(0, s["reserved"] - s["in_use"]) / total * barw
        body.append(f'<rect x="20" y="{y}" width="{barw}" height="16" fill="#eeeeee" '
                    f'stroke="#555"><title>total {mib(s["total"])}</title></rect>')
        body.append(f'<rect x="20" y="{y}" width="{in_use:.1f}" height="16" fill="#3c9a5f">'
                    f'<title>in use {mib(s["in_use"])}</title></rect>')
        body.append(f'<rect x="{20 + in_use:.1f}" y="{y}" width="{reserved_free:.1f}" '
                    f'height="16" fill="#f2d15c"><title>reserved, not in use '
                    f'{mib(s["reserved"] - s["in_use"])}</title></rect>')
        y += 30
        text(20, y, "bar: green = in use, yellow = reserved but not in use, grey = unreserved "
             "(of the total)", 11)
        y += 18
    elif st:
        text(20, y, f"live {mib(st['live_bytes'])} | reserved {mib(st['reserved_bytes'])}")
        y += 20

    # The mapped range.
    text(20, y + 10, f"mapped virtual range, {len([x for x in slots if x])} granules in address "
         f"order ({columns} per row; grey marks: unmapped gaps left out)", 13, "bold")
    y += 20
    top = y
    for i, slot in enumerate(slots):
        r, c = divmod(i, columns)
        x0, y0 = 20 + c * (cell + gap), top + r * (cell + gap)
        if slot is None:
            body.append(f'<rect x="{x0 + cell // 2 - 1}" y="{y0}" width="3" height="{cell}" '
                        f'fill="#bbbbbb"><title>unmapped gap</title></rect>')
            continue
        p, k = slot
        colour = STATE_COLOURS.get(p["state"], "#cccccc")
        if p["kind"] == "span" and p["state"] == "live" and p["index"] % 2:
            colour = "#2e7d4f"  # neighbouring live spans alternate shades
        tip = escape(tooltip(p))
        if p["kind"] == "superblock" and p["state"] == "active":
            # Light base, dark share for the live fraction.
            h = max(1, round(cell * p["live"]))
            body.append(f'<g><title>{tip}</title><rect x="{x0}" y="{y0}" width="{cell}" '
                        f'height="{cell}" fill="#cfdcef"/><rect x="{x0}" y="{y0 + cell - h}" '
                        f'width="{cell}" height="{h}" fill="{colour}"/></g>')
        else:
            body.append(f'<rect x="{x0}" y="{y0}" width="{cell}" height="{cell}" '
                        f'fill="{colour}"><title>{tip}</title></rect>')
        if p["stream"] is not None:
            body.append(f'<rect x="{x0}" y="{y0 + cell - 3}" width="{cell}" height="3" '
                        f'fill="{stream_colour[p["stream"]]}"/>')
        if p["kind"] == "span":
            # Outline the span as one piece: edges where it starts, ends or wraps.
            first, last = k == 0, k == max(1, p["size"] // gran) - 1
            edges = [(x0, y0, x0 + cell, y0), (x0, y0 + cell, x0 + cell, y0 + cell)]
            if first or c == 0:
                edges.append((x0, y0, x0, y0 + cell))
            if last or c == columns - 1:
                edges.append((x0 + cell, y0, x0 + cell, y0 + cell))
            for (a, b, cc, d) in edges:
                body.append(f'<line x1="{a}" y1="{b}" x2="{cc}" y2="{d}" stroke="#1d4d2f" '
                            f'stroke-width="1.5"/>')
    rows = (len(slots) + columns - 1) // columns
    y = top + rows * (cell + gap) + 16

    # Chunk cache.
    cached = [ch for ch in snap.get("chunks", []) if ch.get("mapped_at") is None]
    mapped = [ch for ch in snap.get("chunks", []) if ch.get("mapped_at") is not None]
    text(20, y, f"physical chunks: {len(mapped)} mapped, {len(cached)} cached unmapped "
         f"({mib(sum(c['size'] for c in cached))}); sizes of cached chunks: "
         + (", ".join(mib(c["size"]) for c in cached[:12]) or "none")
         + (" ..." if len(cached) > 12 else ""), 12)
    y += 24

    # Legend: states, then streams.
    text(20, y, "legend", 13, "bold")
    y += 8
    for i, (key, label) in enumerate(LEGEND):
        col, row = i % 2, i // 2
        x0, y0 = 20 + col * 370, y + row * 20
        body.append(f'<rect x="{x0}" y="{y0}" width="14" height="14" '
                    f'fill="{STATE_COLOURS[key]}" stroke="#444"/>')
        text(x0 + 20, y0 + 12, label, 12)
    y += ((len(LEGEND) + 1) // 2) * 20 + 8
    text(20, y + 4, "stream stripe (bottom of each cell):", 12)
    y += 12
    for i, sname in enumerate(streams):
        col, row = i % 2, i // 2
        x0, y0 = 20 + col * 370, y + row * 20
        info = next((x for x in snap.get("streams", []) if x["stream"] == sname), None)
        extra = ""
        if info is not None and "live_span_bytes" in info:
            extra = (f": {mib(info['live_span_bytes'] + info['live_block_bytes'])} live"
                     + (" (released)" if info.get("released") else ""))
        body.append(f'<rect x="{x0}" y="{y0}" width="14" height="14" '
                    f'fill="{stream_colour[sname]}"/>')
        text(x0 + 20, y0 + 12, f"stream {sname}{extra}", 12)
    y += ((len(streams) + 1) // 2) * 20 + 10

    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" '
            f'viewBox="0 0 {width} {y}" font-family="sans-serif">'
            f'<rect width="{width}" height="{y}" fill="white"/>')
    return head + "\n".join(body) + "</svg>\n"


BLOCK_PARTS = {"C": "blocks in thread caches", "F": "free blocks in superblocks",
               "D": "blocks on their way back from another stream"}


def excess(snap):
    """(label, bytes) rows: reserved, in use, and the parts of the difference,
    which add up to it exactly; the last part is what no descriptor names."""
    s = snap["summary"]
    parts = {}

    def add(label, n):
        parts[label] = parts.get(label, 0) + n

    for sb in snap.get("superblocks", []):
        if sb.get("stream") is None:
            add("superblocks on the global stack", sb["size"])
            continue
        if sb["state"] == "empty":
            add("empty superblocks kept by their stream", sb["size"])
            continue
        bs, letters = sb["block_size"], sb.get("blocks", "")
        for letter, label in BLOCK_PARTS.items():
            add(label, letters.count(letter) * bs)
        add("superblock room past its last block", sb["size"] - len(letters) * bs)
    for sp in snap.get("spans", []):
        if sp["state"] == "cached":
            add("free spans, ready", sp["size"])
        elif sp["state"] == "awaiting_event":
            add("free spans, work not known done (their own stream may reuse them)", sp["size"])
    add("chunk cache (created, not mapped)",
        sum(c["size"] for c in snap.get("chunks", []) if c.get("mapped_at") is None))
    above = s["reserved"] - s["in_use"]
    named = sum(parts.values())
    rows = [("reserved", s["reserved"]), ("in use (live blocks and spans, whole)", s["in_use"]),
            ("held above in use", above)]
    rows += [("- " + label, n) for label, n in parts.items() if n > 0]
    rows.append(("- mapped, in no superblock or span (free slab slots)", above - named))
    return rows


def print_excess(snap):
    rows = excess(snap)
    in_use = snap["summary"]["in_use"] or 1
    print("| where | MiB | of in use |")
    print("| --- | ---: | ---: |")
    for label, n in rows:
        print(f"| {label} | {n / MiB:.1f} | {n / in_use:.4f} |")
    largest = snap["summary"].get("largest_free_span", 0)
    spans = sorted((sp["size"] for sp in snap.get("spans", []) if sp["state"] != "live"),
                   reverse=True)
    print(f"\nlargest free spans (MiB): {', '.join(f'{n / MiB:.1f}' for n in spans[:5]) or 'none'}"
          f"; largest free range, unmapped room included: {largest / MiB:.1f} MiB")
    sbs = snap.get("superblocks", [])
    idle = [sb for sb in sbs if not sb.get("live")]
    print(f"superblocks: {len(sbs)} ({sum(sb['size'] for sb in sbs) / MiB:.1f} MiB), {len(idle)} "
          f"of them with no live block ({sum(sb['size'] for sb in idle) / MiB:.1f} MiB)")
    cached = cached_by_size(snap)
    if any(cached.values()):
        print("blocks in thread caches by block size (MiB): " +
              ", ".join(f"{band} {n / MiB:.1f}" for band, n in cached.items()))


CACHED_BANDS = ((16 << 10, "to 16 KiB"), (64 << 10, "to 64 KiB"), (256 << 10, "to 256 KiB"),
                (None, "larger"))


def cached_by_size(snap):
    """Bytes of blocks in thread caches ("C" in a superblock's blocks), by block size."""
    out = {band: 0 for _, band in CACHED_BANDS}
    for sb in snap.get("superblocks", []):
        bs = sb.get("block_size", 0)
        band = next(b for top, b in CACHED_BANDS if top is None or bs <= top)
        out[band] += sb.get("blocks", "").count("C") * bs
    return out


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("snapshot")
    p.add_argument("-o", "--output", help="SVG file (default: the snapshot's name + .svg)")
    p.add_argument("--columns", type=int, default=64, help="granules per row (default 64)")
    p.add_argument("--excess", action="store_true",
                   help="print where the memory held above in use goes; draw nothing")
    args = p.parse_args(argv)
    snap = load(args.snapshot)
    if args.excess:
        print_excess(snap)
        return 0
    out = args.output or (os.path.splitext(args.snapshot)[0] + ".svg")
    with open(out, "w") as f:
        f.write(render(snap, max(8, args.columns)))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
