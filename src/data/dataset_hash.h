// SHA-256 (OpenSSL EVP) for dataset manifests: input files, row checksums, tokenizer/template hashes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace olmosft {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  void update(const std::string& s) { update(s.data(), s.size()); }
  // Finishes and returns the 32-byte digest; the object must not be updated afterwards.
  std::string digest();
  std::string hex_digest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string sha256_hex(const void* data, size_t n);
std::string sha256_hex(const std::string& s);
// Streams a file; throws olmosft::Error naming the file if it cannot be read.
std::string sha256_file_hex(const std::string& path, uint64_t* size = nullptr);
// First 8 bytes of SHA-256 as a little-endian integer (row checksums).
uint64_t sha256_u64(const void* data, size_t n);
std::string to_hex(const std::string& bytes);

}  // namespace olmosft
