# KDA kernels: the hot loops (state updates, pairwise decay sums) need the loop vectoriser with runtime alias
# checks, which GCC's -O2 "very cheap" cost model does not do; build these files at -O3.
file(GLOB OLMOSFT_KDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/kernels/kda_*.cpp)
set_source_files_properties(${OLMOSFT_KDA_SOURCES} PROPERTIES COMPILE_OPTIONS "-O3")
