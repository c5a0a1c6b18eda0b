#!/usr/bin/env python3
"""Checks that calls between the allocator's files only go down.

src/internal.h lists the allocator's files top to bottom ("Layers, top to
bottom (each calls only the ones below it)"). This reads that list, finds
which file defines each function with external linkage in src/**/*.c, and
reports every call from a file to a function defined in a file listed above
it (or in a file the list does not name). src/driver/ and src/sim/ must not
call into the allocator at all, and the simulator not into the driver
backends (only sa_driver_set_error, the driver layer's error record).

    python3 tools/layers.py [SRC_DIR]     # exit 1 and one line per call up
"""
import os
import re
import sys

DEFINITION = re.compile(
    r"^(?!static\b)[A-Za-z_][\w \t\*\(\)]*?\b(sa_\w+)\s*\([^;{]*\)\s*\{", re.M)
CALL = re.compile(r"\b(sa_\w+)\s*\(")
LAYER_LINE = re.compile(r"^ \*\s+(\S+\.[ch])\s")
# Files the list leaves out on purpose: leaves that call nothing of the
# allocator (they may be called from anywhere), and the public drop-in layer
# above everything.
LEAVES = {"status.c", "config.c"}
ABOVE_ALL = {"default_arena.c"}


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
                    order.append(os.path.basename(m.group(1)))
                elif line.strip() in ("*", "*/"):
                    break
    return order


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "src")
    order = layer_order(os.path.join(src, "internal.h"))
    if not order:
        print("layers: no layer list found in internal.h")
        return 1
    rank = {name: i for i, name in enumerate(order)}
    files = {}
    for d, _, names in sorted(os.walk(src)):
        for name in sorted(names):
            if name.endswith(".c"):
                path = os.path.relpath(os.path.join(d, name), src)
                with open(os.path.join(d, name)) as f:
                    files[path] = strip_comments(f.read())
    defined_in = {}
    for path, text in files.items():
        for m in DEFINITION.finditer(text):
            defined_in.setdefault(m.group(1), path)
    problems, calls = [], 0
    for path, text in files.items():
        caller = os.path.basename(path)
        system = path.split(os.sep)[0] if os.sep in path else ""
        system = system if system in ("driver", "sim") else ""
        own = {m.group(1) for m in DEFINITION.finditer(text)}
        for fn in sorted({m.group(1) for m in CALL.finditer(text)} - own):
            callee_path = defined_in.get(fn)
            if callee_path is None:
                continue  # a macro, a static inline of a header, or libc
            calls += 1
            callee = os.path.basename(callee_path)
            callee_system = callee_path.split(os.sep)[0] if os.sep in callee_path else ""
            callee_system = callee_system if callee_system in ("driver", "sim") else ""
            if system == "sim":
                if callee_system != "sim" and fn != "sa_driver_set_error":
                    problems.append(f"sim/{caller} calls {fn} ({callee_path}): the simulator "
                                    "calls nothing outside src/sim/")
                continue
            if system == "driver":
                if callee_system == "":
                    if callee not in LEAVES:
                        problems.append(f"driver/{caller} calls {fn} ({callee_path}): the driver "
                                        "calls nothing of the allocator")
                continue
            if callee_system != "" or callee in LEAVES or caller in ABOVE_ALL:
                continue  # down into the driver, a leaf, or from the top
            if caller not in rank or callee not in rank:
                missing = caller if caller not in rank else callee
                problems.append(f"{missing} is not in internal.h's layer list")
                continue
            if rank[callee] < rank[caller]:
                problems.append(f"{caller} calls {fn} of {callee}, a layer above it")
    for p in sorted(set(problems)):
        print("layers:", p)
    print(f"layers: {len(files)} files, {len(order)} layers, {calls} cross-file calls, "
          f"{len(set(problems))} calls up")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
