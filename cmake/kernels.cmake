# kernels area: RoPE/YaRN frequencies must reproduce HF's float32 arithmetic bit for bit; GCC contracts
# a*b + c*d into FMAs by default in C++ (-ffp-contract=fast), which changes the last bit of the YaRN
# blend. Turn contraction off for that file only (the other kernels are compared with tolerances).
set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/rope.cpp PROPERTIES COMPILE_OPTIONS -ffp-contract=off)

# oneDNN (Debian's libdnnl-dev, deps/apt-core.txt): the bf16 GEMMs (compute.dtype=bf16) and the optional fp32
# GEMM library (compute.gemm=onednn); src/kernels/gemm_onednn.cpp. Its CMake package wants OpenCL's headers
# (its GPU runtime, unused here), so the library is found directly.
find_path(OLMOSFT_DNNL_INCLUDE dnnl.hpp)
find_library(OLMOSFT_DNNL_LIB NAMES dnnl)
if(NOT OLMOSFT_DNNL_INCLUDE OR NOT OLMOSFT_DNNL_LIB)
  message(FATAL_ERROR "oneDNN not found (dnnl.hpp, libdnnl.so): run scripts/install-deps.sh (Debian's libdnnl-dev)")
endif()
target_include_directories(olmosft_lib SYSTEM PUBLIC ${OLMOSFT_DNNL_INCLUDE})
target_link_libraries(olmosft_lib PUBLIC ${OLMOSFT_DNNL_LIB})

# AdamW's elementwise loop vectorises only without errno-setting sqrt (-fno-math-errno: the same IEEE sqrt,
# no errno write for negative inputs, which the second moment never is); its bits are pinned by
# KernelsAdamW.StepsKeepTheScalarLoopsBits.
set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/adamw.cpp PROPERTIES COMPILE_OPTIONS -fno-math-errno)

# vexp.cpp (the vectorised exp): its AVX2 and AVX-512 paths are compiled with target attributes and chosen
# at run time, so the file is built for the baseline ISA (no AVX-512 instruction can leak into the AVX2 path
# under -march=native), and without contraction (a multiply followed by an add must round twice on every
# path, or the paths would differ in bits).
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/vexp.cpp PROPERTIES COMPILE_OPTIONS
                              "-march=x86-64;-mtune=generic;-ffp-contract=off")
else()
  set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/vexp.cpp PROPERTIES COMPILE_OPTIONS -ffp-contract=off)
endif()
