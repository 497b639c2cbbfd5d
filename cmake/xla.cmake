# XLA area (src/xla, docs/xla.md): the PJRT runtime compiles against the PJRT C API header shipped in the pinned
# xla-cpu-pjrt wheel, and `cpu` resolves to that wheel's plugin. scripts/install-deps.sh unpacks both, sha256
# checked, into the git-ignored deps/xla/ (deps/pypi/files.txt). Nothing is vendored; nothing is skipped: a missing
# header or plugin is a configure error.
set(OLMOSFT_XLA_DIR "${CMAKE_SOURCE_DIR}/deps/xla"
    CACHE PATH "Where scripts/install-deps.sh unpacks the PJRT C API header and XLA's CPU plugin")
set(OLMOSFT_XLA_HEADER "${OLMOSFT_XLA_DIR}/include/pjrt_c_api.h")
set(OLMOSFT_XLA_CPU_PLUGIN "${OLMOSFT_XLA_DIR}/cpu/xla_cpu_pjrt.so")
foreach(f OLMOSFT_XLA_HEADER OLMOSFT_XLA_CPU_PLUGIN)
  if(NOT EXISTS "${${f}}")
    message(FATAL_ERROR "olmosft xla: ${${f}} not found. Run scripts/install-deps.sh (it unpacks the pinned "
                        "xla-cpu-pjrt wheel's header and CPU plugin into deps/xla/), or set -DOLMOSFT_XLA_DIR.")
  endif()
endforeach()
file(STRINGS "${OLMOSFT_XLA_HEADER}" _olmosft_pjrt_version REGEX "^#define PJRT_API_(MAJOR|MINOR) ")
message(STATUS "olmosft xla: PJRT C API header ${OLMOSFT_XLA_HEADER} (${_olmosft_pjrt_version}); "
               "CPU plugin ${OLMOSFT_XLA_CPU_PLUGIN}")
# Only the runtime's own sources see the C API header (src/xla/pjrt_internal.h includes it; pjrt.h does not).
file(GLOB _olmosft_xla_sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/xla/*.cpp)
set_property(SOURCE ${_olmosft_xla_sources} APPEND PROPERTY INCLUDE_DIRECTORIES "${OLMOSFT_XLA_DIR}/include")
set_property(SOURCE ${CMAKE_SOURCE_DIR}/src/xla/pjrt_plugin.cpp APPEND PROPERTY COMPILE_DEFINITIONS
             OLMOSFT_XLA_CPU_PLUGIN="${OLMOSFT_XLA_CPU_PLUGIN}")
target_link_libraries(olmosft_lib PUBLIC ${CMAKE_DL_LIBS})

# Two stand-in plugins for the runtime's version checks (tests/unit/xla/xla_fake_plugin.cpp): one reports a
# different API major, one a newer minor. They export GetPjrtApi and nothing XLA.
foreach(kind major minor)
  add_library(xla_fake_plugin_${kind} MODULE ${CMAKE_SOURCE_DIR}/tests/unit/xla/xla_fake_plugin.cpp)
  target_include_directories(xla_fake_plugin_${kind} SYSTEM PRIVATE "${OLMOSFT_XLA_DIR}/include")
  string(TOUPPER ${kind} _k)
  target_compile_definitions(xla_fake_plugin_${kind} PRIVATE OLMOSFT_FAKE_PJRT_NEWER_${_k})
endforeach()
# The test executables are made after the area files are read (CMakeLists.txt), so these are deferred.
# xla_aot_test uses the newer-minor stand-in's topology function (it echoes the named values it receives).
# (A deferred call's arguments are expanded when it runs, so no loop variable here.)
cmake_language(DEFER CALL target_compile_definitions xla_runtime_test PRIVATE
               OLMOSFT_XLA_FAKE_PLUGIN_MAJOR="$<TARGET_FILE:xla_fake_plugin_major>"
               OLMOSFT_XLA_FAKE_PLUGIN_MINOR="$<TARGET_FILE:xla_fake_plugin_minor>")
cmake_language(DEFER CALL add_dependencies xla_runtime_test xla_fake_plugin_major xla_fake_plugin_minor)
cmake_language(DEFER CALL target_compile_definitions xla_aot_test PRIVATE
               OLMOSFT_XLA_FAKE_PLUGIN_MINOR="$<TARGET_FILE:xla_fake_plugin_minor>")
cmake_language(DEFER CALL add_dependencies xla_aot_test xla_fake_plugin_minor)

# The exported-step runner (tests/xla-accel/xla_step_run.cpp: runs `olmosft xla export`'s program with the
# runtime alone). Built here too so that tests/e2e/xla_export.sh checks it on XLA's CPU plugin; the accelerator
# build (tests/xla-accel) builds the same file without the CPU libraries.
add_executable(xla_step_run ${CMAKE_SOURCE_DIR}/tests/xla-accel/xla_step_run.cpp)
target_link_libraries(xla_step_run PRIVATE olmosft_lib)
# The libtpu ahead-of-time compile test (opt-in libtpu, so not registered with ctest): run by
# scripts/tpu-compile-check.sh after `install-deps.sh --tpu`.
add_executable(xla_libtpu_test ${CMAKE_SOURCE_DIR}/tests/xla-accel/xla_libtpu_test.cpp)
target_link_libraries(xla_libtpu_test PRIVATE olmosft_lib GTest::gtest GTest::gtest_main)
