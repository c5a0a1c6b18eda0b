#!/usr/bin/env python3
"""compare.py's rounds without a GPU or PyTorch: each allocator runs first,
in the middle and last once in three rounds; a result is the median step
time with the largest peaks; a failed round fails the allocator.

    compare_test.py path/to/compare.py
"""
import importlib.util
import sys


def load(path):
    spec = importlib.util.spec_from_file_location("compare", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    c = load(sys.argv[1])
    names = ["streamarena", "default", "expandable"]
    orders = [c.rotated(names, r) for r in range(3)]
    for name in names:
        positions = sorted(order.index(name) for order in orders)
        assert positions == [0, 1, 2], (name, orders)
    assert c.rotated(names, 3) == names

    def run(step, reserved, loss=2.0):
        return {"allocator": "streamarena", "step_ms": step, "peak_reserved": reserved,
                "peak_requested": 100, "final_loss": loss, "losses": [loss]}

    a = c.aggregate([run(30.0, 110), run(10.0, 130, 2.5), run(20.0, 120, 2.25)])
    assert a["step_ms"] == 20.0, a
    assert a["final_loss"] == 2.25, a  # the median round's
    assert a["peak_reserved"] == 130, a  # the largest
    assert a["step_ms_rounds"] == [30.0, 10.0, 20.0], a
    even = c.aggregate([run(4.0, 1), run(1.0, 1), run(3.0, 1), run(2.0, 1)])
    assert even["step_ms"] == 2.0, even  # the lower middle
    assert c.aggregate([run(1.0, 1), None]) is None
    assert c.aggregate([]) is None

    de, ex = run(25.0, 300), run(18.0, 125)
    de["allocator"], ex["allocator"] = "default", "expandable"
    results = {"streamarena": a, "default": de, "expandable": ex}
    text = "\n".join(c.targets(results))
    assert "[MISSED] step time: streamarena 20.0 ms, fastest PyTorch" in text, text
    assert "[met] step time: streamarena 20.0 ms, PyTorch's default allocator 25.0" in text, text
    assert "[MISSED] peak reserved: streamarena" in text, text
    assert "30.0 10.0 20.0" in c.table({"streamarena": a}), c.table({"streamarena": a})
    print("compare_test: passed")


if __name__ == "__main__":
    main()
