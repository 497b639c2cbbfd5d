// Small helpers of the tokenizer area: file reading, zstd decompression, SHA-256, atomic writes.
#pragma once
#include <string>
#include <string_view>

namespace olmosft::tok {

std::string read_file(const std::string& path);  // throws olmosft::Error naming the path
// Reads a .zst file (one or more frames) fully into memory.
std::string read_zstd_file(const std::string& path);
std::string sha256_hex(std::string_view data);
// Writes data to path atomically (temp file in the same dir, fsync, rename).
void write_file_atomic(const std::string& path, std::string_view data);

}  // namespace olmosft::tok
