#include "io/hash.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace olmosft::io {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
  bool done = false;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  OLMO_CHECK(impl_->ctx != nullptr, "SHA-256: EVP_MD_CTX_new failed");
  OLMO_CHECK(EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) == 1, "SHA-256: EVP_DigestInit_ex failed");
}

Sha256::~Sha256() {
  if (impl_ && impl_->ctx) EVP_MD_CTX_free(impl_->ctx);
}

void Sha256::update(const void* data, size_t n) {
  OLMO_CHECK(!impl_->done, "SHA-256: update after hex()");
  if (n == 0) return;
  OLMO_CHECK(EVP_DigestUpdate(impl_->ctx, data, n) == 1, "SHA-256: EVP_DigestUpdate failed");
}

std::string Sha256::hex() {
  OLMO_CHECK(!impl_->done, "SHA-256: hex() called twice");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  OLMO_CHECK(EVP_DigestFinal_ex(impl_->ctx, md, &len) == 1 && len == 32,
             "SHA-256: EVP_DigestFinal_ex failed");
  impl_->done = true;
  static const char* digits = "0123456789abcdef";
  std::string out(64, '0');
  for (unsigned i = 0; i < len; ++i) {
    out[2 * i] = digits[md[i] >> 4];
    out[2 * i + 1] = digits[md[i] & 15];
  }
  return out;
}

std::string sha256_hex(const void* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return h.hex();
}

std::string sha256_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  OLMO_CHECK(fd >= 0, "cannot open ", path, " to hash it: ", std::strerror(errno));
  Sha256 h;
  std::vector<char> buf(1 << 20);
  for (;;) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int err = errno;
      ::close(fd);
      fail("read of ", path, " failed while hashing: ", std::strerror(err));
    }
    if (r == 0) break;
    h.update(buf.data(), static_cast<size_t>(r));
  }
  ::close(fd);
  return h.hex();
}

}  // namespace olmosft::io
