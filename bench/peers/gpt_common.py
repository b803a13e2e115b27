"""What the GPT peers share with examples/train_gpt.c: the text, its split,
the initial weights, the batches and the learning-rate schedule, drawn from
the same splitmix64 stream in the same order, so dpar, JAX and PyTorch start
from identical weights and see identical batches.

    text -> tokens (the sorted distinct bytes: 65 for tiny Shakespeare),
            first 90% train, the rest validation
    seed -> weights in train_gpt.c's table order (wte [V, C], wpe [T, C], per
            block ln1, q, k, v, proj, ln2, fc1, fc2, then ln_f, head; matrices
            [in, out]), each normal(0, 0.02) by Box-Muller on two 53-bit
            uniforms (proj and fc2: 0.02 / sqrt(2 n_layer)); biases zero,
            norm gains one
         -> every step: 32 random windows of the training split
    validation: 20 batches of windows evenly spaced over the validation split.

n_layer 4, n_head 4, n_embd 128, context 64: 818,241 parameters.
"""
import argparse
import gzip
import math
import os
import time

import numpy as np

from cnn_common import SplitMix64

N_LAYER, N_HEAD, N_EMBD, CTX = 4, 4, 128, 64
NPARAM = 818241  # train_gpt.c's count; every peer checks its own against it
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "examples", "data", "tinyshakespeare.txt.gz")
BLOCK = ["ln1.w", "ln1.b", "q.w", "q.b", "k.w", "k.b", "v.w", "v.b",
         "proj.w", "proj.b", "ln2.w", "ln2.b", "fc1.w", "fc1.b", "fc2.w", "fc2.b"]


def load(path=DATA):
    """(tokens uint8 [n], chars: the vocabulary as a str, ntrain)."""
    with gzip.open(path, "rb") as f:
        raw = np.frombuffer(f.read(), dtype=np.uint8)
    chars = np.unique(raw)
    lut = np.zeros(256, np.uint8)
    lut[chars] = np.arange(len(chars), dtype=np.uint8)
    return lut[raw], bytes(chars.tolist()).decode("latin-1"), len(raw) * 9 // 10


def table(vocab):
    """[(name, shape, std)] in train_gpt.c's order; std 0: zeros, -1: ones."""
    s = np.float32(0.02)
    sp = np.float32(s / np.sqrt(np.float32(2.0 * N_LAYER)))  # float arithmetic, as the C
    C, F = N_EMBD, 4 * N_EMBD
    t = [("wte", (vocab, C), s), ("wpe", (CTX, C), s)]
    kinds = {"ln1.w": ((C,), -1), "ln1.b": ((C,), 0), "q.w": ((C, C), s), "q.b": ((C,), 0), "k.w": ((C, C), s),
             "k.b": ((C,), 0), "v.w": ((C, C), s), "v.b": ((C,), 0), "proj.w": ((C, C), sp), "proj.b": ((C,), 0),
             "ln2.w": ((C,), -1), "ln2.b": ((C,), 0), "fc1.w": ((C, F), s), "fc1.b": ((F,), 0),
             "fc2.w": ((F, C), sp), "fc2.b": ((C,), 0)}
    for layer in range(N_LAYER):
        t += [("h%d.%s" % (layer, k), kinds[k][0], kinds[k][1]) for k in BLOCK]
    return t + [("ln_f.w", (C,), -1), ("ln_f.b", (C,), 0), ("head.w", (C, vocab), s), ("head.b", (vocab,), 0)]


def normal(rng, n):
    """n standard normals as train_gpt.c's rng_normal: u1, u2 from consecutive draws, float64."""
    z = rng.next_block(2 * n) >> np.uint64(11)
    u1 = (z[0::2].astype(np.float64) + 1.0) * 2.0 ** -53
    u2 = z[1::2].astype(np.float64) * 2.0 ** -53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u2)


def prepare(seed=42):
    """(rng, data, params): data = (tokens, chars, ntrain); params an ordered list of (name, float32 array)."""
    tok, chars, ntrain = load()
    rng = SplitMix64(seed)
    params = []
    for name, shape, std in table(len(chars)):
        n = int(np.prod(shape))
        if std > 0:
            w = (np.float64(std) * normal(rng, n)).astype(np.float32)
        else:
            w = np.full(n, -std, np.float32)
        params.append((name, w.reshape(shape)))
    return rng, (tok, chars, ntrain), params


def rows(tok, starts):
    """x, y int32 [len(starts), CTX]: the windows at starts and the next tokens."""
    i = np.asarray(starts, np.int64)[:, None] + np.arange(CTX)[None, :]
    return tok[i].astype(np.int32), tok[i + 1].astype(np.int32)


def train_batch(rng, data, batch=32):
    """The next training batch from the seeded stream (train_gpt.c's train_batch)."""
    tok, _, ntrain = data
    return rows(tok, rng.next_block(batch) % np.uint64(ntrain - CTX - 1))


def val_batch(data, k, nb=20, batch=32):
    """Validation batch k of nb (train_gpt.c's val_batch; the same for every seed)."""
    tok, _, ntrain = data
    span, total = len(tok) - ntrain - CTX - 1, nb * batch
    return rows(tok, [ntrain + span * (k * batch + r) // total for r in range(batch)])


def lr_at(step, steps, lr=3e-3):
    """train_gpt.c's schedule (dpar_lr_at, optax.warmup_cosine_decay_schedule): 0 rising linearly
    to lr over 100 steps, then cosine to lr / 10 at the last step."""
    warm, decay = 100, max(steps, 101)
    if step < warm:
        return lr * step / warm
    x = min(step - warm, decay - warm)
    return lr / 10 + (lr - lr / 10) * 0.5 * (1.0 + math.cos(math.pi * x / (decay - warm)))


class Log:
    """The progress lines of train_gpt.c: train loss (mean since the last line) and ms/step every
    log_every steps; the median ms/step of the blocks after the first (compilation) for the final line."""

    def __init__(self, log_every, now):
        self.every, self.t, self.sum, self.k, self.ms = log_every, now, 0.0, 0, []
        self.train_loss = float("nan")

    def step(self, done, loss, lr, now, last):
        self.sum, self.k = self.sum + loss, self.k + 1
        if done % self.every == 0 or last:
            ms = 1e3 * (now - self.t) / self.k
            self.train_loss = self.sum / self.k
            print("step %5d  train_loss %.8f  lr %.3e  ms/step %.0f" % (done, self.train_loss, lr, ms), flush=True)
            if done > self.every:
                self.ms.append(ms)
            self.sum, self.k, self.t = 0.0, 0, now
            return True
        return False

    def reset(self, now):
        """After an evaluation: the next block's clock starts now (as train_gpt.c)."""
        self.t = now

    def step_ms(self):
        v = sorted(self.ms)
        return v[len(v) // 2] if v else float("nan")


def parse_args(extra=()):
    """The flags of train_gpt.c every peer takes (--steps --seed --log-every --eval-every --val-batches
    --batch --lr), plus extra: (flag, type, default) triples."""
    ap = argparse.ArgumentParser()
    for flag, default in (("--steps", 1000), ("--seed", 42), ("--log-every", 50), ("--eval-every", 250),
                          ("--val-batches", 20), ("--batch", 32)):
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--lr", type=float, default=3e-3)
    for flag, kind, default in extra:
        ap.add_argument(flag, type=kind, default=default)
    return ap.parse_args()


def train(a, rng, data, step, val_loss, peer, wait=None):
    """train_gpt.c's loop, for every peer: a.steps steps of step(x, y, lr) -> the loss, a float or (with
    wait) a handle that float() reads: then at most 2 steps are in flight (wait(handle) blocks on the older
    one) and a logging block's losses are read at its end, so its time covers all its steps. Progress lines
    every a.log_every steps, val_loss() every a.eval_every and at the end, then the final line."""
    log, pending, vl = Log(a.log_every, time.perf_counter()), [], float("nan")
    for s in range(a.steps):
        x, y = train_batch(rng, data, a.batch)
        lr = lr_at(s, a.steps, a.lr)
        if wait is not None and len(pending) >= 2:
            wait(pending[-2])
        pending.append(step(x, y, lr))
        done, last = s + 1, s + 1 == a.steps
        if done % a.log_every == 0 or last:
            losses = [float(v) for v in pending[:-1]]
            lv = float(pending[-1])  # waits for the block's last step
            now = time.perf_counter()
            for v in losses:
                log.sum, log.k = log.sum + v, log.k + 1
            log.step(done, lv, lr, now, last)
            pending = []
        if (a.eval_every and done % a.eval_every == 0) or last:
            vl = val_loss()
            print("step %5d  val_loss %.6f  (%d batches)" % (done, vl, a.val_batches), flush=True)
            log.reset(time.perf_counter())
    print("final: peer=%s devices=1 model=gpt steps=%d train_loss=%.6f val_loss=%.6f step_ms=%.3f" %
          (peer, a.steps, log.train_loss, vl, log.step_ms()), flush=True)
