# Vulkan backend (backends/dpar_vulkan.h), included by the Makefile.
#   VULKAN=0|1   compile the backend in (default: 1 when the Vulkan headers exist).
#                The loader is dlopen'ed at run time (libvulkan.so.1), so nothing
#                is linked and binaries start on machines without Vulkan.
#   GLSLANG=...  glslangValidator used to regenerate backends/dpar_vulkan_spirv.h
#                from shaders/*.comp. Without it the committed header is used.
#   make spirv        regenerate the embedded SPIR-V header
#   make check-spirv  regenerate into a temporary file and fail on any difference
VULKAN ?= $(if $(wildcard /usr/include/vulkan/vulkan.h),1,0)
GLSLANG ?= $(shell command -v glslangValidator 2>/dev/null)
VK_SHADERS := $(sort $(wildcard shaders/*.comp))
VK_SPIRV_H := backends/dpar_vulkan_spirv.h

ifeq ($(VULKAN),1)
IMPL_DEFS += -DDPAR_VULKAN
IMPL_DEPS += backends/dpar_vulkan.h $(VK_SPIRV_H)
endif

ifneq ($(GLSLANG),)
$(VK_SPIRV_H): $(VK_SHADERS) $(wildcard shaders/*.glsl) tools/embed_spirv.py
	python3 tools/embed_spirv.py --glslang $(GLSLANG) -o $@ $(VK_SHADERS)
endif

.PHONY: spirv check-spirv
spirv:
	@test -n "$(GLSLANG)" || { echo "spirv: glslangValidator not found (apt install glslang-tools)"; exit 1; }
	python3 tools/embed_spirv.py --glslang $(GLSLANG) -o $(VK_SPIRV_H) $(VK_SHADERS)

check-spirv:
	@test -n "$(GLSLANG)" || { echo "check-spirv: glslangValidator not found (apt install glslang-tools)"; exit 1; }
	@tmp=$$(mktemp) && \
	python3 tools/embed_spirv.py --glslang $(GLSLANG) -o $$tmp $(VK_SHADERS) && \
	if cmp -s $$tmp $(VK_SPIRV_H); then echo "check-spirv: $(VK_SPIRV_H) is up to date"; rm -f $$tmp; \
	else diff -u $(VK_SPIRV_H) $$tmp | head -20; rm -f $$tmp; \
	     echo "check-spirv: $(VK_SPIRV_H) is stale: run 'make spirv' and commit it"; exit 1; fi
