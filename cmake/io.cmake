# io area: OpenSSL libcrypto for SHA-256 (src/io/hash, the only SHA-256 in the project: io, data, tokenizer); optional libFuzzer target for the safetensors parser.
pkg_check_modules(OLMOSFT_LIBCRYPTO REQUIRED IMPORTED_TARGET libcrypto)
target_link_libraries(olmosft_lib PUBLIC PkgConfig::OLMOSFT_LIBCRYPTO)

# fuzz_safetensors: libFuzzer + AddressSanitizer over safetensors::parse. It needs clang++ and
# compiler-rt's fuzzer runtime (Debian: clang-14, libclang-rt-14-dev), and the parser is compiled with
# clang so that it is instrumented; it is therefore a separate command, not a normal CMake target, and
# not part of `all`. Build: cmake --build build --target fuzz_safetensors; run: build/fuzz/fuzz_safetensors
# -max_total_time=60 tests/fuzz/corpus_safetensors (see docs/io.md).
find_program(OLMOSFT_CLANGXX NAMES clang++ clang++-14)
if(OLMOSFT_CLANGXX)
  execute_process(COMMAND ${OLMOSFT_CLANGXX} -print-file-name=libclang_rt.fuzzer-x86_64.a
                  OUTPUT_VARIABLE _olmosft_fuzzer_rt OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  # clang++ -print-file-name prints the bare name when it cannot find the file; look in compiler-rt too.
  if(NOT EXISTS "${_olmosft_fuzzer_rt}")
    execute_process(COMMAND ${OLMOSFT_CLANGXX} -print-resource-dir OUTPUT_VARIABLE _olmosft_rd
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    set(_olmosft_fuzzer_rt "${_olmosft_rd}/lib/linux/libclang_rt.fuzzer-x86_64.a")
  endif()
endif()
if(OLMOSFT_CLANGXX AND EXISTS "${_olmosft_fuzzer_rt}")
  set(_fuzz_src ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_safetensors.cpp ${CMAKE_SOURCE_DIR}/src/io/safetensors.cpp
      ${CMAKE_SOURCE_DIR}/src/io/atomic_file.cpp ${CMAKE_SOURCE_DIR}/src/core/tensor.cpp
      ${CMAKE_SOURCE_DIR}/src/core/bf16.cpp)
  add_custom_command(
    OUTPUT ${CMAKE_BINARY_DIR}/fuzz/fuzz_safetensors
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/fuzz
    COMMAND ${OLMOSFT_CLANGXX} -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined
            -I${CMAKE_SOURCE_DIR}/src ${_fuzz_src} -o ${CMAKE_BINARY_DIR}/fuzz/fuzz_safetensors
    DEPENDS ${_fuzz_src} ${CMAKE_SOURCE_DIR}/src/io/safetensors.h
    COMMENT "Building fuzz_safetensors (clang++ libFuzzer + ASan + UBSan)"
    VERBATIM)
  add_custom_target(fuzz_safetensors DEPENDS ${CMAKE_BINARY_DIR}/fuzz/fuzz_safetensors)
else()
  message(STATUS "io: clang++ with libFuzzer not found; fuzz_safetensors target not available "
                 "(install clang-14 and libclang-rt-14-dev)")
endif()
