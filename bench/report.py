"""Turns the rows bench/run.sh collected into bench/results/collectives.csv,
matmul.csv, train.csv, ops.csv, results.md and busbw.png / train.png (when matplotlib
is there), and prints the closing "summary:" line. Exits 1 when a collective
or an op is above 100% of its memory-traffic limit (the measurement is broken).

    python bench/report.py RAW_ROWS OUT_DIR
    python bench/report.py --gpt RAW_ROWS OUT_DIR   (bench/peers/run_gpt.sh: gpt.md, gpt.csv, gpt_steps.csv)
    python bench/report.py --cnn RAW_ROWS OUT_DIR   (bench/peers/run_cnn.sh: cnn.md, cnn.csv, cnn_steps.csv)

Rows (CSV, no header):
  coll,backend,op,devices,bytes,time_us,algbw,busbw,limit_us,pct,pct_min,pct_max,alts[,limit_kernel,own_kernel,
       own_us,pct_own,pct_own_min,pct_own_max]   (bench_collectives)
  pair,alternation,<a coll row of dpar or MPI, up to busbw>                       (all-reduce vs MPI)
  mm,shape,threads,dpar_us,dpar_gflops,blas_us,blas_gflops,ratio,ratio_min,ratio_max,alts  (bench_matmul)
  train,framework,model,devices,batch,step_ms,samples_per_s[,note]
  ops,backend,op,dtype,shape,threads,time_us,GBps,stream_GBps,pct_stream,min,max,gflops,blas_gflops,
      pct_blas,min,max,alts,working_set_bytes,stream_kernel                      (bench_ops; GEMM columns may be empty)
  opskip,backend,op,dtype,reason                                                 (bench_ops: dtype refused)
  gptstep,round,system,mesh,step_ms,load1                                  (run_gpt.sh, interleaved)
  gptval,system,mesh,seed,steps,train_loss,val_loss,step_ms,load1          (run_gpt.sh, 1000 steps)
  cnnstep,round,system,devices,step_ms,load1,cpu_ms                        (run_cnn.sh, interleaved)
  cnnval,system,devices,seed,epochs,test_accuracy,train_loss,step_ms       (run_cnn.sh, from its logs)
  load,start|end,1min/5min/15min
  skip,what,reason
"""
import csv
import os
import sys
import time


def human(b):
    units = (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10))
    for unit, k in units:
        if b >= k and b % k == 0:
            return "%d %s" % (b // k, unit)
    for unit, k in units:  # not a whole number of any: 3 digits of the largest that fits
        if b >= k:
            return "%.3g %s" % (b / k, unit)
    return "%d B" % b


def med(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def write_csv(path, header, rows):
    """a CSV table: the header row, then the rows"""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def parse_ops(r):
    """an ops row of bench_ops; pct is the % of its limit (sgemm for GEMM rows, else the stream)"""
    f = lambda x: float(x) if x else None
    o = dict(backend=r[1], op=r[2], dtype=r[3], shape=r[4], threads=int(r[5]), us=float(r[6]), gbps=float(r[7]),
             stream=float(r[8]), ps=float(r[9]), psmin=float(r[10]), psmax=float(r[11]), gflops=f(r[12]),
             blas=f(r[13]), pb=f(r[14]), pbmin=f(r[15]), pbmax=f(r[16]), alts=int(r[17]),
             ws=int(r[18]) if len(r) > 19 else None, kernel=r[19] if len(r) > 19 else "")
    o["pct"], o["limit"] = (o["pb"], "sgemm") if o["pb"] is not None else (o["ps"], "stream")
    return o


def ops_section(ops, opskip):
    """the Markdown of bench_ops's rows: a table per backend, the worst rows, the refused dtypes"""
    md = ["## Ops against their limits (bench_ops: the CNN's and the GPT's per-device shapes)", "",
          "Per row the op alternates with its limits (median of the alternations, min-max): the stream limit = "
          "the bytes the op must read + write (formula per op in bench/bench_ops.c) / the best of the copy, add, "
          "in-place add, fill, read and the op's own access-mix stream kernels, each over the op's working set "
          "(the distinct bytes it touches: a cache-resident op against a cache-resident stream) with the same "
          "threads; `limit kernel` names the kernel that set it (above 100% the run "
          "fails: the measurement would be broken); for matmul, conv2d and attention also OpenBLAS sgemm at the "
          "equivalent GEMM shapes (`% sgemm` = sgemm time / op time; above 100% dpar is faster than OpenBLAS "
          "there, which is possible). `% limit` is the sgemm figure for those rows, the stream figure for the "
          "rest. CPU backend: 1 thread per device, as in the training jobs; Vulkan: llvmpipe, which computes on "
          "the same CPU cores with its own threads.", ""]
    for backend in sorted({o["backend"] for o in ops}):
        rows = [o for o in ops if o["backend"] == backend]
        md += ["### %s backend (%d threads)" % (backend, rows[0]["threads"]), "",
               "| op | dtype | shape | time us | GB/s | % stream (min-max) | limit kernel (working set) | GFLOP/s "
               "| sgemm GFLOP/s | % sgemm (min-max) |",
               "|---|---|---|---|---|---|---|---|---|---|"]
        for o in rows:
            g = ("%.1f" % o["gflops"], "%.1f" % o["blas"], "%.0f%% (%.0f-%.0f)" % (o["pb"], o["pbmin"], o["pbmax"])) \
                if o["pb"] is not None else ("", "", "")
            k = "%s (%s)" % (o["kernel"], human(o["ws"])) if o["ws"] is not None else ""
            md.append("| %s | %s | %s | %.2f | %.3g | %.3g%% (%.3g-%.3g) | %s | %s | %s | %s |" % (
                o["op"], o["dtype"], o["shape"], o["us"], o["gbps"], o["ps"], o["psmin"], o["psmax"], k, *g))
        worst = sorted(rows, key=lambda o: o["pct"])[:3]
        md += ["", "Furthest from their limit: " + "; ".join(
            "%s %s (%s) %.3g%% of %s" % (o["op"], o["dtype"], o["shape"], o["pct"], o["limit"]) for o in worst) + ".",
            ""]
        refused = {}
        for s in opskip:
            if s["backend"] == backend:
                refused.setdefault(s["dtype"], []).append(s["op"])
        if refused:
            md += ["Dtypes refused (DPAR_ERR_DTYPE or DPAR_ERR_BACKEND: no row): " + "; ".join(
                "%s: %d ops (%s)" % (d, len(v), ", ".join(sorted(set(v)))) for d, v in sorted(refused.items())), ""]
    return md


def gpt_rows(path):
    """(steps, vals, load) from the gptstep / gptval / load rows of a raw file."""
    steps, vals, load = [], [], {}
    with open(path) as f:
        for r in csv.reader(f):
            if len(r) >= 6 and r[0] == "gptstep":  # [7]: CPU ms/step of every thread (optional)
                steps.append(dict(k=int(r[1]), sys=r[2], mesh=r[3], ms=float(r[4]), load=float(r[5]),
                                  cpu=float(r[6]) if len(r) > 6 and r[6] else None))
            elif len(r) >= 9 and r[0] == "gptval":
                vals.append(dict(sys=r[1], mesh=r[2], seed=int(r[3]), steps=int(r[4]), train=float(r[5]),
                                 val=float(r[6]), ms=float(r[7]) if r[7] else float("nan"),
                                 load=r[8] if len(r) > 8 else "?"))
            elif len(r) >= 3 and r[0] == "load":
                load[r[1]] = r[2].replace("/", " ")
    return steps, vals, load


def step_ratios(steps, key="ms", same_mesh=False):
    """{(dpar mesh, peer): (median ratio, min, max, rounds, dpar median, peer median)} of the wall ("ms") or
    CPU ("cpu") time per step; ratio = dpar's / the peer's in the same round (below 1: dpar is faster), against
    the peer's run on the same mesh (device count) when same_mesh, else against its only one."""
    res = {}
    for mesh in sorted({s["mesh"] for s in steps if s["sys"] == "dpar"}, key=lambda m: (len(m), m)):
        d = {s["k"]: s[key] for s in steps if s["sys"] == "dpar" and s["mesh"] == mesh and s.get(key)}
        for peer in sorted({s["sys"] for s in steps if s["sys"] != "dpar"}):
            p = {s["k"]: s[key] for s in steps
                 if s["sys"] == peer and s.get(key) and (s["mesh"] == mesh or not same_mesh)}
            rs = [d[k] / p[k] for k in d if k in p and p[k] > 0]
            if rs:
                res[(mesh, peer)] = (med(rs), min(rs), max(rs), len(rs), med([d[k] for k in d if k in p]),
                                     med([p[k] for k in d if k in p]))
    return res


def steps_rows(steps):
    """the rows of gpt_steps.csv / cnn_steps.csv: one per round and system"""
    return ([s["k"], s["sys"], s["mesh"], s["ms"], s["load"], s["cpu"] if s["cpu"] is not None else ""]
            for s in steps)


def gpt_md(steps, vals, load):
    """The GPT section: step times and ratios, validation losses (mean over seeds)."""
    md = ["## GPT step: dpar against JAX and PyTorch (interleaved)", "",
          "examples/train_gpt.c's GPT (818,241 parameters, batch 32, context 64; every peer checks its count) on "
          "one CPU device for the peers (bench/peers/gpt_jax.py, gpt_torch.py) and on 1x1 and 2x2 (data, model) "
          "meshes of CPU devices for dpar. Per round: dpar 1x1, JAX, dpar 2x2, PyTorch, one process each; step "
          "time = the median of the logging blocks after the first (compilation). Ratio = dpar step time / peer "
          "step time in the same round (below 1: dpar is faster): median (min-max) over the rounds. The machine "
          "(%d cores) is shared: load average at the start %s, at the end %s; absolute times move with it." % (
              os.cpu_count(), load.get("start", "?"), load.get("end", "?")), "",
          "Threads: dpar one worker per device (1x1: 1, 2x2: 4); PyTorch 1 (`GPT_TORCH_THREADS`); JAX its own "
          "pool (every core). On a loaded machine the scheduler shares the cores per thread, so a process with "
          "more threads gets a larger share: wall-clock ratios there say as much about the load as about the "
          "code." + (" 1-minute load during the rounds: %.1f-%.1f." % (min(s["load"] for s in steps), max(
              s["load"] for s in steps)) if steps else ""), ""]
    if steps:
        md += ["| dpar mesh | peer | rounds | dpar ms/step | peer ms/step | dpar/peer (min-max) |",
               "|---|---|---|---|---|---|"]
        for (mesh, peer), (r, lo, hi, n, dm, pm) in sorted(step_ratios(steps).items()):
            md.append("| %s | %s | %d | %.1f | %.1f | %.2f (%.2f-%.2f) |" % (mesh, peer, n, dm, pm, r, lo, hi))
        cpu = step_ratios(steps, "cpu")
        if cpu:
            md += ["", "CPU time (user + system of every thread of the process, in the second logging block: "
                   "what the step costs the machine, whatever the load; a peer's idle pool threads that spin "
                   "count too):", "",
                   "| dpar mesh | peer | rounds | dpar CPU ms/step | peer CPU ms/step | dpar/peer (min-max) |",
                   "|---|---|---|---|---|---|"]
            for (mesh, peer), (r, lo, hi, n, dm, pm) in sorted(cpu.items()):
                md.append("| %s | %s | %d | %.1f | %.1f | %.2f (%.2f-%.2f) |" % (mesh, peer, n, dm, pm, r, lo, hi))
        for mesh in sorted({s["mesh"] for s in steps if s["sys"] == "dpar"}):
            if not any(s["sys"] != "dpar" for s in steps):
                d = [s["ms"] for s in steps if s["sys"] == "dpar" and s["mesh"] == mesh]
                md.append("dpar %s alone (no peers): %.1f ms/step, median of %d runs" % (mesh, med(d), len(d)))
        md.append("")
    if vals:
        md += ["### Validation loss after training (20 fixed batches of the validation split)", "",
               "| system | mesh | steps | seeds | val loss mean | val losses | train loss (last 50 steps) mean |",
               "|---|---|---|---|---|---|---|"]
        for key in sorted({(v["sys"], v["mesh"], v["steps"]) for v in vals}, key=lambda k: (k[0] != "dpar", k)):
            vs = [v for v in vals if (v["sys"], v["mesh"], v["steps"]) == key]
            md.append("| %s | %s | %d | %s | %.4f | %s | %.4f |" % (
                key[0], key[1], key[2], " ".join(str(v["seed"]) for v in vs), sum(v["val"] for v in vs) / len(vs),
                " ".join("%.4f" % v["val"] for v in vs), sum(v["train"] for v in vs) / len(vs)))
        md.append("")
    return md


def gpt_summary(steps):
    """The GPT part of the summary line."""
    out = []
    for key, what in (("ms", "wall"), ("cpu", "CPU")):
        rr = ["%s/%s %.2f (%.2f-%.2f)" % (mesh, peer, r, lo, hi)
              for (mesh, peer), (r, lo, hi, _, _, _) in sorted(step_ratios(steps, key).items())]
        if rr:
            out.append("gpt step dpar/peer %s: %s" % (what, ", ".join(rr)))
    return out


def gpt_main(raw, out):
    """report.py --gpt: bench/results/gpt.md, gpt.csv (validation runs) and gpt_steps.csv (the rounds)."""
    steps, vals, load = gpt_rows(raw)
    md = ["# The GPT of examples/train_gpt.c: dpar and its peers", "",
          "Measured %s with `sh bench/peers/run_gpt.sh` (see its header for the knobs)." % time.strftime(
              "%Y-%m-%d %H:%M UTC", time.gmtime()), ""] + gpt_md(steps, vals, load)
    if os.environ.get("GPT_NOTE"):  # what the run could not measure itself, with where it comes from
        md += [os.environ["GPT_NOTE"], ""]
    with open(os.path.join(out, "gpt.md"), "w") as f:
        f.write("\n".join(md))
    write_csv(os.path.join(out, "gpt.csv"), ["system", "mesh", "seed", "steps", "train_loss", "val_loss", "step_ms",
                                             "load1"],
              ([v["sys"], v["mesh"], v["seed"], v["steps"], v["train"], v["val"], v["ms"], v["load"]] for v in vals))
    write_csv(os.path.join(out, "gpt_steps.csv"), ["round", "system", "mesh", "step_ms", "load1", "cpu_ms_per_step"],
              steps_rows(steps))
    print("\n".join(md))
    print("bench: wrote %s/{gpt.md,gpt.csv,gpt_steps.csv}" % out)
    return 0


def cnn_rows(path):
    """(steps, vals, load) from the cnnstep / cnnval / load rows of a raw file (bench/peers/run_cnn.sh)."""
    steps, vals, load = [], [], {}
    with open(path) as f:
        for r in csv.reader(f):
            if len(r) >= 6 and r[0] == "cnnstep":  # [6]: CPU ms/step of the process tree
                steps.append(dict(k=int(r[1]), sys=r[2], mesh=r[3], ms=float(r[4]), load=float(r[5]),
                                  cpu=float(r[6]) if len(r) > 6 and r[6] else None))
            elif len(r) >= 7 and r[0] == "cnnval":
                vals.append(dict(sys=r[1], n=int(r[2]), seed=int(r[3]), epochs=int(r[4]), acc=float(r[5]),
                                 loss=float(r[6]), ms=float(r[7]) if len(r) > 7 and r[7] else float("nan")))
            elif len(r) >= 3 and r[0] == "load":
                load[r[1]] = r[2].replace("/", " ")
    return steps, vals, load


# issue 17's targets for the CNN step: dpar at 0.7x JAX's speed or better, at PyTorch's or better
CNN_TARGET = {"jax": 1 / 0.7, "torch": 1.0}


def cnn_md(steps, vals, load):
    """cnn.md's sections: step-time ratios (wall and CPU) per device count, then the accuracies per seed."""
    md = ["## CNN step: dpar against JAX and PyTorch (interleaved)", "",
          "Per round, for each device count: dpar, JAX, PyTorch, one run each of %s epochs of 62 steps (global "
          "batch 64); the first epoch (compilation, warm-up) is dropped. Step time = the median of the other "
          "epochs' training wall clock / 62. CPU time = user + system of every thread of the run's process tree "
          "over the second epoch (from the first epoch line to the second), per step: it includes that epoch's "
          "test evaluation, 1,000 images forward, in every system. Ratio = dpar / peer in the same round and device count (below 1: "
          "dpar is faster): median (min-max) over the rounds. Target (issue 17): at most %.2f against JAX "
          "(0.7x its speed), at most 1.00 against PyTorch." % (os.environ.get("CNN_STEP_EPOCHS", "3"),
                                                               CNN_TARGET["jax"]), "",
          "Threads: dpar one worker per device; JAX one process with its own pool over N host devices, at most 2 "
          "steps in flight (XLA:CPU aborts in its all-reduce rendezvous with more queued on 4 devices / 2 cores); "
          "PyTorch one process (N = 1: every core) or N processes with DistributedDataParallel over gloo, "
          "cores / N threads each (at least 1). The machine (%d cores) is shared by several agents: load average "
          "at the start %s, at the end %s%s. Wall-clock ratios on a loaded machine say as much about the load as "
          "about the code; the CPU-time ratios are steadier." % (
              os.cpu_count(), load.get("start", "?"), load.get("end", "?"),
              "; 1-minute load at the rounds' starts %.1f-%.1f" % (min(s["load"] for s in steps),
                                                                 max(s["load"] for s in steps)) if steps else ""), ""]
    for key, what in (("ms", "ms/step"), ("cpu", "CPU ms/step")):
        rs = step_ratios(steps, key, same_mesh=True)
        if not rs:
            continue
        md += ["| devices | peer | rounds | dpar %s | peer %s | dpar/peer (min-max) | target met (median) |" % (
            what, what), "|---|---|---|---|---|---|---|"]
        for (mesh, peer), (r, lo, hi, n, dm, pm) in sorted(rs.items(), key=lambda kv: (int(kv[0][0]), kv[0][1])):
            t = CNN_TARGET.get(peer)
            md.append("| %s | %s | %d | %.1f | %.1f | %.2f (%.2f-%.2f) | %s |" % (
                mesh, peer, n, dm, pm, r, lo, hi, "" if t is None else ("yes" if r <= t else "no (%.2f)" % t)))
        md.append("")
    if vals:
        md += ["## Quality: 10-epoch runs, one per seed", "",
               "Every system starts from the same weights and sees the same batches for a seed (cnn_common.py "
               "draws them from train_cnn.c's splitmix64 stream: the seed sets the split, the weights and every "
               "epoch's order). Test accuracy on the 1,000 held-out images and training loss (mean over the last "
               "epoch) per seed, then their mean.", "",
               "| system | devices | epochs | seeds | test accuracy per seed | mean | train loss per seed | mean |",
               "|---|---|---|---|---|---|---|---|"]
        for key in sorted({(v["sys"], v["n"], v["epochs"]) for v in vals}, key=lambda k: (k[0] != "dpar", k)):
            vs = sorted((v for v in vals if (v["sys"], v["n"], v["epochs"]) == key), key=lambda v: v["seed"])
            md.append("| %s | %d | %d | %s | %s | %.4f | %s | %.5f |" % (
                key[0], key[1], key[2], " ".join(str(v["seed"]) for v in vs), " ".join("%.4f" % v["acc"] for v in vs),
                sum(v["acc"] for v in vs) / len(vs), " ".join("%.5f" % v["loss"] for v in vs),
                sum(v["loss"] for v in vs) / len(vs)))
        md.append("")
    return md


def cnn_main(raw, out):
    """report.py --cnn: bench/results/cnn.md, cnn.csv (quality runs) and cnn_steps.csv (the rounds)."""
    steps, vals, load = cnn_rows(raw)
    md = ["# The seed CNN on 5,000 MNIST images: dpar and its peers", "",
          "Measured %s with `sh bench/peers/run_cnn.sh` (see its header for the knobs). Same data, split, batch "
          "order, initial weights (bench/peers/cnn_common.py = examples/mnist_common.h), AdamW lr 1e-3 wd 1e-4." %
          time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), ""] + cnn_md(steps, vals, load)
    if os.environ.get("CNN_NOTE"):  # what the run could not say itself (commits, what else ran)
        md += [os.environ["CNN_NOTE"], ""]
    with open(os.path.join(out, "cnn.md"), "w") as f:
        f.write("\n".join(md))
    write_csv(os.path.join(out, "cnn.csv"), ["system", "devices", "seed", "epochs", "test_accuracy", "train_loss",
                                             "step_ms"],
              ([v["sys"], v["n"], v["seed"], v["epochs"], v["acc"], v["loss"], v["ms"]] for v in vals))
    write_csv(os.path.join(out, "cnn_steps.csv"), ["round", "system", "devices", "step_ms", "load1",
                                                   "cpu_ms_per_step"], steps_rows(steps))
    print("\n".join(md))
    print("bench: wrote %s/{cnn.md,cnn.csv,cnn_steps.csv}" % out)
    return 0


def main():
    if sys.argv[1] == "--gpt":
        return gpt_main(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "--cnn":
        return cnn_main(sys.argv[2], sys.argv[3])
    raw, out = sys.argv[1], sys.argv[2]
    coll, train, skips, pairs, mm, load, graph, oprows, opskip = [], [], [], [], [], {}, [], [], []
    with open(raw) as f:
        for line in f:
            r = line.strip().split(",")
            if not r or not r[0]:
                continue
            if r[0] == "coll" and len(r) >= 13:
                coll.append(dict(backend=r[1], op=r[2], n=int(r[3]), bytes=int(r[4]), us=float(r[5]),
                                 algbw=float(r[6]), busbw=float(r[7]), limit_us=float(r[8]), pct=float(r[9]),
                                 pmin=float(r[10]), pmax=float(r[11]), alts=int(r[12]),
                                 kernel=r[13] if len(r) >= 19 else "",
                                 own=float(r[16]) if len(r) >= 19 and float(r[15]) > 0 else None))
            elif r[0] == "pair" and len(r) >= 9:  # pair,alternation,backend,op,n,bytes,time_us,algbw,busbw,...
                pairs.append(dict(k=int(r[1]), backend=r[2], n=int(r[4]), bytes=int(r[5]), us=float(r[6]),
                                  busbw=float(r[8])))
            elif r[0] == "mm" and len(r) >= 11:
                mm.append(dict(shape=r[1], threads=int(r[2]), dpar_us=float(r[3]), dpar_gf=float(r[4]),
                               blas_us=float(r[5]), blas_gf=float(r[6]), ratio=float(r[7]), rmin=float(r[8]),
                               rmax=float(r[9]), alts=int(r[10])))
            elif r[0] == "train" and len(r) >= 7:
                train.append(dict(fw=r[1], model=r[2], n=int(r[3]), batch=int(r[4]), ms=float(r[5]),
                                  sps=float(r[6]), note=r[7] if len(r) > 7 else ""))
            elif r[0] == "load" and len(r) >= 3:
                load[r[1]] = r[2].replace("/", " ")
            elif r[0] == "graph" and len(r) >= 11:  # bench_graph.c: graph vs eager digits step, interleaved
                graph.append(dict(backend=r[1], n=int(r[3]), eager=float(r[4]), graph=float(r[5]), med=float(r[6]),
                                  lo=float(r[7]), hi=float(r[8]), rounds=int(r[9]), load=float(r[10]),
                                  cpu="%s (%s-%s)" % (r[11], r[12], r[13]) if len(r) >= 14 else "-",
                                  host=[float(x) for x in r[14:19]] if len(r) >= 19 else None))
            elif r[0] == "ops" and len(r) >= 18:
                oprows.append(parse_ops(r))
            elif r[0] == "opskip" and len(r) >= 5:
                opskip.append(dict(backend=r[1], op=r[2], dtype=r[3], why=",".join(r[4:])))
            elif r[0] == "skip":
                skips.append(", ".join(r[1:]))

    keys = ["backend", "op", "n", "bytes", "us", "algbw", "busbw", "limit_us", "pct", "pmin", "pmax", "alts"]
    write_csv(os.path.join(out, "collectives.csv"),
              ["backend", "op", "devices", "bytes", "time_us", "algbw_GBps", "busbw_GBps", "limit_us", "pct_of_limit",
               "pct_min", "pct_max", "alternations"], ([c[k] for k in keys] for c in coll))
    write_csv(os.path.join(out, "matmul.csv"),
              ["shape", "threads", "dpar_us", "dpar_gflops", "openblas_us", "openblas_gflops",
               "openblas_time_over_dpar_time", "ratio_min", "ratio_max", "alternations"],
              ([m["shape"], m["threads"], m["dpar_us"], m["dpar_gf"], m["blas_us"], m["blas_gf"], m["ratio"],
                m["rmin"], m["rmax"], m["alts"]] for m in mm))
    write_csv(os.path.join(out, "train.csv"), ["framework", "model", "devices", "batch", "step_ms", "samples_per_s",
                                               "note"],
              ([t["fw"], t["model"], t["n"], t["batch"], t["ms"], t["sps"], t["note"]] for t in train))

    keys = ["backend", "op", "dtype", "shape", "threads", "us", "gbps", "stream", "ps", "psmin", "psmax", "gflops",
            "blas", "pb", "pbmin", "pbmax", "limit", "pct", "alts", "ws", "kernel"]
    write_csv(os.path.join(out, "ops.csv"),
              ["backend", "op", "dtype", "shape", "threads", "time_us", "GBps", "stream_GBps", "pct_stream",
               "pct_stream_min", "pct_stream_max", "gflops", "openblas_gflops", "pct_sgemm", "pct_sgemm_min",
               "pct_sgemm_max", "limit", "pct_of_limit", "alternations", "working_set_bytes", "stream_kernel"],
              (["" if o[k] is None else o[k] for k in keys] for o in oprows))

    def get(backend, op, n, b):
        for c in coll:
            if c["backend"] == backend and c["op"] == op and c["n"] == n and c["bytes"] == b:
                return c
        return None

    md = ["# dpar benchmarks", "",
          "One run of `make bench` on this machine (%s, %s CPUs). Load average (1/5/15 min) at the start: %s; "
          "at the end: %s. The machine is shared: absolute figures move with the load, the ratios below are "
          "taken from interleaved runs so that a busy spell hits both sides." % (
              os.uname().nodename, os.cpu_count(), load.get("start", "?"), load.get("end", "?")), "",
          "## Collectives against the memory-traffic limit (CPU backend)", "",
          "limit = the DRAM bytes the collective must read + write (all-reduce and all-to-all 2nS, all-gather, "
          "reduce-scatter and broadcast (n+1)S for S bytes on n devices) / the bandwidth of the fastest stream kernel "
          "(copy, add, in-place add, fill, read and the collectives' own patterns, each with non-temporal and "
          "ordinary stores; bench_collectives.c's header) run by n threads "
          "over the same footprint in the same run, alternating with dpar. `% limit` = limit time / dpar time: "
          "the median over the alternations (min-max). Above 100% the benchmark fails: the measurement would "
          "be broken. `own` = the same bytes at the bandwidth of the op's own access pattern alone (sum_all, "
          "fanout, sum_one or copy, no rendezvous) / dpar time: below 100% is dpar's own cost, the rest of the "
          "gap to the limit is the pattern's. busbw follows nccl-tests (a network figure, GB/s = 1e9 B/s).", ""]
    for backend in ("cpu", "vulkan"):
        for op in ("allreduce", "allgather", "reducescatter", "broadcast", "alltoall"):
            rows = [c for c in coll if c["backend"] == backend and c["op"] == op]
            if not rows:
                continue
            devs = sorted({c["n"] for c in rows})
            md += ["### %s, %s backend" % (op, backend), ""]
            hdr = ["size"]
            for n in devs:
                hdr += ["n=%d busbw" % n, "n=%d %% limit (min-max)" % n]
            md += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
            for b in sorted({c["bytes"] for c in rows}):
                row = [human(b)]
                for n in devs:
                    c = get(backend, op, n, b)
                    own = "; own %.0f%%" % c["own"] if c and c.get("own") is not None else ""
                    row += ["%.2f" % c["busbw"], "%.0f%% (%.0f-%.0f)%s" % (c["pct"], c["pmin"], c["pmax"], own)] if c else [
                        "-", "-"]
                md.append("| " + " | ".join(row) + " |")
            md.append("")

    # dpar vs MPI, per alternation
    ratios_mpi = {}
    for (n, b) in sorted({(p["n"], p["bytes"]) for p in pairs}):
        d = {p["k"]: p for p in pairs if p["backend"] == "cpu" and p["n"] == n and p["bytes"] == b}
        m = {p["k"]: p for p in pairs if p["backend"] == "mpi" and p["n"] == n and p["bytes"] == b}
        rs = [m[k]["us"] / d[k]["us"] for k in d if k in m]
        if rs:
            ratios_mpi[(n, b)] = (med(rs), min(rs), max(rs), med([d[k]["busbw"] for k in d]),
                                  med([m[k]["busbw"] for k in m]), len(rs))
    if ratios_mpi:
        md += ["## All-reduce: dpar (CPU backend) against Open MPI `MPI_Allreduce`", "",
               "The two alternate per device count (one dpar run, one `mpirun`, repeated); ratio = MPI time / dpar "
               "time per alternation (above 1: dpar is faster), median (min-max).", "",
               "| devices | size | dpar busbw | MPI busbw | dpar/MPI speed (min-max) | alternations |",
               "|---|---|---|---|---|---|"]
        for (n, b), (r, lo, hi, db, mb, k) in sorted(ratios_mpi.items()):
            md.append("| %d | %s | %.2f | %.2f | %.1fx (%.1f-%.1f) | %d |" % (n, human(b), db, mb, r, lo, hi, k))
        md.append("")

    if mm:
        md += ["## Matmul: dpar_matmul (CPU backend) against OpenBLAS sgemm", "",
               "Same shape, same thread count, alternating per shape; shape MxNxK (C[M,N] = op(A)[M,K] op(B)[K,N], "
               ":tn/:nt = A/B transposed). ratio = OpenBLAS time / dpar time (above 1: dpar is faster), median "
               "(min-max). 1 thread: the per-device shapes of the digits, CNN (batch 16 per device) and GPT jobs, "
               "where every device is one thread; 2 threads: one device with the whole machine.", "",
               "| shape | threads | dpar GFLOP/s | OpenBLAS GFLOP/s | ratio (min-max) |", "|---|---|---|---|---|"]
        for m in mm:
            md.append("| %s | %d | %.1f | %.1f | %.2f (%.2f-%.2f) |" % (
                m["shape"], m["threads"], m["dpar_gf"], m["blas_gf"], m["ratio"], m["rmin"], m["rmax"]))
        md.append("")

    # training
    def tget(fw, model, n):
        for t in train:
            if t["fw"] == fw and t["model"] == model and t["n"] == n:
                return t
        return None
    models = []
    for t in train:
        if t["model"] not in models:
            models.append(t["model"])
    md += ["## Training step (data-parallel MLP, SGD momentum 0.9, fresh host batch each step)", "",
           "Scaling efficiency = step(1 device) / (n x step(n devices)) at a fixed global batch; this machine "
           "has 2 cores, so 4 devices share them. Ratio = dpar step time / JAX step time (below 1: dpar is faster).",
           "", "| model | devices | dpar step ms | dpar samples/s | dpar efficiency | JAX step ms | JAX samples/s | JAX efficiency | dpar/JAX |",
           "|---|---|---|---|---|---|---|---|---|"]
    ratios = {}
    for model in models:
        for n in sorted({t["n"] for t in train if t["model"] == model}):
            d, j = tget("dpar", model, n), tget("jax", model, n)
            d1, j1 = tget("dpar", model, 1), tget("jax", model, 1)
            de = "%.2f" % (d1["ms"] / (n * d["ms"])) if d and d1 else "-"
            je = "%.2f" % (j1["ms"] / (n * j["ms"])) if j and j1 else "-"
            r = d["ms"] / j["ms"] if d and j else None
            if r is not None:
                ratios[(model, n)] = r
            note = " (%s)" % j["note"] if j and j["note"] else ""
            md.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s |" % (
                model, n, "%.3f" % d["ms"] if d else "-", "%.0f" % d["sps"] if d else "-", de,
                ("%.3f" % j["ms"] + note) if j else "-", "%.0f" % j["sps"] if j else "-", je,
                "%.2f" % r if r is not None else "-"))
    md.append("")
    # overlap, from the trace of the large MLP on 2 devices
    tpath = os.path.join(out, "trace_large_2dev.json")
    if os.path.exists(tpath):
        try:
            import json
            with open(tpath) as f:
                ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
            comm = [e for e in ev if e.get("cat") == "collective async"]
            ops = [e for e in ev if e.get("cat") == "op"]
            tot = sum(c["dur"] for c in comm)
            ovl = 0.0
            for c in comm:  # comm track of device d: tid 100001 + d; its worker track: tid d + 1
                for e in ops:
                    if e["pid"] == c["pid"] and e["tid"] == c["tid"] - 100000:
                        o = min(e["ts"] + e["dur"], c["ts"] + c["dur"]) - max(e["ts"], c["ts"])
                        if o > 0:
                            ovl += o
            buckets = sorted({c["args"]["bytes"] for c in comm})
            md += ["## Overlap (trace of the large MLP, 2 devices, 8 MB buckets: `trace_large_2dev.json`)", "",
                   "Gradient buckets all-reduced asynchronously: %s bytes. Of %.1f ms spent in async all-reduces, "
                   "%.1f ms (%.0f%%) ran while the same device's worker was computing (earlier layers' gradients)."
                   % (", ".join(str(b) for b in buckets), tot / 1e3, ovl / 1e3, 100 * ovl / tot if tot else 0), ""]
        except Exception as e:
            md += ["(trace not readable: %s)" % e, ""]
    if graph:
        md += ["## Digits step: replayed graph vs eager hand-written step (bench_graph, interleaved)", "",
               "Per round, a block of eager steps and a block of graph steps, alternating which goes first; "
               "ratio = graph step time / eager step time (< 1: the graph is faster), wall time; CPU time: the "
               "process's (every thread). Host time: the CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID) "
               "and of the threads dpar started (named dpar-*, read from /proc/self/task/<tid>/schedstat), not of "
               "a driver's threads: on Vulkan (llvmpipe, which computes on the same cores) the host's cost of "
               "issuing a step; it counts the host threads' waits that burn CPU (dpar's spin before sleeping, "
               "the driver's fence wait called from dpar's threads).", "",
               "| backend | devices | eager ms/step | graph ms/step | ratio median | min | max | CPU-time ratio (min-max) "
               "| host ms/step eager | graph | host ratio (min-max) | rounds | load avg |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for g in graph:
            h = g["host"]
            hs = ("%.4f | %.4f | %.3f (%.3f-%.3f)" % tuple(h)) if h and h[0] >= 0 else "- | - | -"
            md.append("| %s | %d | %.4f | %.4f | %.3f | %.3f | %.3f | %s | %s | %d | %.1f |" % (
                g["backend"], g["n"], g["eager"], g["graph"], g["med"], g["lo"], g["hi"], g["cpu"], hs, g["rounds"],
                g["load"]))
        md.append("")
    if oprows:
        md += ops_section(oprows, opskip)
    gsteps, gvals, _ = gpt_rows(raw)
    if gsteps or gvals:
        md += gpt_md(gsteps, gvals, load)
    if skips:
        md += ["## Skipped", ""] + ["- " + s for s in skips] + [""]

    # plots
    pngs = []
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        ops = [op for op in ("allreduce", "allgather", "reducescatter", "broadcast", "alltoall")
               if any(c["op"] == op and c["backend"] == "cpu" for c in coll)]
        if ops:
            fig, axs = plt.subplots(1, len(ops), figsize=(4.2 * len(ops), 4.2), squeeze=False)
            for ax, op in zip(axs[0], ops):
                for n in sorted({c["n"] for c in coll if c["op"] == op and c["backend"] == "cpu"}):
                    pts = sorted((c["bytes"], c["busbw"], c["busbw"] * 100.0 / c["pct"] if c["pct"] > 0 else None)
                                 for c in coll if c["backend"] == "cpu" and c["op"] == op and c["n"] == n)
                    line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", ms=3, label="dpar n=%d" % n)
                    ax.plot([p[0] for p in pts if p[2]], [p[2] for p in pts if p[2]], "--", color=line.get_color(),
                            label="limit n=%d" % n)
                if op == "allreduce":
                    for n in sorted({p["n"] for p in pairs}):
                        pts = sorted((b, v[4]) for (nn, b), v in ratios_mpi.items() if nn == n)
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], ":x", ms=4, label="MPI n=%d" % n)
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_xlabel("bytes")
                ax.set_ylabel("busbw (GB/s)")
                ax.set_title(op)
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=6)
            fig.tight_layout()
            fig.savefig(os.path.join(out, "busbw.png"), dpi=100)
            pngs.append("busbw.png")
        if train:
            keys = sorted({(t["model"], t["n"]) for t in train})
            fws = sorted({t["fw"] for t in train})
            fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(keys)), 4))
            for i, fw in enumerate(fws):
                ys = [next((t["ms"] for t in train if t["fw"] == fw and (t["model"], t["n"]) == k), 0) for k in keys]
                ax.bar([x + 0.8 * i / len(fws) for x in range(len(keys))], ys, 0.8 / len(fws), label=fw)
            ax.set_xticks(range(len(keys)))
            ax.set_xticklabels(["%s %ddev" % k for k in keys], fontsize=7)
            ax.set_yscale("log")
            ax.set_ylabel("step time (ms)")
            ax.legend()
            fig.tight_layout()
            fig.savefig(os.path.join(out, "train.png"), dpi=100)
            pngs.append("train.png")
        md += ["![%s](%s)" % (p, p) for p in pngs] + [""]
    except Exception as e:  # no matplotlib: the tables still stand
        md += ["(no plots: %s)" % e, ""]

    # summary and the limit check
    parts = []
    for n in sorted({n for n, _ in ratios_mpi}):
        rs = [v[0] for (nn, b), v in ratios_mpi.items() if nn == n and b >= (1 << 20)]
        if rs:
            parts.append("allreduce dpar/MPI n=%d >=1MB median %.1fx (min %.1fx)" % (n, med(rs), min(rs)))
    for op in ("allreduce", "allgather", "reducescatter", "broadcast", "alltoall"):
        ps = [c["pct"] for c in coll if c["backend"] == "cpu" and c["op"] == op and c["bytes"] >= (1 << 20)]
        if ps:
            parts.append("%s >=1MB %.0f-%.0f%% of limit" % (op, min(ps), max(ps)))
    small = [m["ratio"] for m in mm if m["threads"] == 1]
    large = [m["ratio"] for m in mm if m["threads"] > 1]
    if small:
        parts.append("matmul/OpenBLAS per-device shapes median %.2f (min %.2f)" % (med(small), min(small)))
    if large:
        parts.append("large %.2f" % med(large))
    for model in models:
        rr = ["%ddev %.2f" % (n, r) for (m, n), r in sorted(ratios.items()) if m == model]
        if rr:
            parts.append("%s step dpar/JAX: %s" % (model, ", ".join(rr)))
    parts += gpt_summary(gsteps)
    parts.append("load %s" % load.get("start", "?"))
    for g in graph:
        host = g["host"]
        parts.append("digits graph/eager %s %ddev %.2f (%.2f-%.2f%s, load %.1f)" % (
            g["backend"], g["n"], g["med"], g["lo"], g["hi"],
            "; host time %.2f, %.2f-%.2f" % tuple(host[2:5]) if host and host[2] >= 0 else "", g["load"]))
    for backend in sorted({o["backend"] for o in oprows}):
        rows = [o for o in oprows if o["backend"] == backend]
        worst = sorted(rows, key=lambda o: o["pct"])[:3]
        parts.append("ops %s: %d rows, median %.3g%% of limit, worst %s" % (
            backend, len(rows), med([o["pct"] for o in rows]),
            ", ".join("%s %.3g%%" % (o["op"], o["pct"]) for o in worst)))
    summary = "summary: " + ("; ".join(parts) if parts else "no results")
    md += ["", "`" + summary + "`", ""]
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(md))
    print("bench: wrote %s/{collectives.csv,matmul.csv,train.csv,ops.csv,results.md%s}" % (
        out, "".join("," + p for p in pngs)))
    over = [c for c in coll if c["pct"] > 100.0]
    for c in over:
        print("bench: FAIL %s %s n=%d %s at %.0f%% of its memory-traffic limit: above 100%% is impossible, the "
              "measurement is broken" % (c["backend"], c["op"], c["n"], human(c["bytes"]), c["pct"]))
    over_ops = [o for o in oprows if o["ps"] > 100.0]
    for o in over_ops:
        print("bench: FAIL %s %s %s (%s) at %.0f%% of its memory-traffic limit: above 100%% is impossible, the "
              "measurement is broken" % (o["backend"], o["op"], o["dtype"], o["shape"], o["ps"]))
    print(summary)
    return 1 if over or over_ops else 0


if __name__ == "__main__":
    sys.exit(main())
