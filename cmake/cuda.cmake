# cuda area (issue 13): the CUDA toolchain in the build. OLMOSFT_CUDA=AUTO builds the CUDA targets when CMake
# finds nvcc, ON requires nvcc, OFF skips them. The targets (docs/cuda.md):
#   olmosft_cuda     static library, src/cuda/*.cu (smoke kernel, issue 15 device kernels); links CUDA::cudart
#                    and cuBLASLt, not olmosft_lib
#   cuda_*_test      GoogleTest, one per tests/cuda/*_test.cpp; skipped at run time without a device
#   cuda             builds both
# Kept out of olmosft_lib (whose glob takes src/**/*.cpp only) so the CPU build never needs nvcc. Also included
# by the standalone project tests/cuda/CMakeLists.txt (scripts/gpu-check.sh), so paths are relative to this file.
set(OLMOSFT_CUDA AUTO CACHE STRING "Build the CUDA targets: AUTO (when nvcc is found), ON (nvcc required), OFF")
set_property(CACHE OLMOSFT_CUDA PROPERTY STRINGS AUTO ON OFF)
get_filename_component(OLMOSFT_CUDA_ROOT ${CMAKE_CURRENT_LIST_DIR}/.. ABSOLUTE)

string(TOUPPER "${OLMOSFT_CUDA}" olmosft_cuda_mode)
if(NOT olmosft_cuda_mode STREQUAL "AUTO")
  if(OLMOSFT_CUDA)
    set(olmosft_cuda_mode ON)
  else()
    set(olmosft_cuda_mode OFF)
  endif()
endif()
if(olmosft_cuda_mode STREQUAL "OFF")
  message(STATUS "CUDA: off (OLMOSFT_CUDA=OFF): olmosft_cuda and the cuda_*_test binaries are not built")
  return()
endif()

include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  if(olmosft_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "OLMOSFT_CUDA=ON but CMake found no CUDA compiler (nvcc): put nvcc on PATH "
                        "(/usr/local/cuda/bin), or set CUDACXX or -DCMAKE_CUDA_COMPILER=/path/to/nvcc")
  endif()
  message(STATUS "CUDA: nvcc not found: olmosft_cuda and the cuda_*_test binaries are not built (OLMOSFT_CUDA=AUTO)")
  return()
endif()

# 90 = sm_90 machine code for Hopper (H100, H200) plus compute_90 PTX the driver can compile for later chips.
# Must be set before enable_language(CUDA), which otherwise picks the compiler's default (sm_75 on nvcc 13).
set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures (CMake syntax: 90 = sm_90 SASS + compute_90 PTX)")
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
# CMake 3.25 (Debian 12) knows no C++20 flag for nvcc and would fail at generate time: supply it.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
message(STATUS "CUDA: nvcc ${CMAKE_CUDA_COMPILER_VERSION} (${CMAKE_CUDA_COMPILER}), toolkit "
               "${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")

# One CUDA runtime: the shared libcudart (CUDA::cudart), also for executables linking olmosft_cuda (CMake's
# default would add cudart_static beside it).
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
file(GLOB OLMOSFT_CUDA_SOURCES CONFIGURE_DEPENDS ${OLMOSFT_CUDA_ROOT}/src/cuda/*.cu)
add_library(olmosft_cuda STATIC ${OLMOSFT_CUDA_SOURCES})
target_include_directories(olmosft_cuda PUBLIC ${OLMOSFT_CUDA_ROOT}/src)
# cuBLASLt (the GEMM wrapper, src/cuda/gemm.cu): the toolkit's, else one named by OLMOSFT_CUBLAS_ROOT (a
# directory with include/cublasLt.h and lib/libcublasLt.so*, e.g. the nvidia-cublas Python wheel's
# site-packages/nvidia/cublas, for a GPU machine whose toolkit lacks the library; scripts/gpu-check.sh looks).
set(OLMOSFT_CUBLAS_ROOT "" CACHE PATH "Directory with include/cublasLt.h and lib/libcublasLt.so when the toolkit has none")
if(OLMOSFT_CUBLAS_ROOT)
  find_path(OLMOSFT_CUBLASLT_INCLUDE cublasLt.h PATHS ${OLMOSFT_CUBLAS_ROOT}/include NO_DEFAULT_PATH)
  find_library(OLMOSFT_CUBLASLT_LIB NAMES cublasLt libcublasLt.so.13 libcublasLt.so.12
               PATHS ${OLMOSFT_CUBLAS_ROOT}/lib NO_DEFAULT_PATH)
  if(NOT OLMOSFT_CUBLASLT_INCLUDE OR NOT OLMOSFT_CUBLASLT_LIB)
    message(FATAL_ERROR "OLMOSFT_CUBLAS_ROOT=${OLMOSFT_CUBLAS_ROOT}: expected include/cublasLt.h and "
                        "lib/libcublasLt.so* there")
  endif()
  add_library(olmosft_cublaslt INTERFACE)
  target_include_directories(olmosft_cublaslt SYSTEM INTERFACE ${OLMOSFT_CUBLASLT_INCLUDE})
  target_link_libraries(olmosft_cublaslt INTERFACE ${OLMOSFT_CUBLASLT_LIB})
  set(olmosft_cublaslt_target olmosft_cublaslt)
elseif(TARGET CUDA::cublasLt)
  set(olmosft_cublaslt_target CUDA::cublasLt)
else()
  message(FATAL_ERROR "CUDA: the toolkit at ${CUDAToolkit_LIBRARY_DIR} has no cuBLASLt; pass "
                      "-DOLMOSFT_CUBLAS_ROOT=<dir with include/cublasLt.h and lib/libcublasLt.so*> or -DOLMOSFT_CUDA=OFF")
endif()
target_link_libraries(olmosft_cuda PUBLIC CUDA::cudart ${olmosft_cublaslt_target})
# The directory's options (-Wall -Werror -march=native, from add_compile_options) are GCC's, which nvcc
# rejects: replace them on this target with nvcc's own. Host code gets GCC's warnings through -Xcompiler;
# ptxas reports spills and local-memory use, and with OLMOSFT_WERROR every warning is an error.
set_target_properties(olmosft_cuda PROPERTIES COMPILE_OPTIONS "" CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON
                                              CUDA_EXTENSIONS OFF)
target_compile_options(olmosft_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra
                       -Xptxas=-warn-spills,-warn-lmem-usage>)
if(OLMOSFT_WERROR)
  target_compile_options(olmosft_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Werror>)
endif()

enable_testing()
include(GoogleTest)
file(GLOB OLMOSFT_CUDA_TEST_SOURCES CONFIGURE_DEPENDS ${OLMOSFT_CUDA_ROOT}/tests/cuda/*_test.cpp)
foreach(src ${OLMOSFT_CUDA_TEST_SOURCES})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE olmosft_cuda GTest::gtest GTest::gtest_main)
  # ctest names: cuda.<Suite>.<Test>, so `ctest -R cuda` selects them.
  gtest_discover_tests(${name} TEST_PREFIX "cuda." DISCOVERY_TIMEOUT 60)
  list(APPEND OLMOSFT_CUDA_TESTS ${name})
endforeach()
add_custom_target(cuda DEPENDS olmosft_cuda ${OLMOSFT_CUDA_TESTS})
