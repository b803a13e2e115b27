"""The PyTorch peer of bench_ops' conv2d rows: conv2d forward (with bias), its
input gradient and its kernel gradient at the CNN's per-device shapes (16
images; cnn1 28x28x1 -> 32, cnn2 14x14x32 -> 64; 3x3, SAME, stride 1), on the
CPU with a fixed number of threads, as a user of torch would call them
(NCHW tensors, torch's default; the gradients through
torch.ops.aten.convolution_backward with one output each).

    python bench/peers/conv_torch.py [--threads 1] [--time 0.2] [--clock cpu|wall]

Each op: 3 warm-up calls, then calls until --time seconds have passed; prints
    torchconv,<op>:<shape>,<threads>,<microseconds per call>
with the op names of bench_ops (conv2d, conv2d_backward_input,
conv2d_backward_kernel). --clock cpu: process CPU time divided by --threads
(CPU time per working thread), as bench_ops --clock cpu.
"""
import argparse
import time

SHAPES = {"cnn1": (16, 28, 28, 1, 32), "cnn2": (16, 14, 14, 32, 64)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--time", type=float, default=0.2)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    clock = time.process_time if a.clock == "cpu" else time.perf_counter
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(0)
    for name, (n, h, w, ci, co) in SHAPES.items():
        x = torch.randn(n, ci, h, w, generator=g)
        k = torch.randn(co, ci, 3, 3, generator=g)
        b = torch.randn(co, generator=g)
        dy = torch.randn(n, co, h, w, generator=g)

        def conv():
            return torch.nn.functional.conv2d(x, k, b, padding=1)

        def bwd(mask):
            return aten.convolution_backward(dy, x, k, [co], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask)

        ops = (
            ("conv2d", conv),
            ("conv2d_backward_input", lambda: bwd([True, False, False])),
            ("conv2d_backward_kernel", lambda: bwd([False, True, True])),
        )
        with torch.no_grad():
            for op, fn in ops:
                for _ in range(3):
                    fn()
                calls, t0 = 0, clock()
                while True:
                    fn()
                    calls += 1
                    t = clock() - t0
                    if t >= a.time:
                        break
                per = 1e6 * t / calls / (a.threads if a.clock == "cpu" else 1)
                print(f"torchconv,{op}:{name},{a.threads},{per:.3f}", flush=True)


if __name__ == "__main__":
    main()
