"""What the CNN peers share with examples/train_cnn.c: the data, its split,
the batch order and the initial weights, drawn from the same splitmix64
stream in the same order (examples/mnist_common.h), so dpar, JAX and PyTorch
start from identical weights and see identical batches.

    seed -> shuffle rows 0..4999 -> test = first 1000, train = the other 4000
         -> weights conv1 [3,3,1,32], conv2 [3,3,32,64], dense1 [3136,256],
            dense2 [256,10] (HWIO / [in, out], row-major), each LeCun-uniform
            (bound sqrt(3 / fan_in), the variance of flax's lecun_normal);
            biases zero
         -> every epoch: shuffle the training rows, take 62 batches of 64.
"""
import gzip
import os

import numpy as np

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "examples", "data", "mnist_5k.csv.gz")
SHAPES = [("conv1", (3, 3, 1, 32)), ("conv2", (3, 3, 32, 64)), ("dense1", (3136, 256)), ("dense2", (256, 10))]


class SplitMix64:
    """examples/digits_common.h's rng_next / rng_uniform / shuffle, bit for bit."""

    def __init__(self, seed):
        self.state = seed & M64

    def next_block(self, n):
        """The next n outputs as uint64 (state_k = seed + k * GAMMA, so vectorised)."""
        k = np.arange(1, n + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            z = np.uint64(self.state) + k * np.uint64(GAMMA)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        self.state = (self.state + n * GAMMA) & M64
        return z ^ (z >> np.uint64(31))

    def uniform(self, n):
        """float32 in [0, 1): (next >> 40) / 2^24, exact."""
        return ((self.next_block(n) >> np.uint64(40)).astype(np.float64) * (1.0 / 16777216.0)).astype(np.float32)

    def shuffle(self, idx):
        """Fisher-Yates from the end, j = next % (i + 1), in place."""
        n = len(idx)
        r = self.next_block(n - 1) if n > 1 else []
        for t, i in enumerate(range(n - 1, 0, -1)):
            j = int(r[t] % np.uint64(i + 1))
            idx[i], idx[j] = idx[j], idx[i]


def load(path=DATA):
    """x [5000, 28, 28, 1] f32 in [0, 1] (pixel / 255), y [5000] int32."""
    with gzip.open(path, "rt") as f:
        a = np.loadtxt(f, delimiter=",", dtype=np.int32)
    x = (a[:, :784].astype(np.float32) / np.float32(255.0)).reshape(-1, 28, 28, 1)
    return x, a[:, 784].astype(np.int32)


def prepare(seed=42, ntest=1000):
    """(rng, x, y, train_idx, test_idx, params): params a dict name -> (w, b)."""
    x, y = load()
    rng = SplitMix64(seed)
    idx = list(range(len(y)))
    rng.shuffle(idx)
    idx = np.array(idx, dtype=np.int64)
    params = {}
    for name, shape in SHAPES:
        fan_in = int(np.prod(shape[:-1]))
        bound = np.sqrt(np.float32(3.0) / np.float32(fan_in)).astype(np.float32)
        u = rng.uniform(int(np.prod(shape))).reshape(shape)
        params[name] = ((np.float32(2.0) * u - np.float32(1.0)) * bound, np.zeros(shape[-1], np.float32))
    return rng, x, y, idx[ntest:].copy(), idx[:ntest].copy(), params


def epoch_order(rng, train_idx):
    """Shuffles train_idx in place (as train_cnn.c at the start of each epoch)."""
    lst = train_idx.tolist()
    rng.shuffle(lst)
    train_idx[:] = lst
