#!/usr/bin/env bash
# Prepares, on this (networked) Debian machine, what scripts/gpu-check.sh
# builds with on a lent GPU machine that is bare and offline (no apt, no
# cmocka, zlib or Vulkan headers there): downloads the Debian packages into
# .gpu-debs/ (ignored by git), which the device call carries and gpu-check.sh
# unpacks into a private prefix there (never into /).
#   bash scripts/gpu-prep.sh       download (again) into .gpu-debs/
# Packages: cmocka (the test suites), zlib headers (the examples' data
# loaders), the Vulkan loader and headers (the Vulkan backend over the NVIDIA
# driver), and what the NVIDIA Vulkan ICD (libGLX_nvidia.so.0) links against:
# GLVND's dispatch library and Xlib (on the first H200 run the ICD failed to
# load without them: VK_ERROR_INCOMPATIBLE_DRIVER). Open MPI is not carried
# (dozens of dependencies); the MPI steps of gpu-check.sh say SKIPPED without it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-debs
pkgs="libcmocka0 libcmocka-dev zlib1g-dev libvulkan1 libvulkan-dev
      libglvnd0 libglx0 libgl1 libegl1 libx11-6 libx11-data libxext6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0"
rm -rf "$out"
mkdir -p "$out" /tmp/dpar-gpu-apt/partial
# amd64 packages whatever this machine is (the lent machine is x86-64)
o="-oAPT::Sandbox::User=root -oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/dpar-gpu-apt"
# shellcheck disable=SC2086
apt-get $o -qq update
# shellcheck disable=SC2086
(cd "$out" && apt-get $o -qq download $pkgs)
ls -l "$out"
echo "gpu-prep: $(ls "$out"/*.deb | wc -l) packages in $out ($(du -sh "$out" | cut -f1)); carry \"$out\" in the device call"
