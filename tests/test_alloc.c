/* The allocator hooks: every host allocation of the library goes through
   DPAR_MALLOC / DPAR_FREE (CPU-backend device buffers too, through the default
   DPAR_ALIGNED_MALLOC). This file holds its own implementation (CPU backend
   only) with a counting allocator, so it is built without build/dpar.o. */
#include <stdlib.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* counting allocator: a 16-byte header keeps each block's size */
static size_t t_live, t_total, t_calls;
/* Address reuse on demand, as any allocator may do it: the block at t_want, each time it is freed, is kept
   and handed to the next request of its size (test_param_address_reused). */
static void *t_want, *t_kept;
static size_t t_kept_size;
static void *t_malloc(size_t n) {
    void *kept = __atomic_load_n(&t_kept, __ATOMIC_ACQUIRE);
    if (!kept || t_kept_size != n ||
        !__atomic_compare_exchange_n(&t_kept, &kept, NULL, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        kept = malloc(n + 16);
    unsigned char *p = (unsigned char *)kept;
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    __atomic_add_fetch(&t_live, n, __ATOMIC_RELAXED);
    __atomic_add_fetch(&t_total, n, __ATOMIC_RELAXED);
    __atomic_add_fetch(&t_calls, 1, __ATOMIC_RELAXED);
    return p + 16;
}
static void t_free(void *q) {
    if (!q) return;
    unsigned char *p = (unsigned char *)q - 16;
    size_t n;
    memcpy(&n, p, sizeof n);
    __atomic_sub_fetch(&t_live, n, __ATOMIC_RELAXED);
    if (q == __atomic_load_n(&t_want, __ATOMIC_ACQUIRE)) {
        t_kept_size = n;
        __atomic_store_n(&t_kept, p, __ATOMIC_RELEASE);
        return;
    }
    free(p);
}
static void *t_realloc(void *q, size_t n) {
    void *r = t_malloc(n);
    if (r && q) {
        size_t old;
        memcpy(&old, (unsigned char *)q - 16, sizeof old);
        memcpy(r, q, old < n ? old : n);
    }
    if (r) t_free(q);
    return r;
}
#define DPAR_MALLOC(sz)     t_malloc(sz)
#define DPAR_FREE(p)        t_free(p)
#define DPAR_REALLOC(p, sz) t_realloc(p, sz)
#define DPAR_IMPLEMENTATION
#include "testutil.h"

/* a 64 MiB CPU buffer is seen by the hooks, 64-byte aligned, and given back */
static void test_cpu_buffer_through_hooks(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 1);
    size_t live0 = __atomic_load_n(&t_live, __ATOMIC_RELAXED), total0 = __atomic_load_n(&t_total, __ATOMIC_RELAXED);
    int64_t shape[1] = { (int64_t)16 << 20 }; /* 16 Mi f32 = 64 MiB */
    dpar_buffer *b = NULL;
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 1, shape, &b));
    size_t seen = __atomic_load_n(&t_total, __ATOMIC_RELAXED) - total0;
    size_t live1 = __atomic_load_n(&t_live, __ATOMIC_RELAXED);
    printf("64 MiB CPU buffer: the hooks saw %zu bytes\n", seen);
    assert_true(seen >= (size_t)64 << 20);
    float v = 1.0f;
    T_OK(dpar_fill(b, 2.5f));
    T_OK(dpar_buffer_read(b, ((size_t)16 << 20) * 4 - 4, &v, 4));
    assert_true(v == 2.5f);
    dpar_buffer_destroy(b);
    /* given back (the workers may free small blocks of their own meanwhile: no equality here) */
    assert_true(live1 >= live0 + ((size_t)64 << 20));
    assert_true(__atomic_load_n(&t_live, __ATOMIC_RELAXED) + ((size_t)64 << 20) <= live1);
    dpar_runtime_destroy(rt);
}

/* the default aligned allocator: aligned, through DPAR_MALLOC, freed by DPAR_FREE */
static void test_aligned_default(void **state) {
    (void)state;
    size_t live0 = __atomic_load_n(&t_live, __ATOMIC_RELAXED);
    for (size_t align = 1; align <= 4096; align *= 2) {
        void *p = DPAR_ALIGNED_MALLOC(1000, align);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % align, 0);
        memset(p, 0xab, 1000);
        assert_true(__atomic_load_n(&t_live, __ATOMIC_RELAXED) >= live0 + 1000);
        DPAR_ALIGNED_FREE(p);
    }
    DPAR_ALIGNED_FREE(NULL);
    assert_int_equal(__atomic_load_n(&t_live, __ATOMIC_RELAXED), live0);
}

/* one SGD step clipped by the global norm over "data" on each device: the clip's scratch stays with the runtime */
static dpar_status clipped_step(dpar_ctx *ctx, void *user) {
    (void)user;
    int64_t n = 64;
    dpar_buffer *p = NULL, *g = NULL;
    dpar_status s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &n, &p);
    if (!s) s = dpar_ctx_buffer(ctx, DPAR_F32, 1, &n, &g);
    if (!s) s = dpar_fill(p, 1.0f);
    if (!s) s = dpar_fill(g, 2.0f);
    dpar_sgd_desc d = { .learning_rate = 0.5f, .clip_norm = 1.0f, .norm_axes = "data" };
    if (!s) s = dpar_sgd_step(ctx, &d, &p, &g, NULL, 1);
    dpar_buffer_destroy(p);
    dpar_buffer_destroy(g);
    return s;
}
/* a whole runtime's life (workers, meshes, a training-sized op, a clipped step) leaves nothing behind */
static void test_runtime_life_balanced(void **state) {
    (void)state;
    size_t live0 = __atomic_load_n(&t_live, __ATOMIC_RELAXED), calls0 = __atomic_load_n(&t_calls, __ATOMIC_RELAXED);
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    int64_t shape[2] = { 256, 256 };
    dpar_buffer *a = NULL, *c = NULL;
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, shape, &a));
    T_OK(dpar_buffer_create(rt, 0, DPAR_F32, 2, shape, &c));
    T_OK(dpar_fill(a, 1.0f));
    T_OK(dpar_matmul(c, a, a, false, false, 1.0f, 0.0f)); /* packs through DPAR_ALIGNED_MALLOC */
    float v = 0;
    T_OK(dpar_buffer_read(c, 0, &v, 4));
    assert_true(v == 256.0f);
    dpar_buffer_destroy(a);
    dpar_buffer_destroy(c);
    dpar_pmap_desc pd = { .axis = "data", .fn = clipped_step };
    T_OK(dpar_pmap(m, &pd));
    dpar_mesh_destroy(m);
    dpar_runtime_destroy(rt);
    printf("runtime life: %zu allocations through the hooks\n", __atomic_load_n(&t_calls, __ATOMIC_RELAXED) - calls0);
    assert_int_equal(__atomic_load_n(&t_live, __ATOMIC_RELAXED), live0);
}

/* A graph's param destroyed, then a new array made at its address: the graph must refuse to run (it went by
   address and wrote through the old array's freed shards; the uid recorded at dpar_g_param tells them apart).
   The hooks hand the param's block to the next allocation of its size, so the address comes back here for
   sure (test_lifetime's version depends on the system allocator's order). */
static void test_param_address_reused(void **state) {
    (void)state;
    dpar_runtime *rt = t_runtime(DPAR_BACKEND_CPU, 2);
    dpar_mesh *m = t_mesh1(rt, 2, "data");
    dpar_array_desc pd = { .dtype = DPAR_F32, .ndim = 1, .shape = { 4 } };
    dpar_array_desc xd = { .dtype = DPAR_F32, .ndim = 2, .shape = { 2, 4 }, .spec = { "data" } };
    dpar_array *w = NULL, *reused = NULL;
    T_OK(dpar_array_create(m, &pd, &w));
    dpar_graph *g = NULL;
    T_OK(dpar_graph_create(m, &g));
    dpar_value x = dpar_g_feed(g, "x", &xd), pw = dpar_g_param(g, "w", w), gw;
    dpar_value loss = dpar_g_sum(g, dpar_g_matmul(g, x, dpar_g_reshape(g, pw, 2, (int64_t[]){ 4, 1 }), false, false));
    T_OK(dpar_graph_value_and_grad(g, loss, &pw, 1, &gw));
    T_OK(dpar_graph_sgd(g, &(dpar_sgd_desc){ .learning_rate = 0.1f }, &pw, &gw, 1));
    float xs[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, l = 0.0f;
    dpar_graph_feed f = { x, xs, NULL };
    T_OK(dpar_graph_run(g, &f, 1, &l));
    void *old = w;
    __atomic_store_n(&t_want, old, __ATOMIC_RELEASE);
    T_OK(dpar_array_destroy(w));
    /* the registry keeps the last 256 destroyed addresses from new objects: destroy more until w's block is free */
    for (int i = 0; i < 4096 && !reused; i++) {
        dpar_array *t = NULL;
        T_OK(dpar_array_create(m, &pd, &t));
        if ((void *)t == old)
            reused = t;
        else
            T_OK(dpar_array_destroy(t));
    }
    __atomic_store_n(&t_want, NULL, __ATOMIC_RELEASE);
    if (!reused) fail_msg("%s", "no new array took the destroyed param's address in 4096 arrays");
    T_ERR(dpar_graph_run(g, &f, 1, &l), DPAR_ERR_STATE, "dpar_graph_run: param 'w' (node 2): its array was destroyed",
          "nothing was done");
    T_OK(dpar_array_destroy(reused));
    T_OK(dpar_graph_destroy(g));
    T_OK(dpar_mesh_destroy(m));
    T_OK(dpar_runtime_destroy(rt));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_buffer_through_hooks),
        cmocka_unit_test(test_aligned_default),
        cmocka_unit_test(test_runtime_life_balanced),
        cmocka_unit_test(test_param_address_reused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
