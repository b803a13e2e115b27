"""The JAX peer of examples/train_gpt.c: the same character-level GPT in flax,
trained with optax on one host CPU device.

    python bench/peers/gpt_jax.py [--steps 1000] [--seed 42] [--log-every 50] [--eval-every 250]
                                  [--val-batches 20] [--batch 32] [--lr 3e-3]

Pre-LN blocks, learned positions, causal attention (4 heads of 32), GELU
(tanh) MLP 4x, untied head; 4 layers, 128 wide, context 64: 818,241
parameters (checked: exit status 1 otherwise). optax: clip_by_global_norm(1.0)
then adamw(b1 0.9, b2 0.99, eps 1e-8, weight decay 0.1 on the matrices)
under warmup_cosine_decay_schedule(0 -> lr in 100 steps -> lr/10 at the
last step). Data, initial weights, batches and validation windows of
gpt_common.py (train_gpt.c's). At most 2 steps in flight. Prints train_gpt.c's
progress lines and closes with
    final: peer=jax devices=1 model=gpt steps=N train_loss=... val_loss=... step_ms=...
(step_ms: the median over the logging blocks after the first, which holds the compilation).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    import gpt_common as gc

    a = gc.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np
    import flax.linen as nn
    import optax

    C, H, T = gc.N_EMBD, gc.N_HEAD, gc.CTX

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):  # x [b, T, C]
            b = x.shape[0]
            h = nn.LayerNorm(epsilon=1e-5, name="ln1")(x)
            q, k, v = (nn.Dense(C, name=n)(h).reshape(b, T, H, C // H) for n in ("q", "k", "v"))
            att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(C // H)
            att = jnp.where(jnp.tril(jnp.ones((T, T), bool)), att, -jnp.inf)
            y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(att, -1), v).reshape(b, T, C)
            x = x + nn.Dense(C, name="proj")(y)
            h = nn.LayerNorm(epsilon=1e-5, name="ln2")(x)
            return x + nn.Dense(C, name="fc2")(nn.gelu(nn.Dense(4 * C, name="fc1")(h), approximate=True))

    class GPT(nn.Module):
        vocab: int

        @nn.compact
        def __call__(self, idx):  # idx [b, T] int32 -> logits [b, T, V]
            x = nn.Embed(self.vocab, C, name="wte")(idx) + self.param("wpe", nn.initializers.zeros, (T, C))
            for layer in range(gc.N_LAYER):
                x = Block(name="h%d" % layer)(x)
            return nn.Dense(self.vocab, name="head")(nn.LayerNorm(epsilon=1e-5, name="ln_f")(x))

    rng, data, init = gc.prepare(a.seed)
    vocab = len(data[1])
    model = GPT(vocab)
    leaf = {"w": "kernel", "b": "bias"}
    params = {}
    for name, w in init:  # "h0.q.w" -> params["h0"]["q"]["kernel"]; norms' "w" -> "scale"
        parts = name.split(".")
        if name == "wte":
            params["wte"] = {"embedding": w}
        elif name == "wpe":
            params["wpe"] = w
        else:
            node = params
            for p in parts[:-2]:
                node = node.setdefault(p, {})
            key = "scale" if parts[-2].startswith("ln") and parts[-1] == "w" else leaf[parts[-1]]
            node.setdefault(parts[-2], {})[key] = w
    params = {"params": params}
    shapes = jax.tree_util.tree_map(jnp.shape, model.init(jax.random.PRNGKey(0), np.zeros((1, T), np.int32)))
    assert shapes == jax.tree_util.tree_map(jnp.shape, params), "flax parameter shapes differ from gpt_common's"
    nparam = sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params))
    if nparam != gc.NPARAM:
        sys.exit("gpt_jax: %d parameters, train_gpt.c has %d; the models differ" % (nparam, gc.NPARAM))
    sched = optax.warmup_cosine_decay_schedule(0.0, a.lr, 100, max(a.steps, 101), a.lr / 10)
    mask = jax.tree_util.tree_map(lambda p: p.ndim == 2, params)
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(sched, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.1, mask=mask))

    def loss_fn(ps, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(ps, x), y).mean()

    def step(ps, st, x, y):
        loss, g = jax.value_and_grad(loss_fn)(ps, x, y)
        upd, st = tx.update(g, st, ps)
        return optax.apply_updates(ps, upd), st, loss

    jstep = jax.jit(step, donate_argnums=(0, 1))
    jloss = jax.jit(loss_fn)
    state = [jax.device_put(params), jax.device_put(tx.init(params))]  # (parameters, optimizer state)
    print("jax %s, 1 device: GPT %d layers, %d heads, %d embd, context %d: %d parameters; batch %d, %d steps" %
          (jax.__version__, gc.N_LAYER, H, C, T, nparam, a.batch, a.steps), flush=True)

    def train_step(x, y, lr):  # lr: the schedule's, inside tx
        state[0], state[1], loss = jstep(state[0], state[1], x, y)
        return loss

    def val_loss():
        return float(np.mean([float(jloss(state[0], *gc.val_batch(data, k, a.val_batches, a.batch)))
                              for k in range(a.val_batches)]))

    gc.train(a, rng, data, train_step, val_loss, "jax", wait=lambda loss: loss.block_until_ready())


if __name__ == "__main__":
    main()
