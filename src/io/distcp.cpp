#include "io/distcp.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/pickle.h"

namespace fs = std::filesystem;

namespace olmosft::distcp {

using pickle::Kind;
using pickle::Value;

namespace {

const std::map<std::string, DType>& torch_dtypes() {
  static const std::map<std::string, DType> m = {
      {"torch.float32", DType::F32}, {"torch.bfloat16", DType::BF16}, {"torch.float16", DType::F16},
      {"torch.float64", DType::F64}, {"torch.int64", DType::I64},     {"torch.int32", DType::I32},
      {"torch.uint8", DType::U8}};
  return m;
}

// dtypes that may appear but cannot be converted here (kept by name; an error only if read).
const char* const kOtherTorchDtypes[] = {
    "torch.int8",          "torch.int16",       "torch.bool",   "torch.complex64", "torch.complex128",
    "torch.float8_e4m3fn", "torch.float8_e5m2", "torch.uint16", "torch.uint32",    "torch.uint64"};
const std::string kDcp = "torch.distributed.checkpoint.metadata.";

// ---- Reading the metadata value tree -------------------------------------------------------------

struct Walk {
  const std::string& ctx;
  template <typename... A>
  [[noreturn]] void bad(const A&... parts) const {
    fail(ctx, ": ", parts...);
  }
  const Value& object(const Value& v, const std::string& cls, const std::string& where) const {
    if (!v.is(Kind::Object) || v.class_name() != cls)
      bad(where, " is ", pickle::describe(v, 1), ", expected a ", cls);
    return v;
  }
  // A dataclass field: BUILD state as a dict, or (dict-or-None, slots dict) as Python writes for
  // classes with __slots__.
  const Value* field(const Value& obj, const std::string& name) const {
    const Value* st = obj.state;
    if (!st) return nullptr;
    if (st->is(Kind::Dict)) return st->get(name);
    if (st->is(Kind::Tuple) && st->items.size() == 2) {
      for (const Value* part : st->items) {
        if (const Value* f = part->get(name)) return f;
      }
    }
    return nullptr;
  }
  const Value& need(const Value& obj, const std::string& name, const std::string& where) const {
    const Value* f = field(obj, name);
    if (!f) bad(where, " (", obj.class_name(), ") has no field '", name, "'");
    return *f;
  }
  int64_t integer(const Value& v, const std::string& where) const {
    if (!v.is(Kind::Int)) bad(where, " is ", pickle::describe(v, 1), ", expected an integer");
    return v.i;
  }
  const std::string& str(const Value& v, const std::string& where) const {
    if (!v.is(Kind::Str)) bad(where, " is ", pickle::describe(v, 1), ", expected a string");
    return v.s;
  }
  // torch.Size((a, b, ...)) (or a plain tuple) -> non-negative integers.
  std::vector<int64_t> size(const Value& v, const std::string& where) const {
    const Value* t = &v;
    if (v.is(Kind::Object) && v.class_name() == "torch.Size") {
      if (v.args->items.size() != 1) bad(where, ": torch.Size takes one tuple");
      t = v.args->items[0];
    }
    if (!t->is(Kind::Tuple) && !t->is(Kind::List))
      bad(where, " is ", pickle::describe(v, 1), ", expected a size");
    if (t->items.size() > 8) bad(where, " has ", t->items.size(), " dimensions (at most 8)");
    std::vector<int64_t> out;
    int64_t numel = 1;  // bounded, so that element and byte counts never overflow
    for (const Value* x : t->items) {
      int64_t d = integer(*x, where);
      if (d < 0 || d > (int64_t{1} << 48)) bad(where, " has dimension ", d, " (out of range)");
      numel =
          d == 0 || numel == 0 ? 0 : (d > (int64_t{1} << 48) / numel ? (int64_t{1} << 48) + 1 : numel * d);
      if (numel > (int64_t{1} << 48)) bad(where, " has more than 2^48 elements");
      out.push_back(d);
    }
    return out;
  }
};

// dtype of a TensorProperties object: its state is a dict {'dtype': ...} or the __getstate__ tuple
// (dtype, layout, requires_grad, memory_format, pin_memory).
std::string properties_dtype(const Walk& w, const Value& props, const std::string& where) {
  w.object(props, kDcp + "TensorProperties", where);
  const Value* d = w.field(props, "dtype");
  if (!d && props.state && props.state->is(Kind::Tuple) && !props.state->items.empty())
    d = props.state->items[0];
  if (!d && props.args && !props.args->items.empty()) d = props.args->items[0];
  if (!d || !d->is(Kind::Global)) w.bad(where, ": no dtype in its TensorProperties");
  return d->s;
}

TensorEntry tensor_entry(const Walk& w, const std::string& key, const Value& tsm) {
  const std::string where = "state_dict_metadata['" + key + "']";
  TensorEntry e;
  e.key = key;
  e.torch_dtype = properties_dtype(w, w.need(tsm, "properties", where), where + ".properties");
  auto it = torch_dtypes().find(e.torch_dtype);
  if (it != torch_dtypes().end()) e.dtype = it->second;
  e.shape = w.size(w.need(tsm, "size", where), where + ".size");
  const Value& chunks = w.need(tsm, "chunks", where);
  if (!chunks.is(Kind::List)) w.bad(where, ".chunks is not a list");
  // The tiling check is quadratic in the chunk count; FSDP writes one chunk per rank.
  if (chunks.items.size() > 65536) w.bad(where, " has ", chunks.items.size(), " chunks (at most 65,536)");
  for (size_t k = 0; k < chunks.items.size(); ++k) {
    const std::string cw = where + ".chunks[" + std::to_string(k) + "]";
    const Value& c = w.object(*chunks.items[k], kDcp + "ChunkStorageMetadata", cw);
    Chunk ch;
    ch.offsets = w.size(w.need(c, "offsets", cw), cw + ".offsets");
    ch.sizes = w.size(w.need(c, "sizes", cw), cw + ".sizes");
    if (ch.offsets.size() != e.shape.size() || ch.sizes.size() != e.shape.size())
      w.bad(cw, " has ", ch.offsets.size(), "/", ch.sizes.size(), " dimensions, the tensor ", e.shape.size());
    for (size_t d = 0; d < e.shape.size(); ++d) {
      if (ch.offsets[d] + ch.sizes[d] > e.shape[d])
        w.bad(cw, " extends to ", ch.offsets[d] + ch.sizes[d], " in dimension ", d, ", beyond the size ",
              shape_str(e.shape));
    }
    e.chunks.push_back(std::move(ch));
  }
  return e;
}

// Chunks must be pairwise disjoint and their volumes must add up to the tensor's: then they tile it.
void check_tiling(const Walk& w, const TensorEntry& e) {
  int64_t total = 0;
  for (size_t a = 0; a < e.chunks.size(); ++a) {
    total += shape_numel(e.chunks[a].sizes);  // each <= 2^48 (checked), so stopping early avoids overflow
    if (total > shape_numel(e.shape))
      w.bad("tensor '", e.key, "': its chunks hold more than its ", shape_numel(e.shape), " elements");
    for (size_t b = 0; b < a; ++b) {
      bool overlap = true;
      for (size_t d = 0; d < e.shape.size() && overlap; ++d) {
        const Chunk &x = e.chunks[a], &y = e.chunks[b];
        overlap = x.offsets[d] < y.offsets[d] + y.sizes[d] && y.offsets[d] < x.offsets[d] + x.sizes[d];
      }
      if (overlap && shape_numel(e.chunks[a].sizes) && shape_numel(e.chunks[b].sizes))
        w.bad("tensor '", e.key, "': chunks ", b, " and ", a, " overlap");
    }
  }
  if (total != shape_numel(e.shape))
    w.bad("tensor '", e.key, "': its chunks hold ", total, " elements, the tensor ", shape_str(e.shape),
          " has ", shape_numel(e.shape));
}

bool plain_file_name(const std::string& f) {
  return !f.empty() && f.size() < 256 && f.find('/') == std::string::npos && f != "." && f != ".." &&
         f.find('\0') == std::string::npos;
}

// storage_data: {MetadataIndex(fqn, offset, index): _StorageInfo(relative_path, offset, length)}.
void attach_storage(const Walk& w, const Value& storage, Metadata& m) {
  if (!storage.is(Kind::Dict)) w.bad("storage_data is ", pickle::describe(storage, 1), ", expected a dict");
  std::map<std::pair<std::string, std::vector<int64_t>>, const Value*> info;
  for (size_t k = 0; k + 1 < storage.items.size(); k += 2) {
    const std::string where = "storage_data key " + std::to_string(k / 2);
    const Value& idx = w.object(*storage.items[k], kDcp + "MetadataIndex", where);
    const std::string& fqn = w.str(w.need(idx, "fqn", where), where + ".fqn");
    const Value* off = w.field(idx, "offset");
    std::vector<int64_t> o =
        off && !off->is(Kind::None) ? w.size(*off, where + ".offset") : std::vector<int64_t>{};
    info[{fqn, o}] = storage.items[k + 1];
  }
  for (auto& [key, e] : m.tensors) {
    for (size_t k = 0; k < e.chunks.size(); ++k) {
      Chunk& c = e.chunks[k];
      auto it = info.find({key, c.offsets});
      if (it == info.end())
        w.bad("tensor '", key, "' chunk ", k, " (offsets ", shape_str(c.offsets),
              ") has no storage_data entry");
      const Value& si = *it->second;
      const std::string where = "storage_data['" + key + "' " + shape_str(c.offsets) + "]";
      if (!si.is(Kind::Object) || si.class_name().size() < 12 ||
          si.class_name().compare(si.class_name().size() - 12, 12, "_StorageInfo") != 0)
        w.bad(where, " is ", pickle::describe(si, 1), ", expected a _StorageInfo");
      c.file = w.str(w.need(si, "relative_path", where), where + ".relative_path");
      if (!plain_file_name(c.file)) w.bad(where, ": relative_path '", c.file, "' is not a plain file name");
      int64_t off = w.integer(w.need(si, "offset", where), where + ".offset");
      int64_t len = w.integer(w.need(si, "length", where), where + ".length");
      if (off < 0 || len < 0) w.bad(where, ": negative offset ", off, " or length ", len);
      c.offset = uint64_t(off);
      c.length = uint64_t(len);
    }
  }
}

}  // namespace

const std::set<std::string>& metadata_classes() {
  static const std::set<std::string> s = [] {
    std::set<std::string> c = {kDcp + "Metadata",
                               kDcp + "TensorStorageMetadata",
                               kDcp + "BytesStorageMetadata",
                               kDcp + "ChunkStorageMetadata",
                               kDcp + "TensorProperties",
                               kDcp + "MetadataIndex",
                               kDcp + "StorageMeta",
                               kDcp + "_MEM_FORMAT_ENCODING",
                               "torch.serialization._get_layout",
                               "torch.distributed.checkpoint.filesystem._StorageInfo",
                               "olmo_core.distributed.checkpoint.filesystem._StorageInfo",
                               "torch.Size",
                               "torch.strided",
                               "torch.contiguous_format",
                               "torch.preserve_format",
                               "torch.channels_last",
                               "collections.OrderedDict"};
    for (const auto& [n, d] : torch_dtypes()) c.insert(n);
    for (const char* n : kOtherTorchDtypes) c.insert(n);
    return c;
  }();
  return s;
}

Metadata parse_metadata(const uint8_t* data, size_t size, const std::string& context) {
  pickle::Pickle p = pickle::unpickle(data, size, metadata_classes(), context);
  Walk w{context};
  const Value& root = w.object(p.root(), kDcp + "Metadata", "the pickle's top-level value");
  const Value& sdm = w.need(root, "state_dict_metadata", "Metadata");
  if (!sdm.is(Kind::Dict)) w.bad("state_dict_metadata is not a dict");
  Metadata m;
  for (size_t k = 0; k + 1 < sdm.items.size(); k += 2) {
    const std::string& key = w.str(*sdm.items[k], "a state_dict_metadata key");
    const Value& v = *sdm.items[k + 1];
    if (v.is(Kind::Object) && v.class_name() == kDcp + "BytesStorageMetadata") {
      if (!m.byte_entries.insert(key).second) w.bad("key '", key, "' appears twice");
      continue;
    }
    w.object(v, kDcp + "TensorStorageMetadata", "state_dict_metadata['" + key + "']");
    if (m.byte_entries.count(key) || !m.tensors.emplace(key, tensor_entry(w, key, v)).second)
      w.bad("key '", key, "' appears twice");
  }
  attach_storage(w, w.need(root, "storage_data", "Metadata"), m);
  for (const auto& [key, e] : m.tensors) check_tiling(w, e);
  return m;
}

bool is_dcp_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kMetadataFile, ec);
}

Checkpoint Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  OLMO_CHECK(fs::is_directory(dir, ec), "distributed checkpoint ", dir,
             " does not exist or is not a directory");
  const std::string mpath = dir + "/" + kMetadataFile;
  OLMO_CHECK(fs::is_regular_file(mpath, ec), mpath,
             ": missing (a distributed checkpoint directory holds .metadata and __<rank>_<i>.distcp files; "
             "it is written last, so a directory without it is an incomplete save)");
  std::vector<uint8_t> bytes = io::read_file_bytes(mpath);
  Checkpoint c;
  c.dir_ = dir;
  c.meta_ = parse_metadata(bytes.data(), bytes.size(), mpath);
  std::map<std::string, uint64_t> sizes;
  for (const auto& [key, e] : c.meta_.tensors) {
    for (const Chunk& ch : e.chunks) {
      auto it = sizes.find(ch.file);
      if (it == sizes.end()) {
        const std::string f = dir + "/" + ch.file;
        OLMO_CHECK(fs::is_regular_file(f, ec), mpath, ": tensor '", key, "' is stored in ", ch.file,
                   ", which does not exist in ", dir);
        it = sizes.emplace(ch.file, fs::file_size(f, ec)).first;
      }
      OLMO_CHECK(ch.offset <= it->second && ch.length <= it->second - ch.offset, dir, "/", ch.file,
                 ": tensor '", key, "' is stored at bytes [", ch.offset, ", ", ch.offset + ch.length,
                 ") but the file has ", it->second, " bytes (truncated?)");
    }
  }
  return c;
}

const TensorEntry& Checkpoint::at(const std::string& key) const {
  auto it = meta_.tensors.find(key);
  OLMO_CHECK(it != meta_.tensors.end(), dir_, ": the checkpoint has no tensor '", key, "'");
  return it->second;
}

}  // namespace olmosft::distcp
