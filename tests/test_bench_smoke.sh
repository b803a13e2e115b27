#!/bin/sh
# Every benchmark binary runs to its end at its smallest setting: each row path of bench_ops (CPU, and the
# Vulkan conv rows), the collectives on CPU and Vulkan, matmul, a training step and the replayed graph on both
# backends. A benchmark that dies (bench_ops once did, of a 0 / 0 in the stream limit: every row SIGFPE,
# `make bench` logging "failed" and going on) or prints no rows fails here. Timings are not checked: at
# these sizes and times they mean nothing, and exit status 3 (a point above its limit, which a cache-resident
# size on a loaded machine can reach) counts as a run that reached its end. A missing Vulkan device is
# SKIPPED, or a FAIL when DPAR_REQUIRE_BACKENDS lists vulkan.
BUILD=${BUILD:-build}
case "$BUILD" in *address*|*thread*) # CI's 45 minutes: the sanitizer suites run the library's own tests
    echo "SKIPPED bench_smoke under $BUILD: the benchmarks' plumbing (the plain run covers it)"
    exit 0;;
esac
benches="bench_ops bench_collectives bench_matmul bench_train bench_graph"
bins=""
for b in $benches; do bins="$bins $BUILD/$b"; done
# shellcheck disable=SC2086 # a list of targets
if ! make -s BUILD="$BUILD" $bins >/dev/null; then
    echo "FAIL bench_smoke: make $bins"
    exit 1
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# run NAME MIN_ROWS ARGS...: the benchmark exits 0 (or 3) and prints at least MIN_ROWS measured CSV rows (not
# its header, not a "skip," row; a Vulkan run whose device is missing prints one: SKIPPED unless required)
run() {
    name=$1 want=$2
    shift 2
    "$@" >"$out" 2>&1
    rc=$?
    rows=$(grep -v '^kind,\|^skip,' "$out" | grep -c ',')
    case "$name" in *vulkan*) vk=1;; *) vk=0;; esac
    if [ "$vk" -eq 1 ] && grep -q '^skip,.*vulkan' "$out" && \
        ! echo ",${DPAR_REQUIRE_BACKENDS:-}," | grep -q ",vulkan,"; then
        echo "SKIPPED bench_smoke $name: $(grep -m1 '^skip,' "$out")"
    elif { [ "$rc" -eq 0 ] || [ "$rc" -eq 3 ]; } && [ "$rows" -ge "$want" ] && ! grep -q '^skip,' "$out"; then
        echo "PASS bench_smoke $name: exit $rc, $rows rows"
    else
        tail -5 "$out"
        echo "FAIL bench_smoke $name: exit $rc, $rows rows (at least $want expected, no skip row)"
    fi
}
run "bench_ops cpu" 100 "$BUILD/bench_ops" --backend cpu --threads 1 --time 0.01 --alts 1
# the stream limit runs over the op's working set (the distinct bytes it touches) and names its kernel: axpy
# touches y and x (2 x 802,816 f32), sgd_update:digits the parameter, gradient and momentum (3 x 64 x 128)
"$BUILD/bench_ops" --backend cpu --time 0.01 --alts 1 --dtypes f32 --only axpy >"$out" 2>&1
"$BUILD/bench_ops" --backend cpu --time 0.01 --alts 1 --dtypes f32 --only sgd_update:digits >>"$out" 2>&1
got=$(awk -F, '$1 == "ops" && $20 != "" { printf "%s=%s ", $3, $19 }' "$out")
if [ "$got" = "axpy=6422528 sgd_update:digits=98304 " ]; then
    echo "PASS bench_smoke bench_ops limit at the op's working set, its kernel named"
else
    tail -5 "$out"
    echo "FAIL bench_smoke bench_ops limit at the op's working set: got '$got' (axpy=6422528 sgd_update:digits=98304)"
fi
run "bench_ops vulkan conv" 6 "$BUILD/bench_ops" --backend vulkan --threads 1 --time 0.01 --alts 1 --only conv
run "bench_collectives cpu" 20 "$BUILD/bench_collectives" --backend cpu --devices 2,4 --min 65536 --max 262144 \
    --factor 4 --time 0.02 --alts 1
# each row names its limit's kernel and its op's own pattern, with that pattern's time (> 0 on 2 or more devices)
bad=$(awk -F, '$1 == "coll" {
    own = $3 == "allreduce" ? "sum_all" : $3 == "reducescatter" ? "sum_one" : $3 == "alltoall" ? "copy" : "fanout"
    if (NF != 19 || $14 == "" || $15 != own || !($16 > 0)) print $3 "/" $4 "/" $5 ": " NF " fields, " $14 ", " $15 ", " $16
}' "$out")
if [ -z "$bad" ] && grep -q '^coll,' "$out"; then
    echo "PASS bench_smoke bench_collectives names the limit's kernel and times the op's own pattern"
else
    echo "FAIL bench_smoke bench_collectives own-pattern columns: ${bad:-no coll rows}"
fi
run "bench_collectives vulkan" 1 "$BUILD/bench_collectives" --backend vulkan --devices 2 --ops allreduce \
    --min 65536 --max 65536 --time 0.02 --alts 1
run "bench_matmul" 2 "$BUILD/bench_matmul" --shapes 64x128x64,64x32x64:tn --threads 1 --time 0.02 --alts 1
run "bench_train" 1 "$BUILD/bench_train" --name digits --layers 64,128,10 --batch 64 --devices 2 --steps 3
for b in cpu vulkan; do
    run "bench_graph $b" 2 "$BUILD/bench_graph" --backend $b --devices 1,2 --rounds 5 --time 0.02
done
