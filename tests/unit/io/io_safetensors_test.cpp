// io: atomic files, SHA-256, safetensors reader/writer/sharding, and a deterministic mutation fuzz of the
// safetensors parser.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/bf16.h"
#include "core/rng.h"
#include "io/atomic_file.h"
#include "io/hash.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;
using namespace olmosft;
namespace st = olmosft::safetensors;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    path = (fs::temp_directory_path() / ("olmosft-io-test-" + io::random_suffix())).string();
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& n) const { return path + "/" + n; }
};

void write_raw(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// An image with the given header text (not padded) and `data` bytes of buffer.
std::vector<uint8_t> image(const std::string& header, size_t data, uint64_t n_override = UINT64_MAX) {
  uint64_t n = n_override == UINT64_MAX ? header.size() : n_override;
  std::vector<uint8_t> b(8 + header.size() + data, 0xAB);
  std::memcpy(b.data(), &n, 8);
  if (!header.empty()) std::memcpy(b.data() + 8, header.data(), header.size());
  return b;
}

// Expects parse() to throw olmosft::Error whose message contains every fragment.
void expect_error(const std::vector<uint8_t>& b, std::vector<std::string> fragments) {
  try {
    st::parse(b.data(), b.size(), "file.safetensors");
    FAIL() << "expected an error containing " << fragments[0];
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("file.safetensors"), std::string::npos) << m;
    for (const auto& f : fragments)
      EXPECT_NE(m.find(f), std::string::npos) << "missing '" << f << "' in: " << m;
  }
}

std::vector<st::NamedTensor> sample_tensors() {
  Rng rng{7, 1};
  Tensor a = Tensor::empty({3, 5});
  fill_normal(a, rng, 0, 1);
  Tensor b = a.to(DType::BF16);
  Tensor c = a.slice(0, 1, 3).to(DType::F16);
  Tensor d = Tensor::from<int64_t>({1, -2, 3}, {3});
  Tensor e = Tensor::from<uint8_t>({1, 2, 3, 4, 5}, {5});
  Tensor f = Tensor::from<double>({0.25}, {});  // 0-rank scalar
  Tensor g = Tensor::zeros({0, 4});             // empty tensor
  Tensor h = Tensor::from<int32_t>({7, 8}, {2});
  return {{"w.f32", a},    {"w.bf16", b},     {"w.f16", c},     {"idx.i64", d},
          {"bytes.u8", e}, {"scalar.f64", f}, {"empty.f32", g}, {"i32", h}};
}

}  // namespace

TEST(AtomicFile, WritesAndLeavesNoTemp) {
  TempDir d;
  io::write_file_atomic(d / "a.txt", "hello");
  EXPECT_EQ(io::read_file(d / "a.txt"), "hello");
  io::write_file_atomic(d / "a.txt", "replaced");
  EXPECT_EQ(io::read_file(d / "a.txt"), "replaced");
  {
    io::AtomicFile f(d / "b.txt");
    f.write("partial");
    EXPECT_TRUE(fs::exists(f.temp_path()));
  }  // not committed: nothing published, temp removed
  EXPECT_FALSE(fs::exists(d / "b.txt"));
  int n = 0;
  for (auto& e : fs::directory_iterator(d.path)) (void)e, ++n;
  EXPECT_EQ(n, 1);
}

TEST(AtomicFile, ClearErrors) {
  TempDir d;
  EXPECT_THROW(io::write_file_atomic(d / "no/such/dir/x", "x"), Error);
  try {
    io::read_file(d / "missing.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.json: no such file"), std::string::npos) << e.what();
  }
  try {
    io::read_file(d.path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
}

TEST(AtomicDir, PublishesNewOrEmptyOnly) {
  TempDir d;
  {
    io::AtomicDir out(d / "out");
    io::write_file_atomic(out.file("x"), "1");
    EXPECT_FALSE(fs::exists(d / "out"));
    out.commit();
  }
  EXPECT_EQ(io::read_file(d / "out/x"), "1");
  EXPECT_THROW(io::AtomicDir(d / "out"), Error);  // not empty
  fs::create_directories(d / "empty");
  {
    io::AtomicDir out(d / "empty");
    io::write_file_atomic(out.file("y"), "2");
    out.commit();
  }
  EXPECT_EQ(io::read_file(d / "empty/y"), "2");
  {
    io::AtomicDir out(d / "abandoned");
    io::write_file_atomic(out.file("z"), "3");
  }
  EXPECT_FALSE(fs::exists(d / "abandoned"));
  int n = 0;
  for (auto& e : fs::directory_iterator(d.path)) (void)e, ++n;
  EXPECT_EQ(n, 2);  // out, empty; no staging leftovers
}

TEST(Hash, Sha256KnownVectors) {
  // FIPS 180-2 test vectors.
  EXPECT_EQ(io::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(io::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(io::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  TempDir d;
  std::string big(3 << 20, 'a');  // spans several 1 MiB read blocks
  io::write_file_atomic(d / "big", big);
  EXPECT_EQ(io::sha256_file(d / "big"), io::sha256_hex(big));
  io::Sha256 h;
  h.update(big.substr(0, 12345));
  h.update(big.substr(12345));
  EXPECT_EQ(h.hex(), io::sha256_hex(big));
  EXPECT_THROW(io::sha256_file(d / "missing"), Error);
}

TEST(Safetensors, ExactLayoutOfASmallFile) {
  Tensor a = Tensor::from<float>({1.0f, 2.0f}, {2});
  Tensor b = Tensor::from<uint8_t>({9}, {1});
  auto bytes = st::serialize({{"b", b}, {"a", a}});
  std::string expect_json =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[1],"data_offsets":[8,9]}})";
  while (expect_json.size() % 8) expect_json += ' ';
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  ASSERT_EQ(n, expect_json.size());
  EXPECT_EQ(std::string(bytes.begin() + 8, bytes.begin() + 8 + n), expect_json);
  ASSERT_EQ(bytes.size(), 8 + n + 9);
  float f[2];
  std::memcpy(f, bytes.data() + 8 + n, 8);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], 2.0f);
  EXPECT_EQ(bytes.back(), 9);
}

TEST(Safetensors, RoundTripAllDtypes) {
  TempDir d;
  auto ts = sample_tensors();
  st::write(d / "m.safetensors", ts, {{"format", "pt"}, {"note", "x y"}});
  auto r = st::Reader::open(d / "m.safetensors");
  EXPECT_EQ(r->header().header_size % 8, 0u);
  EXPECT_EQ(r->metadata().at("note"), "x y");
  ASSERT_EQ(r->tensors().size(), ts.size());
  for (const auto& t : ts) {
    const auto& info = r->at(t.name);
    EXPECT_EQ(info.dtype, t.tensor.dtype()) << t.name;
    EXPECT_EQ(info.shape, t.tensor.shape()) << t.name;
    EXPECT_EQ(info.begin % dtype_size(info.dtype), 0u) << t.name;  // aligned layout
    Tensor v = r->view(t.name);
    Tensor c = t.tensor.contiguous();
    ASSERT_EQ(v.nbytes(), c.nbytes());
    EXPECT_EQ(std::memcmp(v.raw_data(), c.raw_data(), c.nbytes()), 0) << t.name;
  }
  // Deterministic: input order does not matter, bytes are identical.
  auto rev = ts;
  std::reverse(rev.begin(), rev.end());
  EXPECT_EQ(st::serialize(ts), st::serialize(rev));
  EXPECT_THROW(r->at("nope"), Error);
}

TEST(Safetensors, WriterRejectsBadInput) {
  Tensor a = Tensor::zeros({2});
  EXPECT_THROW(st::serialize({{"a", a}, {"a", a}}), Error);
  EXPECT_THROW(st::serialize({{"", a}}), Error);
  EXPECT_THROW(st::serialize({{"__metadata__", a}}), Error);
}

TEST(Safetensors, RejectsTruncatedAndBadLength) {
  TempDir d;
  auto good = st::serialize(sample_tensors());
  EXPECT_NO_THROW(st::parse(good.data(), good.size(), "file.safetensors"));
  expect_error(std::vector<uint8_t>(good.begin(), good.begin() + 5), {"too small"});
  expect_error(std::vector<uint8_t>(good.begin(), good.end() - 1), {"truncated"});
  uint64_t n;
  std::memcpy(&n, good.data(), 8);
  expect_error(std::vector<uint8_t>(good.begin(), good.begin() + 8 + n / 2), {"exceeds the file size"});
  auto big = good;
  uint64_t huge = 1ull << 40;
  std::memcpy(big.data(), &huge, 8);
  expect_error(big, {"exceeds the limit"});
  // On disk, through the mmap reader.
  write_raw(d / "t.safetensors", std::vector<uint8_t>(good.begin(), good.end() - 3));
  try {
    st::Reader::open(d / "t.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.safetensors"), std::string::npos) << e.what();
  }
  write_raw(d / "empty.safetensors", {});
  EXPECT_THROW(st::Reader::open(d / "empty.safetensors"), Error);
  EXPECT_THROW(st::Reader::open(d / "missing.safetensors"), Error);
}

TEST(Safetensors, RejectsBadJson) {
  expect_error(image("{\"a\": ", 0), {"invalid JSON"});
  expect_error(image("[1,2,3]", 0), {"does not start with '{'"});
  expect_error(image("{}xx", 0), {"invalid JSON"});
  expect_error(image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                     8),
               {"duplicate JSON key 'a'"});
  expect_error(image(std::string("{\"\xff\xfe\":1}"), 0), {"invalid JSON"});  // not UTF-8
  expect_error(image("{\"__metadata__\":{\"k\":1}}", 0), {"__metadata__", "must be a string"});
  expect_error(image("{\"__metadata__\":[1]}", 0), {"__metadata__ must be an object"});
  expect_error(image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4),
               {"tensor 'a'", "unknown field 'x'"});
  expect_error(image("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4),
               {"tensor 'a'", "non-negative integer"});
  expect_error(image("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.0,4]}}", 4),
               {"tensor 'a'", "non-negative integer"});
  expect_error(image("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4), {"tensor 'a'", "dtype"});
  expect_error(image("{\"a\":[[[[[[[[[[[[1]]]]]]]]]]]}", 0), {"nested deeper"});
  // Spaces after the object are padding and fine.
  EXPECT_NO_THROW(st::parse(image("{}      ", 0).data(), 8 + 8, "x"));
}

TEST(Safetensors, RejectsLayoutErrors) {
  auto ent = [](const std::string& name, const std::string& dt, const std::string& shape, int b, int e) {
    return "\"" + name + "\":{\"dtype\":\"" + dt + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
           std::to_string(b) + "," + std::to_string(e) + "]}";
  };
  // Overlap.
  expect_error(image("{" + ent("a", "F32", "[2]", 0, 8) + "," + ent("b", "F32", "[2]", 4, 12) + "}", 12),
               {"'a'", "'b'", "overlap"});
  // Hole between tensors.
  expect_error(image("{" + ent("a", "F32", "[1]", 0, 4) + "," + ent("b", "F32", "[1]", 8, 12) + "}", 12),
               {"after tensor 'a'", "entirely indexed"});
  // Hole at the start.
  expect_error(image("{" + ent("a", "F32", "[1]", 4, 8) + "}", 8), {"at the start"});
  // Trailing bytes nobody owns.
  expect_error(image("{" + ent("a", "F32", "[1]", 0, 4) + "}", 6), {"last 2 bytes"});
  // Wrong dtype.
  expect_error(image("{" + ent("a", "Q4", "[1]", 0, 4) + "}", 4), {"tensor 'a'", "unsupported dtype 'Q4'"});
  // Shape/size mismatch.
  expect_error(image("{" + ent("a", "BF16", "[3]", 0, 4) + "}", 4), {"tensor 'a'", "needs 6"});
  // Offsets beyond the buffer.
  expect_error(image("{" + ent("a", "F32", "[2]", 0, 8) + "}", 4), {"tensor 'a'", "beyond"});
  // begin > end.
  expect_error(image("{" + ent("a", "F32", "[0]", 4, 0) + "}", 4), {"tensor 'a'", "begin > end"});
  // Overflowing shape.
  expect_error(
      image("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0),
      {"tensor 'a'", "overflow"});
  // Valid: zero-size tensors sharing an offset, and a scalar.
  auto v = image("{" + ent("z1", "F32", "[0]", 0, 0) + "," + ent("s", "F64", "[]", 0, 8) + "," +
                     ent("z2", "BF16", "[0,3]", 8, 8) + "}",
                 8);
  auto h = st::parse(v.data(), v.size(), "x");
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[1].name, "s");
}

// Thousands of deterministic random mutations (byte flips, header-length edits, truncations, extensions)
// of valid images: the parser must return a consistent header or throw olmosft::Error, never crash or
// throw anything else.
TEST(Safetensors, MutationFuzzNeverCrashes) {
  std::vector<std::vector<uint8_t>> seeds = {st::serialize(sample_tensors()),
                                             st::serialize({{"x", Tensor::zeros({2, 2})}}, {})};
  Rng rng{20261202, 99};
  uint64_t ctr = 0;
  int ok = 0, rejected = 0;
  const int kIters = 6000;
  for (int it = 0; it < kIters; ++it) {
    auto b = seeds[it % seeds.size()];
    uint64_t n;
    std::memcpy(&n, b.data(), 8);
    int muts = 1 + static_cast<int>(rng.below(ctr++, 4));
    for (int m = 0; m < muts; ++m) {
      uint64_t kind = rng.below(ctr++, 10);
      if (kind < 6 && !b.empty()) {  // flip a byte, mostly inside the header
        uint64_t lim = (kind < 4) ? std::min<uint64_t>(b.size(), 8 + n) : b.size();
        uint64_t pos = rng.below(ctr++, lim);
        b[pos] = static_cast<uint8_t>(rng.bits(ctr++));
      } else if (kind == 6) {  // truncate
        b.resize(rng.below(ctr++, b.size() + 1));
      } else if (kind == 7) {  // extend
        uint64_t extra = 1 + rng.below(ctr++, 16);
        b.resize(b.size() + extra, static_cast<uint8_t>(rng.bits(ctr++)));
      } else if (kind == 8 && b.size() >= 8) {  // nudge the header length
        uint64_t v;
        std::memcpy(&v, b.data(), 8);
        v += static_cast<uint64_t>(static_cast<int64_t>(rng.below(ctr++, 17)) - 8);
        std::memcpy(b.data(), &v, 8);
      } else if (b.size() > 8 + n && n > 0) {  // replace a digit in the header with another digit
        uint64_t p = 8 + rng.below(ctr++, n);
        if (b[p] >= '0' && b[p] <= '9') b[p] = static_cast<uint8_t>('0' + rng.below(ctr++, 10));
      }
    }
    try {
      auto h = st::parse(b.data(), b.size(), "mutant");
      uint64_t pos = 0;
      for (const auto& t : h.tensors) {
        ASSERT_EQ(t.begin, pos);
        ASSERT_LE(t.end, h.data_size);
        ASSERT_EQ(t.end - t.begin, static_cast<uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype));
        pos = t.end;
      }
      ASSERT_EQ(pos, h.data_size);
      ASSERT_EQ(8 + h.header_size + h.data_size, b.size());
      ++ok;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << ": non-olmosft exception " << e.what();
    }
  }
  EXPECT_EQ(ok + rejected, kIters);
  EXPECT_GT(ok, 0);  // some mutations (e.g. data bytes) keep the file valid
  EXPECT_GT(rejected, kIters / 2);
  std::printf("mutation fuzz: %d accepted, %d rejected\n", ok, rejected);
}

TEST(Sharding, ParseSize) {
  EXPECT_EQ(st::parse_size("5GB"), 5000000000ull);
  EXPECT_EQ(st::parse_size("500MB"), 500000000ull);
  EXPECT_EQ(st::parse_size("2GiB"), 2ull << 30);
  EXPECT_EQ(st::parse_size("64kib"), 65536ull);
  EXPECT_EQ(st::parse_size("1000"), 1000ull);
  EXPECT_THROW(st::parse_size("5XB"), Error);
  EXPECT_THROW(st::parse_size("GB"), Error);
  EXPECT_THROW(st::parse_size("0"), Error);
  EXPECT_THROW(st::parse_size("-5GB"), Error);
}

TEST(Sharding, WritesShardsAndIndex) {
  TempDir d;
  std::vector<st::NamedTensor> ts;
  for (int i = 0; i < 5; ++i) ts.push_back({"t" + std::to_string(i), Tensor::zeros({100})});  // 400 B each
  ts.push_back({"big", Tensor::zeros({1000})});                                               // 4000 B
  ts.push_back({"tail", Tensor::zeros({10})});
  fs::create_directories(d / "s");
  auto res = st::write_sharded(d / "s", ts, 1000);
  ASSERT_TRUE(res.indexed);
  // greedy: [t0 t1] [t2 t3] [t4] [big] [tail] -> t4 alone because big does not fit after it
  ASSERT_EQ(res.files.size(), 5u);
  EXPECT_EQ(res.files[0], "model-00001-of-00005.safetensors");
  EXPECT_EQ(res.total_size, 5 * 400 + 4000 + 40u);
  auto idx = st::read_index(d / "s/model.safetensors.index.json");
  EXPECT_TRUE(idx.has_total_size);
  EXPECT_EQ(idx.total_size, res.total_size);
  EXPECT_EQ(idx.weight_map.at("t0"), "model-00001-of-00005.safetensors");
  EXPECT_EQ(idx.weight_map.at("t2"), "model-00002-of-00005.safetensors");
  EXPECT_EQ(idx.weight_map.at("big"), "model-00004-of-00005.safetensors");
  for (const auto& [name, file] : idx.weight_map) {
    auto r = st::Reader::open(d / ("s/" + file));
    EXPECT_NE(r->find(name), nullptr) << name;
  }
  fs::create_directories(d / "one");
  auto single = st::write_sharded(d / "one", ts);
  EXPECT_FALSE(single.indexed);
  EXPECT_TRUE(fs::exists(d / "one/model.safetensors"));
  EXPECT_FALSE(fs::exists(d / "one/model.safetensors.index.json"));
}

TEST(Sharding, IndexValidation) {
  TempDir d;
  auto bad = [&](const std::string& text, const std::string& frag) {
    io::write_file_atomic(d / "i.json", text);
    try {
      st::read_index(d / "i.json");
      FAIL() << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("i.json"), std::string::npos) << e.what();
    }
  };
  bad("{}", "weight_map");
  bad(R"({"weight_map": {"a": 3}})", "must be a file name");
  bad(R"({"weight_map": {"a": "../x.safetensors"}})", "plain");
  bad(R"({"weight_map": {"a": "x.bin"}})", "plain");
  bad(R"({"metadata": {"total_size": -1}, "weight_map": {"a": "x.safetensors"}})", "total_size");
  bad(R"({"weight_map": {}})", "empty");
  io::write_file_atomic(
      d / "ok.json",
      R"({"metadata": {"total_size": 12.0, "total_parameters": 3}, "weight_map": {"a": "x.safetensors"}})");
  auto idx = st::read_index(d / "ok.json");
  EXPECT_EQ(idx.total_size, 12u);
}

TEST(Safetensors, StoreAsConvertsWhileWriting) {
  Tensor a = Tensor::empty({4, 3});
  fill_normal(a, Rng{1, 2}, 0, 1);
  Tensor i = Tensor::from<float>({1.5f}, {1});
  auto lazy = st::serialize({{"a", a, DType::BF16}, {"i", i, DType::F16}});
  auto eager = st::serialize({{"a", a.to(DType::BF16)}, {"i", i.to(DType::F16)}});
  EXPECT_EQ(lazy, eager);
  EXPECT_EQ((st::NamedTensor{"a", a, DType::BF16}.stored_nbytes()), 24u);
}

TEST(Hash, Sha256Manifest) {
  TempDir d;
  fs::create_directories(d / "ck/sub");
  io::write_file_atomic(d / "ck/a.bin", "alpha");
  io::write_file_atomic(d / "ck/sub/b.json", "{}");
  EXPECT_EQ(io::write_sha256_manifest(d / "ck"), 2u);
  EXPECT_EQ(io::read_file(d / "ck/SHA256SUMS"),
            "8ed3f6ad685b959ead7022518e1af76cd816f8e8ec7ccdda1ed4018e8f2223f8  a.bin\n"
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a  sub/b.json\n");
  EXPECT_EQ(io::verify_sha256_manifest(d / "ck"), 2u);
  // Independent check with coreutils.
  std::string cmd = "cd '" + (d / "ck") + "' && sha256sum --quiet -c SHA256SUMS";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  io::write_file_atomic(d / "ck/a.bin", "alphA");
  fs::remove(d / "ck/sub/b.json");
  try {
    io::verify_sha256_manifest(d / "ck");
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("2 of 2 files failed"), std::string::npos) << m;
    EXPECT_NE(m.find("checksum mismatch: a.bin"), std::string::npos) << m;
    EXPECT_NE(m.find("missing: sub/b.json"), std::string::npos) << m;
  }
  io::write_file_atomic(d / "ck/SHA256SUMS", "xyz  a.bin\n");
  EXPECT_THROW(io::verify_sha256_manifest(d / "ck"), Error);
}

// A file written by the independent Python reference (tests/reference/io_safetensors.py, PyTorch's
// bf16/fp16 conversions): the reader gets every value, and the writer reproduces the file byte for byte.
TEST(Safetensors, MatchesPythonReferenceFile) {
  std::string dir = std::string(OLMOSFT_GOLDEN_DIR) + "/io/";
  auto r = st::Reader::open(dir + "ref.safetensors");
  auto vals = nlohmann::json::parse(io::read_file(dir + "ref_values.json"));
  auto floats = [&](const char* key, Shape shape) {
    std::vector<float> v;
    for (const auto& b : vals[key]) {
      uint32_t u = b.get<uint32_t>();
      float f;
      std::memcpy(&f, &u, 4);
      v.push_back(f);
    }
    return Tensor::from(v, shape);
  };
  Tensor w = floats("w_bits", {4, 6}), special = floats("special_bits", {10});
  EXPECT_EQ(r->metadata().at("format"), "pt");
  EXPECT_EQ(max_abs_diff(r->view("model.w"), w), 0.0);
  std::vector<st::NamedTensor> mine = {{"model.w", w},
                                       {"model.w_bf16", w.to(DType::BF16)},
                                       {"model.special_bf16", special.to(DType::BF16)},
                                       {"model.w_f16", w.slice(0, 0, 2).to(DType::F16)},
                                       {"ids", Tensor::from<int64_t>({3, -1, 100277}, {3})},
                                       {"scalar", Tensor::from<double>({0.125}, {})},
                                       {"empty", Tensor::zeros({0, 3})}};
  for (const auto& t : mine) {
    Tensor v = r->view(t.name);
    ASSERT_EQ(v.dtype(), t.tensor.dtype()) << t.name;
    ASSERT_EQ(v.shape(), t.tensor.shape()) << t.name;
    Tensor c = t.tensor.contiguous();
    EXPECT_EQ(std::memcmp(v.raw_data(), c.raw_data(), c.nbytes()), 0)
        << t.name << " (bf16/f16 rounding vs torch)";
  }
  auto bytes = st::serialize(mine);
  auto ref = io::read_file_bytes(dir + "ref.safetensors");
  EXPECT_EQ(bytes, ref);
}
