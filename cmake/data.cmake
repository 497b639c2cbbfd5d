# Data area (src/data/*): Apache Arrow C++ (libarrow + libparquet) from the pinned pyarrow wheel for Parquet
# and compressed JSONL input, and the DuckDB CLI binary from the pinned duckdb-cli wheel for `--sql`.
# Both live in the project's virtual environment deps/venv (scripts/install-deps.sh, deps/pypi/build.txt).
# The wheel ships headers and versioned shared libraries (libarrow.so.<SO>) but no CMake package, so the
# libraries are imported by path, and executables carry an rpath to the wheel's directory: no machine path is
# written here, and nothing needs LD_LIBRARY_PATH at run time.
set(OLMOSFT_VENV_PYTHON "${CMAKE_SOURCE_DIR}/deps/venv/bin/python"
    CACHE FILEPATH "Python of the build virtual environment (made by scripts/install-deps.sh)")
if(NOT EXISTS "${OLMOSFT_VENV_PYTHON}")
  message(FATAL_ERROR "olmosft data: ${OLMOSFT_VENV_PYTHON} not found. Run scripts/install-deps.sh (it makes "
                      "deps/venv with the pinned pyarrow and duckdb-cli wheels), or set -DOLMOSFT_VENV_PYTHON.")
endif()
execute_process(
  COMMAND "${OLMOSFT_VENV_PYTHON}" -c
          "import os, pyarrow, duckdb_cli; v = pyarrow.__version__.split('.'); print(pyarrow.get_include()); print(pyarrow.get_library_dirs()[0]); print(int(v[0]) * 100 + int(v[1])); print(pyarrow.__version__); print(os.path.join(os.path.dirname(duckdb_cli.__file__), 'duckdb'))"
  OUTPUT_VARIABLE _olmosft_pa OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _olmosft_pa_rc)
if(NOT _olmosft_pa_rc EQUAL 0)
  message(FATAL_ERROR "olmosft data: ${OLMOSFT_VENV_PYTHON} cannot import pyarrow and duckdb_cli; "
                      "run scripts/install-deps.sh")
endif()
string(REPLACE "\n" ";" _olmosft_pa "${_olmosft_pa}")
list(GET _olmosft_pa 0 OLMOSFT_ARROW_INCLUDE)
list(GET _olmosft_pa 1 OLMOSFT_ARROW_LIBDIR)
list(GET _olmosft_pa 2 OLMOSFT_ARROW_SO)
list(GET _olmosft_pa 3 OLMOSFT_ARROW_VERSION)
list(GET _olmosft_pa 4 OLMOSFT_DUCKDB_CLI)
message(STATUS "olmosft data: Arrow C++ ${OLMOSFT_ARROW_VERSION} from ${OLMOSFT_ARROW_LIBDIR}; "
               "DuckDB CLI ${OLMOSFT_DUCKDB_CLI}")
foreach(lib arrow parquet)
  set(_so "${OLMOSFT_ARROW_LIBDIR}/lib${lib}.so.${OLMOSFT_ARROW_SO}")
  if(NOT EXISTS "${_so}")
    message(FATAL_ERROR "olmosft data: ${_so} not found in the pyarrow wheel")
  endif()
  add_library(olmosft_${lib} SHARED IMPORTED GLOBAL)
  set_target_properties(olmosft_${lib} PROPERTIES IMPORTED_LOCATION "${_so}" IMPORTED_SONAME
                                                  "lib${lib}.so.${OLMOSFT_ARROW_SO}")
  target_include_directories(olmosft_${lib} SYSTEM INTERFACE "${OLMOSFT_ARROW_INCLUDE}")
  target_link_libraries(olmosft_lib PUBLIC olmosft_${lib})
endforeach()
target_compile_definitions(olmosft_lib PRIVATE OLMOSFT_DUCKDB_CLI="${OLMOSFT_DUCKDB_CLI}")
# Every executable that links olmosft_lib finds the wheel's libraries (an explicit RUNPATH entry in addition to
# CMake's automatic build RPATH, so it also holds for targets built with CMAKE_SKIP_BUILD_RPATH).
target_link_options(olmosft_lib INTERFACE "LINKER:-rpath,${OLMOSFT_ARROW_LIBDIR}")
