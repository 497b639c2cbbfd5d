# Data area (src/data/{build,pack,shuffle,dataset,duckdb,source}*): DuckDB's C API for Parquet/JSONL input.
# (SHA-256 for manifest hashes and row checksums comes from src/io/hash; cmake/io.cmake links libcrypto.)
#
# libduckdb.so ships (without a header) in the npm package @duckdb/node-bindings-linux-x64, installed by
# scripts/install-deps.sh under deps/npm/node_modules. src/data/duckdb_capi.h declares the few C API functions used.
set(OLMOSFT_DUCKDB_SO "${CMAKE_SOURCE_DIR}/deps/npm/node_modules/@duckdb/node-bindings-linux-x64/libduckdb.so"
    CACHE FILEPATH "libduckdb.so (from the npm package @duckdb/node-bindings-linux-x64)")
if(NOT EXISTS "${OLMOSFT_DUCKDB_SO}")
  message(FATAL_ERROR "olmosft data: libduckdb.so not found at ${OLMOSFT_DUCKDB_SO}.\n"
                      "Run scripts/install-deps.sh (it installs deps/npm, which ships libduckdb.so), "
                      "or set -DOLMOSFT_DUCKDB_SO=/path/to/libduckdb.so.")
endif()
add_library(olmosft_data_duckdb SHARED IMPORTED GLOBAL)
set_target_properties(olmosft_data_duckdb PROPERTIES IMPORTED_LOCATION "${OLMOSFT_DUCKDB_SO}"
                                                     IMPORTED_NO_SONAME OFF)
get_filename_component(OLMOSFT_DUCKDB_DIR "${OLMOSFT_DUCKDB_SO}" DIRECTORY)

target_link_libraries(olmosft_lib PUBLIC olmosft_data_duckdb)
# Every executable that links olmosft_lib finds libduckdb.so without LD_LIBRARY_PATH (an explicit RUNPATH entry in
# addition to CMake's automatic build RPATH, so it also holds for targets built with CMAKE_SKIP_BUILD_RPATH).
target_link_options(olmosft_lib INTERFACE "LINKER:-rpath,${OLMOSFT_DUCKDB_DIR}")
