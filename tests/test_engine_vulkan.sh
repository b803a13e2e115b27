#!/bin/sh
# Runs examples/engine_vulkan.cpp (an engine that owns its Vulkan device, hands it to dpar, trains a
# step per few frames and reads the weights through the exported VkBuffer) under the Khronos
# validation layer with synchronization validation, and fails on any layer message, a non-zero exit,
# or a readback that differs from dpar_array_get. Called by tests/run.sh with BUILD set; prints
# "PASS name", "FAIL name" or "SKIPPED name: reason". No Vulkan driver, layer or build is a skip,
# unless DPAR_REQUIRE_BACKENDS lists "vulkan" (CI), where it is a failure.
BUILD=${BUILD:-build}
name=engine_vulkan
bin="$BUILD/engine_vulkan"
binmsg=" (needs the Vulkan headers and loader: Debian libvulkan-dev, make VULKAN=1)"
. "$(dirname "$0")/lib/vulkan_layer.sh"
log=$(mktemp)
# ASan builds: llvmpipe leaks 128 bytes per VkDevice from its JIT code, which
# LeakSanitizer cannot suppress (an unknown module); test_cnn.sh does the same.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation \
VK_LAYER_ENABLES=VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT \
VK_LAYER_REPORT_FLAGS=error,warn \
VK_LAYER_DEBUG_ACTION=VK_DBG_LAYER_ACTION_LOG_MSG \
    "$bin" --steps 40 --devices 2 >"$log" 2>&1
rc=$?
if [ "$rc" -eq 77 ]; then
    reason=$(grep -m1 'engine_vulkan:' "$log")
    rm -f "$log"
    miss "no Vulkan driver or device for the engine ($reason)"
fi
nerr=$(grep -c -E 'Validation (Error|Warning)|SYNC-HAZARD|VUID-' "$log")
if [ "$rc" -ne 0 ] || [ "$nerr" -ne 0 ] || ! grep -q 'equals dpar_array_get(w2): yes' "$log"; then
    grep -E 'Validation (Error|Warning)|SYNC-HAZARD|VUID-|engine_vulkan:|readback|steps:' "$log" | head -20
    echo "FAIL $name: exit status $rc, $nerr validation message(s)"
    rm -f "$log"
    exit 1
fi
frames=$(grep '^frames:' "$log")
rm -f "$log"
echo "  $frames"
echo "PASS $name: own instance/device/queue adopted, 40 steps over frames, readback through the exported VkBuffer equals dpar_array_get, no validation messages (synchronization validation on)"
