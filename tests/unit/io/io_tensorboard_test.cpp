// io: TensorBoard event files. Checked against the golden records of docs/reference/formats.md §4 (computed
// there with stdlib Python) and decoded back by an independent minimal TFRecord + protobuf decoder written
// here (bitwise CRC-32C, not the writer's table).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/tensorboard.h"

namespace fs = std::filesystem;
using namespace olmosft;

namespace {

uint32_t crc32c_bitwise(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}
uint32_t masked(const uint8_t* p, size_t n) {
  uint32_t c = crc32c_bitwise(p, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string o;
  for (unsigned char c : s) o += {d[c >> 4], d[c & 15]};
  return o;
}

struct Scalar {
  std::string tag;
  float value;
};
struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<Scalar> scalars;
};

struct Cursor {
  const uint8_t* p;
  const uint8_t* end;
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) throw std::runtime_error("truncated varint");
      uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    throw std::runtime_error("varint too long");
  }
  std::string bytes() {
    uint64_t n = varint();
    if (static_cast<uint64_t>(end - p) < n) throw std::runtime_error("truncated bytes");
    std::string s(reinterpret_cast<const char*>(p), n);
    p += n;
    return s;
  }
  template <typename T>
  T fixed() {
    T v;
    if (static_cast<size_t>(end - p) < sizeof v) throw std::runtime_error("truncated fixed");
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    return v;
  }
};

Event decode_event(const std::string& data) {
  Event e;
  Cursor c{reinterpret_cast<const uint8_t*>(data.data()),
           reinterpret_cast<const uint8_t*>(data.data()) + data.size()};
  while (c.p < c.end) {
    uint64_t key = c.varint();
    switch (key) {
      case 0x09:
        e.wall_time = c.fixed<double>();
        break;
      case 0x10:
        e.step = static_cast<int64_t>(c.varint());
        break;
      case 0x1A:
        e.file_version = c.bytes();
        break;
      case 0x2A: {
        std::string summary = c.bytes();
        Cursor s{reinterpret_cast<const uint8_t*>(summary.data()),
                 reinterpret_cast<const uint8_t*>(summary.data()) + summary.size()};
        while (s.p < s.end) {
          if (s.varint() != 0x0A) throw std::runtime_error("unexpected Summary field");
          std::string value = s.bytes();
          Cursor v{reinterpret_cast<const uint8_t*>(value.data()),
                   reinterpret_cast<const uint8_t*>(value.data()) + value.size()};
          Scalar sc;
          while (v.p < v.end) {
            uint64_t k = v.varint();
            if (k == 0x0A)
              sc.tag = v.bytes();
            else if (k == 0x15)
              sc.value = v.fixed<float>();
            else
              throw std::runtime_error("unexpected Value field");
          }
          e.scalars.push_back(sc);
        }
        break;
      }
      default:
        throw std::runtime_error("unexpected Event field " + std::to_string(key));
    }
  }
  return e;
}

std::vector<Event> read_events(const std::string& path) {
  std::string f = io::read_file(path);
  const uint8_t* p = reinterpret_cast<const uint8_t*>(f.data());
  size_t pos = 0;
  std::vector<Event> out;
  while (pos < f.size()) {
    EXPECT_GE(f.size() - pos, 12u);
    uint64_t len;
    std::memcpy(&len, p + pos, 8);
    uint32_t lc;
    std::memcpy(&lc, p + pos + 8, 4);
    EXPECT_EQ(lc, masked(p + pos, 8)) << "length CRC at " << pos;
    EXPECT_GE(f.size() - pos - 12, len + 4);
    uint32_t dc;
    std::memcpy(&dc, p + pos + 12 + len, 4);
    EXPECT_EQ(dc, masked(p + pos + 12, len)) << "data CRC at " << pos;
    out.push_back(decode_event(f.substr(pos + 12, len)));
    pos += 12 + len + 4;
  }
  EXPECT_EQ(pos, f.size());
  return out;
}

}  // namespace

TEST(Crc32c, CheckValueAndMask) {
  EXPECT_EQ(io::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(io::crc32c("", 0), 0u);
  std::string s(1000, 'x');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 7 + 3);
  EXPECT_EQ(io::crc32c(s.data(), s.size()),
            crc32c_bitwise(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
  // Incremental equals one-shot.
  EXPECT_EQ(io::crc32c(s.data() + 400, 600, io::crc32c(s.data(), 400)), io::crc32c(s.data(), s.size()));
}

TEST(TensorBoard, GoldenRecordsFromFormatsMd) {
  EXPECT_EQ(hex(io::tfrecord_frame(io::tb_encode_file_version_event(1.5))),
            "1800000000000000a37f4b2209000000000000f83f1a0d627261696e2e4576656e743a322a28646c");
  EXPECT_EQ(hex(io::tfrecord_frame(io::tb_encode_scalars_event(2.0, 10, {{"loss", 0.5f}}))),
            "1a00000000000000129bd82d090000000000000040100a2a0d0a0b0a046c6f7373150000003f081add56");
}

TEST(TensorBoard, WriterFileDecodesBack) {
  auto dir = (fs::temp_directory_path() / ("olmosft-tb-" + io::random_suffix())).string();
  std::string path;
  {
    io::TensorBoardWriter w(dir + "/run1");
    path = w.path();
    EXPECT_NE(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), std::string::npos);
    for (int step = 0; step < 50; ++step) {
      w.add_scalar("train/loss", 3.0f / static_cast<float>(step + 1), step);
      // Flushed per step: the file already holds every record written so far.
      EXPECT_EQ(read_events(path).size(), static_cast<size_t>(step + 2));
    }
    w.add_scalars(1000000000000LL, {{"train/lr", 5e-5f}, {"train/grad_norm", 0.0f}});
    w.add_scalar("neg", -1.25f, -3);
  }
  auto ev = read_events(path);
  ASSERT_EQ(ev.size(), 53u);
  EXPECT_EQ(ev[0].file_version, "brain.Event:2");
  EXPECT_GT(ev[0].wall_time, 1.6e9);
  for (int step = 0; step < 50; ++step) {
    const auto& e = ev[static_cast<size_t>(step) + 1];
    EXPECT_EQ(e.step, step);
    ASSERT_EQ(e.scalars.size(), 1u);
    EXPECT_EQ(e.scalars[0].tag, "train/loss");
    EXPECT_EQ(e.scalars[0].value, 3.0f / static_cast<float>(step + 1));
    EXPECT_GE(e.wall_time, ev[0].wall_time);
  }
  EXPECT_EQ(ev[51].step, 1000000000000LL);
  ASSERT_EQ(ev[51].scalars.size(), 2u);
  EXPECT_EQ(ev[51].scalars[0].tag, "train/lr");
  EXPECT_EQ(ev[51].scalars[0].value, 5e-5f);
  EXPECT_EQ(ev[51].scalars[1].tag, "train/grad_norm");
  EXPECT_EQ(ev[51].scalars[1].value, 0.0f);
  EXPECT_EQ(ev[52].step, -3);
  EXPECT_EQ(ev[52].scalars[0].value, -1.25f);
  // A second writer in the same second gets a distinct file.
  io::TensorBoardWriter a(dir + "/run2"), b(dir + "/run2");
  EXPECT_NE(a.path(), b.path());
  fs::remove_all(dir);
}

// Records serialised by Google's protobuf runtime (tests/reference/io_tfevents.py).
TEST(TensorBoard, MatchesProtobufReferenceFixture) {
  auto j = nlohmann::json::parse(io::read_file(std::string(OLMOSFT_GOLDEN_DIR) + "/io/tb_records.json"));
  ASSERT_GE(j.size(), 6u);
  for (const auto& c : j) {
    double wall = c["wall_time"].get<double>();
    std::string got;
    if (c["values"].is_null()) {
      got = io::tfrecord_frame(io::tb_encode_file_version_event(wall));
    } else {
      std::vector<std::pair<std::string, float>> vals;
      for (const auto& v : c["values"])
        vals.push_back({v[0].get<std::string>(), static_cast<float>(v[1].get<double>())});
      got = io::tfrecord_frame(io::tb_encode_scalars_event(wall, c["step"].get<int64_t>(), vals));
    }
    EXPECT_EQ(hex(got), c["record_hex"].get<std::string>()) << c.dump();
    auto e = decode_event(got.substr(12, got.size() - 16));
    EXPECT_EQ(e.wall_time, wall);
  }
}
