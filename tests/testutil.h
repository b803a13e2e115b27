/* Shared helpers for the dpar test suite (cmocka). */
#ifndef DPAR_TESTUTIL_H
#define DPAR_TESTUTIL_H
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>
#define DPAR_INCLUDE_WINDOWS /* <windows.h> on Windows, as dpar.h's implementation includes it */
#include "dpar.h"

/* Windows (MinGW-w64 under wine, tests/test_windows.sh): the POSIX calls the
   tests use, on the C runtime and Win32. */
#if defined(_WIN32)
#include <direct.h>
#undef near /* <windows.h> defines these names, which the tests use */
#undef far
#undef IN
#undef OUT
#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif
#define _SC_NPROCESSORS_ONLN 84
static inline long sysconf(int name) { /* the count dpar's CPU backend uses */
    return name == _SC_NPROCESSORS_ONLN ? (long)GetActiveProcessorCount(ALL_PROCESSOR_GROUPS) : -1;
}
static inline int setenv(const char *k, const char *v, int overwrite) {
    if (!overwrite && getenv(k)) return 0;
    return _putenv_s(k, v) == 0 ? 0 : -1;
}
static inline int unsetenv(const char *k) {
    return _putenv_s(k, "") == 0 ? 0 : -1;
} /* "" removes it */
static inline char *mkdtemp(char *tmpl) {
    if (_mktemp_s(tmpl, strlen(tmpl) + 1) != 0) return NULL;
    return _mkdir(tmpl) == 0 ? tmpl : NULL;
}
static inline int symlink(const char *target, const char *link) {
    return CreateSymbolicLinkA(link, target, 0) ? 0 : -1;
}
#endif
/* A hang fails the binary instead of stalling the suite: t_watchdog(msg, s) writes msg to stderr and exits 2
   once the binary has run for s seconds (Windows has no SIGALRM: tests/test_windows.sh's timeout stops a hang
   there). msg must outlive the binary's run (a string literal). */
#include <signal.h>
#ifdef SIGALRM
#include <unistd.h>
static const char *t__watchdog_msg;
static size_t t__watchdog_len;
static inline void t__watchdog_fire(int sig) {
    (void)sig;
    if (write(2, t__watchdog_msg, t__watchdog_len) < 0) _exit(3);
    _exit(2);
}
#endif
static inline void t_watchdog(const char *msg, unsigned seconds) {
#ifdef SIGALRM
    t__watchdog_msg = msg;
    t__watchdog_len = strlen(msg);
    signal(SIGALRM, t__watchdog_fire);
    alarm(seconds);
#else
    (void)msg;
    (void)seconds;
#endif
}
/* The tests' random numbers: splitmix64 of *state (advanced), uniform in [-1, 1) on a 2^-52 grid. Each test
   file keeps its own state and seeds, so its values do not depend on the other files. */
static inline double t_splitmix(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 4503599627370496.0 - 1.0;
}
/* Removes folder `dir` and what is in it; 0 on success. */
static inline int t_remove_tree(const char *dir) {
    char cmd[1200];
#if defined(_WIN32)
    int n = snprintf(cmd, sizeof cmd, "rmdir /s /q \"%s\"", dir);
    for (int i = 0; i < n && i < (int)sizeof cmd; i++)
        if (cmd[i] == '/' && i > 12) cmd[i] = '\\';
#else
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
#endif
    return system(cmd) == 0 ? 0 : -1;
}

/* Fails the test with the status and dpar_last_error() when s != DPAR_OK. */
#define T_OK(expr)                                                                                         \
    do {                                                                                                   \
        dpar_status t__s = (expr);                                                                         \
        if (t__s != DPAR_OK) fail_msg("%s -> %s: %s", #expr, dpar_status_string(t__s), dpar_last_error()); \
    } while (0)
/* Expects status `want` and that the last error contains every given substring. */
#define T_ERR(expr, want, ...)                                                                              \
    do {                                                                                                    \
        dpar_status t__s = (expr);                                                                          \
        if (t__s != (want))                                                                                 \
            fail_msg("%s -> %s (wanted %s): %s", #expr, dpar_status_string(t__s), dpar_status_string(want), \
                     dpar_last_error());                                                                    \
        const char *t__subs[] = { __VA_ARGS__, NULL };                                                      \
        for (int t__i = 0; t__subs[t__i]; t__i++)                                                           \
            if (!strstr(dpar_last_error(), t__subs[t__i]))                                                  \
                fail_msg("%s: error text lacks \"%s\": %s", #expr, t__subs[t__i], dpar_last_error());       \
    } while (0)

/* The tests' runtime: n devices of backend k, a 20 s collective timeout. */
static inline dpar_runtime_desc t_runtime_desc(dpar_backend_kind k, int n) {
    dpar_runtime_desc d;
    memset(&d, 0, sizeof d);
    d.backend = k;
    d.num_devices = n;
    d.timeout_ms = 20000;
    return d;
}
/* Runtime with n devices of backend k (CPU unless said) and a 1-d mesh "data". */
static inline dpar_runtime *t_runtime(dpar_backend_kind k, int n) {
    dpar_runtime_desc d = t_runtime_desc(k, n);
    dpar_runtime *rt = NULL;
    T_OK(dpar_runtime_create(&d, &rt));
    return rt;
}
/* A 1-device CPU runtime with `threads` intra-op threads (DPAR_CPU_THREADS, read at create); the
   variable is put back as it was. */
static inline dpar_runtime *t_cpu_runtime_threads(const char *threads) {
    const char *old = getenv("DPAR_CPU_THREADS");
    char keep[32] = "";
    if (old) snprintf(keep, sizeof keep, "%s", old);
    setenv("DPAR_CPU_THREADS", threads, 1);
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 1);
    if (old)
        setenv("DPAR_CPU_THREADS", keep, 1);
    else
        unsetenv("DPAR_CPU_THREADS");
    return rt;
}
/* What dpar_graph_print writes for g (at most cap - 1 bytes), through a temporary file named after tag. */
static inline void t_graph_text(const dpar_graph *g, const char *tag, char *text, size_t cap) {
    char path[512];
    snprintf(path, sizeof path, "%s/dpar_%s.txt", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", tag);
    T_OK(dpar_graph_print(g, path));
    FILE *f = fopen(path, "r");
    size_t got = f ? fread(text, 1, cap - 1, f) : 0;
    text[got] = 0;
    if (f) fclose(f);
    remove(path);
}
static inline dpar_mesh *t_mesh(dpar_runtime *rt, int ndim, const int *shape, const char *const *names) {
    dpar_mesh_desc d;
    memset(&d, 0, sizeof d);
    d.ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        d.shape[i] = shape[i];
        d.axis_names[i] = names[i];
    }
    dpar_mesh *m = NULL;
    T_OK(dpar_mesh_create(rt, &d, &m));
    return m;
}
static inline dpar_mesh *t_mesh1(dpar_runtime *rt, int n, const char *axis) {
    return t_mesh(rt, 1, &n, &axis);
}
/* Is `name` listed in DPAR_REQUIRE_BACKENDS (comma separated)? Then a missing
   backend is a failure, not a skip. */
static inline int t_required(const char *name) {
    const char *r = getenv("DPAR_REQUIRE_BACKENDS");
    if (!r) return 0;
    size_t n = strlen(name);
    for (const char *p = r; (p = strstr(p, name)); p += n)
        if ((p == r || p[-1] == ',' || p[-1] == ' ') && (p[n] == 0 || p[n] == ',' || p[n] == ' ')) return 1;
    return 0;
}
/* Creates a runtime of backend k with n devices or skips (prints SKIPPED with
   the reason) / fails when the backend is required. Returns NULL after skip. */
static inline dpar_runtime *t_runtime_or_skip(dpar_backend_kind k, int n) {
    dpar_runtime_desc d = t_runtime_desc(k, n);
    dpar_runtime *rt = NULL;
    dpar_status s = dpar_runtime_create(&d, &rt);
    if (s == DPAR_OK) return rt;
    if (s == DPAR_ERR_BACKEND_UNAVAILABLE && !t_required(dpar_backend_name(k))) {
        printf("SKIPPED: %s backend unavailable: %s\n", dpar_backend_name(k), dpar_last_error());
        fflush(stdout);
        skip();
    }
    fail_msg("%s backend with %d devices: %s: %s", dpar_backend_name(k), n, dpar_status_string(s), dpar_last_error());
    return NULL;
}

/* Defines `static dpar_runtime *RT` and the cmocka group fixtures t_setup and
   t_teardown, which create a CPU runtime of n devices in RT and destroy it. */
#define T_CPU_FIXTURE(n)                       \
    static dpar_runtime *RT;                   \
    static int t_setup(void **st) {            \
        (void)st;                              \
        RT = t_runtime(DPAR_BACKEND_CPU, (n)); \
        return RT ? 0 : -1;                    \
    }                                          \
    static int t_teardown(void **st) {         \
        (void)st;                              \
        dpar_runtime_destroy(RT);              \
        RT = NULL;                             \
        return 0;                              \
    }

/* A buffer of rt's device `dev`, filled from `data` when it is not NULL. */
static inline dpar_buffer *t_buf(dpar_runtime *rt, int dev, dpar_dtype t, int ndim, const int64_t *shape,
                                 const void *data) {
    dpar_buffer *b = NULL;
    T_OK(dpar_buffer_create(rt, dev, t, ndim, shape, &b));
    if (data && dpar_buffer_nbytes(b)) T_OK(dpar_buffer_write(b, 0, data, dpar_buffer_nbytes(b)));
    return b;
}
/* Reads all of b into out (nothing for a NULL or empty buffer). */
static inline void t_read(const dpar_buffer *b, void *out) {
    if (b && out && dpar_buffer_nbytes(b)) T_OK(dpar_buffer_read(b, 0, out, dpar_buffer_nbytes(b)));
}
/* A 1-D buffer of n elements on rt's device 0 (see t_buf). */
static inline dpar_buffer *t_buf1(dpar_runtime *rt, dpar_dtype t, int64_t n, const void *data) {
    return t_buf(rt, 0, t, 1, &n, data);
}
/* The value of a one-element f32 / f64 buffer (a sum, a loss). */
static inline float t_value_f32(const dpar_buffer *b) {
    float v;
    assert_int_equal(dpar_buffer_nbytes(b), sizeof v);
    t_read(b, &v);
    return v;
}
static inline double t_value_f64(const dpar_buffer *b) {
    double v;
    assert_int_equal(dpar_buffer_nbytes(b), sizeof v);
    t_read(b, &v);
    return v;
}
/* The bits of an f32, and back. */
static inline uint32_t t_f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float t_u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Mesa's lavapipe (llvmpipe) leaks about 128 bytes per VkDevice from its
   JIT-compiled code, which LeakSanitizer reports from an "unknown module"
   that no suppression pattern can match (the driver is unloaded by then). In
   ASan builds, the exit-time leak check is therefore skipped for a test
   binary that loaded llvmpipe's LLVM (libLLVM stays mapped after the driver is
   unloaded; seen in /proc/self/maps); binaries that never opened a Vulkan
   device keep the check, and every other ASan/UBSan check stays on. */
#if defined(__SANITIZE_ADDRESS__)
#define T_LSAN_HOOK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define T_LSAN_HOOK 1
#endif
#endif
#ifdef T_LSAN_HOOK
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, "libLLVM") != NULL;
    if (f) fclose(f);
    return found;
}
#endif
#endif
