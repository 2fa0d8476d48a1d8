# Intel MKL from PyPI, unpacked into build-deps/mkl by
# `EPMOE_GEMM_CANDIDATES=1 bash scripts/setup.sh` (README, "Dependencies"):
# one of the candidates bench/gemm_libraries.cc measures. Not a backend of
# src/kernels: it did not beat oneDNN 2.6 on this AVX2 machine (issue 29).
# Found by path, not by MKL's own MKLConfig.cmake (which wants the whole
# oneAPI layout); linked as MKL's link line advisor says for GCC with GNU
# OpenMP and 32-bit integers: mkl_intel_lp64, mkl_gnu_thread, mkl_core,
# libgomp. The core loads its per-ISA kernels (libmkl_avx2.so.3, ...) from
# its own directory at run time.
set(EPMOE_MKL_ROOT "${CMAKE_CURRENT_SOURCE_DIR}/build-deps/mkl" CACHE PATH
    "Where scripts/setup.sh unpacked Intel MKL (lib/, include/); empty or absent: no MKL")
set(EPMOE_MKL_FOUND OFF)
if(EPMOE_MKL_ROOT AND EXISTS "${EPMOE_MKL_ROOT}/include/mkl_cblas.h")
  foreach(part intel_lp64 gnu_thread core)
    find_library(EPMOE_MKL_${part} NAMES mkl_${part} libmkl_${part}.so.3 PATHS "${EPMOE_MKL_ROOT}/lib" NO_DEFAULT_PATH)
  endforeach()
  if(EPMOE_MKL_intel_lp64 AND EPMOE_MKL_gnu_thread AND EPMOE_MKL_core)
    set(EPMOE_MKL_FOUND ON)
    add_library(epmoe_mkl INTERFACE)
    target_include_directories(epmoe_mkl INTERFACE $<BUILD_INTERFACE:${EPMOE_MKL_ROOT}/include>)
    # --no-as-needed: the interface and threading layers are reached only
    # through the core's calls, so the linker would drop them.
    target_link_libraries(epmoe_mkl INTERFACE -Wl,--no-as-needed ${EPMOE_MKL_intel_lp64} ${EPMOE_MKL_gnu_thread}
                                              ${EPMOE_MKL_core} -Wl,--as-needed OpenMP::OpenMP_CXX)
    target_compile_definitions(epmoe_mkl INTERFACE EPMOE_HAVE_MKL)
    message(STATUS "epmoe: Intel MKL for bench_gemm_libraries: ${EPMOE_MKL_ROOT}")
  endif()
endif()
if(NOT EPMOE_MKL_FOUND)
  message(STATUS "epmoe: no Intel MKL in EPMOE_MKL_ROOT='${EPMOE_MKL_ROOT}': bench_gemm_libraries not built")
endif()
