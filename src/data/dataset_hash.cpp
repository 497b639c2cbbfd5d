#include "data/dataset_hash.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace olmosft {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  OLMO_CHECK(impl_->ctx && EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) == 1,
             "SHA-256: OpenSSL init failed");
}

Sha256::~Sha256() { EVP_MD_CTX_free(impl_->ctx); }

void Sha256::update(const void* data, size_t n) {
  OLMO_CHECK(EVP_DigestUpdate(impl_->ctx, data, n) == 1, "SHA-256: OpenSSL update failed");
}

std::string Sha256::digest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  OLMO_CHECK(EVP_DigestFinal_ex(impl_->ctx, md, &len) == 1 && len == 32, "SHA-256: OpenSSL final failed");
  return std::string(reinterpret_cast<char*>(md), len);
}

std::string Sha256::hex_digest() { return to_hex(digest()); }

std::string to_hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

std::string sha256_hex(const void* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return h.hex_digest();
}

std::string sha256_hex(const std::string& s) { return sha256_hex(s.data(), s.size()); }

std::string sha256_file_hex(const std::string& path, uint64_t* size) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail("cannot open ", path, ": ", std::strerror(errno));
  Sha256 h;
  std::vector<char> buf(1 << 20);
  uint64_t total = 0;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    h.update(buf.data(), n);
    total += n;
  }
  bool err = std::ferror(f);
  std::fclose(f);
  if (err) fail("error reading ", path);
  if (size) *size = total;
  return h.hex_digest();
}

uint64_t sha256_u64(const void* data, size_t n) {
  unsigned char md[32];
  unsigned int len = 0;
  OLMO_CHECK(EVP_Digest(data, n, md, &len, EVP_sha256(), nullptr) == 1, "SHA-256: OpenSSL digest failed");
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | md[i];
  return v;
}

}  // namespace olmosft
