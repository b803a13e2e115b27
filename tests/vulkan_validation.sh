#!/bin/sh
# Runs the Vulkan test binaries (test_vulkan, test_parity, test_elem, test_graph_record, test_dtypes) under the
# Khronos validation layer with synchronization validation on, and fails if the
# layer reports any error or warning (or if the tests fail). Called by
# tests/run.sh with BUILD set; prints "PASS name", "FAIL name" or
# "SKIPPED name: reason".
# A missing layer or Vulkan driver is a skip, unless DPAR_REQUIRE_BACKENDS
# lists "vulkan" (CI), where it is a failure.
BUILD=${BUILD:-build}
name=vulkan_validation
bin="$BUILD/test_vulkan"  # needed; test_parity runs too when built
case "$BUILD" in *thread*)
    # The layer's findings do not depend on the sanitizer, and TSan runs it about 6x slower (2-3 minutes of CI).
    echo "SKIPPED $name under TSan: the layer checks the same calls in the plain and ASan runs; the Vulkan binaries themselves run under TSan"; exit 0;;
esac
. "$(dirname "$0")/lib/vulkan_layer.sh"
log=$(mktemp)
total=0
for t in test_vulkan test_parity test_elem test_graph_record test_dtypes; do
    b="$BUILD/$t"
    [ -x "$b" ] || continue
    # VK_LAYER_ENABLES turns on synchronization validation (layer settings, 1.3.2xx);
    # debug_action log + report flags error,warn make every finding a printed line.
    VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation \
    VK_LAYER_ENABLES=VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT \
    VK_LAYER_REPORT_FLAGS=error,warn \
    VK_LAYER_DEBUG_ACTION=VK_DBG_LAYER_ACTION_LOG_MSG \
        "$b" >"$log" 2>&1
    rc=$?
    if [ "$t" = test_vulkan ] && grep -q '^SKIPPED' "$log"; then
        reason=$(grep -m1 '^SKIPPED' "$log" | sed 's/^SKIPPED: *//')
        rm -f "$log"
        miss "$reason"
    fi
    nerr=$(grep -c -E 'Validation (Error|Warning)|SYNC-HAZARD|VUID-' "$log")
    if [ "$rc" -ne 0 ] || [ "$nerr" -ne 0 ]; then
        grep -E 'Validation (Error|Warning)|SYNC-HAZARD|VUID-|FAILED|\[  ERROR' "$log" | head -20
        echo "FAIL $name: $t: exit status $rc, $nerr validation message(s)"
        rm -f "$log"
        exit 1
    fi
    summary=$(grep -E '^\[  PASSED  \]' "$log" | tail -1)
    echo "  $t: no validation messages ($summary)"
    total=$((total + 1))
done
rm -f "$log"
echo "PASS $name: $total Vulkan test binaries under VK_LAYER_KHRONOS_validation + synchronization validation, no messages"
