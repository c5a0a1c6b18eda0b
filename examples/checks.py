"""What the GPU checks of examples/ share (torch/check_hooks.py,
ecosystem/check_*.py): a check runs a function and prints one line, `ok`
(with what it returned) or `FAILED` with the exception; summary() prints
`NAME: N passed, M failed` and gives the exit status."""

results = []


def check(name, fn):
    try:
        detail = fn()
        results.append(True)
        print(f"[ok] {name}{': ' + str(detail) if detail else ''}", flush=True)
    except Exception as e:  # noqa: BLE001  (each check reports its own failure)
        results.append(False)
        print(f"[FAILED] {name}: {type(e).__name__}: {e}", flush=True)


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def summary(name):
    passed = sum(results)
    print(f"{name}: {passed} passed, {len(results) - passed} failed", flush=True)
    return 0 if passed == len(results) else 1
