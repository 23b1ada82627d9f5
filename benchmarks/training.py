"""End-to-end training throughput against PyTorch CPU and JAX.

The same MLP (784-512-512-10), the same small CNN (two 3x3 conv + ReLU + 2x2 max-pool
blocks and a Linear head on 1x28x28 images), both batch 128, the same LeNet-style network
(5x5 conv with 20 then 50 channels, each + ReLU + 2x2 max-pool, Linear 800-500-10, batch 64),
and two real-width networks on 3x32x32 images, batch 32: a ResNet-18 in its CIFAR form (3x3
stem, 4 stages of 2 basic blocks, 64-512 channels, BatchNorm) and a MobileNetV2 (width 1.0,
inverted residuals with depthwise 3x3, BatchNorm, ReLU6), both defined once
(:func:`conv_nets`) over ``megbrain.nn`` and ``torch.nn``; softmax cross-entropy, SGD with
momentum 0.9, trained from the same initial weights (made by ``megbrain.nn`` and copied into
each peer) on the same batches:

* throughput: samples/s of a whole training step (forward, backward, update, loss fetched to
  the host), timed in interleaved rounds in one process, best round kept; the table gives
  ``ratio = megbrain samples/s / peer samples/s`` (targets against PyTorch, issue 32's: the MLP,
  the CNN and LeNet >= 1.5, ResNet-18 and MobileNetV2 >= 1.2);
* agreement: the first 20 losses of megbrain and PyTorch from the same weights, within float32
  tolerance (max relative difference <= 1e-4). For the two BatchNorm networks the output also
  gives PyTorch float32 against PyTorch float64 over the same steps: float32 rounding alone,
  amplified step by step by training, moves their losses by more than 1e-4 after a few steps.
  So for them each step is also taken from the same state (:func:`same_state_check`: the
  weights and momentum buffers of PyTorch float64's run at that step), which measures one
  step's error (loss within 1e-4, and the update's relative error, PyTorch float32's the
  floor) instead of the drift.

Peers that are not importable are skipped (``benchmarks/requirements-peers.txt`` lists them).
Run ``python benchmarks/training.py [--rounds N] [--steps N] [--profile]
[--models mlp,cnn,lenet,resnet18,mobilenetv2]`` (the JAX peer knows the MLP and the CNN only).
"""

from __future__ import annotations

import os

# peers' OpenMP pools (PyTorch) must not spin between calls and steal our cores
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import cProfile
import importlib.util
import platform
import pstats
import time
from collections.abc import Callable

import numpy as np

import megbrain as mgb
from megbrain import nn, optim

BATCH = 128
CONV_NETS = ("resnet18", "mobilenetv2")  # 3x32x32 inputs, BatchNorm, batch 32
BATCHES = {"mlp": BATCH, "cnn": BATCH, "lenet": 64, "resnet18": 32, "mobilenetv2": 32}
# megbrain / PyTorch samples/s
TARGETS = {"mlp": 1.5, "cnn": 1.5, "lenet": 1.5, "resnet18": 1.2, "mobilenetv2": 1.2}
LR, MOMENTUM = 0.01, 0.9
N_BATCHES = 4  # distinct batches cycled through
LOSS_STEPS = 20
LOSS_RTOL = 1e-4


# ---- models --------------------------------------------------------------------------------
#: MobileNetV2's inverted-residual stages (expansion t, channels c, blocks n, first stride s),
#: in the CIFAR form: stride 1 in the stem and in the 24-channel stage, so 32x32 ends at 4x4
MBV2_STAGES = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
               (6, 160, 3, 2), (6, 320, 1, 1))  # fmt: skip


def conv_nets(lib) -> dict[str, Callable[[], object]]:
    """The ResNet-18 (CIFAR form) and MobileNetV2 (width 1.0) builders over the module library
    ``lib``: ``megbrain.nn`` or ``torch.nn``, whose modules share names, argument orders and
    parameter names, so that both sides build the same network with the same state names."""

    def conv_bn(cin, cout, k, stride=1, groups=1, act=None):
        layers = [lib.Conv2d(cin, cout, k, stride=stride, padding=k // 2, groups=groups,
                             bias=False), lib.BatchNorm2d(cout)]  # fmt: skip
        return lib.Sequential(*layers, *([act()] if act else []))

    class BasicBlock(lib.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = conv_bn(cin, cout, 3, stride, act=lib.ReLU)
            self.conv2 = conv_bn(cout, cout, 3)
            self.shortcut = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else None
            self.relu = lib.ReLU()

        def forward(self, x):
            skip = x if self.shortcut is None else self.shortcut(x)
            return self.relu(self.conv2(self.conv1(x)) + skip)

    class InvertedResidual(lib.Module):
        def __init__(self, cin, cout, stride, t):
            super().__init__()
            hid = cin * t
            expand = [conv_bn(cin, hid, 1, act=lib.ReLU6)] if t != 1 else []
            self.conv = lib.Sequential(
                *expand, conv_bn(hid, hid, 3, stride, groups=hid, act=lib.ReLU6),
                conv_bn(hid, cout, 1),
            )  # fmt: skip
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            y = self.conv(x)
            return x + y if self.residual else y

    def resnet18():
        layers, cin = [conv_bn(3, 64, 3, act=lib.ReLU)], 64
        for i, cout in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        return lib.Sequential(*layers, lib.AvgPool2d(4), lib.Flatten(), lib.Linear(512, 10))

    def mobilenetv2():
        layers, cin = [conv_bn(3, 32, 3, act=lib.ReLU6)], 32
        for t, c, n, s in MBV2_STAGES:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [conv_bn(cin, 1280, 1, act=lib.ReLU6), lib.AvgPool2d(4), lib.Flatten(),
                   lib.Linear(1280, 10)]  # fmt: skip
        return lib.Sequential(*layers)

    return {"resnet18": resnet18, "mobilenetv2": mobilenetv2}


def mgb_model(kind: str) -> nn.Module:
    """The megbrain model, seeded: its ``state_dict`` is the initial weights of every peer."""
    nn.init.default_rng(0)
    if kind in CONV_NETS:
        return conv_nets(nn)[kind]()
    if kind == "mlp":
        return nn.Sequential(
            nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
    if kind == "lenet":
        return nn.Sequential(
            nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(20, 50, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(50 * 4 * 4, 500), nn.ReLU(), nn.Linear(500, 10),
        )  # fmt: skip
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 10),
    )  # fmt: skip


def input_shape(kind: str) -> tuple:
    b = BATCHES[kind]
    if kind in CONV_NETS:
        return (b, 3, 32, 32)
    return (b, 784) if kind == "mlp" else (b, 1, 28, 28)


def make_data(kind: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """``N_BATCHES`` (x, labels) pairs; labels come from a fixed random linear teacher so
    that the loss can go down."""
    rng = np.random.default_rng(1)
    shape = input_shape(kind)
    teacher = rng.standard_normal((int(np.prod(shape[1:])), 10)).astype(np.float32)
    out = []
    for _ in range(N_BATCHES):
        x = rng.standard_normal(shape).astype(np.float32)
        y = np.argmax(x.reshape(shape[0], -1) @ teacher, axis=1).astype(np.int64)
        out.append((x, y))
    return out


# ---- megbrain -----------------------------------------------------------------------------
def mgb_trainer(kind: str, state: dict, data) -> Callable[[int], float]:
    """``step(i)`` trains on batch ``i % N_BATCHES`` and returns the loss."""
    model = mgb_model(kind)
    model.load_state_dict(state)
    g = mgb.comp_graph()
    x = mgb.make_arg("cpu0", g, shape=input_shape(kind), name="x")
    y = mgb.make_arg("cpu0", g, shape=(BATCHES[kind], 10), name="y")
    loss = nn.functional.cross_entropy(model(x), y)
    opt = optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    func = g.compile([x, y], [mgb.copy_output(loss)] + opt.minimize(loss))
    onehot = np.eye(10, dtype=np.float32)
    batches = [(xb, onehot[yb]) for xb, yb in data]

    def step(i: int) -> float:
        xb, yb = batches[i % N_BATCHES]
        return float(func(xb, yb)[0][0])

    params = dict(model.named_parameters())
    slot = {n: opt.slots[f"{k}.momentum_buffer"] for k, n in enumerate(params)}

    def load(weights: dict, buffers: dict) -> None:
        model.load_state_dict({k: v.reshape(own[k].shape) for k, v in weights.items()})
        for n, v in buffers.items():
            slot[n].set_value(v.reshape(slot[n].shape).astype(np.float32))

    own = model.state_dict()
    step.func = func
    step.load = load
    step.params = lambda: {n: p.get_value() for n, p in params.items()}
    return step


def operator_profile(func, runs: int) -> list[str]:
    """Time every operator of ``func``'s bound program (one run = the steps in order) and
    total them by operator type (convolutions also by their algorithm, Elemwise by mode); reads the
    executor's private plan, so it may break when the executor changes."""
    try:
        plan = func._func._ensure_plan()
        steps, oprs = plan.steps[0], plan.step_oprs[0]
    except (AttributeError, IndexError, TypeError) as exc:
        return [f"operator profile unavailable: {exc!r}"]
    by_opr = [0.0] * len(steps)
    for _ in range(runs):
        for k, st in enumerate(steps):
            t0 = time.perf_counter()
            st()
            by_opr[k] += time.perf_counter() - t0
    by_type: dict[str, list] = {}
    for o, t in zip(oprs, by_opr):
        algo = getattr(o, "chosen_algorithm", None)
        if o.type_name == "Elemwise":
            algo = o.param.mode
        key = o.type_name if algo is None else f"{o.type_name} {algo}"
        e = by_type.setdefault(key, [0.0, 0])
        e[0] += t / runs
        e[1] += 1
    total = sum(by_opr) / runs
    lines = [f"operators of one step: {len(steps)}, kernel time {total * 1e3:.2f} ms"]
    for name, (t, n) in sorted(by_type.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"  {name:<48}{n:>5} oprs {t * 1e3:>9.3f} ms {100 * t / total:>6.1f} %")
    return lines


# ---- PyTorch ------------------------------------------------------------------------------
def torch_trainer(kind: str, state: dict, data, double: bool = False) -> Callable[[int], float]:
    """``step(i)`` as :func:`mgb_trainer`'s, in float64 when ``double`` (the reference that
    measures how far float32 rounding alone moves the losses)."""
    import torch

    tnn = torch.nn
    if kind in CONV_NETS:
        model = conv_nets(tnn)[kind]()
    elif kind == "mlp":
        model = tnn.Sequential(
            tnn.Linear(784, 512), tnn.ReLU(), tnn.Linear(512, 512), tnn.ReLU(),
            tnn.Linear(512, 10),
        )  # fmt: skip
    elif kind == "lenet":
        model = tnn.Sequential(
            tnn.Conv2d(1, 20, 5), tnn.ReLU(), tnn.MaxPool2d(2),
            tnn.Conv2d(20, 50, 5), tnn.ReLU(), tnn.MaxPool2d(2),
            tnn.Flatten(), tnn.Linear(50 * 4 * 4, 500), tnn.ReLU(), tnn.Linear(500, 10),
        )  # fmt: skip
    else:
        model = tnn.Sequential(
            tnn.Conv2d(1, 16, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2),
            tnn.Conv2d(16, 32, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2),
            tnn.Flatten(), tnn.Linear(32 * 7 * 7, 10),
        )  # fmt: skip
    own = model.state_dict()
    # BatchNorm's num_batches_tracked (unused with a fixed momentum) keeps its own value
    model.load_state_dict(
        {
            **own,
            **{
                k: torch.from_numpy(np.ascontiguousarray(v).reshape(own[k].shape))
                for k, v in state.items()
            },
        }
    )
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    batches = [(torch.from_numpy(xb), torch.from_numpy(yb)) for xb, yb in data]
    if double:
        model.double()
        batches = [(xb.double(), yb) for xb, yb in batches]
    ce = tnn.functional.cross_entropy

    def step(i: int) -> float:
        xb, yb = batches[i % N_BATCHES]
        opt.zero_grad(set_to_none=True)
        loss = ce(model(xb), yb)
        loss.backward()
        opt.step()
        return loss.item()

    params = dict(model.named_parameters())

    def load(weights: dict, buffers: dict) -> None:
        own = model.state_dict()
        with torch.no_grad():
            for k, v in weights.items():
                own[k].copy_(torch.from_numpy(np.ascontiguousarray(v).reshape(own[k].shape)))
        for n, v in buffers.items():
            # a zero buffer steps exactly as PyTorch's first step (buffer = gradient)
            opt.state[params[n]]["momentum_buffer"] = torch.from_numpy(
                np.ascontiguousarray(v).reshape(params[n].shape)
            ).to(params[n].dtype)

    def snapshot() -> tuple[dict, dict]:
        """The model's state and the momentum buffers (zeros before the first step)."""
        weights = {
            k: v.detach().numpy().copy()
            for k, v in model.state_dict().items()
            if not k.endswith("num_batches_tracked")
        }
        bufs = {}
        for n, p in params.items():
            b = opt.state.get(p, {}).get("momentum_buffer")
            bufs[n] = np.zeros(p.shape) if b is None else b.detach().numpy().copy()
        return weights, bufs

    step.load, step.snapshot = load, snapshot
    step.params = lambda: {n: p.detach().numpy().copy() for n, p in params.items()}
    return step


# ---- JAX ----------------------------------------------------------------------------------
def jax_trainer(kind: str, state: dict, data) -> Callable[[int], float]:
    import jax
    import jax.numpy as jnp

    names = list(state)
    params = [jnp.asarray(state[k]) for k in names]

    def forward(ps, x):
        p = dict(zip(names, ps))
        if kind == "mlp":
            h = jax.nn.relu(x @ p["0.weight"].T + p["0.bias"])
            h = jax.nn.relu(h @ p["2.weight"].T + p["2.bias"])
            return h @ p["4.weight"].T + p["4.bias"]
        h = x
        for i in (0, 3):
            h = jax.lax.conv_general_dilated(
                h, p[f"{i}.weight"], (1, 1), ((1, 1), (1, 1)),
                dimension_numbers=("NCHW", "OIHW", "NCHW"),
            ) + p[f"{i}.bias"]  # fmt: skip
            h = jax.nn.relu(h)
            h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        h = h.reshape(h.shape[0], -1)
        return h @ p["7.weight"].T + p["7.bias"]

    def loss_fn(ps, x, y):
        logp = jax.nn.log_softmax(forward(ps, x), axis=1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    @jax.jit
    def train_step(ps, bufs, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(ps, x, y)
        bufs = [MOMENTUM * b + g for b, g in zip(bufs, grads)]
        ps = [p - LR * b for p, b in zip(ps, bufs)]
        return ps, bufs, loss

    batches = [(jnp.asarray(xb), jnp.asarray(yb.astype(np.int32))) for xb, yb in data]
    st = {"ps": params, "bufs": [jnp.zeros_like(p) for p in params]}

    def step(i: int) -> float:
        xb, yb = batches[i % N_BATCHES]
        st["ps"], st["bufs"], loss = train_step(st["ps"], st["bufs"], xb, yb)
        return float(loss)

    return step


PEERS = {"pytorch": ("torch", torch_trainer), "jax": ("jax", jax_trainer)}


# ---- measuring ----------------------------------------------------------------------------
SETTLE_S = 0.3


def max_rel(a: np.ndarray, b: np.ndarray) -> float:
    """The largest ``|a - b| / |b|`` (``|b|`` at least 1e-6)."""
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-6)))


def first_losses(step: Callable[[int], float]) -> np.ndarray:
    """The losses of a fresh trainer's first :data:`LOSS_STEPS` steps."""
    return np.array([step(i) for i in range(LOSS_STEPS)])


def torch_other_threads_curve(kind: str, state: dict, data) -> np.ndarray:
    """PyTorch float32's first losses at one thread (two if it runs on one): its curve at the
    benchmark's thread count differs from this only by the order of its float32 sums, the
    floor under any two float32 implementations' free-running curves."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2 if threads == 1 else 1)
    try:
        return first_losses(torch_trainer(kind, state, data))
    finally:
        torch.set_num_threads(threads)


def same_state_check(kind: str, state: dict, data) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each step from the same state: before step ``i`` megbrain and PyTorch float32 load the
    weights and momentum buffers of PyTorch float64's run at step ``i``, then take one step.

    Returns per trainer the relative difference of each step's loss from float64's and the
    relative error of each step's update (``|w'_x - w'_64| / |w'_64 - w_64|`` over all
    parameters). Unlike free-running trajectories, which a deep BatchNorm network drives apart
    from float32 rounding alone, these measure one step's error: conventions (BatchNorm,
    initialisation, the optimizer's form) that differed would show here.
    """
    ref = torch_trainer(kind, state, data, double=True)
    steps = {
        "megbrain": mgb_trainer(kind, state, data),
        "pytorch": torch_trainer(kind, state, data),
    }
    out = {k: ([], []) for k in steps}
    for i in range(LOSS_STEPS):
        weights, bufs = ref.snapshot()
        loss_ref = ref(i)
        after = ref.params()
        step_norm = np.sqrt(sum(np.sum((after[n] - weights[n]) ** 2) for n in after))
        for name, s in steps.items():
            s.load(weights, bufs)
            loss = s(i)
            got = s.params()
            err = np.sqrt(sum(np.sum((got[n].reshape(v.shape) - v) ** 2) for n, v in after.items()))
            out[name][0].append(abs(loss - loss_ref) / abs(loss_ref))
            out[name][1].append(err / step_norm)
    return {k: (np.array(a), np.array(b)) for k, (a, b) in out.items()}


def throughput(
    steps: dict[str, Callable[[int], float]], n: int, rounds: int, batch: int = BATCH
) -> dict:
    """Best samples/s of each trainer over ``rounds`` interleaved rounds of ``n`` steps.

    Each round starts after a pause of ``SETTLE_S``: thread pools that spin after their work
    (OpenBLAS's, OpenMP's, XLA's) go idle first, so no framework runs against the previous
    one's spinning threads.
    """
    for s in steps.values():
        for i in range(3):  # warm up: plans, jit, allocator caches
            s(i)
    best = dict.fromkeys(steps, 0.0)
    for _ in range(rounds):
        for k, s in steps.items():
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            for i in range(n):
                s(i)
            best[k] = max(best[k], n * batch / (time.perf_counter() - t0))
    return best


def environment() -> list[str]:
    lines = [
        f"python {platform.python_version()}, numpy {np.__version__}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}"
    ]
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        val = os.environ.get(var)
        lines.append(f"{var}: {'set to ' + repr(val) if val is not None else 'not set'}")
    try:
        from threadpoolctl import threadpool_info

        for info in threadpool_info():
            lines.append(
                f"threadpoolctl: {info.get('internal_api')} {info.get('version')} "
                f"threads={info.get('num_threads')} arch={info.get('architecture')} "
                f"({os.path.basename(info.get('filepath', ''))})"
            )
    except ImportError:
        lines.append("threadpoolctl: not installed")
    return lines


def available_peers(wanted: list[str]) -> dict:
    out = {}
    for name, (module, fn) in PEERS.items():
        if name not in wanted:
            continue
        if importlib.util.find_spec(module) is None:
            print(f"{name}: not installed, skipped")
            continue
        out[name] = fn
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models",
        default="mlp,cnn,lenet,resnet18,mobilenetv2",
        help="comma-separated: mlp, cnn, lenet, resnet18, mobilenetv2",
    )
    ap.add_argument("--steps", type=int, default=20, help="training steps per timed round")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (best of)")
    ap.add_argument("--peers", default="pytorch,jax", help="comma-separated: pytorch, jax")
    ap.add_argument("--profile", action="store_true", help="cProfile megbrain's steps")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="limit every framework's kernels to N threads (NumPy's BLAS through "
        "threadpoolctl, torch.set_num_threads, XLA flags); 0 keeps their defaults",
    )
    args = ap.parse_args()

    if args.threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)
        if args.threads == 1:
            os.environ["XLA_FLAGS"] = (
                os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
            ).strip()
    peers = available_peers(args.peers.split(","))
    if "pytorch" in peers:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        versions = f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
    else:
        versions = "torch -"
    if "jax" in peers:
        import jax

        versions += f", jax {jax.__version__}"
    for line in environment() + [versions]:
        print(line)
    print()

    rows, agree = [], []
    for kind in args.models.split(","):
        if kind != "mlp" and not hasattr(mgb.opr, "convolution"):
            print(f"{kind}: mgb.opr.convolution is not available, skipped")
            continue
        state = mgb_model(kind).state_dict()
        data = make_data(kind)
        makers = {"megbrain": mgb_trainer, **peers}
        if kind not in ("mlp", "cnn"):
            makers.pop("jax", None)
        # loss curves first, each from a fresh trainer
        curves = {}
        for name in ("megbrain", "pytorch"):
            if name in makers:
                curves[name] = first_losses(makers[name](kind, state, data))
        if "pytorch" in curves:
            a, b = curves["megbrain"], curves["pytorch"]
            floor = same = None
            if kind in CONV_NETS:
                floor = (max_rel(b, first_losses(torch_trainer(kind, state, data, double=True))),
                         max_rel(b, torch_other_threads_curve(kind, state, data)))  # fmt: skip
                same = same_state_check(kind, state, data)
            agree.append((kind, a, b, max_rel(a, b), floor, same))
        steps = {name: make(kind, state, data) for name, make in makers.items()}
        sps = throughput(steps, args.steps, args.rounds, BATCHES[kind])
        for name, v in sps.items():
            rows.append((kind, name, v, sps["megbrain"] / v))
        if args.profile:
            s = steps["megbrain"]
            pr = cProfile.Profile()
            pr.enable()
            for i in range(args.steps * 2):
                s(i)
            pr.disable()
            print(f"cProfile: megbrain {kind}, {args.steps * 2} steps (by tottime)")
            pstats.Stats(pr).sort_stats("tottime").print_stats(12)
            batch = BATCHES[kind]
            t_step = batch / throughput({"m": s}, args.steps * 2, 1, batch)["m"]
            print(f"whole step (call, inputs, run, loss out): {t_step * 1e3:.2f} ms")
            print("\n".join(operator_profile(s.func, args.steps)) + "\n")

    print(f"{'model':<12}{'framework':<12}{'samples/s':>12}{'megbrain / peer':>18}")
    print("-" * 54)
    for kind, name, v, ratio in rows:
        note = ""
        if name == "pytorch":
            t = TARGETS[kind]
            note = f"   target >= {t}  [{'OK' if ratio >= t else 'MISS'}]"
        print(f"{kind:<12}{name:<12}{v:>12.0f}{ratio:>18.2f}{note}")
    for kind, a, b, rel, floor, same in agree:
        print(
            f"\n{kind}: first {LOSS_STEPS} losses, megbrain vs pytorch: max relative difference "
            f"{rel:.2e}  [{'OK' if rel <= LOSS_RTOL else 'MISS'}] (tolerance {LOSS_RTOL:g})"
        )
        if floor is not None:
            print(
                f"  float32 rounding alone (a deep BatchNorm network amplifies it step by step):"
                f" pytorch float32 vs pytorch float64, max relative difference {floor[0]:.2e}; "
                f"pytorch float32 vs itself at another thread count {floor[1]:.2e}"
            )
        print("  step  megbrain    pytorch")
        for i in (0, 1, 2, 5, 10, LOSS_STEPS - 1):
            print(f"  {i:>4}  {a[i]:.6f}  {b[i]:.6f}")
        if same is not None:
            worst = max(float(np.max(v[0])) for v in same.values())
            print(
                f"  each step from PyTorch float64's state (weights, momentum buffers): loss "
                f"against float64's, max relative {worst:.2e} "
                f"[{'OK' if worst <= LOSS_RTOL else 'MISS'}] (tolerance {LOSS_RTOL:g}); the "
                f"update's relative error beside PyTorch float32's (its floor)"
            )
            print("  step  loss: megbrain  pytorch32   update: megbrain  pytorch32")
            m, p = same["megbrain"], same["pytorch"]
            for i in range(LOSS_STEPS):
                print(
                    f"  {i:>4}  {m[0][i]:>14.1e} {p[0][i]:>10.1e}  {m[1][i]:>16.1e} "
                    f"{p[1][i]:>10.1e}"
                )


if __name__ == "__main__":
    main()
