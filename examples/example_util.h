/* example_util.h — what every example shares: CHECK, TRY, the --backend
   name, and the one "--flag value" parser (ex_parse, in flags.h, which the
   bench/ programs share) that the digits examples (through digits_parse),
   train_cnn and the others build their flags on.
   Included by the examples (not compiled on its own). */
#ifndef EXAMPLE_UTIL_H
#define EXAMPLE_UTIL_H
#include "dpar.h"
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* --backend NAME -> the backend kind ("cpu", "vulkan", "cuda"); an unknown
   name prints the library's error and exits with status 2 (a usage error). */
static inline dpar_backend_kind parse_backend(const char *s) {
    dpar_backend_kind k;
    if (dpar_backend_from_name(s, &k) == DPAR_OK) return k;
    fprintf(stderr, "%s\n", dpar_last_error());
    exit(2);
}

/* Host code: a failing call prints where, the status and the library's text, and exits. */
#define CHECK(call)                                                                                     \
    do {                                                                                                \
        dpar_status s_ = (call);                                                                        \
        if (s_ != DPAR_OK) {                                                                            \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, dpar_status_string(s_), \
                    dpar_last_error());                                                                 \
            exit(1);                                                                                    \
        }                                                                                               \
    } while (0)
/* Inside a per-device function: return the status, pmap reports it. */
#define TRY(call)                     \
    do {                              \
        dpar_status s_ = (call);      \
        if (s_ != DPAR_OK) return s_; \
    } while (0)

/* the flags: ex_parse and its table (flags.h, shared with bench/) */
#include "flags.h"

/* The last component of a path ("examples/data/mnist_5k.csv.gz" -> "mnist_5k.csv.gz"), for output lines. */
static inline const char *ex_basename(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* ----------------------------------------------------------------- checks */
/* What the examples refuse up front or stop on, each with a message naming
   the flag, the value and the limit, and a non-zero exit status. */

/* --batch against the rows there are: 0 when 1 <= batch <= rows; else prints
   why (a batch larger than the data would run 0 steps and average nothing)
   and returns 2 (a usage error). */
static inline int ex_check_batch(const char *prog, int batch, int rows, const char *what) {
    if (batch >= 1 && batch <= rows) return 0;
    fprintf(stderr, "%s: --batch %d is larger than the %d %s; use --batch %d or less\n", prog, batch, rows, what, rows);
    return 2;
}

/* A learning-rate flag: 0 when finite and >= 0 (> 0 with positive_only); else prints why and returns 2. */
static inline int ex_check_lr(const char *prog, const char *flag, float lr, int positive_only) {
    if (isfinite(lr) && (positive_only ? lr > 0.0f : lr >= 0.0f)) return 0;
    fprintf(stderr, "%s: %s %g: must be a finite number %s\n", prog, flag, (double)lr, positive_only ? "> 0" : ">= 0");
    return 2;
}

/* The loss of training step `step` (1-based over the run; epoch 0: no
   epochs): 0 when finite; else prints where training diverged and returns 1,
   main's exit status (a NaN or inf loss never becomes a "final:" line). */
static inline int ex_check_loss(const char *prog, double loss, long long step, int epoch, double lr) {
    if (isfinite(loss)) return 0;
    if (epoch > 0)
        fprintf(stderr, "%s: the training loss is %g at step %lld (epoch %d): training diverged; lower --lr (%g)\n",
                prog, loss, step, epoch, lr);
    else
        fprintf(stderr, "%s: the training loss is %g at step %lld: training diverged; lower --lr (%g)\n", prog, loss,
                step, lr);
    return 1;
}

/* Can `path` be written (a file in an existing, writable directory, not a
   directory itself)? 0 if so; else prints why, naming `flag`, and returns 2.
   Checked before training, not after the first epoch's work. */
static inline int ex_check_writable(const char *prog, const char *flag, const char *path) {
    struct stat st;
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!*path || strlen(path) >= sizeof dir) {
        fprintf(stderr, "%s: %s '%s': give a file path (at most %zu characters)\n", prog, flag, path, sizeof dir - 1);
        return 2;
    }
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: %s %s is a directory; give a file path in it\n", prog, flag, path);
        return 2;
    }
    if (!slash)
        strcpy(dir, ".");
    else if (slash == path)
        strcpy(dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if (access(dir, W_OK | X_OK)) {
        fprintf(stderr, "%s: %s %s: cannot write in directory %s: %s; create it or choose another path\n", prog, flag,
                path, dir, strerror(errno));
        return 2;
    }
    return 0;
}

/* Can `path` be read as a --data file? 0 if so (or if stat cannot tell:
   opening it then says why); -1 after printing that it is a directory, which
   zlib would report as corrupt gzip data. */
static inline int ex_check_data_file(const char *prog, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    fprintf(stderr, "%s: --data %s is a directory; give the path of a data file\n", prog, path);
    return -1;
}

/* The first bytes of p[0..len) (at most 20) for an error message: printable
   ASCII as is, other bytes as \xNN, "..." when cut; always 0-terminated.
   A binary --data file then shows "\x1f\x8b", not raw bytes on the terminal. */
static inline const char *ex_excerpt(const char *p, size_t len, char *buf, size_t cap) {
    size_t at = 0, k = 0;
    for (; k < len && k < 20 && at + 5 < cap; k++) {
        unsigned char c = (unsigned char)p[k];
        at += (size_t)snprintf(buf + at, cap - at, c >= 32 && c < 127 && c != '\\' ? "%c" : "\\x%02x", c);
    }
    if (k < len && at + 4 < cap) at += (size_t)snprintf(buf + at, cap - at, "...");
    buf[at < cap ? at : cap - 1] = 0;
    return buf;
}

/* One CSV row of `n` integers: fields 0..n-2 pixels in [0, pix_max] (x[j] =
   v / scale), field n-1 the label in [0, label_max] (*y). Blank lines are the
   caller's to skip. 0 on success; else prints "<prog>: <path> line L field F:
   what is wrong" (a field that is not a whole integer in range, "1.5" or
   "999", is quoted, its bytes escaped: ex_excerpt) and returns -1, so a
   malformed file says where, not only that it could not be read. */
static inline int ex_csv_row(const char *prog, const char *path, long line_no, const char *line, int n, long pix_max,
                             long label_max, float scale, float *x, int32_t *y) {
    const char *p = line;
    char text[96]; /* an excerpt of a bad field (ex_excerpt) */
    for (int j = 0; j < n; j++) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10), max = j < n - 1 ? pix_max : label_max;
        const char *what = j < n - 1 ? "pixel" : "label";
        /* the integer must be the whole field: "1.5" is a bad value, not a row that ends after "1" */
        int whole = end != p && (!*end || strchr(",\r\n \t", *end));
        if (!whole || errno || v < 0 || v > max) {
            int len = (int)strcspn(p, ",\r\n");
            if (end == p && len == 0 && *p != ',')
                fprintf(stderr, "%s: %s line %ld has %d field(s); want %d (%d pixels and a label)\n", prog, path,
                        line_no, j, n, n - 1);
            else if (end == p && len == 0)
                fprintf(stderr, "%s: %s line %ld field %d is empty; want a %s in 0..%ld\n", prog, path, line_no, j + 1,
                        what, max);
            else
                fprintf(stderr, "%s: %s line %ld field %d: '%s' is not a %s (an integer in 0..%ld)\n", prog, path,
                        line_no, j + 1, ex_excerpt(p, (size_t)len, text, sizeof text), what, max);
            return -1;
        }
        if (j < n - 1)
            x[j] = (float)v / scale;
        else
            *y = (int32_t)v;
        if (j < n - 1 && *end != ',') {
            fprintf(stderr, "%s: %s line %ld has %d field(s); want %d (%d pixels and a label)\n", prog, path, line_no,
                    j + 1, n, n - 1);
            return -1;
        }
        p = end + (j < n - 1);
    }
    p += strspn(p, " \t\r\n");
    if (*p) {
        fprintf(stderr, "%s: %s line %ld has more than %d fields (after the label: '%s')\n", prog, path, line_no, n,
                ex_excerpt(p, strcspn(p, "\r\n"), text, sizeof text));
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- monitor */
/* --monitor 1: after each epoch (train_gpt: with each training-loss line), one line per device of this process from
   dpar_runtime_device_stats over the epoch's window, then a new window:
   the shares of the window spent in ops, in collectives (waiting included)
   and in host <-> device copies, the rest idle (asynchronous collectives
   overlap ops, so the shares may add up to more than 100%); memory now and its peak;
   on NVIDIA, NVML's utilization, temperature and power. A straggler shows as
   the device that waits least in collectives. */
static inline void ex_monitor(dpar_runtime *rt) {
    for (int d = 0; d < dpar_runtime_device_count(rt); d++) {
        dpar_device_stats st;
        if (dpar_runtime_device_stats(rt, d, &st) != DPAR_OK) continue; /* another process's device */
        double w = st.window_s > 0 ? st.window_s : 1, idle = w - st.compute_s - st.collective_s - st.transfer_s;
        printf("monitor: device %d  compute %5.1f%%  collective %5.1f%%  transfer %5.1f%%  idle %5.1f%%  "
               "memory %.1f MiB (peak %.1f)",
               d, 100 * st.compute_s / w, 100 * st.collective_s / w, 100 * st.transfer_s / w,
               idle > 0 ? 100 * idle / w : 0.0, (double)st.memory_in_use / 1048576, (double)st.memory_peak / 1048576);
        if (st.gpu_util_pct >= 0) printf("  gpu %d%%", st.gpu_util_pct);
        if (st.temperature_c >= 0) printf("  %d C", st.temperature_c);
        if (st.power_w >= 0) printf("  %.0f W", st.power_w);
        printf("\n");
    }
    dpar_runtime_stats_reset(rt);
}

/* ---------------------------------------------------------------- replicas */
/* Are the replicas of every shard of `a` bitwise identical across the mesh?
   Two devices hold the same block when they share the coordinates of every
   mesh axis in a's spec; each such pair is read back and compared. */
static inline int ex_replicas_identical(dpar_mesh *mesh, dpar_array *a) {
    int n = dpar_mesh_size(mesh), ok = 1;
    size_t nb = dpar_buffer_nbytes(dpar_array_shard(a, 0));
    char *x = (char *)malloc(nb ? nb : 1), *y = (char *)malloc(nb ? nb : 1); /* C++ too (engine_vulkan) */
    for (int i = 0; i < n && ok; i++)
        for (int j = i + 1; j < n && ok; j++) {
            int ci[DPAR_MAX_AXES], cj[DPAR_MAX_AXES], same = 1;
            dpar_mesh_coords(mesh, i, ci);
            dpar_mesh_coords(mesh, j, cj);
            for (int d = 0; d < dpar_array_ndim(a); d++) {
                char spec[64];
                dpar_array_spec(a, d, spec, sizeof spec);
                for (int ax = 0; ax < dpar_mesh_ndim(mesh); ax++)
                    if (strstr(spec, dpar_mesh_axis_name(mesh, ax)) && ci[ax] != cj[ax]) same = 0;
            }
            if (!same) continue;
            dpar_buffer_read(dpar_array_shard(a, i), 0, x, nb);
            dpar_buffer_read(dpar_array_shard(a, j), 0, y, nb);
            if (memcmp(x, y, nb)) ok = 0;
        }
    free(x);
    free(y);
    return ok;
}

/* ----------------------------------------------------------------- memory */
/* --memory 1: the training graph's memory on device 0 against its plan
   (dpar_graph_stats; the issue 17 target: measured within 1.1x of the
   planned live set). ex_memory_now before building the graph and after its
   compile gives the bytes the graph allocated; ex_memory_now again with
   reset set, right before the first step, starts a stats window; after that
   step ex_memory_report adds what the step held above that (op temporaries)
   and prints one "memory:" line. Device 0 only: one process's view. */
typedef struct ex_memory {
    uint64_t base, graph, step; /* in use before the graph; allocated by it; in use as the step began */
} ex_memory;
static inline uint64_t ex_memory_now(dpar_runtime *rt, int reset) {
    dpar_device_stats st;
    if (reset) dpar_runtime_stats_reset(rt);
    return dpar_runtime_device_stats(rt, 0, &st) == DPAR_OK ? st.memory_in_use : 0;
}
static inline void ex_memory_report(dpar_runtime *rt, const ex_memory *m, const dpar_graph_stats *gs) {
    dpar_device_stats st;
    if (dpar_runtime_device_stats(rt, 0, &st) != DPAR_OK) return;
    const double mb = 1048576.0;
    uint64_t live = gs->live_bytes + gs->resident_bytes + gs->opt_bytes, peak = m->graph + (st.memory_peak - m->step);
    printf("memory: device 0: measured peak %.2f MiB = %.3fx the planned live set %.2f MiB (node buffers live at "
           "once %.2f, feeds %.2f, optimizer %.2f); allocated %.2f (node buffers %.2f, one per node %.2f); "
           "params %.2f not counted\n",
           (double)peak / mb, live ? (double)peak / (double)live : 0.0, (double)live / mb, (double)gs->live_bytes / mb,
           (double)gs->resident_bytes / mb, (double)gs->opt_bytes / mb, (double)m->graph / mb,
           (double)gs->planned_bytes / mb, (double)gs->naive_bytes / mb, (double)m->base / mb);
}

#endif
