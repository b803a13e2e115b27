"""The JAX peer of bench_train.c: the same MLP, batch, optimizer and device
count, data-parallel with jax.pmap over host CPU devices
(--xla_force_host_platform_device_count=N), gradients pmean'd over the axis.

    python bench/jax_peer.py --devices N --layers 64,128,10 --batch 64 --steps 200

Each step feeds a fresh host batch (numpy, split over the devices), like
bench_train.c uploads its batch each step; SGD with momentum 0.9 (PyTorch /
dpar semantics: v = mu v + g; p -= lr v). Prints one CSV row:

    train,jax,<model>,<devices>,<batch>,<step_ms>,<samples_per_s>
"""
import argparse
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--layers", default="64,128,10")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--name", default="mlp")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    a = ap.parse_args()
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=%d" % a.devices)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np
    if os.environ.get("JAX_PEER_SYNC_DISPATCH"):
        jax.config.update("jax_cpu_enable_async_dispatch", False)

    n = a.devices
    sizes = [int(x) for x in a.layers.split(",")]
    if a.batch % n:
        sys.exit("batch %d not divisible by %d devices" % (a.batch, n))
    if len(jax.devices()) < n:
        sys.exit("jax has %d devices, asked %d" % (len(jax.devices()), n))
    rng = np.random.default_rng(0)
    params = []
    for i in range(len(sizes) - 1):
        bound = np.sqrt(6.0 / sizes[i])
        params.append((rng.uniform(-bound, bound, (sizes[i], sizes[i + 1])).astype(np.float32),
                       np.zeros((sizes[i + 1],), np.float32)))
    moms = [(np.zeros_like(w), np.zeros_like(b)) for w, b in params]

    def loss_fn(ps, x, y):
        h = x
        for i, (w, b) in enumerate(ps):
            h = h @ w + b
            if i + 1 < len(ps):
                h = jax.nn.relu(h)
        logz = jax.nn.log_softmax(h)
        return -jnp.mean(jnp.take_along_axis(logz, y[:, None], axis=1))

    lr, mu = a.lr, a.momentum

    def step(ps, vs, x, y):
        loss, g = jax.value_and_grad(loss_fn)(ps, x, y)
        g = jax.lax.pmean(g, "data")
        vs = jax.tree_util.tree_map(lambda v, gg: mu * v + gg, vs, g)
        ps = jax.tree_util.tree_map(lambda p, v: p - lr * v, ps, vs)
        return ps, vs, jax.lax.pmean(loss, "data")

    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()[:n]), ("data",))
    smap = getattr(jax, "shard_map", None)
    if smap is None:
        from jax.experimental.shard_map import shard_map as smap
    pstep = jax.jit(smap(step, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")),
                         out_specs=(P(), P(), P())), donate_argnums=(0, 1))
    rep = NamedSharding(mesh, P())
    split = NamedSharding(mesh, P("data"))
    ps = jax.device_put(params, rep)
    vs = jax.device_put(moms, rep)
    nb = 8  # a few distinct host batches, cycled; each step uploads its batch
    xs = [rng.standard_normal((a.batch, sizes[0])).astype(np.float32) for _ in range(nb)]
    ys = [rng.integers(0, sizes[-1], (a.batch,)).astype(np.int32) for _ in range(nb)]

    def put(i):
        return jax.device_put(xs[i % nb], split), jax.device_put(ys[i % nb], split)

    for i in range(a.warmup):
        ps, vs, loss = pstep(ps, vs, *put(i))
    jax.block_until_ready(loss)
    best = None
    per_trial = max(1, a.steps // 3)
    for trial in range(3):  # best of 3 trials, as the C side
        t0 = time.perf_counter()
        for i in range(per_trial):
            ps, vs, loss = pstep(ps, vs, *put(i))
        jax.block_until_ready((ps, vs, loss))
        dt = (time.perf_counter() - t0) / per_trial
        best = dt if best is None or dt < best else best
    print("train,jax,%s,%d,%d,%.4f,%.1f" % (a.name, n, a.batch, best * 1e3, a.batch / best))


if __name__ == "__main__":
    main()
