"""The PyTorch peer of examples/train_cnn.c: the seed material's CNN in
torch.nn on the CPU, AdamW lr 1e-3 wd 1e-4 (torch.optim.AdamW: decay
multiplied by lr, as optax), on one process or data-parallel over N
processes with DistributedDataParallel over gloo (each takes its 64 / N rows
of every global batch; DDP averages the gradients). --device cuda runs the
one process on GPU 0 instead (the data set moved there once; an epoch's time
ends after torch.cuda.synchronize), for train_cnn.c --backend cuda's step time.

    python bench/peers/cnn_torch.py [--devices 1|2|4] [--epochs 10] [--batch 64] [--seed 42]
                                    [--device cpu|cuda]

The data, split, batch order and initial weights of cnn_common.py (the same
as train_cnn.c's); NHWC weights are transposed to torch's layouts and the
flatten is done in NHWC order, so the model is the flax one exactly.
Threads: cores / N per process. Prints one line per epoch and closes with
    final: peer=torch devices=N model=cnn data=mnist epochs=E test_accuracy=... train_loss=...
           step_ms=... samples_per_s=...
(step time: the median epoch of epochs 2..E, divided by its steps).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def build(init):
    import torch
    import torch.nn as nn

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
            self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
            self.dense1 = nn.Linear(3136, 256)
            self.dense2 = nn.Linear(256, 10)
            self.pool = nn.AvgPool2d(2)

        def forward(self, x):  # x: NHWC [b, 28, 28, 1]
            x = x.permute(0, 3, 1, 2)
            x = self.pool(torch.relu(self.conv1(x)))
            x = self.pool(torch.relu(self.conv2(x)))
            x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # NHWC flatten, as flax
            return self.dense2(torch.relu(self.dense1(x)))

    m = CNN()
    with torch.no_grad():
        for name, (w, b) in init.items():
            layer = getattr(m, name)
            wt = torch.from_numpy(w)
            layer.weight.copy_(wt.permute(3, 2, 0, 1) if w.ndim == 4 else wt.t())  # HWIO->OIHW, [in,out]->[out,in]
            layer.bias.copy_(torch.from_numpy(b))
    return m


def worker(rank, a):
    import numpy as np
    import torch
    import torch.distributed as dist
    import cnn_common

    n = a.devices
    dev = torch.device(a.device)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // n))
    if n > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(a.port))
        dist.init_process_group("gloo", rank=rank, world_size=n)
    rng, x, y, train_idx, test_idx, init = cnn_common.prepare(a.seed)
    model = build(init).to(dev)
    nparam = sum(p.numel() for p in model.parameters())
    net = torch.nn.parallel.DistributedDataParallel(model) if n > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.wd)
    lossf = torch.nn.CrossEntropyLoss()
    xs, ys = torch.from_numpy(x).to(dev), torch.from_numpy(y).long().to(dev)
    xt, yt = xs[torch.from_numpy(test_idx).to(dev)], ys[torch.from_numpy(test_idx).to(dev)]
    steps, per = len(train_idx) // a.batch, a.batch // n
    if rank == 0:
        print("torch %s, %d process(es)%s, %d parameters, %d steps of %d per epoch" %
              (torch.__version__, n, " on " + torch.cuda.get_device_name(dev) if dev.type == "cuda" else "", nparam,
               steps, a.batch), flush=True)
    times, loss_mean, acc = [], 0.0, 0.0
    for e in range(1, a.epochs + 1):
        cnn_common.epoch_order(rng, train_idx)
        t0 = time.perf_counter()
        total = torch.zeros(1, device=dev)
        for s in range(steps):
            rows = torch.from_numpy(train_idx[s * a.batch + rank * per:s * a.batch + (rank + 1) * per]).to(dev)
            loss = lossf(net(xs[rows]), ys[rows])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach()
        if n > 1:
            dist.all_reduce(total)
            total /= n
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # the epoch's kernels, not only their launches
        dt = time.perf_counter() - t0
        times.append(dt)
        loss_mean = float(total) / steps
        if rank == 0:
            with torch.no_grad():
                acc = float((model(xt).argmax(-1) == yt).float().mean())
            print("epoch %3d  loss %.8f  test_accuracy %.4f  samples/s %.0f" %
                  (e, loss_mean, acc, steps * a.batch / dt), flush=True)
    med = statistics.median(times[1:] if len(times) > 1 else times) / steps
    if rank == 0:
        print("final: peer=torch devices=%d model=cnn data=mnist epochs=%d test_accuracy=%.4f train_loss=%.8f "
              "step_ms=%.3f samples_per_s=%.0f" % (n, a.epochs, acc, loss_mean, med * 1e3, a.batch / med), flush=True)
    if n > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=1e-4)
    ap.add_argument("--port", type=int, default=29500 + os.getpid() % 1000)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = ap.parse_args()
    if a.batch % a.devices:
        sys.exit("batch %d not divisible by %d processes" % (a.batch, a.devices))
    if a.device == "cuda":
        import torch

        if a.devices != 1:
            sys.exit("cnn_torch: --device cuda runs one process on GPU 0; give --devices 1")
        if not torch.cuda.is_available():
            sys.exit("cnn_torch: --device cuda: torch %s sees no GPU (torch.cuda.is_available() is False)" %
                     torch.__version__)
    if a.devices == 1:
        worker(0, a)
    else:
        import torch.multiprocessing as mp
        mp.spawn(worker, args=(a,), nprocs=a.devices)


if __name__ == "__main__":
    main()
