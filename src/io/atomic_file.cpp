#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.h"

namespace fs = std::filesystem;

namespace olmosft::io {

namespace {
std::string errno_str() { return std::strerror(errno); }

std::string parent_of(const std::string& path) {
  fs::path p(path);
  fs::path parent = p.parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  OLMO_CHECK(fd >= 0, "cannot open ", path, " to fsync it: ", errno_str());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  errno = err;
  OLMO_CHECK(rc == 0, "fsync of ", path, " failed: ", errno_str());
}
}  // namespace

std::string random_suffix() {
  static thread_local std::mt19937_64 gen([] {
    std::random_device rd;
    uint64_t seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    seed ^= static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    return seed;
  }());
  static const char* hex = "0123456789abcdef";
  uint64_t v = gen();
  std::string s(12, '0');
  for (auto& c : s) {
    c = hex[v & 15];
    v >>= 4;
  }
  return s;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  OLMO_CHECK(!path_.empty(), "AtomicFile: empty output path");
  fs::path p(path_);
  OLMO_CHECK(!p.filename().empty(), "output path ", path_, " names a directory, expected a file");
  std::string dir = parent_of(path_);
  std::error_code ec;
  OLMO_CHECK(fs::is_directory(dir, ec), "cannot write ", path_, ": directory ", dir, " does not exist");
  OLMO_CHECK(!fs::is_directory(path_, ec), "cannot write ", path_, ": it is a directory");
  tmp_ = path_ + ".tmp-" + std::to_string(::getpid()) + "-" + random_suffix();
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  OLMO_CHECK(fd_ >= 0, "cannot create temporary file ", tmp_, ": ", errno_str());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  OLMO_CHECK(fd_ >= 0 && !committed_, "write to ", path_, " after commit");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n > (1u << 30) ? (1u << 30) : n);
    if (w < 0 && errno == EINTR) continue;
    OLMO_CHECK(w > 0, "write to ", tmp_, " (for ", path_, ") failed: ", errno_str());
    p += w;
    n -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
}

void AtomicFile::commit() {
  OLMO_CHECK(fd_ >= 0 && !committed_, "AtomicFile::commit called twice for ", path_);
  OLMO_CHECK(::fsync(fd_) == 0, "fsync of ", tmp_, " failed: ", errno_str());
  int rc = ::close(fd_);
  fd_ = -1;
  OLMO_CHECK(rc == 0, "close of ", tmp_, " failed: ", errno_str());
  OLMO_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, "rename ", tmp_, " -> ", path_,
             " failed: ", errno_str());
  committed_ = true;
  fsync_dir(parent_of(path_));
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  auto st = fs::status(path, ec);
  OLMO_CHECK(fs::exists(st), "cannot read ", path, ": no such file");
  OLMO_CHECK(!fs::is_directory(st), "cannot read ", path, ": it is a directory, expected a file");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  OLMO_CHECK(fd >= 0, "cannot open ", path, ": ", errno_str());
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int err = errno;
      ::close(fd);
      errno = err;
      fail("read of ", path, " failed: ", errno_str());
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::string s = read_file(path);
  return std::vector<uint8_t>(s.begin(), s.end());
}

void fsync_dir(const std::string& dir) { fsync_path(dir, true); }

void fsync_tree(const std::string& dir) {
  std::vector<std::string> dirs{dir};
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_directory()) {
      dirs.push_back(e.path().string());
    } else if (e.is_regular_file()) {
      fsync_path(e.path().string(), false);
    }
  }
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) fsync_dir(*it);
}

namespace {
void check_new_or_empty(const std::string& d) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(d, ec))) return;
  OLMO_CHECK(fs::is_directory(fs::symlink_status(d, ec)), "output ", d, " exists and is not a directory");
  OLMO_CHECK(fs::is_empty(d, ec), "output directory ", d, " is not empty (it must be new or empty)");
}
}  // namespace

AtomicDir::AtomicDir(std::string final_dir) : final_(std::move(final_dir)) {
  while (final_.size() > 1 && final_.back() == '/') final_.pop_back();
  OLMO_CHECK(!final_.empty(), "empty output directory path");
  check_new_or_empty(final_);
  std::string parent = parent_of(final_);
  std::error_code ec;
  OLMO_CHECK(fs::is_directory(parent, ec), "cannot create ", final_, ": parent directory ", parent,
             " does not exist");
  staging_ = final_ + ".tmp-" + std::to_string(::getpid()) + "-" + random_suffix();
  OLMO_CHECK(::mkdir(staging_.c_str(), 0755) == 0, "cannot create staging directory ", staging_, ": ",
             errno_str());
}

AtomicDir::~AtomicDir() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(staging_, ec);
  }
}

void AtomicDir::commit() {
  OLMO_CHECK(!committed_, "AtomicDir::commit called twice for ", final_);
  check_new_or_empty(final_);
  fsync_tree(staging_);
  // rename(2) replaces an empty directory atomically; a missing target is simply created.
  OLMO_CHECK(::rename(staging_.c_str(), final_.c_str()) == 0, "publishing ", staging_, " as ", final_,
             " failed: ", errno_str());
  committed_ = true;
  fsync_dir(parent_of(final_));
}

}  // namespace olmosft::io
