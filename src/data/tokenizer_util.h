// Small helpers of the tokenizer area: file reading, zstd decompression. (SHA-256 and atomic writes:
// io/hash.h, io/atomic_file.h.)
#pragma once
#include <string>
#include <string_view>

namespace olmosft::tok {

std::string read_file(const std::string& path);  // throws olmosft::Error naming the path
// Reads a .zst file (one or more frames) fully into memory.
std::string read_zstd_file(const std::string& path);

}  // namespace olmosft::tok
