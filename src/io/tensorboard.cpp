#include "io/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace olmosft::io {

namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> tab{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      tab[i] = c;
    }
    return tab;
  }();
  return t;
}

void put_varint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  s.push_back(static_cast<char>(v));
}

void put_fixed(std::string& s, const void* p, size_t n) { s.append(static_cast<const char*>(p), n); }

void put_bytes_field(std::string& s, uint8_t tag, const std::string& bytes) {
  s.push_back(static_cast<char>(tag));
  put_varint(s, bytes.size());
  s += bytes;
}

double now_seconds() {
  using namespace std::chrono;
  return duration_cast<duration<double>>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto& t = crc_table();
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

std::string tb_encode_file_version_event(double wall_time) {
  std::string e;
  e.push_back(0x09);  // field 1, fixed64: wall_time
  put_fixed(e, &wall_time, 8);
  put_bytes_field(e, 0x1A, "brain.Event:2");  // field 3: file_version
  return e;
}

std::string tb_encode_scalars_event(double wall_time, int64_t step,
                                    const std::vector<std::pair<std::string, float>>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    OLMO_CHECK(!tag.empty(), "TensorBoard: empty scalar tag");
    std::string value;
    put_bytes_field(value, 0x0A, tag);  // Summary.Value field 1: tag
    value.push_back(0x15);              // field 2, fixed32: simple_value
    put_fixed(value, &v, 4);
    put_bytes_field(summary, 0x0A, value);  // Summary field 1: repeated value
  }
  std::string e;
  e.push_back(0x09);
  put_fixed(e, &wall_time, 8);
  if (step != 0) {  // proto3 omits default values
    e.push_back(0x10);
    put_varint(e, static_cast<uint64_t>(step));  // int64: negative values take 10 bytes, as protobuf
  }
  put_bytes_field(e, 0x2A, summary);  // field 5: summary
  return e;
}

std::string tfrecord_frame(const std::string& data) {
  std::string r;
  uint64_t len = data.size();
  put_fixed(r, &len, 8);
  uint32_t lc = masked_crc32c(&len, 8);
  put_fixed(r, &lc, 4);
  r += data;
  uint32_t dc = masked_crc32c(data.data(), data.size());
  put_fixed(r, &dc, 4);
  return r;
}

double TensorBoardWriter::now() const { return clock_ ? clock_() : now_seconds(); }

TensorBoardWriter::TensorBoardWriter(const std::string& logdir, std::function<double()> clock)
    : clock_(std::move(clock)) {
  std::error_code ec;
  std::filesystem::create_directories(logdir, ec);
  OLMO_CHECK(std::filesystem::is_directory(logdir, ec), "cannot create TensorBoard log directory ", logdir);
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == 0) std::strcpy(host, "localhost");
  double t = now();
  char base[400];
  std::snprintf(base, sizeof base, "%s/events.out.tfevents.%010lld.%s", logdir.c_str(),
                static_cast<long long>(t), host);
  path_ = base;
  for (int n = 0;; ++n) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ >= 0) break;
    OLMO_CHECK(errno == EEXIST && n < 100, "cannot create TensorBoard event file ", path_, ": ",
               std::strerror(errno));
    path_ = std::string(base) + "." + std::to_string(::getpid()) + "." + std::to_string(n);
  }
  write_record(tb_encode_file_version_event(t));
}

TensorBoardWriter::~TensorBoardWriter() {
  try {
    close();
  } catch (...) {
  }
}

void TensorBoardWriter::write_record(const std::string& event) {
  OLMO_CHECK(fd_ >= 0, "TensorBoard writer for ", path_, " is closed");
  std::string rec = tfrecord_frame(event);
  const char* p = rec.data();
  size_t n = rec.size();
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    OLMO_CHECK(w > 0, "write to ", path_, " failed: ", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void TensorBoardWriter::add_scalar(const std::string& tag, float value, int64_t step) {
  add_scalars(step, {{tag, value}});
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& values) {
  if (values.empty()) return;
  write_record(tb_encode_scalars_event(now(), step, values));
}

void TensorBoardWriter::sync() {
  OLMO_CHECK(fd_ >= 0, "TensorBoard writer for ", path_, " is closed");
  OLMO_CHECK(::fsync(fd_) == 0, "fsync of ", path_, " failed: ", std::strerror(errno));
}

void TensorBoardWriter::close() {
  if (fd_ < 0) return;
  int rc = ::fsync(fd_);
  ::close(fd_);
  fd_ = -1;
  OLMO_CHECK(rc == 0, "fsync of ", path_, " failed");
}

}  // namespace olmosft::io
