# KDA kernels: the hot loops (state updates, pairwise decay sums, the vectorised exp in kda_chunk.cpp) need
# the loop vectoriser with runtime alias checks, which GCC's -O2 "very cheap" cost model does not do, so these
# files build at -O3. -fno-trapping-math lets GCC if-convert the float selects in the exp loop; it changes no
# IEEE result (olmosft never inspects floating-point exception flags).
file(GLOB OLMOSFT_KDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/kernels/kda_*.cpp)
set_source_files_properties(${OLMOSFT_KDA_SOURCES} PROPERTIES COMPILE_OPTIONS "-O3;-fno-trapping-math")
