# kernels area: RoPE/YaRN frequencies must reproduce HF's float32 arithmetic bit for bit; GCC contracts
# a*b + c*d into FMAs by default in C++ (-ffp-contract=fast), which changes the last bit of the YaRN
# blend. Turn contraction off for that file only (the other kernels are compared with tolerances).
set_source_files_properties(${CMAKE_SOURCE_DIR}/src/kernels/rope.cpp PROPERTIES COMPILE_OPTIONS -ffp-contract=off)
