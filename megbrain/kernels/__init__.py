"""The "megdnn" layer: pure compute kernels writing into given output arrays.

Each module binds a kernel once (``bind``, ``bind_reduce``, ``bind_matmul``...) to its input and
output arrays and returns a zero-argument callable for the executor's hot path; nothing here
knows about graphs, vars or operators.
"""

from .numba_names import randomize_function_ids

# before any kernel compiles (every compiled function of megbrain lives in this package)
randomize_function_ids()
