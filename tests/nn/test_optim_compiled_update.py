"""SGD with momentum on float32 parameters large enough for AddUpdate's compiled pass: the
same float32 values as the unfused NumPy passes, step after step, with lr changed between
runs."""

import numpy as np

import megbrain as mgb
from megbrain import nn, optim
from megbrain.kernels import elemwise as ew


def test_sgd_momentum_compiled_update_is_exact(monkeypatch):
    bound = []
    real = ew.compiled_scaled_update

    def spy(dest, delta):
        fn = real(dest, delta)
        bound.append(fn is not None)
        return fn

    monkeypatch.setattr(ew, "compiled_scaled_update", spy)
    rng = np.random.default_rng(3)
    shape = (64, 100)  # 6400 elements >= COMPILED_UPDATE_MIN_SIZE
    p0 = rng.standard_normal(shape).astype(np.float32)
    c = rng.standard_normal(shape).astype(np.float32)
    p = nn.Parameter(p0)
    g = mgb.comp_graph()
    loss = (p.symvar(g) * c).sum()  # gradient c
    opt = optim.SGD([p], lr=0.05, momentum=0.9)
    func = g.compile(None, [mgb.copy_output(loss)] + opt.minimize(loss))
    want_p, buf = p0.copy(), np.zeros(shape, np.float32)
    for step, lr in enumerate([0.05, 0.05, 0.01]):
        opt.lr = lr  # a SharedScalar: no recompile
        func()
        buf = np.float32(0.9) * buf + c
        want_p = want_p + np.float32(-lr) * buf
        assert np.array_equal(p.get_value(), want_p), step
    assert bound and all(bound)
