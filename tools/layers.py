#!/usr/bin/env python3
"""Checks that the allocator's files depend only downwards: calls and includes.

src/internal.h lists the allocator's files top to bottom ("Layers, top to
bottom"), by their path under src/; the folders they are in are the tiers,
in the order the list first names them (src/ itself, then small/, large/,
vm/, base/), with src/driver/ and src/sim/ below them all. This checks:

  Calls. It finds which file defines each function with external linkage
  in src/**/*.c and reports every call from a file to a function defined in
  a file listed above it (or in a file the list does not name). src/driver/
  and src/sim/ must not call into the allocator at all, and the simulator
  not into the driver backends (only sa_driver_set_error, the driver
  layer's error record).

  Includes. A file (.c or .h) may include only headers of its own tier and
  of the tiers below it, with two exceptions: arena.h, which gathers every
  layer's state into struct sa_arena_s and which any .c file of the
  allocator may include to reach its own layer's fields; and the umbrella
  internal.h, which includes everything and which no file under src/
  includes. The simulator may include driver/driver.h, for the error record
  only (as for calls).

    python3 tools/layers.py [SRC_DIR]     # exit 1 and one line per problem
"""
import os
import re
import sys

DEFINITION = re.compile(
    r"^(?!static\b)[A-Za-z_][\w \t\*\(\)]*?\b(sa_\w+)\s*\([^;{]*\)\s*\{", re.M)
CALL = re.compile(r"\b(sa_\w+)\s*\(")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
LAYER_LINE = re.compile(r"^ \*\s+(\S+\.[ch])\s")
# Files the list leaves out on purpose: leaves that call nothing of the
# allocator (they may be called from anywhere), and the public drop-in layer
# above everything.
LEAVES = {"status.c", "config.c"}
ABOVE_ALL = {"default_arena.c"}
SYSTEMS = ("driver", "sim")  # below the allocator, in this order
UMBRELLA = "internal.h"
ARENA = "arena.h"


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def layer_order(internal_h):
    order, inside = [], False
    with open(internal_h) as f:
        for line in f:
            if "Layers, top to bottom" in line:
                inside = True
                continue
            if inside:
                m = LAYER_LINE.match(line)
                if m:
                    order.append(m.group(1))
                elif line.strip() in ("*", "*/"):
                    break
    return order


def tier_of(path):
    """The folder of a path under src/: "" for src/ itself."""
    return path.split("/")[0] if "/" in path else ""


def read_sources(src):
    """Every .c and .h under src, by path relative to it, comments out."""
    files = {}
    for d, _, names in sorted(os.walk(src)):
        for name in sorted(names):
            if name.endswith((".c", ".h")):
                path = os.path.relpath(os.path.join(d, name), src).replace(os.sep, "/")
                with open(os.path.join(d, name)) as f:
                    text = f.read()
                files[path] = (strip_comments(text),
                               re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"),
                                      text, flags=re.S))
    return files


def check_calls(files, rank):
    sources = {p: t for p, (t, _) in files.items() if p.endswith(".c")}
    defined_in = {}
    for path, text in sources.items():
        for m in DEFINITION.finditer(text):
            defined_in.setdefault(m.group(1), path)
    problems, calls = [], 0
    for path, text in sources.items():
        system = tier_of(path) if tier_of(path) in SYSTEMS else ""
        own = {m.group(1) for m in DEFINITION.finditer(text)}
        for fn in sorted({m.group(1) for m in CALL.finditer(text)} - own):
            callee = defined_in.get(fn)
            if callee is None:
                continue  # a macro, a static inline of a header, or libc
            calls += 1
            callee_system = tier_of(callee) if tier_of(callee) in SYSTEMS else ""
            if system == "sim":
                if callee_system != "sim" and fn != "sa_driver_set_error":
                    problems.append(f"{path} calls {fn} ({callee}): the simulator "
                                    "calls nothing outside src/sim/")
                continue
            if system == "driver":
                if callee_system == "" and callee not in LEAVES:
                    problems.append(f"{path} calls {fn} ({callee}): the driver "
                                    "calls nothing of the allocator")
                continue
            if callee_system != "" or callee in LEAVES or path in ABOVE_ALL:
                continue  # down into the driver, a leaf, or from the top
            if path not in rank or callee not in rank:
                missing = path if path not in rank else callee
                problems.append(f"{missing} is not in internal.h's layer list")
                continue
            if rank[callee] < rank[path]:
                problems.append(f"{path} calls {fn} of {callee}, a layer above it")
    return problems, calls


def check_includes(files, tiers):
    tier_rank = {t: i for i, t in enumerate(tiers)}
    problems, includes = [], 0
    for path, (_, text) in files.items():
        here = tier_of(path)
        for m in INCLUDE.finditer(text):
            target = os.path.normpath(os.path.join(os.path.dirname(path), m.group(1)))
            target = target.replace(os.sep, "/")
            if target not in files:
                continue  # a header outside src/ (include/, the toolkit's)
            includes += 1
            there = tier_of(target)
            if target == UMBRELLA:
                problems.append(f"{path} includes {UMBRELLA}: the umbrella is for tests and "
                                "tools; include the layer headers")
            elif path == UMBRELLA:
                continue
            elif target == ARENA and path.endswith(".c") and here not in SYSTEMS:
                continue
            elif here == "sim" and target == "driver/driver.h":
                continue  # the driver layer's error record
            elif there not in tier_rank or here not in tier_rank:
                problems.append(f"{path} includes {target}: a folder internal.h does not name")
            elif tier_rank[there] < tier_rank[here]:
                what = "a header of a tier above it" if target != ARENA else \
                    "which only .c files of the allocator include"
                problems.append(f"{path} includes {target}, {what}")
    return problems, includes


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "src")
    order = layer_order(os.path.join(src, UMBRELLA))
    if not order:
        print("layers: no layer list found in internal.h")
        return 1
    rank = {path: i for i, path in enumerate(order)}
    tiers = []
    for path in order:
        if tier_of(path) not in tiers and tier_of(path) not in SYSTEMS:
            tiers.append(tier_of(path))
    tiers += list(SYSTEMS)
    files = read_sources(src)
    call_problems, calls = check_calls(files, rank)
    include_problems, includes = check_includes(files, tiers)
    problems = sorted(set(call_problems)) + sorted(set(include_problems))
    for p in problems:
        print("layers:", p)
    print(f"layers: {len(files)} files, {len(order)} layers in {len(tiers)} tiers "
          f"({', '.join(t + '/' if t else 'src/' for t in tiers)}), {calls} cross-file "
          f"calls, {len(set(call_problems))} calls up, {includes} includes, "
          f"{len(set(include_problems))} includes up")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
