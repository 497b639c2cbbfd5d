#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/bf16.h"
#include "io/atomic_file.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace olmosft::safetensors {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {

constexpr int kMaxJsonDepth = 8;  // the header is {name: {dtype, shape: [..], data_offsets: [..]}}

// Parses JSON rejecting duplicate keys (which nlohmann would silently overwrite) and deep nesting.
json parse_strict_json(const char* begin, const char* end, const std::string& context) {
  std::vector<std::set<std::string>> keys;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) -> bool {
    if (depth > kMaxJsonDepth) fail(context, ": JSON nested deeper than ", kMaxJsonDepth, " levels");
    switch (ev) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& k = parsed.get_ref<const std::string&>();
        if (!keys.empty() && !keys.back().insert(k).second) fail(context, ": duplicate JSON key '", k, "'");
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(begin, end, cb);
  } catch (const json::exception& e) {
    fail(context, ": invalid JSON (", e.what(), ")");
  }
}

uint64_t get_u64(const json& v, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  fail(what, ": expected a non-negative integer, got ", v.dump());
}

}  // namespace

Header parse(const uint8_t* bytes, size_t size, const std::string& context) {
  OLMO_CHECK(size >= 8, context, ": file is ", size, " bytes, too small for the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, bytes, 8);
  OLMO_CHECK(n <= kMaxHeaderSize, context, ": header length ", n, " exceeds the limit of ", kMaxHeaderSize,
             " bytes (not a safetensors file?)");
  OLMO_CHECK(n <= size - 8, context, ": header length ", n, " exceeds the file size ", size,
             " (truncated file or not a safetensors file)");
  OLMO_CHECK(n >= 2, context, ": header length ", n, " is too small for a JSON object");
  const char* hbeg = reinterpret_cast<const char*>(bytes + 8);
  OLMO_CHECK(hbeg[0] == '{', context, ": header does not start with '{' (not a safetensors file?)");
  json j = parse_strict_json(hbeg, hbeg + n, context + " header");
  OLMO_CHECK(j.is_object(), context, ": header is not a JSON object");

  Header h;
  h.header_size = n;
  h.data_size = size - 8 - n;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "__metadata__") {
      if (v.is_null()) continue;
      OLMO_CHECK(v.is_object(), context, ": __metadata__ must be an object of strings, got ", v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m) {
        OLMO_CHECK(m.value().is_string(), context, ": __metadata__[\"", m.key(), "\"] must be a string, got ",
                   m.value().type_name());
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    std::string where = context + ": tensor '" + key + "'";
    OLMO_CHECK(!key.empty(), context, ": a tensor has an empty name");
    OLMO_CHECK(v.is_object(), where, ": entry must be an object, got ", v.type_name());
    for (auto f = v.begin(); f != v.end(); ++f) {
      OLMO_CHECK(f.key() == "dtype" || f.key() == "shape" || f.key() == "data_offsets", where,
                 ": unknown field '", f.key(), "' (expected dtype, shape, data_offsets)");
    }
    OLMO_CHECK(v.contains("dtype") && v["dtype"].is_string(), where, ": missing or non-string 'dtype'");
    OLMO_CHECK(v.contains("shape") && v["shape"].is_array(), where, ": missing or non-array 'shape'");
    OLMO_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
               where, ": 'data_offsets' must be an array [begin, end]");
    TensorInfo t;
    t.name = key;
    t.dtype = parse_dtype(v["dtype"].get<std::string>(), where);
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      uint64_t dim = get_u64(d, where + " shape");
      OLMO_CHECK(dim <= static_cast<uint64_t>(INT64_MAX), where, ": shape dimension ", dim, " too large");
      OLMO_CHECK(!__builtin_mul_overflow(numel, dim, &numel), where, ": shape ", v["shape"].dump(),
                 " overflows the element count");
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t nbytes = 0;
    OLMO_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &nbytes), where,
               ": byte size of shape ", v["shape"].dump(), " overflows");
    t.begin = get_u64(v["data_offsets"][0], where + " data_offsets[0]");
    t.end = get_u64(v["data_offsets"][1], where + " data_offsets[1]");
    OLMO_CHECK(t.begin <= t.end, where, ": data_offsets [", t.begin, ", ", t.end, ") has begin > end");
    OLMO_CHECK(t.end <= h.data_size, where, ": data_offsets end ", t.end, " lies beyond the byte buffer (",
               h.data_size, " bytes; truncated file?)");
    OLMO_CHECK(t.end - t.begin == nbytes, where, ": data_offsets cover ", t.end - t.begin, " bytes but ",
               dtype_name(t.dtype), " ", shape_str(t.shape), " needs ", nbytes);
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : (a.end != b.end ? a.end < b.end : a.name < b.name);
  });
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const auto& t : h.tensors) {
    if (t.begin < pos) {
      fail(context, ": tensors '", prev->name, "' [", prev->begin, ", ", prev->end, ") and '", t.name, "' [",
           t.begin, ", ", t.end, ") overlap");
    }
    if (t.begin > pos) {
      fail(context, ": bytes [", pos, ", ", t.begin, ") of the buffer ",
           prev ? "after tensor '" + prev->name + "'" : std::string("at the start"),
           " belong to no tensor (the buffer must be entirely indexed)");
    }
    pos = t.end;
    prev = &t;
  }
  OLMO_CHECK(pos == h.data_size, context, ": the last ", h.data_size - pos,
             " bytes of the buffer (from offset ", pos,
             ") belong to no tensor (the buffer must be entirely indexed)");
  return h;
}

// ---- Reader -----------------------------------------------------------------------------------------

std::shared_ptr<Reader> Reader::open(const std::string& path) {
  std::shared_ptr<Reader> r(new Reader());
  r->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  OLMO_CHECK(fd >= 0, "cannot open safetensors file ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file");
  }
  r->size_ = static_cast<size_t>(st.st_size);
  if (r->size_ < 8) {
    ::close(fd);
    fail(path, ": file is ", r->size_, " bytes, too small for the 8-byte header length");
  }
  void* p = ::mmap(nullptr, r->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  OLMO_CHECK(p != MAP_FAILED, "cannot mmap ", path, ": ", std::strerror(err));
  r->base_ = static_cast<uint8_t*>(p);
  r->header_ = parse(r->base_, r->size_, path);
  for (size_t i = 0; i < r->header_.tensors.size(); ++i) r->by_name_[r->header_.tensors[i].name] = i;
  return r;
}

Reader::~Reader() {
  if (base_) ::munmap(base_, size_);
}

const TensorInfo* Reader::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &header_.tensors[it->second];
}

const TensorInfo& Reader::at(const std::string& name) const {
  const TensorInfo* t = find(name);
  OLMO_CHECK(t != nullptr, path_, ": no tensor named '", name, "'");
  return *t;
}

namespace {

// Reads exactly n bytes at offset off (retrying short reads); errors name the file.
void pread_all(int fd, const std::string& path, void* dst, size_t n, uint64_t off) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    OLMO_CHECK(r > 0, path, ": cannot read ", n, " bytes at offset ", off, ": ",
               r == 0 ? "unexpected end of file (truncated since it was opened?)" : std::strerror(errno));
    p += r;
    off += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
}

}  // namespace

void Reader::read_f32(const TensorInfo& t, int64_t begin, int64_t n, float* out) const {
  OLMO_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16, path_, ": tensor '",
             t.name, "' is ", dtype_name(t.dtype), "; expected F32, BF16 or F16");
  const uint64_t es = dtype_size(t.dtype), numel = t.nbytes() / es;
  OLMO_CHECK(begin >= 0 && n >= 0 && static_cast<uint64_t>(begin) + static_cast<uint64_t>(n) <= numel, path_,
             ": tensor '", t.name, "': elements [", begin, ", ", begin + n, ") are outside its ", numel);
  if (n == 0) return;
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  OLMO_CHECK(fd >= 0, "cannot open safetensors file ", path_, ": ", std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const uint64_t off = 8 + header_.header_size + t.begin + static_cast<uint64_t>(begin) * es;
  if (t.dtype == DType::F32) {
    pread_all(fd, path_, out, static_cast<size_t>(n) * 4, off);
    return;
  }
  constexpr int64_t kChunk = int64_t(1) << 21;  // elements per read (4 MiB of 16-bit values)
  std::vector<uint16_t> buf(static_cast<size_t>(std::min(n, kChunk)));
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t k = std::min(kChunk, n - i);
    pread_all(fd, path_, buf.data(), static_cast<size_t>(k) * 2, off + static_cast<uint64_t>(i) * 2);
    if (t.dtype == DType::BF16) {
      bf16_to_f32(buf.data(), out + i, static_cast<size_t>(k));
    } else {
      for (int64_t j = 0; j < k; ++j) out[i + j] = f16_to_f32(buf[static_cast<size_t>(j)]);
    }
  }
}

Tensor Reader::view(const std::string& name) const {
  const TensorInfo& t = at(name);
  uint8_t* p = base_ + 8 + header_.header_size + t.begin;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(t.dtype) != 0) return copy(name);
  return Tensor::wrap(p, t.shape, t.dtype);
}

Tensor Reader::copy(const std::string& name) const {
  const TensorInfo& t = at(name);
  Tensor out = Tensor::empty(t.shape, t.dtype);
  if (t.nbytes()) std::memcpy(out.raw_data(), data(t), t.nbytes());
  return out;
}

// ---- Writer -----------------------------------------------------------------------------------------

Tensor placeholder(const Shape& shape, DType dtype) {
  static std::byte none[8];
  return Tensor::wrap(none, shape, dtype);
}

namespace {

struct Layout {
  std::string header;  // padded JSON
  std::vector<const NamedTensor*> order;
};

Layout make_layout(const std::vector<NamedTensor>& tensors,
                   const std::map<std::string, std::string>& metadata) {
  Layout L;
  std::set<std::string> names;
  for (const auto& t : tensors) {
    OLMO_CHECK(!t.name.empty(), "safetensors writer: empty tensor name");
    OLMO_CHECK(t.name != "__metadata__", "safetensors writer: '__metadata__' is reserved");
    OLMO_CHECK(t.tensor.defined(), "safetensors writer: tensor '", t.name, "' is undefined");
    OLMO_CHECK(names.insert(t.name).second, "safetensors writer: duplicate tensor name '", t.name, "'");
    L.order.push_back(&t);
  }
  std::sort(L.order.begin(), L.order.end(), [](const NamedTensor* a, const NamedTensor* b) {
    size_t sa = dtype_size(a->stored_dtype()), sb = dtype_size(b->stored_dtype());
    return sa != sb ? sa > sb : a->name < b->name;
  });
  ordered_json j = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    j["__metadata__"] = m;
  }
  uint64_t off = 0;
  for (const NamedTensor* t : L.order) {
    ordered_json e = ordered_json::object();
    e["dtype"] = dtype_name(t->stored_dtype());
    e["shape"] = t->tensor.shape();
    uint64_t nb = t->stored_nbytes();
    e["data_offsets"] = {off, off + nb};
    off += nb;
    j[t->name] = e;
  }
  L.header = j.dump();
  while (L.header.size() % 8 != 0) L.header.push_back(' ');
  return L;
}

template <typename Sink>
void emit(const Layout& L, Sink&& sink) {
  uint64_t n = L.header.size();
  sink(&n, 8);
  sink(L.header.data(), L.header.size());
  for (const NamedTensor* t : L.order) {
    if (t->tensor.numel() == 0) continue;
    Tensor src = t->tensor;
    if (t->load) {
      src = t->load();
      OLMO_CHECK(src.shape() == t->tensor.shape() && src.dtype() == t->tensor.dtype(),
                 "safetensors writer: ", t->name, " was announced as ", dtype_name(t->tensor.dtype()), " ",
                 shape_str(t->tensor.shape()), " but loaded as ", dtype_name(src.dtype()), " ",
                 shape_str(src.shape()));
    }
    Tensor c = t->stored_dtype() == src.dtype() ? src.contiguous() : src.to(t->stored_dtype());
    sink(c.raw_data(), c.nbytes());
  }
}

}  // namespace

std::vector<uint8_t> serialize(const std::vector<NamedTensor>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  Layout L = make_layout(tensors, metadata);
  std::vector<uint8_t> out;
  emit(L, [&](const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  });
  return out;
}

void write(const std::string& path, const std::vector<NamedTensor>& tensors,
           const std::map<std::string, std::string>& metadata) {
  Layout L = make_layout(tensors, metadata);
  io::AtomicFile f(path);
  emit(L, [&](const void* p, size_t n) { f.write(p, n); });
  f.commit();
}

// ---- Sharding ---------------------------------------------------------------------------------------

uint64_t parse_size(const std::string& text) {
  std::string s;
  for (char c : text) {
    if (c != ' ') s.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  }
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  OLMO_CHECK(i > 0 && i <= 15, "size '", text, "': expected a positive integer with an optional unit ",
             "(e.g. 5GB, 500MB, 2GiB, 1000000)");
  uint64_t v = std::stoull(s.substr(0, i));
  std::string unit = s.substr(i);
  static const std::map<std::string, uint64_t> units = {{"", 1},
                                                        {"B", 1},
                                                        {"KB", 1000ull},
                                                        {"MB", 1000000ull},
                                                        {"GB", 1000000000ull},
                                                        {"KIB", 1ull << 10},
                                                        {"MIB", 1ull << 20},
                                                        {"GIB", 1ull << 30}};
  auto it = units.find(unit);
  OLMO_CHECK(it != units.end(), "size '", text, "': unknown unit '", text.substr(i),
             "' (expected B, KB, MB, GB, KiB, MiB, GiB)");
  uint64_t out = 0;
  OLMO_CHECK(!__builtin_mul_overflow(v, it->second, &out), "size '", text, "' is too large");
  OLMO_CHECK(out > 0, "size '", text, "' must be positive");
  return out;
}

Index read_index(const std::string& path) {
  std::string text = io::read_file(path);
  json j = parse_strict_json(text.data(), text.data() + text.size(), path);
  OLMO_CHECK(j.is_object(), path, ": expected a JSON object");
  OLMO_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), path, ": missing 'weight_map' object");
  Index idx;
  if (j.contains("metadata")) {
    const json& m = j["metadata"];
    OLMO_CHECK(m.is_object() || m.is_null(), path, ": 'metadata' must be an object");
    if (m.is_object() && m.contains("total_size")) {
      const json& ts = m["total_size"];
      if (ts.is_number_float()) {
        double d = ts.get<double>();
        OLMO_CHECK(d >= 0 && d == static_cast<double>(static_cast<uint64_t>(d)), path,
                   ": metadata.total_size must be a non-negative integer, got ", ts.dump());
        idx.total_size = static_cast<uint64_t>(d);
      } else {
        idx.total_size = get_u64(ts, path + ": metadata.total_size");
      }
      idx.has_total_size = true;
    }
  }
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    OLMO_CHECK(it.value().is_string(), path, ": weight_map[\"", it.key(), "\"] must be a file name string");
    std::string f = it.value().get<std::string>();
    bool plain = !f.empty() && f.find('/') == std::string::npos && f.find('\\') == std::string::npos &&
                 f != "." && f != ".." && f.size() > 12 && f.compare(f.size() - 12, 12, ".safetensors") == 0;
    OLMO_CHECK(plain, path, ": weight_map[\"", it.key(), "\"] = '", f,
               "' is not a plain *.safetensors file name in the same directory");
    idx.weight_map[it.key()] = f;
  }
  OLMO_CHECK(!idx.weight_map.empty(), path, ": 'weight_map' is empty");
  return idx;
}

ShardedWriteResult write_sharded(const std::string& dir, const std::vector<NamedTensor>& tensors,
                                 uint64_t max_shard_bytes,
                                 const std::map<std::string, std::string>& metadata) {
  OLMO_CHECK(max_shard_bytes > 0, "shard size must be positive");
  std::vector<std::vector<NamedTensor>> shards(1);
  uint64_t cur = 0, total = 0;
  for (const auto& t : tensors) {
    uint64_t nb = t.stored_nbytes();
    if (!shards.back().empty() && cur + nb > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(t);
    cur += nb;
    total += nb;
  }
  ShardedWriteResult res;
  res.total_size = total;
  if (shards.size() == 1) {
    write(dir + "/" + kSingleFile, shards[0], metadata);
    res.files = {kSingleFile};
    return res;
  }
  res.indexed = true;
  json wm = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write(dir + "/" + name, shards[i], metadata);
    res.files.push_back(name);
    for (const auto& t : shards[i]) wm[t.name] = name;
  }
  json idx = {{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
  io::write_file_atomic(dir + "/" + kIndexFile, idx.dump(2) + "\n");
  return res;
}

}  // namespace olmosft::safetensors
