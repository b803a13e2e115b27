# Install dpar for other projects (included by the Makefile). Header-only:
#   make install   PREFIX=/usr/local DESTDIR=
#       headers and the amalgamated dpar_single.h (written afresh, as make amalgamate
#       does; needs python3) into $(INCLUDEDIR)/dpar/, dpar.pc into $(DATADIR)/pkgconfig/,
#       the CMake package (find_package(dpar CONFIG)) into $(DATADIR)/cmake/dpar/: the
#       same files as `cmake --install` (CMakeLists.txt)
#   make uninstall   the same variables: removes what install wrote
#   INCLUDEDIR (default $(PREFIX)/include), DATADIR (default $(PREFIX)/share)
PREFIX     ?= /usr/local
INCLUDEDIR ?= $(PREFIX)/include
DATADIR    ?= $(PREFIX)/share
PKG_GEN    := $(BUILD)/package

# 0.1.0 from DPAR_VERSION_MAJOR / _MINOR / _PATCH in dpar.h (a missing one is 0)
dpar_version_part = $(or $(shell sed -n 's/^.define DPAR_VERSION_$(1)  *\([0-9][0-9]*\).*/\1/p' dpar.h),0)
DPAR_VERSION_MAJOR := $(call dpar_version_part,MAJOR)
DPAR_VERSION_MINOR := $(call dpar_version_part,MINOR)
DPAR_VERSION := $(DPAR_VERSION_MAJOR).$(DPAR_VERSION_MINOR).$(call dpar_version_part,PATCH)

# The templates in tools/package/ filled as CMakeLists.txt fills them: dpar.pc
# names the absolute prefix, dparConfig.cmake finds the headers relative to itself.
PKG_INCLUDEDIR = $(abspath $(INCLUDEDIR))
PKG_CMAKEDIR   = $(abspath $(DATADIR))/cmake/dpar
PKG_SED = sed -e 's|@DPAR_VERSION@|$(DPAR_VERSION)|g' \
              -e 's|@DPAR_VERSION_MAJOR@|$(DPAR_VERSION_MAJOR)|g' -e 's|@DPAR_VERSION_MINOR@|$(DPAR_VERSION_MINOR)|g' \
              -e 's|@DPAR_PREFIX@|$(abspath $(PREFIX))|g' \
              -e 's|@DPAR_INCLUDEDIR@|$(patsubst $(abspath $(PREFIX))/%,$${prefix}/%,$(PKG_INCLUDEDIR))|g' \
              -e "s|@DPAR_CONFIG_TO_INCLUDE@|$$(realpath -m --relative-to=$(PKG_CMAKEDIR) $(PKG_INCLUDEDIR)/dpar)|g"

.PHONY: install uninstall
install:
	rm -rf $(PKG_GEN) && mkdir -p $(PKG_GEN)
	python3 tools/amalgamate.py -o $(PKG_GEN)/dpar_single.h
	$(PKG_SED) tools/package/dpar.pc.in >$(PKG_GEN)/dpar.pc
	$(PKG_SED) tools/package/dparConfig.cmake.in >$(PKG_GEN)/dparConfig.cmake
	$(PKG_SED) tools/package/dparConfigVersion.cmake.in >$(PKG_GEN)/dparConfigVersion.cmake
	install -d $(DESTDIR)$(INCLUDEDIR)/dpar/backends $(DESTDIR)$(DATADIR)/pkgconfig $(DESTDIR)$(DATADIR)/cmake/dpar
	install -m 644 dpar.h $(PKG_GEN)/dpar_single.h $(DESTDIR)$(INCLUDEDIR)/dpar/
	install -m 644 $(wildcard backends/*.h) $(DESTDIR)$(INCLUDEDIR)/dpar/backends/
	$(if $(wildcard util/*.h),install -d $(DESTDIR)$(INCLUDEDIR)/dpar/util && \
	    install -m 644 $(wildcard util/*.h) $(DESTDIR)$(INCLUDEDIR)/dpar/util/)
	install -m 644 $(PKG_GEN)/dpar.pc $(DESTDIR)$(DATADIR)/pkgconfig/
	install -m 644 $(PKG_GEN)/dparConfig.cmake $(PKG_GEN)/dparConfigVersion.cmake tools/package/dpar-target.cmake \
	    $(DESTDIR)$(DATADIR)/cmake/dpar/

uninstall: $(BUILD)/dpar_single.h
	rm -rf $(DESTDIR)$(INCLUDEDIR)/dpar $(DESTDIR)$(DATADIR)/cmake/dpar
	rm -f $(DESTDIR)$(DATADIR)/pkgconfig/dpar.pc
