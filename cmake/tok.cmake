# Tokenizer area: PCRE2 (pre-tokenizer regex) and libzstd (compressed golden corpus).
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
target_link_libraries(olmosft_lib PUBLIC PkgConfig::PCRE2 PkgConfig::ZSTD)
