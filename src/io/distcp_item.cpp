// The tensor items of a distributed checkpoint: torch.save ZIP archives (stored entries, optionally
// ZIP64), their data.pkl (a restricted pickle of torch._utils._rebuild_tensor_v2), and the reassembly of a
// tensor from its chunks with pread.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "core/error.h"
#include "io/distcp.h"
#include "io/pickle.h"

namespace olmosft::distcp {

using pickle::Kind;
using pickle::Value;

namespace {

uint64_t rd(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int k = bytes - 1; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

struct ZipEntry {
  std::string name;
  uint64_t data_offset = 0, size = 0;
};

// ZIP64 extended information (extra field 0x0001): the 8-byte values of the fields that were 0xFFFFFFFF,
// in the order uncompressed size, compressed size, local header offset.
void zip64_extra(const uint8_t* extra, size_t n, uint64_t* usize, uint64_t* csize, uint64_t* off,
                 const std::string& ctx) {
  size_t k = 0;
  while (k + 4 <= n) {
    uint64_t id = rd(extra + k, 2), len = rd(extra + k + 2, 2);
    OLMO_CHECK(k + 4 + len <= n, ctx, ": ZIP extra field runs past its entry");
    if (id == 1) {
      size_t q = k + 4;
      for (uint64_t* f : {usize, csize, off}) {
        if (*f != 0xFFFFFFFFu) continue;
        OLMO_CHECK(q + 8 <= k + 4 + len, ctx, ": ZIP64 extra field too short");
        *f = rd(extra + q, 8);
        q += 8;
      }
      return;
    }
    k += 4 + len;
  }
}

std::vector<ZipEntry> zip_entries(const uint8_t* p, size_t n, const std::string& ctx) {
  OLMO_CHECK(n >= 22, ctx, ": ", n, " bytes is too small for a torch.save ZIP archive");
  size_t eocd = n - 22;
  for (size_t back = 0; rd(p + eocd, 4) != 0x06054b50u; ++back, --eocd)
    OLMO_CHECK(eocd > 0 && back < 65536, ctx,
               ": no ZIP end-of-central-directory record (not a torch.save item?)");
  uint64_t count = rd(p + eocd + 10, 2), cd_size = rd(p + eocd + 12, 4), cd_off = rd(p + eocd + 16, 4);
  if (count == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_off == 0xFFFFFFFFu) {
    OLMO_CHECK(eocd >= 20 && rd(p + eocd - 20, 4) == 0x07064b50u, ctx, ": ZIP64 locator missing");
    uint64_t r = rd(p + eocd - 12, 8);
    OLMO_CHECK(r + 56 <= n && rd(p + r, 4) == 0x06064b50u, ctx, ": ZIP64 end record missing at ", r);
    count = rd(p + r + 32, 8);
    cd_size = rd(p + r + 40, 8);
    cd_off = rd(p + r + 48, 8);
  }
  OLMO_CHECK(cd_off <= n && cd_size <= n - cd_off && count <= 4096, ctx, ": ZIP central directory (", count,
             " entries at ", cd_off, ", ", cd_size, " bytes) does not fit the item");
  std::vector<ZipEntry> out;
  size_t q = cd_off, end = cd_off + cd_size;
  for (uint64_t k = 0; k < count; ++k) {
    OLMO_CHECK(q + 46 <= end && rd(p + q, 4) == 0x02014b50u, ctx, ": ZIP central directory entry ", k,
               " is damaged");
    uint64_t method = rd(p + q + 10, 2), csize = rd(p + q + 20, 4), usize = rd(p + q + 24, 4);
    uint64_t nlen = rd(p + q + 28, 2), xlen = rd(p + q + 30, 2), clen = rd(p + q + 32, 2);
    uint64_t lho = rd(p + q + 42, 4);
    OLMO_CHECK(q + 46 + nlen + xlen + clen <= end, ctx, ": ZIP central directory entry ", k, " is truncated");
    ZipEntry e;
    e.name.assign(reinterpret_cast<const char*>(p + q + 46), nlen);
    zip64_extra(p + q + 46 + nlen, xlen, &usize, &csize, &lho, ctx);
    OLMO_CHECK(method == 0 && csize == usize, ctx, ": ZIP entry '", e.name, "' is compressed (method ",
               method, "); torch.save stores entries uncompressed");
    OLMO_CHECK(lho <= n && n - lho >= 30 && rd(p + lho, 4) == 0x04034b50u, ctx, ": ZIP entry '", e.name,
               "' has no local header at ", lho);
    e.data_offset = lho + 30 + rd(p + lho + 26, 2) + rd(p + lho + 28, 2);
    e.size = usize;
    OLMO_CHECK(e.data_offset <= n && e.size <= n - e.data_offset, ctx, ": ZIP entry '", e.name, "' (", e.size,
               " bytes at ", e.data_offset, ") runs past the item's ", n, " bytes");
    out.push_back(std::move(e));
    q += 46 + nlen + xlen + clen;
  }
  return out;
}

const std::map<std::string, DType>& storage_dtypes() {
  static const std::map<std::string, DType> m = {
      {"torch.FloatStorage", DType::F32}, {"torch.BFloat16Storage", DType::BF16},
      {"torch.HalfStorage", DType::F16},  {"torch.DoubleStorage", DType::F64},
      {"torch.LongStorage", DType::I64},  {"torch.IntStorage", DType::I32},
      {"torch.ByteStorage", DType::U8}};
  return m;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<int64_t> int_tuple(const Value& v, const std::string& what, const std::string& ctx) {
  OLMO_CHECK(v.is(Kind::Tuple) && v.items.size() <= 8, ctx, ": data.pkl: ", what, " is ",
             pickle::describe(v, 1), ", expected a tuple of integers");
  std::vector<int64_t> out;
  for (const Value* x : v.items) {
    OLMO_CHECK(x->is(Kind::Int) && x->i >= 0 && x->i <= (int64_t{1} << 48), ctx, ": data.pkl: ", what,
               " holds ", pickle::describe(*x, 0));
    out.push_back(x->i);
  }
  return out;
}

}  // namespace

const std::set<std::string>& torch_save_classes() {
  static const std::set<std::string> s = [] {
    std::set<std::string> c = {"torch._utils._rebuild_tensor_v2",
                               "collections.OrderedDict",
                               "torch.CharStorage",
                               "torch.ShortStorage",
                               "torch.BoolStorage",
                               "torch.ComplexFloatStorage",
                               "torch.ComplexDoubleStorage"};
    for (const auto& [n, d] : storage_dtypes()) c.insert(n);
    return c;
  }();
  return s;
}

SavedTensor parse_torch_save(const uint8_t* data, size_t size, const std::string& ctx) {
  auto entries = zip_entries(data, size, ctx);
  const ZipEntry* pkl = nullptr;
  for (const auto& e : entries) {
    if (ends_with(e.name, "/data.pkl") || e.name == "data.pkl") pkl = &e;
  }
  OLMO_CHECK(pkl, ctx, ": no data.pkl in the torch.save archive");
  std::string prefix = pkl->name.substr(0, pkl->name.size() - 8);  // "<archive>/"
  pickle::Pickle p =
      pickle::unpickle(data + pkl->data_offset, pkl->size, torch_save_classes(), ctx + ": " + pkl->name);
  const Value& r = p.root();
  OLMO_CHECK(r.is(Kind::Object) && r.class_name() == "torch._utils._rebuild_tensor_v2", ctx,
             ": data.pkl holds ", pickle::describe(r, 1),
             ", expected one tensor (torch._utils._rebuild_tensor_v2)");
  const auto& a = r.args->items;
  OLMO_CHECK(a.size() >= 4 && a[0]->is(Kind::PersId), ctx, ": data.pkl: unexpected tensor arguments ",
             pickle::describe(*r.args, 1));
  // Persistent id ('storage', <storage class>, key, location, numel).
  const auto& id = a[0]->items;
  OLMO_CHECK(id.size() == 5 && id[0]->is(Kind::Str) && id[0]->s == "storage" && id[1]->is(Kind::Global) &&
                 id[2]->is(Kind::Str) && id[4]->is(Kind::Int) && id[4]->i >= 0,
             ctx, ": data.pkl: unexpected storage reference ", pickle::describe(*a[0], 1));
  SavedTensor t;
  t.storage_class = id[1]->s;
  auto sd = storage_dtypes().find(t.storage_class);
  if (sd != storage_dtypes().end()) t.dtype = sd->second;
  OLMO_CHECK(a[1]->is(Kind::Int) && a[1]->i >= 0, ctx, ": data.pkl: storage offset ",
             pickle::describe(*a[1], 0));
  t.storage_offset = a[1]->i;
  t.shape = int_tuple(*a[2], "size", ctx);
  t.stride = int_tuple(*a[3], "stride", ctx);
  OLMO_CHECK(t.stride.size() == t.shape.size(), ctx, ": data.pkl: stride ", shape_str(t.stride),
             " does not match size ", shape_str(t.shape));
  for (const auto& e : entries) {  // torch.save records the writer's byte order; the data is read as LE
    if (e.name == prefix + "byteorder") {
      const std::string bo(reinterpret_cast<const char*>(data + e.data_offset), e.size);
      OLMO_CHECK(bo == "little", ctx, ": the archive's byteorder is '", bo.substr(0, 16),
                 "' (only little is read)");
    }
  }
  const std::string want = prefix + "data/" + id[2]->s;
  const ZipEntry* blob = nullptr;
  for (const auto& e : entries) {
    if (e.name == want) blob = &e;
  }
  OLMO_CHECK(blob, ctx, ": the torch.save archive has no entry '", want, "' for its storage");
  t.data = data + blob->data_offset;
  t.data_bytes = blob->size;
  if (t.dtype) {
    uint64_t numel = uint64_t(id[4]->i);
    OLMO_CHECK(numel <= blob->size / dtype_size(*t.dtype) && numel * dtype_size(*t.dtype) == blob->size, ctx,
               ": storage '", want, "' has ", blob->size, " bytes, its reference says ", numel,
               " elements of ", dtype_name(*t.dtype));
  }
  return t;
}

namespace {

// Reads [offset, offset + length) of a file with pread.
std::vector<uint8_t> pread_range(const std::string& path, uint64_t offset, uint64_t length) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  OLMO_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  std::vector<uint8_t> buf(length);
  uint64_t done = 0;
  while (done < length) {
    ssize_t r = ::pread(fd, buf.data() + done, length - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int err = errno;
      ::close(fd);
      fail(path, ": reading bytes [", offset, ", ", offset + length, ") failed at ", offset + done, ": ",
           r == 0 ? "end of file (truncated?)" : std::strerror(err));
    }
    done += uint64_t(r);
  }
  ::close(fd);
  return buf;
}

// Copies a chunk (row-major, `sizes`) into the box at `offsets` of the row-major tensor `dst`.
void copy_box(const uint8_t* src, const Chunk& c, Tensor& dst) {
  const size_t es = dtype_size(dst.dtype());
  const Shape& shape = dst.shape();
  const size_t nd = shape.size();
  if (shape_numel(c.sizes) == 0) return;
  if (nd == 0) {
    std::memcpy(dst.raw_data(), src, es);
    return;
  }
  std::vector<int64_t> stride(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  const size_t row = size_t(c.sizes[nd - 1]) * es;
  std::vector<int64_t> idx(nd, 0);  // index inside the chunk, last dimension fixed at 0
  uint8_t* out = static_cast<uint8_t*>(dst.raw_data());
  for (int64_t r = 0, rows = shape_numel(c.sizes) / c.sizes[nd - 1]; r < rows; ++r) {
    int64_t at = 0;
    for (size_t d = 0; d < nd; ++d) at += (c.offsets[d] + idx[d]) * stride[d];
    std::memcpy(out + size_t(at) * es, src + size_t(r) * row, row);
    for (size_t d = nd - 1; d-- > 0;) {
      if (++idx[d] < c.sizes[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

Tensor Checkpoint::read(const std::string& key) const {
  const TensorEntry& e = at(key);
  OLMO_CHECK(e.dtype, dir_, ": tensor '", key, "' has dtype ", e.torch_dtype,
             ", which this reader does not convert");
  Tensor out = Tensor::empty(e.shape, *e.dtype);
  const uint64_t es = dtype_size(*e.dtype);
  for (size_t k = 0; k < e.chunks.size(); ++k) {
    const Chunk& c = e.chunks[k];
    const std::string path = dir_ + "/" + c.file;
    const std::string ctx = path + ": tensor '" + key + "' chunk " + std::to_string(k) + " at bytes [" +
                            std::to_string(c.offset) + ", " + std::to_string(c.offset + c.length) + ")";
    const uint64_t want = uint64_t(shape_numel(c.sizes)) * es;
    OLMO_CHECK(c.length <= want + (1u << 20), ctx, ": the item is ", c.length, " bytes for a chunk of ", want,
               " bytes (wrong offset or length?)");
    std::vector<uint8_t> item = pread_range(path, c.offset, c.length);
    SavedTensor t = parse_torch_save(item.data(), item.size(), ctx);
    OLMO_CHECK(t.dtype == e.dtype, ctx, ": stored as ", t.storage_class, ", the metadata says ",
               e.torch_dtype);
    OLMO_CHECK(t.shape == c.sizes, ctx, ": stored with size ", shape_str(t.shape), ", the metadata says ",
               shape_str(c.sizes));
    int64_t expect = 1;
    for (size_t d = t.shape.size(); d-- > 0;) {
      OLMO_CHECK(t.shape[d] <= 1 || t.stride[d] == expect, ctx, ": stored with stride ", shape_str(t.stride),
                 ", expected a contiguous tensor");
      expect *= t.shape[d];
    }
    OLMO_CHECK(uint64_t(t.storage_offset) <= t.data_bytes / es &&
                   uint64_t(t.storage_offset) * es + want <= t.data_bytes,
               ctx, ": storage offset ", t.storage_offset, " and ", want, " bytes run past its ",
               t.data_bytes, "-byte storage");
    copy_box(t.data + t.storage_offset * es, c, out);
  }
  return out;
}

}  // namespace olmosft::distcp
