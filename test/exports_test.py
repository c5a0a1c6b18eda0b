#!/usr/bin/env python3
"""Every function the public headers declare is exported by each shared
library that says it carries the public API (the PyTorch plugin, the Python
hooks' library): a program that loads one of them and calls any sa_ function
must find it. A static library links only the objects something refers to,
so a file of entry points nothing inside calls (src/pool.c) fell out of both.

    exports_test.py HEADER... -- LIBRARY...
"""
import re
import subprocess
import sys

DECLARATION = re.compile(r"^[A-Za-z_][\w \t\*]*?\b(sa_\w+)\s*\(", re.M)


def declared(paths):
    names = set()
    for path in paths:
        text = open(path).read()
        text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)  # comments
        for m in DECLARATION.finditer(text):
            line = text[m.start():text.index("\n", m.start())]
            if line.lstrip().startswith(("typedef", "#", "return")) or "static inline" in line:
                continue
            names.add(m.group(1))
    return names


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                         capture_output=True, text=True).stdout
    return {f[2] for f in (l.split() for l in out.splitlines()) if len(f) == 3 and f[1] == "T"}


def main():
    sep = sys.argv.index("--")
    headers, libs = sys.argv[1:sep], sys.argv[sep + 1:]
    want = declared(headers)
    assert len(want) > 20 and "sa_alloc" in want and "sa_pool_create" in want, sorted(want)
    failed = False
    for lib in libs:
        missing = sorted(want - exported(lib))
        if missing:
            failed = True
            print(f"{lib}: {len(missing)} declared functions not exported: {' '.join(missing)}")
        else:
            print(f"{lib}: all {len(want)} declared functions exported")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
