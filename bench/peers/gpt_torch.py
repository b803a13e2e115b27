"""The PyTorch peer of examples/train_gpt.c: the same character-level GPT in
torch.nn on the CPU, one process; --device cuda on GPU 0 (for train_gpt.c
--backend cuda's step time; two steps in flight, as the JAX peer, so a
logging block's time covers its kernels, not only their launches).

    python bench/peers/gpt_torch.py [--steps 1000] [--seed 42] [--log-every 50] [--eval-every 250]
                                    [--val-batches 20] [--batch 32] [--lr 3e-3] [--threads N (default: cores)]
                                    [--device cpu|cuda]

Pre-LN blocks, learned positions, causal attention (4 heads of 32, through
scaled_dot_product_attention), GELU (tanh) MLP 4x, untied head; 818,241
parameters (checked: exit status 1 otherwise). torch.nn.utils.clip_grad_norm_
(1.0), torch.optim.AdamW(betas (0.9, 0.99), eps 1e-8, weight decay 0.1 on the
matrices; decay multiplied by lr as optax), the learning rate of
gpt_common.lr_at set before each step. Data, initial weights ([in, out]
transposed to torch's [out, in]), batches and validation windows of
gpt_common.py (train_gpt.c's). Prints train_gpt.c's progress lines and closes with
    final: peer=torch devices=1 model=gpt steps=N train_loss=... val_loss=... step_ms=...
(step_ms: the median over the logging blocks after the first).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def build(init, vocab):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import gpt_common as gc

    C, H, T = gc.N_EMBD, gc.N_HEAD, gc.CTX

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C, eps=1e-5), nn.LayerNorm(C, eps=1e-5)
            self.q, self.k, self.v, self.proj = (nn.Linear(C, C) for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):  # x [b, T, C]
            b = x.shape[0]
            h = self.ln1(x)
            q, k, v = (m(h).view(b, T, H, C // H).transpose(1, 2) for m in (self.q, self.k, self.v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, T, C)
            x = x + self.proj(y)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, C)
            self.wpe = nn.Parameter(torch.zeros(T, C))
            self.h = nn.ModuleList(Block() for _ in range(gc.N_LAYER))
            self.ln_f, self.head = nn.LayerNorm(C, eps=1e-5), nn.Linear(C, vocab)

        def forward(self, idx):  # idx [b, T] -> logits [b, T, V]
            x = self.wte(idx) + self.wpe
            for blk in self.h:
                x = blk(x)
            return self.head(self.ln_f(x))

    m = GPT()
    with torch.no_grad():
        for name, w in init:  # "h0.q.w" -> m.h[0].q.weight (transposed: [in, out] -> [out, in])
            parts = name.split(".")
            if name == "wte":
                m.wte.weight.copy_(torch.from_numpy(w))
                continue
            if name == "wpe":
                m.wpe.copy_(torch.from_numpy(w))
                continue
            mod = m.h[int(parts[0][1:])] if parts[0].startswith("h") and parts[0][1:].isdigit() else m
            mod = getattr(mod, parts[-2])
            t = torch.from_numpy(w)
            if parts[-1] == "b":
                mod.bias.copy_(t)
            else:
                mod.weight.copy_(t.t() if t.ndim == 2 else t)
    return m


def main():
    import gpt_common as gc

    a = gc.parse_args([("--threads", int, os.cpu_count() or 1), ("--device", str, "cpu")])
    import numpy as np
    import torch
    import torch.nn.functional as F

    if a.device not in ("cpu", "cuda"):
        sys.exit("gpt_torch: --device %s: give cpu or cuda" % a.device)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpt_torch: --device cuda: torch %s sees no GPU (torch.cuda.is_available() is False)" %
                 torch.__version__)
    dev = torch.device(a.device)
    torch.set_num_threads(a.threads)
    rng, data, init = gc.prepare(a.seed)
    vocab = len(data[1])
    model = build(init, vocab).to(dev)
    nparam = sum(p.numel() for p in model.parameters())
    if nparam != gc.NPARAM:
        sys.exit("gpt_torch: %d parameters, train_gpt.c has %d; the models differ" % (nparam, gc.NPARAM))
    decay = [p for p in model.parameters() if p.ndim == 2]
    other = [p for p in model.parameters() if p.ndim != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.99), eps=1e-8)
    print("torch %s, 1 process, %d threads%s: GPT %d layers, %d heads, %d embd, context %d: %d parameters; "
          "batch %d, %d steps" % (torch.__version__, torch.get_num_threads(),
                                  " on " + torch.cuda.get_device_name(dev) if dev.type == "cuda" else "", gc.N_LAYER,
                                  gc.N_HEAD, gc.N_EMBD, gc.CTX, nparam, a.batch, a.steps), flush=True)

    def loss_of(x, y):
        x, y = torch.from_numpy(x).long().to(dev), torch.from_numpy(y).long().to(dev)
        return F.cross_entropy(model(x).view(-1, vocab), y.view(-1))

    def val_loss():
        with torch.no_grad():
            return float(np.mean([float(loss_of(*gc.val_batch(data, k, a.val_batches, a.batch)))
                                  for k in range(a.val_batches)]))

    def train_step(x, y, lr):
        for g in opt.param_groups:
            g["lr"] = lr
        loss = loss_of(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.detach() if dev.type == "cuda" else loss.item()

    gc.train(a, rng, data, train_step, val_loss, "torch", wait=float if dev.type == "cuda" else None)


if __name__ == "__main__":
    main()
