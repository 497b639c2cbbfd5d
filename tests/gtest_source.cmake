# GoogleTest for the standalone accelerator build (tests/xla-accel), whose machines may lack an installed
# one: a source tree given as -DOLMOSFT_GTEST_SOURCE=DIR (scripts/accel-check.sh --stage copies one to
# deps/googletest), else an installed GoogleTest. Include it before the project's -Werror options.
set(OLMOSFT_GTEST_SOURCE "" CACHE PATH "GoogleTest source tree (e.g. a copy of /usr/src/googletest)")
if(OLMOSFT_GTEST_SOURCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  add_subdirectory(${OLMOSFT_GTEST_SOURCE} googletest EXCLUDE_FROM_ALL SYSTEM)
  foreach(t gtest gtest_main)
    if(NOT TARGET GTest::${t})
      add_library(GTest::${t} ALIAS ${t})
    endif()
  endforeach()
else()
  find_package(GTest)
  if(NOT GTest_FOUND)
    message(FATAL_ERROR "GoogleTest not found: install it, or pass -DOLMOSFT_GTEST_SOURCE=/path/to/googletest")
  endif()
endif()
