"""The JAX peer of examples/train_cnn.c: the seed material's CNN in flax,
trained data-parallel with optax.adamw under shard_map over N host CPU
devices (--xla_force_host_platform_device_count=N), gradients pmean'd over
the axis "data".

    python bench/peers/cnn_jax.py [--devices 4] [--epochs 10] [--batch 64] [--seed 42]

Conv(32,3x3,SAME)-ReLU-avg_pool2x2-Conv(64,3x3,SAME)-ReLU-avg_pool2x2-flatten-
Dense(256)-ReLU-Dense(10), softmax cross-entropy, AdamW lr 1e-3 wd 1e-4
(optax: decay multiplied by lr), 824,458 parameters; the data, split, batch
order and initial weights of cnn_common.py (the same as train_cnn.c's).
XLA:CPU aborts in its all-reduce rendezvous when many steps of a 4-device
program are queued on 2 cores, so at most 2 steps are kept in flight (the
loss of step i-2 is waited for before step i is dispatched).
Prints one line per epoch and closes with
    final: peer=jax devices=N model=cnn data=mnist epochs=E test_accuracy=... train_loss=...
           step_ms=... samples_per_s=...
(step time: the median epoch of epochs 2..E, divided by its steps).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=1e-4)
    a = ap.parse_args()
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=%d" % a.devices)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np
    import flax.linen as nn
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import cnn_common

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(32, (3, 3), padding="SAME", name="conv1")(x))
            x = nn.avg_pool(x, (2, 2), strides=(2, 2))
            x = nn.relu(nn.Conv(64, (3, 3), padding="SAME", name="conv2")(x))
            x = nn.avg_pool(x, (2, 2), strides=(2, 2))
            x = x.reshape((x.shape[0], -1))  # NHWC flatten: [b, 7 * 7 * 64]
            x = nn.relu(nn.Dense(256, name="dense1")(x))
            return nn.Dense(10, name="dense2")(x)

    n = a.devices
    if a.batch % n:
        sys.exit("batch %d not divisible by %d devices" % (a.batch, n))
    rng, x, y, train_idx, test_idx, init = cnn_common.prepare(a.seed)
    model = CNN()
    params = {"params": {k: {"kernel": w, "bias": b} for k, (w, b) in init.items()}}
    shapes = jax.tree_util.tree_map(jnp.shape, model.init(jax.random.PRNGKey(0), x[:1]))
    assert shapes == jax.tree_util.tree_map(jnp.shape, params), "flax parameter shapes differ from cnn_common's"
    nparam = sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params))
    tx = optax.adamw(a.lr, weight_decay=a.wd)

    def loss_fn(ps, xb, yb):
        logits = model.apply(ps, xb)
        return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

    def step(ps, st, xb, yb):
        loss, g = jax.value_and_grad(loss_fn)(ps, xb, yb)
        g = jax.lax.pmean(g, "data")  # mean of per-device means over equal shards
        upd, st = tx.update(g, st, ps)
        return optax.apply_updates(ps, upd), st, jax.lax.pmean(loss, "data")

    mesh = Mesh(np.array(jax.devices()[:n]), ("data",))
    smap = getattr(jax, "shard_map", None)
    if smap is None:
        from jax.experimental.shard_map import shard_map as smap
    pstep = jax.jit(smap(step, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")),
                         out_specs=(P(), P(), P())), donate_argnums=(0, 1))
    predict = jax.jit(lambda ps, xb: jnp.argmax(model.apply(ps, xb), -1))
    rep, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    ps = jax.device_put(params, rep)
    st = jax.device_put(tx.init(params), rep)
    xt, yt = x[test_idx], y[test_idx]
    steps = len(train_idx) // a.batch
    print("jax %s, %d device(s), %d parameters, %d steps of %d per epoch" %
          (jax.__version__, n, nparam, steps, a.batch), flush=True)
    times, loss_mean, acc = [], 0.0, 0.0
    for e in range(1, a.epochs + 1):
        cnn_common.epoch_order(rng, train_idx)
        t0 = time.perf_counter()
        losses = []
        for s in range(steps):
            rows = train_idx[s * a.batch:(s + 1) * a.batch]
            if len(losses) >= 2:
                losses[-2].block_until_ready()  # at most 2 steps in flight
            ps, st, loss = pstep(ps, st, jax.device_put(x[rows], split), jax.device_put(y[rows], split))
            losses.append(loss)
        loss_mean = float(np.mean([float(v) for v in losses]))
        dt = time.perf_counter() - t0
        times.append(dt)
        acc = float(np.mean(np.asarray(predict(ps, xt)) == yt))
        print("epoch %3d  loss %.8f  test_accuracy %.4f  samples/s %.0f" % (e, loss_mean, acc, steps * a.batch / dt),
              flush=True)
    med = statistics.median(times[1:] if len(times) > 1 else times) / steps
    print("final: peer=jax devices=%d model=cnn data=mnist epochs=%d test_accuracy=%.4f train_loss=%.8f "
          "step_ms=%.3f samples_per_s=%.0f" % (n, a.epochs, acc, loss_mean, med * 1e3, a.batch / med))


if __name__ == "__main__":
    main()
