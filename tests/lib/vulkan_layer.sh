# Sourced by the Vulkan validation scripts (tests/vulkan_validation.sh,
# tests/test_engine_vulkan.sh) after they set `name`, `bin` and `binmsg`: a
# missing binary or a missing Khronos validation layer is "SKIPPED name", or
# "FAIL name" when DPAR_REQUIRE_BACKENDS lists vulkan (CI); either ends the
# script. Returns with the layer found.
required=0
case ",${DPAR_REQUIRE_BACKENDS:-}," in *,vulkan,*|*" vulkan"*|*"vulkan "*) required=1 ;; esac
miss() {
    if [ "$required" -eq 1 ]; then echo "FAIL $name: $1 (DPAR_REQUIRE_BACKENDS lists vulkan)"; exit 1; fi
    echo "SKIPPED $name: $1"; exit 0
}
[ -x "$bin" ] || miss "$bin not built${binmsg:-}"
found=0
for d in ${VK_LAYER_PATH:-} ${XDG_DATA_DIRS:-/usr/local/share:/usr/share} /etc; do
    for dir in $(echo "$d" | tr ':' ' '); do
        for f in "$dir"/VkLayer_khronos_validation.json "$dir"/vulkan/explicit_layer.d/VkLayer_khronos_validation.json; do
            [ -f "$f" ] && found=1
        done
    done
done
[ "$found" -eq 1 ] || miss "VK_LAYER_KHRONOS_validation not installed (Debian: vulkan-validationlayers)"
