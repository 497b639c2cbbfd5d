// SHA-256 (OpenSSL libcrypto EVP) for manifests and checkpoint checksums. Digests are lowercase hex.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace olmosft::io {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::string hex();  // finishes the digest; the object can then only be destroyed

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string sha256_hex(const void* data, size_t n);
inline std::string sha256_hex(std::string_view s) { return sha256_hex(s.data(), s.size()); }
// Streams the file (1 MiB blocks); errors name the file.
std::string sha256_file(const std::string& path);

}  // namespace olmosft::io
