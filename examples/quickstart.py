"""Build a graph, compile it into a function, run it: megbrain's basic workflow."""

import numpy as np

import megbrain as mgb


def main() -> None:
    cn = mgb.comp_node("cpu0")
    graph = mgb.comp_graph()

    # a runtime input and a parameter shared with Python
    x = mgb.make_arg(cn, graph, dtype=np.float32, shape=(4, 3), name="x")
    w = mgb.make_shared(cn, value=np.full((3, 2), 0.5, np.float32), comp_graph=graph, name="w")
    y = mgb.opr.elem.relu(x @ w - 1)
    total = y.sum()

    func = graph.compile([x], [mgb.copy_output(y), mgb.copy_output(total)])
    xv = np.arange(12, dtype=np.float32).reshape(4, 3)
    yv, tv = func(xv)
    print("y =\n", yv)
    print("sum =", tv)
    assert np.allclose(yv, np.maximum(xv @ np.full((3, 2), 0.5) - 1, 0))

    # updating the shared value changes the next run, without recompiling
    w.set_value(np.ones((3, 2), np.float32))
    print("sum after w := 1:", func(xv)[1])


if __name__ == "__main__":
    main()
