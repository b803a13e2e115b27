/* flags.h — the one "--flag value" parser (ex_parse) of the examples and the
   benchmarks: a table of flags, each with its type, range and default;
   --help (or -h) prints them to stdout and exits 0, an unknown flag or a
   missing, malformed or out-of-range value prints what is wrong and the
   usage to stderr and exits 2. Included by example_util.h and by the
   bench/ programs (not compiled on its own). */
#ifndef DPAR_EX_FLAGS_H
#define DPAR_EX_FLAGS_H
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One "--name value" flag of an example: its name, where the value goes, the
   values it takes and, for --help, how to say so. */
typedef enum { EX_INT, EX_FLOAT, EX_STR } ex_flag_type;
typedef struct ex_flag {
    const char *name;  /* "--epochs" */
    ex_flag_type type; /* EX_INT: dst is an int *, EX_FLOAT: a float *, EX_STR: a const char ** */
    void *dst;         /* keeps its value (the default) unless the flag is given */
    int lo, hi;        /* EX_INT: the accepted range, inclusive (0, 1: an on/off switch) */
    const char *range; /* --help: the values it takes (EX_INT: NULL, said from lo and hi) */
    const char *dflt;  /* --help: the default when it is not dst's value (NULL: dst's value) */
} ex_flag;
/* Table entries: an integer in [lo, hi]; a float or a string, with the values
   they take as --help says them ("a finite number > 0", "cpu|vulkan|cuda");
   EX_FLAG: any entry, with the default --help prints ("--dp x --tp"). */
#define EX_I(name, dst, lo, hi) \
    { name, EX_INT, dst, lo, hi, NULL, NULL }
#define EX_F(name, dst, range) \
    { name, EX_FLOAT, dst, 0, 0, range, NULL }
#define EX_S(name, dst, range) \
    { name, EX_STR, dst, 0, 0, range, NULL }
#define EX_FLAG(name, type, dst, lo, hi, range, dflt) \
    { name, type, dst, lo, hi, range, dflt }
/* ex_parse's status after --help printed the flags: main returns 0 (ex_exit_status). */
#define EX_HELP (-1)
/* The exit status for a parser's result: 0 after --help (EX_HELP), else the result (2: a usage error). */
static inline int ex_exit_status(int parsed) {
    return parsed == EX_HELP ? 0 : parsed;
}

/* Prints "<prog>: <what>" and the flags of the table to stderr; returns 2 (a usage error). */
static inline int ex_usage(const char *prog, const char *what, const char *arg, const ex_flag *flags, int n) {
    fprintf(stderr, "%s: %s%s\nusage: %s", prog, what, arg ? arg : "", prog);
    for (int k = 0; k < n && flags[k].name; k++)
        fprintf(stderr, " [%s %s]", flags[k].name, flags[k].type == EX_STR ? "S" : flags[k].type == EX_INT ? "N" : "X");
    fprintf(stderr, " (--help: each flag's values and default)\n");
    return 2;
}

/* An integer range as --help says it: "0 or 1 (off/on)", "an integer >= 1", "an integer from 1 to 4096". */
static inline void ex_int_range(int lo, int hi, char *buf, size_t cap) {
    if (lo == 0 && hi == 1)
        snprintf(buf, cap, "0 or 1 (off/on)");
    else if (lo == INT_MIN && hi == INT_MAX)
        snprintf(buf, cap, "any integer");
    else if (hi == INT_MAX)
        snprintf(buf, cap, "an integer >= %d", lo);
    else
        snprintf(buf, cap, "an integer from %d to %d", lo, hi);
}

/* --help: "usage: <prog> [--flag value]..." then one line per flag, its
   values and its default (dst's value before any flag is read), to stdout;
   returns EX_HELP. */
static inline int ex_help(const char *prog, const ex_flag *flags, int n) {
    printf("usage: %s [--flag value]...\n", prog);
    for (int k = 0; k < n && flags[k].name; k++) {
        const ex_flag *f = &flags[k];
        char range[64], dflt[64];
        if (f->type == EX_INT) {
            ex_int_range(f->lo, f->hi, range, sizeof range);
            snprintf(dflt, sizeof dflt, "%d", *(const int *)f->dst);
        } else if (f->type == EX_FLOAT) {
            snprintf(range, sizeof range, "%s", f->range ? f->range : "a finite number");
            snprintf(dflt, sizeof dflt, "%g", (double)*(const float *)f->dst);
        } else {
            const char *v = *(const char *const *)f->dst;
            snprintf(range, sizeof range, "%s", f->range ? f->range : "a string");
            snprintf(dflt, sizeof dflt, "%s", v ? (*v ? v : "''") : "none");
        }
        char flag[40];
        snprintf(flag, sizeof flag, "%s %s", f->name, f->type == EX_STR ? "S" : f->type == EX_INT ? "N" : "X");
        printf("  %-20s %s (default %s)\n", flag, f->type == EX_INT && f->range ? f->range : range,
               f->dflt ? f->dflt : dflt);
    }
    return EX_HELP;
}

/* Prints "<prog>: <flag> <value>: <why>" (the value as typed) and returns 2 (a usage error). */
static inline int ex_bad_value(const char *prog, const char *flag, const char *value, const char *why) {
    fprintf(stderr, "%s: %s %s: %s\n", prog, flag, value, why);
    return 2;
}

/* An integer flag's value v (as typed; x as read, clamped by strtoll) outside
   [lo, hi]: prints the flag's own limit ("--epochs 0: must be >= 1", "--remat
   2: must be 0 (off) or 1 (on)"), or the whole range when the value is past
   what an int holds, and returns 2 (a usage error). */
static inline int ex_bad_int(const char *prog, const char *flag, const char *v, long long x, int lo, int hi) {
    char why[96];
    if (lo == 0 && hi == 1)
        snprintf(why, sizeof why, "must be 0 (off) or 1 (on)");
    else if (x < lo && lo > INT_MIN)
        snprintf(why, sizeof why, "must be >= %d", lo);
    else if (x > hi && hi < INT_MAX)
        snprintf(why, sizeof why, "must be <= %d", hi);
    else
        snprintf(why, sizeof why, "out of range; an integer from %d to %d", lo, hi);
    return ex_bad_value(prog, flag, v, why);
}

/* Parses argv[1..argc) as "--name value" pairs against flags[0..n) (a NULL
   name ends the table early). A number must be the whole token ("--epochs 3x"
   is refused) and fit its type: an int within the flag's [lo, hi], or a
   finite float ("inf" and "nan" are refused) of magnitude <= FLT_MAX ("--lr
   1e40" is refused as out of range, naming the value as typed, not passed on
   as inf; "--lr 1e-50", which rounds to 0, too); floats are read as double,
   then rounded to float. A value that begins with "--" is a flag, never a
   value ("--checkpoint --help" is refused, not a file named "--help"); "-1"
   is a value. A flag given twice keeps the last value. Returns 0;
   EX_HELP after --help (or -h) anywhere among the flags printed the flags
   with their defaults to stdout (ex_help: nothing else is parsed, so the
   defaults are the example's own); or 2 after printing the usage error to
   stderr (unknown flag, missing, malformed or out-of-range value). */
static inline int ex_parse(const char *prog, int argc, char **argv, const ex_flag *flags, int n) {
    for (int i = 1; i < argc; i += 2)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return ex_help(prog, flags, n);
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int k = 0;
        while (k < n && flags[k].name && strcmp(a, flags[k].name)) k++;
        if (k == n || !flags[k].name) return ex_usage(prog, "unknown flag ", a, flags, n);
        if (!v) return ex_usage(prog, "a value is missing after ", a, flags, n);
        if (!strncmp(v, "--", 2)) { /* "--checkpoint --help": a forgotten value, not a file named "--help" */
            char what[80];
            snprintf(what, sizeof what, "%.40s needs a value; got the flag ", a);
            return ex_usage(prog, what, v, flags, n);
        }
        if (flags[k].type == EX_STR) {
            *(const char **)flags[k].dst = v;
            continue;
        }
        char *end;
        errno = 0;
        if (flags[k].type == EX_INT) {
            long long x = strtoll(v, &end, 10);
            if (end == v || *end) return ex_bad_value(prog, a, v, "not an integer");
            if (errno == ERANGE || x < flags[k].lo || x > flags[k].hi)
                return ex_bad_int(prog, a, v, x, flags[k].lo, flags[k].hi);
            *(int *)flags[k].dst = (int)x;
        } else {
            double x = strtod(v, &end);
            if (end == v || *end) return ex_bad_value(prog, a, v, "not a number");
            if ((errno == ERANGE && isinf(x)) || (isfinite(x) && fabs(x) > FLT_MAX)) { /* would become inf */
                fprintf(stderr, "%s: %s %s: too large for a float (at most %g); %s\n", prog, a, v, (double)FLT_MAX,
                        flags[k].range ? flags[k].range : "a finite number"); /* the flag's own range, as --help */
                return 2;
            }
            if (!isfinite(x)) return ex_bad_value(prog, a, v, "not a finite number"); /* "inf", "nan" as typed */
            if (x != 0.0 && (float)x == 0.0f) { /* would be refused later as "0", not as typed */
                fprintf(stderr, "%s: %s %s: too small for a float (it rounds to 0)\n", prog, a, v);
                return 2;
            }
            *(float *)flags[k].dst = (float)x;
        }
    }
    return 0;
}

/* A comma-separated flag value ("--backend cpu,vulkan"): its next item, cut to cap - 1 bytes, into
   item and *list past it, and 1; 0 at the end of the list ("a,,b" holds an empty item). Not strtok:
   drivers use it too. */
static inline int ex_list_next(const char **list, char *item, size_t cap) {
    const char *q = *list;
    if (!*q) return 0;
    size_t len = strcspn(q, ",");
    snprintf(item, cap, "%.*s", (int)(len < cap ? len : cap - 1), q);
    *list = q + len + (q[len] == ',');
    return 1;
}

/* A duration flag's value t in seconds ("--time 0.2"): 0 when 0 < t <= EX_MAX_SECONDS; else prints
   why and returns 2 (a usage error). The cap keeps a typo ("--time 1e9") from running for decades;
   the parser has refused inf and nan already. */
#define EX_MAX_SECONDS 3600
static inline int ex_check_seconds(const char *prog, const char *flag, float t) {
    if (t > 0 && t <= EX_MAX_SECONDS) return 0;
    fprintf(stderr, "%s: %s %g: must be > 0 and at most %d (seconds)\n", prog, flag, (double)t, EX_MAX_SECONDS);
    return 2;
}

/* A range given as two flags ("--min 100 --max 10"): 0 when lo <= hi; else prints why and returns 2
   (a usage error), before anything runs or prints. */
static inline int ex_check_order(const char *prog, const char *lo_flag, int lo, const char *hi_flag, int hi) {
    if (lo <= hi) return 0;
    fprintf(stderr, "%s: %s %d is below %s %d; give %s >= %s\n", prog, hi_flag, hi, lo_flag, lo, hi_flag, lo_flag);
    return 2;
}

/* Was "--name" given on the command line (as a flag, not as another flag's value)? */
static inline int ex_given(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i += 2)
        if (!strcmp(argv[i], name)) return 1;
    return 0;
}

#endif /* DPAR_EX_FLAGS_H */
