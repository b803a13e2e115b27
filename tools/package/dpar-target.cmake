# Usage requirements of dpar.h, shared by CMakeLists.txt (add_subdirectory) and
# the installed dparConfig.cmake (find_package): one place says what a program
# that includes dpar.h needs.
#
#   dpar_target_setup(<target> <include dir> <error variable>)
#
# Gives the INTERFACE <target> the include directory, threads, libm and libdl,
# and for each of the variables DPAR_VULKAN, DPAR_CUDA, DPAR_MPI that is true
# the define of that name plus what the backend needs: the Vulkan headers (the
# loader is opened at run time), nothing for CUDA (driver, cuBLAS and NCCL are
# opened at run time), MPI's C library. Sets <error variable> to "" or to what
# is missing and how to get it, so the caller decides between FATAL_ERROR
# (add_subdirectory) and dpar_FOUND FALSE (find_package).
function(dpar_target_setup tgt incdir errvar)
    set(${errvar} "" PARENT_SCOPE)
    find_package(Threads QUIET)
    if(NOT Threads_FOUND)
        set(${errvar} "dpar needs a threads library (pthreads)" PARENT_SCOPE)
        return()
    endif()
    target_include_directories(${tgt} INTERFACE "${incdir}")
    target_link_libraries(${tgt} INTERFACE Threads::Threads ${CMAKE_DL_LIBS})
    if(NOT WIN32)
        target_link_libraries(${tgt} INTERFACE m)
    endif()
    if(DPAR_VULKAN)
        find_package(Vulkan QUIET)
        if(TARGET Vulkan::Headers)
            target_link_libraries(${tgt} INTERFACE Vulkan::Headers)
        elseif(Vulkan_INCLUDE_DIRS)
            target_include_directories(${tgt} INTERFACE ${Vulkan_INCLUDE_DIRS})
        else()
            set(${errvar} "DPAR_VULKAN needs the Vulkan headers (Debian: apt-get install libvulkan-dev)" PARENT_SCOPE)
            return()
        endif()
        target_compile_definitions(${tgt} INTERFACE DPAR_VULKAN)
    endif()
    if(DPAR_CUDA)
        target_compile_definitions(${tgt} INTERFACE DPAR_CUDA)
    endif()
    if(DPAR_MPI)
        # MPI's C API; a C++-only project finds it through the CXX component
        # without the deprecated C++ bindings.
        get_property(langs GLOBAL PROPERTY ENABLED_LANGUAGES)
        if("C" IN_LIST langs)
            set(mpi_lang C)
        else()
            set(mpi_lang CXX)
            set(MPI_CXX_SKIP_MPICXX ON)
        endif()
        find_package(MPI QUIET COMPONENTS ${mpi_lang})
        if(NOT TARGET MPI::MPI_${mpi_lang})
            set(${errvar} "DPAR_MPI needs an MPI library (Debian: apt-get install libopenmpi-dev)" PARENT_SCOPE)
            return()
        endif()
        target_link_libraries(${tgt} INTERFACE MPI::MPI_${mpi_lang})
        target_compile_definitions(${tgt} INTERFACE DPAR_MPI)
    endif()
endfunction()
