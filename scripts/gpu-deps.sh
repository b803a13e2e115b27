# Sourced by scripts/gpu-check.sh and gpu-check-vulkan.sh (ROOT = the
# repository, DIR = the output folder): unpacks the .debs that
# scripts/gpu-prep.sh put in .gpu-debs/ into a private prefix
# (GPU_CHECK_PREFIX, default /tmp/dpar-gpu-deps; never into /) and points the
# compiler and the loader at it; finds libcuda, cuBLAS, NCCL, NVML and the
# Vulkan loader in the loader's cache, GPU_CHECK_LIBDIRS, the driver's and the
# toolkit's folders or the nvidia-* Python packages, and adds each folder to
# LD_LIBRARY_PATH (dpar dlopens them). Writes what it did to DIR/deps.txt and
# sets MAKEVARS (VULKAN=1 when the Vulkan headers are there).
PREFIX=${GPU_CHECK_PREFIX:-/tmp/dpar-gpu-deps}
MAKEVARS=""
unpack_debs() {
    local f n=0
    mkdir -p "$PREFIX"
    for f in "$ROOT"/.gpu-debs/*.deb; do
        [ -f "$f" ] || continue
        if command -v dpkg-deb >/dev/null 2>&1; then
            dpkg-deb -x "$f" "$PREFIX"
        else # ar + tar (binutils comes with every compiler); tar detects the compression
            local tmp
            tmp=$(mktemp -d)
            (cd "$tmp" && ar x "$f") && tar -xf "$tmp"/data.tar.* -C "$PREFIX"
            rm -rf "$tmp"
        fi
        n=$((n + 1))
    done
    echo "deps: unpacked $n package(s) from .gpu-debs into $PREFIX"
    local inc="$PREFIX/usr/include" lib="$PREFIX/usr/lib/x86_64-linux-gnu"
    # system-header semantics, as for /usr/include on a machine that has them
    export C_INCLUDE_PATH="$inc${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
    export CPLUS_INCLUDE_PATH="$inc${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
    export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
# have_header H: does the C compiler find <H> (system or the prefix)?
have_header() { printf '#include <%s>\n' "$1" | ${CC:-cc} -E -x c - >/dev/null 2>&1; }
# find_lib NAME DIR...: the folder of the first NAME found in the loader's
# cache or in the given folders (searched recursively); prints nothing if none.
find_lib() {
    local name=$1 d hit
    shift
    hit=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n { print $NF; exit }')
    if [ -n "$hit" ]; then dirname "$hit"; return; fi
    for d in "$@"; do
        [ -d "$d" ] || continue
        hit=$(find -L "$d" -maxdepth 6 -name "$name" 2>/dev/null | head -1)
        if [ -n "$hit" ]; then dirname "$hit"; return; fi
    done
}
# use_lib LABEL NAME...: finds the first of the names, adds its folder to
# LD_LIBRARY_PATH (dpar dlopens them), and says where it came from.
use_lib() {
    local label=$1 name dir
    shift
    for name in "$@"; do
        dir=$(find_lib "$name" ${GPU_CHECK_LIBDIRS:-} "$PREFIX/usr/lib" /usr/local/nvidia /usr/local/cuda/lib64 /usr/local/cuda/targets /usr/lib/x86_64-linux-gnu \
            /usr/lib64 $PYSITES)
        if [ -n "$dir" ]; then
            export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            echo "lib: $label: $dir/$name"
            return 0
        fi
    done
    echo "lib: $label: NOT FOUND (looked for $*: loader cache, /usr/local/nvidia, /usr/local/cuda, Python packages)"
    return 1
}
PYSITES=$(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null || true)
unpack_debs >"$DIR/deps.txt" 2>&1
for h in cmocka.h zlib.h vulkan/vulkan.h; do
    if have_header "$h"; then echo "header: <$h> found"; else echo "header: <$h> NOT FOUND"; fi
done >>"$DIR/deps.txt"
have_header vulkan/vulkan.h && MAKEVARS="VULKAN=1"
{
    use_lib "CUDA driver" libcuda.so.1
    use_lib cuBLAS libcublas.so.13 libcublas.so.12
    use_lib NCCL libnccl.so.2
    use_lib NVML libnvidia-ml.so.1
    use_lib "Vulkan loader" libvulkan.so.1
} >>"$DIR/deps.txt" 2>&1
cat "$DIR/deps.txt"

# the NVIDIA Vulkan ICD of a driver mounted under /usr/local/nvidia
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] &&
    ! ls /usr/share/vulkan/icd.d/nvidia* /etc/vulkan/icd.d/nvidia* >/dev/null 2>&1; then
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    echo "vulkan: VK_DRIVER_FILES=$VK_DRIVER_FILES" | tee -a "$DIR/deps.txt"
fi
# the ICD's own library and what it cannot find (a missing one makes vkCreateInstance fail)
for j in ${VK_DRIVER_FILES:-}; do
    icd=$(sed -n 's/.*"library_path" *: *"\([^"]*\)".*/\1/p' "$j" 2>/dev/null)
    [ -n "$icd" ] || continue
    case $icd in /*) ;; *) icd=$(find_lib "$icd" /usr/local/nvidia /usr/lib/x86_64-linux-gnu)/$icd ;; esac
    echo "vulkan: ICD $j -> $icd; unresolved: $(ldd "$icd" 2>&1 | grep -c 'not found')" | tee -a "$DIR/deps.txt"
    ldd "$icd" 2>&1 | grep 'not found' | tee -a "$DIR/deps.txt"
done
