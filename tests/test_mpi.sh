#!/bin/sh
# Multi-process tests under mpirun on this machine (loopback): every
# collective over axes inside and across processes with exact data, the
# mismatch / uneven-step / timeout cases, 100 init/destroy cycles (np 2 and
# 4, 2 CPU devices per process), a bad label on one rank (tests/mpi/badlabel.c),
# dpar_array_get of mismatched arrays or skipped by a rank (tests/mpi/getmismatch.c),
# and the digits run under mpirun -np 2 with 2
# devices per process against the single-process 4-device run (1e-5 relative).
# MPI is required: a missing mpirun or MPI build is a FAIL, never a skip.
BUILD=${BUILD:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
if ! command -v mpirun >/dev/null 2>&1; then echo "FAIL mpi: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 1; fi
if [ ! -x "$BUILD/mpi_collectives" ] || [ ! -x "$BUILD/mpi_late" ] || [ ! -x "$BUILD/mpi_remesh" ] ||
   [ ! -x "$BUILD/mpi_badlabel" ] || [ ! -x "$BUILD/train_digits_mpi" ]; then
    echo "FAIL mpi: $BUILD/mpi_collectives, mpi_late, mpi_remesh, mpi_badlabel or train_digits_mpi not built (needs mpicc: make mpi)"; exit 1
fi
case "$BUILD" in *thread*)
    echo "SKIPPED mpi under TSan: Open MPI's own threads are not instrumented (the MPI tests run in the plain and ASan runs)"; exit 0;;
esac
OVER=""
mpirun --version 2>&1 | grep -q "Open MPI" && OVER="--oversubscribe"
# The sanitizer builds run the MPI programs too, but Open MPI's own leaks are not ours.
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
for np in 2 4; do
    out=$(mktemp)
    timeout 600 mpirun $OVER -np $np ${DPAR_TEST_WRAPPER:-} "$BUILD/mpi_collectives" >"$out" 2>&1
    rc=$?
    cat "$out"
    grep -q "^mpi_collectives np=$np: 0 failed checks" "$out" || { [ "$rc" -ne 0 ] && ! grep -q '^FAIL' "$out" && echo "FAIL mpi_collectives np=$np: exit status $rc"; }
    rm -f "$out"
done
# Meshes made again over the same devices.
if timeout 120 mpirun $OVER -np 2 ${DPAR_TEST_WRAPPER:-} "$BUILD/mpi_remesh" 2>&1 | grep -q '^remesh: ok'; then
    echo "PASS 6 meshes made one after another over the same devices across 2 processes: every psum right"
else
    echo "FAIL mpi_remesh"
fi
# ranks_ok NAME WHAT SECONDS PROGRAM ARGS...: PASS WHAT when `mpirun -np 2 PROGRAM ARGS` exits 0 within SECONDS
# and both ranks print "rank R: ok"; else its output and FAIL NAME.
ranks_ok() {
    name=$1 what=$2 secs=$3
    shift 3
    log=$(mktemp)
    timeout "$secs" mpirun $OVER -np 2 ${DPAR_TEST_WRAPPER:-} "$@" >"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ] && [ "$(grep -c '^rank [01]: ok$' "$log")" -eq 2 ]; then
        echo "PASS $what"
    else
        cat "$log"; echo "FAIL $name: exit status $rc"
    fi
    rm -f "$log"
}
# A rank far later than the timeout: clear errors on both ranks, then no crash in destroy / MPI_Finalize.
ranks_ok mpi_late "a rank 3.5x the timeout late: the waiting rank errs within timeout + 1.5 s, both report it clearly, destroy their runtimes and finalize MPI" \
    120 "$BUILD/mpi_late"
# dpar_array_get of different arrays on the ranks, and one rank skipping a get: errors on both ranks, no MPI abort, no hang.
ranks_ok mpi_getmismatch "dpar_array_get of another shape or spec on rank 1: both ranks get DPAR_ERR_COLLECTIVE_MISMATCH and stay in step; a get rank 1 skips: rank 0 times out within timeout + 1.5 s, rank 1's next get fails" \
    120 "$BUILD/mpi_getmismatch"
# A bad label on rank 1 (2 and 1 devices per process): both ranks fail naming it, nothing updated, no hang.
for local in 2 1; do
    ranks_ok "mpi_badlabel with $local device(s) a process" \
        "a bad label on rank 1 ($local device(s) a process): both ranks' runs fail naming rank 1's device, params and optimizer state kept, the next step as if it never ran" \
        120 "$BUILD/mpi_badlabel" $local
done
# Two ranks that resolve to the same GPU on one node: an immediate error on every rank.
# (llvmpipe is one physical Vulkan device, so two ranks on it collide.)
dup=$(mktemp)
if "$BUILD/train_digits" --backend vulkan --devices 1 --epochs 1 >/dev/null 2>&1; then
    timeout 300 mpirun $OVER -np 2 "$BUILD/train_digits_mpi" --backend vulkan --devices 2 --epochs 1 >"$dup" 2>&1
    n=$(grep -c "ranks 0 and 1 both resolve to physical vulkan device 0" "$dup")
    [ "$n" -eq 2 ] && echo "PASS two ranks on one physical device: both ranks get an error naming ranks 0 and 1 and the device"         || { echo "FAIL two ranks on one physical device: $n of 2 ranks reported it"; cat "$dup"; }
    # allowed to share it: the bad label on rank 1 on Vulkan (read back at the check sync, recorded or not)
    (export DPAR_BACKEND=vulkan DPAR_ALLOW_SHARED_DEVICE=1
     ranks_ok "mpi_badlabel on Vulkan" \
        "a bad label on rank 1 on Vulkan (2 devices a process, one llvmpipe shared): both ranks' runs fail naming it, nothing updated" \
        300 "$BUILD/mpi_badlabel" 2)
else
    echo "SKIPPED two ranks on one physical device: no Vulkan device in this build/machine"
fi
rm -f "$dup"
one=$(mktemp); two=$(mktemp)
"$BUILD/train_digits" --devices 4 --epochs 10 >"$one" 2>&1
timeout 600 mpirun $OVER -np 2 "$BUILD/train_digits_mpi" --devices 4 --epochs 10 >"$two" 2>&1
rc=$?
tail -n 1 "$two"
if [ "$rc" -ne 0 ] || ! grep -q '^final:' "$two"; then
    echo "FAIL train_digits under mpirun -np 2: exit status $rc"; cat "$two"
else
    worst=$(paste "$one" "$two" | awk '/^epoch/ { for (i = 1; i <= NF; i++) if ($i == "loss") { if (!a) a = $(i+1); else b = $(i+1) }
        r = (a - b) / a; if (r < 0) r = -r; if (r > w) w = r; n++; a = ""; b = "" } END { if (!n) print "none"; else printf "%.3g\n", w }')
    echo "max relative loss difference, mpirun -np 2 x 2 devices vs 1 process x 4 devices: $worst"
    awk -v w="$worst" 'BEGIN { exit !(w != "none" && w + 0 <= 1e-5) }' && echo "PASS train_digits mpirun -np 2 x 2 devices matches 4 devices in one process (1e-5)" \
        || echo "FAIL train_digits mpirun -np 2 differs from one process by $worst"
fi
rm -f "$one" "$two"
