// SHA-256 (OpenSSL libcrypto EVP), the project's one implementation: checkpoint/dataset manifests, dataset
// row checksums, tokenizer hashes. Hex digests are lowercase.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace olmosft::io {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // Finish the digest (call one of them once); the object can then only be destroyed.
  std::string digest();  // the 32 raw digest bytes
  std::string hex();     // the same as 64 lowercase hex digits

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Lowercase hex of arbitrary bytes.
std::string to_hex(std::string_view bytes);
std::string sha256_hex(const void* data, size_t n);
inline std::string sha256_hex(std::string_view s) { return sha256_hex(s.data(), s.size()); }
// First 8 digest bytes as a little-endian integer (dataset row checksums; an on-disk format).
uint64_t sha256_u64(const void* data, size_t n);
// Streams the file (1 MiB blocks); errors name the file. If size is given it receives the bytes hashed.
std::string sha256_file(const std::string& path, uint64_t* size = nullptr);

// Checksum manifests in `sha256sum` format ("<64 hex>  <relative path>\n", sorted by path), so that
// `cd DIR && sha256sum -c SHA256SUMS` verifies them too. write_sha256_manifest hashes every regular file
// under dir (recursively, except the manifest itself) and writes the manifest atomically; it returns
// the number of files listed.
size_t write_sha256_manifest(const std::string& dir, const std::string& manifest_name = "SHA256SUMS");
// Re-hashes every listed file; throws olmosft::Error listing each missing or mismatching file.
// Files not in the manifest are ignored. Returns the number of files verified.
size_t verify_sha256_manifest(const std::string& dir, const std::string& manifest_name = "SHA256SUMS");

}  // namespace olmosft::io
