#!/usr/bin/env python3
"""Compares two pytest runs of one suite, PyTorch's allocator against
streamarena's, from their JUnit XML files: counts for each, then every test
whose outcome differs. Exit status 1 where a test that passed under
PyTorch's allocator did not pass under streamarena.

    python3 examples/torch/compare_tests.py PYTORCH.xml STREAMARENA.xml [--name NAME]

The last line: `NAME: N passed, M failed` (streamarena's run, failures being
its tests that passed under PyTorch's allocator and not under it).
"""
import argparse
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    """{test id: passed|failed|error|skipped} of a JUnit XML file."""
    out = {}
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"{path}: {e}")
        return None
    for case in root.iter("testcase"):
        tid = f"{case.get('classname', '')}::{case.get('name', '')}"
        kind = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                kind = {"failure": "failed"}.get(child.tag, child.tag)
                break
        out[tid] = kind
    return out


def counts(o):
    c = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for v in o.values():
        c[v] = c.get(v, 0) + 1
    return c


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pytorch")
    p.add_argument("streamarena")
    p.add_argument("--name", default="test_cuda")
    a = p.parse_args(argv)
    ref, sa = outcomes(a.pytorch), outcomes(a.streamarena)
    if ref is None or sa is None:
        print(f"{a.name}: 0 passed, 1 failed")
        return 1
    for label, o in (("pytorch", ref), ("streamarena", sa)):
        c = counts(o)
        print(f"{label:<12} {len(o)} tests: {c['passed']} passed, {c['failed']} failed, "
              f"{c['error']} errors, {c['skipped']} skipped")
    worse, better = [], []
    for tid in sorted(set(ref) | set(sa)):
        r, s = ref.get(tid, "absent"), sa.get(tid, "absent")
        if r == s:
            continue
        (worse if r == "passed" else better).append((tid, r, s))
    for title, rows in (("passed under PyTorch's allocator, not under streamarena", worse),
                        ("other differences", better)):
        if rows:
            print(f"{title}:")
            for tid, r, s in rows:
                print(f"  {tid}: pytorch {r}, streamarena {s}")
    passed = sum(1 for t, v in sa.items() if v == "passed")
    print(f"{a.name}: {passed} passed, {len(worse)} failed")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
