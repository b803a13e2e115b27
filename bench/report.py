"""Turns the rows bench/run.sh collected into bench/results/collectives.csv,
train.csv, results.md and busbw.png, and prints the closing "summary:" line.

    python bench/report.py RAW_ROWS OUT_DIR

Rows (CSV, no header): coll|memcpy,backend,op,devices,bytes,time_us,algbw,busbw
                       train,framework,model,devices,batch,step_ms,samples_per_s[,note]
                       skip,what,reason
"""
import csv
import os
import sys


def human(b):
    for unit, k in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if b >= k and b % k == 0:
            return "%d %s" % (b // k, unit)
    return "%d B" % b


def main():
    raw, out = sys.argv[1], sys.argv[2]
    coll, train, skips = [], [], []
    with open(raw) as f:
        for line in f:
            r = line.strip().split(",")
            if not r or not r[0]:
                continue
            if r[0] in ("coll", "memcpy") and len(r) >= 8:
                coll.append(dict(kind=r[0], backend=r[1], op=r[2], n=int(r[3]), bytes=int(r[4]),
                                 us=float(r[5]), algbw=float(r[6]), busbw=float(r[7])))
            elif r[0] == "train" and len(r) >= 7:
                train.append(dict(fw=r[1], model=r[2], n=int(r[3]), batch=int(r[4]), ms=float(r[5]),
                                  sps=float(r[6]), note=r[7] if len(r) > 7 else ""))
            elif r[0] == "skip":
                skips.append(", ".join(r[1:]))

    with open(os.path.join(out, "collectives.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "backend", "op", "devices", "bytes", "time_us", "algbw_GBps", "busbw_GBps"])
        for c in coll:
            w.writerow([c["kind"], c["backend"], c["op"], c["n"], c["bytes"], c["us"], c["algbw"], c["busbw"]])
    with open(os.path.join(out, "train.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["framework", "model", "devices", "batch", "step_ms", "samples_per_s", "note"])
        for t in train:
            w.writerow([t["fw"], t["model"], t["n"], t["batch"], t["ms"], t["sps"], t["note"]])

    def get(backend, op, n, b, key="busbw"):
        for c in coll:
            if c["backend"] == backend and c["op"] == op and c["n"] == n and c["bytes"] == b:
                return c[key]
        return None

    sizes = sorted({c["bytes"] for c in coll if c["kind"] == "coll"})
    devs = sorted({c["n"] for c in coll if c["kind"] == "coll" and c["backend"] == "cpu"})
    md = ["# dpar benchmarks", "",
          "One run of `make bench` on this machine (%s). Bandwidths in GB/s (1e9 B/s), "
          "nccl-tests definitions: algbw = bytes / time; busbw = algbw x 2(n-1)/n (all-reduce), "
          "x (n-1)/n (all-gather, reduce-scatter), x 1 (broadcast). Each point is the best of 5 trials "
          "(STREAM's convention) for dpar, MPI and memcpy alike. memcpy = bytes copied per second "
          "(bytes read + written = 2x)." % os.uname().nodename, ""]
    md += ["## All-reduce busbw: dpar (CPU backend) vs Open MPI MPI_Allreduce", ""]
    hdr = ["size"]
    for n in devs:
        hdr += ["dpar n=%d" % n, "MPI n=%d" % n, "dpar/MPI n=%d" % n]
    hdr += ["memcpy 1 thr", "dpar n=2 / memcpy"]
    md += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for b in sizes:
        row = [human(b)]
        for n in devs:
            d, m = get("cpu", "allreduce", n, b), get("mpi", "allreduce", n, b)
            row += ["%.2f" % d if d is not None else "-", "%.2f" % m if m is not None else "-",
                    "%.1fx" % (d / m) if d and m else "-"]
        mc = get("host", "memcpy", 1, b)
        d2 = get("cpu", "allreduce", 2, b)
        row += ["%.2f" % mc if mc else "-", "%.0f%%" % (100 * d2 / mc) if d2 and mc else "-"]
        md.append("| " + " | ".join(row) + " |")
    md.append("")
    for op in ("allgather", "reducescatter", "broadcast"):
        if not any(c["op"] == op for c in coll):
            continue
        md += ["## %s busbw (dpar CPU backend)" % op, ""]
        hdr = ["size"] + ["n=%d" % n for n in devs]
        md += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
        for b in sizes:
            vals = [get("cpu", op, n, b) for n in devs]
            if all(v is None for v in vals):
                continue
            md.append("| " + " | ".join([human(b)] + ["%.2f" % v if v is not None else "-" for v in vals]) + " |")
        md.append("")
    if any(c["backend"] == "vulkan" for c in coll):
        md += ["## All-reduce busbw: Vulkan backend (host-staged) vs CPU backend", ""]
        vdevs = sorted({c["n"] for c in coll if c["backend"] == "vulkan"})
        hdr = ["size"]
        for n in vdevs:
            hdr += ["vulkan n=%d" % n, "cpu n=%d" % n, "vulkan/cpu n=%d" % n]
        md += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
        for b in sizes:
            row = [human(b)]
            for n in vdevs:
                v, c = get("vulkan", "allreduce", n, b), get("cpu", "allreduce", n, b)
                row += ["%.2f" % v if v is not None else "-", "%.2f" % c if c is not None else "-",
                        "%.2f" % (v / c) if v and c else "-"]
            md.append("| " + " | ".join(row) + " |")
        md.append("")
    mrows = [c for c in coll if c["kind"] == "memcpy"]
    if mrows:
        md += ["## memcpy bandwidth (the physical limit of a host reduction)", "",
               "| size | 1 thread | 2 threads |", "|---|---|---|"]
        for b in sorted({c["bytes"] for c in mrows}):
            a1, a2 = get("host", "memcpy", 1, b), get("host", "memcpy", 2, b)
            md.append("| %s | %s | %s |" % (human(b), "%.2f" % a1 if a1 else "-", "%.2f" % a2 if a2 else "-"))
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
    if skips:
        md += ["## Skipped", ""] + ["- " + s for s in skips] + [""]

    # plot
    png = os.path.join(out, "busbw.png")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 5.5))
        series = [("cpu", "allreduce", n, "dpar cpu all-reduce n=%d" % n, "-") for n in devs]
        series += [("mpi", "allreduce", n, "MPI_Allreduce n=%d" % n, "--") for n in devs]
        series += [("vulkan", "allreduce", n, "dpar vulkan all-reduce n=%d" % n, "-.") for n in (2, 4)]
        series += [("host", "memcpy", 1, "memcpy (1 thread)", ":")]
        for backend, op, n, label, style in series:
            pts = sorted((c["bytes"], c["busbw"]) for c in coll if c["backend"] == backend and c["op"] == op and c["n"] == n)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title("All-reduce bus bandwidth vs size (nccl-tests busbw)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(png, dpi=110)
        md += ["![busbw vs size](busbw.png)", ""]
    except Exception as e:  # no matplotlib: the tables still stand
        md += ["(no plot: %s)" % e, ""]

    # summary
    parts = []
    for n in (2, 4):
        rs = [(get("cpu", "allreduce", n, b) / get("mpi", "allreduce", n, b), b) for b in sizes
              if b >= (1 << 20) and get("cpu", "allreduce", n, b) and get("mpi", "allreduce", n, b)]
        if rs:
            lo = min(rs)
            parts.append("allreduce dpar/MPI n=%d >=1MB min %.1fx (at %s) median %.1fx" % (
                n, lo[0], human(lo[1]), sorted(r for r, _ in rs)[len(rs) // 2]))
    d64, m64 = get("cpu", "allreduce", 2, 64 << 20), get("host", "memcpy", 1, 64 << 20)
    if d64 and m64:
        parts.append("allreduce n=2 64MB = %.0f%% of memcpy" % (100 * d64 / m64))
    v16, c16 = get("vulkan", "allreduce", 2, 16 << 20), get("cpu", "allreduce", 2, 16 << 20)
    if v16 and c16:
        parts.append("vulkan/cpu allreduce n=2 16MB %.2f" % (v16 / c16))
    for model in models:
        rr = ["%ddev %.2f" % (n, r) for (m, n), r in sorted(ratios.items()) if m == model]
        if rr:
            parts.append("%s step dpar/JAX: %s" % (model, ", ".join(rr)))
    summary = "summary: " + ("; ".join(parts) if parts else "no results")
    md += ["", "`" + summary + "`", ""]
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md[:0]))
    print("bench: wrote %s/{collectives.csv,train.csv,results.md%s}" % (out, ",busbw.png" if os.path.exists(png) else ""))
    print(summary)


if __name__ == "__main__":
    main()
