# io area: OpenSSL libcrypto for SHA-256 (src/io/hash, the only SHA-256 in the project: io, data, tokenizer).
# The libFuzzer target for the safetensors parser is in cmake/fuzz.cmake.
pkg_check_modules(OLMOSFT_LIBCRYPTO REQUIRED IMPORTED_TARGET libcrypto)
target_link_libraries(olmosft_lib PUBLIC PkgConfig::OLMOSFT_LIBCRYPTO)
