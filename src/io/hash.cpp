#include "io/hash.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"

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

std::string Sha256::digest() {
  OLMO_CHECK(!impl_->done, "SHA-256: digest finished twice");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  OLMO_CHECK(EVP_DigestFinal_ex(impl_->ctx, md, &len) == 1 && len == 32,
             "SHA-256: EVP_DigestFinal_ex failed");
  impl_->done = true;
  return std::string(reinterpret_cast<const char*>(md), len);
}

std::string Sha256::hex() { return to_hex(digest()); }

std::string to_hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out(2 * bytes.size(), '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    auto c = static_cast<unsigned char>(bytes[i]);
    out[2 * i] = digits[c >> 4];
    out[2 * i + 1] = digits[c & 15];
  }
  return out;
}

std::string sha256_hex(const void* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return h.hex();
}

uint64_t sha256_u64(const void* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  std::string md = h.digest();
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(md[static_cast<size_t>(i)]);
  return v;
}

std::string sha256_file(const std::string& path, uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  OLMO_CHECK(fd >= 0, "cannot open ", path, " to hash it: ", std::strerror(errno));
  Sha256 h;
  std::vector<char> buf(1 << 20);
  uint64_t total = 0;
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
    total += static_cast<uint64_t>(r);
  }
  ::close(fd);
  if (size) *size = total;
  return h.hex();
}

size_t write_sha256_manifest(const std::string& dir, const std::string& manifest_name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  OLMO_CHECK(fs::is_directory(dir, ec), "cannot write a checksum manifest: ", dir, " is not a directory");
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::string rel = fs::relative(e.path(), dir).generic_string();
    if (rel == manifest_name || rel.find(".tmp-") != std::string::npos) continue;
    OLMO_CHECK(rel.find('\n') == std::string::npos, dir,
               ": file name with a newline cannot be listed: ", rel);
    files.push_back(rel);
  }
  std::sort(files.begin(), files.end());
  std::string out;
  for (const auto& f : files) out += sha256_file(dir + "/" + f) + "  " + f + "\n";
  write_file_atomic(dir + "/" + manifest_name, out);
  return files.size();
}

size_t verify_sha256_manifest(const std::string& dir, const std::string& manifest_name) {
  std::string path = dir + "/" + manifest_name;
  std::istringstream in(read_file(path));
  std::string line, problems;
  size_t n = 0, lineno = 0, bad = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    bool hex = line.size() > 66 && line[64] == ' ' && line[65] == ' ' &&
               std::all_of(line.begin(), line.begin() + 64,
                           [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
    OLMO_CHECK(hex, path, ":", lineno, ": expected '<64 hex digits>  <file>'");
    std::string want = line.substr(0, 64), file = line.substr(66);
    std::transform(want.begin(), want.end(), want.begin(),
                   [](char c) { return static_cast<char>(std::tolower(c)); });
    std::error_code ec;
    if (!std::filesystem::is_regular_file(dir + "/" + file, ec)) {
      problems += "\n  missing: " + file;
      ++bad;
    } else if (sha256_file(dir + "/" + file) != want) {
      problems += "\n  checksum mismatch: " + file;
      ++bad;
    }
    ++n;
  }
  OLMO_CHECK(bad == 0, path, ": ", bad, " of ", n, " files failed verification:", problems);
  return n;
}

}  // namespace olmosft::io
