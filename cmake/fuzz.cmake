# libFuzzer targets for the hand-written parsers (tests/fuzz/fuzz_<name>.cpp, docs/fuzz.md):
#   fuzz_safetensors  safetensors header (src/io/safetensors.cpp)
#   fuzz_template     Jinja chat templates (src/data/template*.cpp)
#   fuzz_tokenizer    HF tokenizer.json loader + encode (src/data/tokenizer.cpp)
#   fuzz_recipe       recipe YAML flattening + typed config (src/train/recipe.cpp, recipe_schema.cpp)
#   fuzz_manifest     packed-dataset manifest.json (PackedDataset::open, src/data/dataset.cpp)
#   fuzz_pickle       restricted unpickler + distcp .metadata + torch.save items (src/io/pickle.cpp, distcp*.cpp)
# They need clang++ and compiler-rt's fuzzer runtime (Debian: clang-14, libclang-rt-14-dev), and the parser
# sources are compiled with clang so that they are instrumented (ASan + UBSan, UBSan reports fatal). CMake
# cannot use two C++ compilers in one project, so each source is one custom command (ninja runs them in
# parallel, a depfile tracks headers) and each target is one link. The objects are shared between targets.
#
# `make fuzz` (tests/fuzz/run.sh) builds the `fuzz` target (not part of `all`) and mutates each target for
# FUZZ_SECONDS. `make test` only replays the seed corpora (tests/fuzz/corpus_<name>/, ctest fuzz_replay_<name>)
# through fuzz_replay: the same entry points compiled by the normal compiler without sanitizers and linked to
# olmosft_lib, so the default build needs no clang and stays fast (the instrumented builds take minutes).
set(OLMOSFT_FUZZ_TARGETS safetensors template tokenizer recipe manifest pickle)
add_executable(fuzz_replay ${CMAKE_SOURCE_DIR}/tests/fuzz/replay_main.cpp)
foreach(name ${OLMOSFT_FUZZ_TARGETS})
  set(_src ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_${name}.cpp)
  target_sources(fuzz_replay PRIVATE ${_src})
  set_source_files_properties(${_src} PROPERTIES COMPILE_DEFINITIONS
                              "LLVMFuzzerTestOneInput=olmosft_fuzz_${name}")
  add_test(NAME fuzz_replay_${name} COMMAND fuzz_replay ${name} ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus_${name})
  set_tests_properties(fuzz_replay_${name} PROPERTIES TIMEOUT 300)
endforeach()
target_compile_definitions(fuzz_replay PRIVATE
                           OLMOSFT_FUZZ_ROWS_DIR="${CMAKE_SOURCE_DIR}/tests/fuzz/manifest_rows")
target_link_libraries(fuzz_replay PRIVATE olmosft_lib)

find_program(OLMOSFT_CLANGXX NAMES clang++ clang++-14)
set(_olmosft_fuzzer_rt "")
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

set(_fuzz_dir ${CMAKE_BINARY_DIR}/fuzz)

if(NOT (OLMOSFT_CLANGXX AND EXISTS "${_olmosft_fuzzer_rt}"))
  message(STATUS "fuzz: clang++ with libFuzzer not found; the fuzz targets (make fuzz) are not available "
                 "(install clang-14 and libclang-rt-14-dev); the corpus replay tests still run")
  add_custom_target(fuzz COMMAND ${CMAKE_COMMAND} -E echo "fuzz: clang++ with libFuzzer was not found at configure time"
                    COMMAND ${CMAKE_COMMAND} -E false)
  return()
endif()

set(_fuzz_cflags -std=c++20 -O1 -g -fsanitize=fuzzer-no-link,address,undefined
                 -fno-sanitize-recover=undefined -I${CMAKE_SOURCE_DIR}/src
                 -DOLMOSFT_FUZZ_ROWS_DIR="${CMAKE_SOURCE_DIR}/tests/fuzz/manifest_rows")
set(_fuzz_launcher "")
if(CMAKE_CXX_COMPILER_LAUNCHER)
  set(_fuzz_launcher ${CMAKE_CXX_COMPILER_LAUNCHER})
endif()

# One instrumented object per source, built once however many targets link it.
function(_olmosft_fuzz_object src out_var)
  file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR} ${src})
  set(obj ${_fuzz_dir}/obj/${rel}.o)
  get_property(done GLOBAL PROPERTY OLMOSFT_FUZZ_OBJ_${rel} SET)
  if(NOT done)
    set_property(GLOBAL PROPERTY OLMOSFT_FUZZ_OBJ_${rel} 1)
    get_filename_component(objdir ${obj} DIRECTORY)
    file(MAKE_DIRECTORY ${objdir})
    add_custom_command(
      OUTPUT ${obj}
      COMMAND ${_fuzz_launcher} ${OLMOSFT_CLANGXX} ${_fuzz_cflags} -MD -MF ${obj}.d -c ${src} -o ${obj}
      DEPENDS ${src}
      DEPFILE ${obj}.d
      COMMENT "fuzz: compiling ${rel} (clang++, ASan + UBSan)"
      VERBATIM)
  endif()
  set(${out_var} ${obj} PARENT_SCOPE)
endfunction()

# olmosft_fuzz_target(NAME SOURCES src... LIBS lib...): ${_fuzz_dir}/fuzz_NAME from tests/fuzz/fuzz_NAME.cpp
# and the given src/ files; LIBS are link items (generator expressions allowed).
function(olmosft_fuzz_target name)
  cmake_parse_arguments(F "" "" "SOURCES;LIBS" ${ARGN})
  set(objs "")
  foreach(s ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_${name}.cpp ${F_SOURCES})
    if(NOT IS_ABSOLUTE ${s})
      set(s ${CMAKE_SOURCE_DIR}/${s})
    endif()
    _olmosft_fuzz_object(${s} obj)
    list(APPEND objs ${obj})
  endforeach()
  set(bin ${_fuzz_dir}/fuzz_${name})
  add_custom_command(
    OUTPUT ${bin}
    COMMAND ${OLMOSFT_CLANGXX} -fsanitize=fuzzer,address,undefined ${objs} ${F_LIBS} -o ${bin}
    DEPENDS ${objs}
    COMMENT "fuzz: linking fuzz_${name}"
    COMMAND_EXPAND_LISTS VERBATIM)
  add_custom_target(fuzz_${name} DEPENDS ${bin})
  set_property(GLOBAL APPEND PROPERTY OLMOSFT_FUZZ_BINS ${bin})
endfunction()

set(_pcre2 $<TARGET_PROPERTY:PkgConfig::PCRE2,INTERFACE_LINK_LIBRARIES>)
set(_zstd $<TARGET_PROPERTY:PkgConfig::ZSTD,INTERFACE_LINK_LIBRARIES>)
set(_crypto $<TARGET_PROPERTY:PkgConfig::OLMOSFT_LIBCRYPTO,INTERFACE_LINK_LIBRARIES>)
set(_io_common src/io/atomic_file.cpp src/io/json.cpp)

olmosft_fuzz_target(safetensors SOURCES src/io/safetensors.cpp src/io/atomic_file.cpp src/core/tensor.cpp
                                        src/core/bf16.cpp)
olmosft_fuzz_target(template SOURCES src/data/template.cpp src/data/template_filters.cpp
                                     src/data/template_lexer.cpp src/data/template_parser.cpp
                                     src/data/template_render.cpp src/data/template_values.cpp)
olmosft_fuzz_target(tokenizer SOURCES src/data/tokenizer.cpp src/data/tokenizer_util.cpp ${_io_common}
                              LIBS ${_pcre2} ${_zstd})
olmosft_fuzz_target(recipe SOURCES src/train/recipe.cpp src/train/recipe_schema.cpp src/model/memory_policy.cpp
                    src/xla/mesh.cpp src/xla/hlo_builder.cpp src/xla/hlo_builder_shape.cpp
                    src/xla/hlo_builder_spmd.cpp src/xla/mlir_text.cpp src/xla/types.cpp
                    src/kernels/gemm_choice.cpp LIBS $<TARGET_FILE:yaml-cpp>)
olmosft_fuzz_target(manifest SOURCES src/data/dataset.cpp src/io/hash.cpp ${_io_common} LIBS ${_crypto})
olmosft_fuzz_target(pickle SOURCES src/io/pickle.cpp src/io/distcp.cpp src/io/distcp_item.cpp src/io/atomic_file.cpp
                               src/core/tensor.cpp src/core/bf16.cpp)

get_property(_fuzz_bins GLOBAL PROPERTY OLMOSFT_FUZZ_BINS)
add_custom_target(fuzz DEPENDS ${_fuzz_bins})
