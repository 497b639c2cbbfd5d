// Small helpers of the tokenizer area: zstd decompression. (Reading files, SHA-256 and atomic writes:
// io/atomic_file.h, io/hash.h.)
#pragma once
#include <string>
#include <string_view>

namespace olmosft::tok {

// Reads a .zst file (one or more frames) fully into memory.
std::string read_zstd_file(const std::string& path);

}  // namespace olmosft::tok
