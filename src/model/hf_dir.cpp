#include "model/hf_dir.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "io/atomic_file.h"

namespace fs = std::filesystem;

namespace olmosft::model {

const std::vector<std::string>& hf_side_files() {
  static const std::vector<std::string> f = {
      "tokenizer.json",      "tokenizer_config.json",  "special_tokens_map.json",
      "chat_template.jinja", "generation_config.json", "vocab.json",
      "merges.txt",          "added_tokens.json"};
  return f;
}

const Tensor& HfModel::at(const std::string& name) const {
  auto it = tensors.find(name);
  OLMO_CHECK(it != tensors.end(), dir, ": model has no tensor '", name, "'");
  return it->second;
}

std::vector<safetensors::NamedTensor> HfModel::named() const {
  std::vector<safetensors::NamedTensor> out;
  out.reserve(registry.size());
  for (const auto& p : registry) out.push_back({p.name, at(p.name)});
  return out;
}

std::vector<safetensors::NamedTensor> HfModel::fp32_masters() const {
  std::vector<safetensors::NamedTensor> out;
  out.reserve(registry.size());
  for (const auto& p : registry) {
    const Tensor& t = at(p.name);
    out.push_back({p.name, t.dtype() == DType::F32 ? t.clone() : t.to(DType::F32)});
  }
  return out;
}

void HfModel::read_f32(const std::string& name, int64_t begin, int64_t n, float* out) const {
  if (auto it = pieces_.find(name); it != pieces_.end()) {
    int64_t at = 0;  // element offset of the piece in the registry tensor
    for (const auto& [stored, count] : it->second) {
      const int64_t lo = std::max(begin, at), hi = std::min(begin + n, at + count);
      if (lo < hi) read_f32(stored, lo - at, hi - lo, out + (lo - begin));
      at += count;
    }
    return;
  }
  for (const auto& r : readers_)
    if (const safetensors::TensorInfo* t = r->find(name)) return r->read_f32(*t, begin, n, out);
  fail(dir, ": model has no tensor '", name, "'");
}

std::map<DType, size_t> HfModel::dtype_counts() const {
  std::map<DType, size_t> m;
  for (const auto& [n, t] : tensors) m[t.dtype()]++;
  return m;
}

uint64_t HfModel::total_bytes() const {
  uint64_t b = 0;
  for (const auto& [n, t] : tensors) b += t.nbytes();
  return b;
}

void check_against_registry(const ModelConfig& config, const std::map<std::string, Shape>& shapes,
                            const std::map<std::string, DType>& dtypes, const std::string& context) {
  auto reg = param_registry(config);
  std::vector<std::string> missing, unexpected, wrong_shape, wrong_dtype;
  std::set<std::string> expected;
  for (const auto& p : reg) {
    expected.insert(p.name);
    auto it = shapes.find(p.name);
    if (it == shapes.end()) {
      missing.push_back(p.name + " " + shape_str(p.shape));
      continue;
    }
    if (it->second != p.shape) {
      wrong_shape.push_back(p.name + " is " + shape_str(it->second) + ", expected " + shape_str(p.shape));
    }
    auto dt = dtypes.find(p.name);
    if (dt != dtypes.end() && dt->second != DType::F32 && dt->second != DType::BF16 &&
        dt->second != DType::F16) {
      wrong_dtype.push_back(p.name + " is " + dtype_name(dt->second) + ", expected F32, BF16 or F16");
    }
  }
  for (const auto& [name, s] : shapes) {
    if (!expected.count(name)) unexpected.push_back(name + " " + shape_str(s));
  }
  if (missing.empty() && unexpected.empty() && wrong_shape.empty() && wrong_dtype.empty()) return;
  std::ostringstream os;
  os << context << ": tensors do not match the " << config.model_type_name << " parameter registry ("
     << reg.size() << " tensors expected)";
  auto list = [&](const char* what, const std::vector<std::string>& v) {
    if (v.empty()) return;
    os << "\n  " << v.size() << " " << what << ":";
    for (size_t i = 0; i < v.size() && i < 20; ++i) os << "\n    " << v[i];
    if (v.size() > 20) os << "\n    ... and " << v.size() - 20 << " more";
  };
  list("missing", missing);
  list("unexpected", unexpected);
  list("with the wrong shape", wrong_shape);
  list("with an unsupported dtype", wrong_dtype);
  throw Error(os.str());
}

namespace {

struct Stored {
  std::map<std::string, Shape> shapes;
  std::map<std::string, DType> dtypes;
};

// Maps the stored names that hf::import_alias knows to registry names (pieces concatenated along dim 0, in
// piece order); the result holds the registry-named shapes/dtypes and, per aliased registry name, its pieces.
Stored resolve_aliases(const ModelConfig& c, const Stored& in, const std::string& dir,
                       std::map<std::string, std::vector<std::pair<std::string, int64_t>>>& pieces) {
  Stored out;
  std::map<std::string, std::vector<std::string>> parts;  // registry name -> stored name per piece
  for (const auto& [name, shape] : in.shapes) {
    const auto alias = hf::import_alias(c, name);
    if (!alias) {
      out.shapes[name] = shape;
      out.dtypes[name] = in.dtypes.at(name);
      continue;
    }
    auto& v = parts[alias->name];
    v.resize(static_cast<size_t>(alias->pieces));
    v[static_cast<size_t>(alias->piece)] = name;
  }
  for (const auto& [name, v] : parts) {
    OLMO_CHECK(!out.shapes.count(name), dir, ": tensor '", name, "' is stored both under its name and as '",
               v[0].empty() ? v.back() : v[0], "'");
    Shape shape;
    for (size_t i = 0; i < v.size(); ++i) {
      OLMO_CHECK(!v[i].empty(), dir, ": '", name, "' is stored in ", v.size(), " pieces but piece ", i,
                 " is missing (have '", v[i == 0 ? 1 : 0], "')");
      const Shape& s = in.shapes.at(v[i]);
      if (i == 0) {
        shape = s;
        out.dtypes[name] = in.dtypes.at(v[i]);
      } else {
        OLMO_CHECK(
            s.size() == shape.size() && !s.empty() && std::equal(s.begin() + 1, s.end(), shape.begin() + 1),
            dir, ": '", v[i], "' is ", shape_str(s), ", which does not concatenate with '", v[0], "' ",
            shape_str(in.shapes.at(v[0])), " along dim 0");
        OLMO_CHECK(in.dtypes.at(v[i]) == out.dtypes[name], dir, ": '", v[i], "' and '", v[0],
                   "' have different dtypes");
        shape[0] += s[0];
      }
      pieces[name].emplace_back(v[i], shape_numel(s));
    }
    out.shapes[name] = shape;
  }
  return out;
}

// The registry tensor NAME from its stored pieces: a view of the one piece, or a concatenated copy.
Tensor assemble(const std::vector<std::pair<std::string, int64_t>>& pieces, const Shape& shape,
                const std::map<std::string, Tensor>& stored) {
  if (pieces.size() == 1) return stored.at(pieces[0].first).view(shape);
  Tensor t = Tensor::empty(shape, stored.at(pieces[0].first).dtype());
  auto* at = static_cast<std::byte*>(t.raw_data());
  for (const auto& [name, count] : pieces) {
    const Tensor p = stored.at(name).contiguous();
    std::memcpy(at, p.raw_data(), p.nbytes());
    at += p.nbytes();
  }
  return t;
}

}  // namespace

HfModel load_hf_dir(const std::string& dir) {
  std::error_code ec;
  OLMO_CHECK(fs::is_directory(dir, ec), "model directory ", dir, " does not exist or is not a directory");
  HfModel m;
  m.dir = dir;
  m.config = load_config(dir + "/config.json");
  m.registry = param_registry(m.config);
  bool has_index = fs::exists(dir + "/" + safetensors::kIndexFile, ec);
  bool has_single = fs::exists(dir + "/" + safetensors::kSingleFile, ec);
  OLMO_CHECK(!(has_index && has_single), dir, ": both ", safetensors::kSingleFile, " and ",
             safetensors::kIndexFile, " are present; remove the stale one");
  if (!has_index && !has_single) {
    bool bin =
        fs::exists(dir + "/pytorch_model.bin", ec) || fs::exists(dir + "/pytorch_model.bin.index.json", ec);
    fail(dir, ": no ", safetensors::kSingleFile, " or ", safetensors::kIndexFile,
         bin ? " (pytorch_model.bin checkpoints are not supported; convert them to safetensors)" : "");
  }
  std::map<std::string, Shape> shapes;
  std::map<std::string, DType> dtypes;
  std::map<std::string, std::string> where;  // tensor -> file
  auto add_file = [&](const std::string& fname) {
    auto r = safetensors::Reader::open(dir + "/" + fname);
    for (const auto& t : r->tensors()) {
      auto [it, fresh] = where.emplace(t.name, fname);
      OLMO_CHECK(fresh, dir, ": tensor '", t.name, "' appears in both ", it->second, " and ", fname);
      shapes[t.name] = t.shape;
      dtypes[t.name] = t.dtype;
    }
    m.readers_.push_back(r);
    m.files.push_back(fname);
  };
  if (has_single) {
    add_file(safetensors::kSingleFile);
  } else {
    m.sharded = true;
    std::string ipath = dir + "/" + safetensors::kIndexFile;
    auto idx = safetensors::read_index(ipath);
    std::set<std::string> shard_files;
    for (const auto& [n, f] : idx.weight_map) shard_files.insert(f);
    for (const auto& f : shard_files) {
      OLMO_CHECK(fs::exists(dir + "/" + f, ec), ipath, ": shard ", f, " listed in weight_map does not exist");
      add_file(f);
    }
    for (const auto& [n, f] : idx.weight_map) {
      auto it = where.find(n);
      OLMO_CHECK(it != where.end(), ipath, ": weight_map lists '", n, "' in ", f,
                 " but that shard has no such tensor");
      OLMO_CHECK(it->second == f, ipath, ": weight_map puts '", n, "' in ", f, " but it is stored in ",
                 it->second);
    }
    for (const auto& [n, f] : where) {
      OLMO_CHECK(idx.weight_map.count(n), ipath, ": tensor '", n, "' in ", f, " is not listed in weight_map");
    }
    if (idx.has_total_size) {
      uint64_t sum = 0;
      for (const auto& r : m.readers_) {
        for (const auto& t : r->tensors()) sum += t.nbytes();
      }
      OLMO_CHECK(sum == idx.total_size, ipath, ": metadata.total_size is ", idx.total_size,
                 " but the shards hold ", sum, " bytes of tensors");
    }
  }
  const Stored named = resolve_aliases(m.config, {shapes, dtypes}, dir, m.pieces_);
  check_against_registry(m.config, named.shapes, named.dtypes, dir);
  for (const auto& r : m.readers_) {
    for (const auto& t : r->tensors()) m.tensors.emplace(t.name, r->view(t.name));
  }
  for (const auto& [name, pieces] : m.pieces_) {
    Tensor t = assemble(pieces, named.shapes.at(name), m.tensors);
    for (const auto& pc : pieces) m.tensors.erase(pc.first);
    m.tensors.emplace(name, std::move(t));
  }
  return m;
}

ExportOptions parse_export_options(const std::string& dtype, const std::string& shard_size) {
  ExportOptions opts;
  opts.max_shard_bytes = safetensors::parse_size(shard_size);
  if (dtype == "bf16")
    opts.dtype = DType::BF16;
  else if (dtype == "fp32")
    opts.dtype = DType::F32;
  else if (dtype == "fp16")
    opts.dtype = DType::F16;
  else
    OLMO_CHECK(dtype == "keep", "--dtype: expected bf16, fp32, fp16 or keep, got '", dtype, "'");
  return opts;
}

ExportResult export_hf_dir(const std::string& out_dir, const ModelConfig& config,
                           const std::vector<safetensors::NamedTensor>& tensors, const ExportOptions& opts) {
  if (opts.dtype) {
    DType d = *opts.dtype;
    OLMO_CHECK(d == DType::BF16 || d == DType::F32 || d == DType::F16,
               "export dtype must be bf16, fp32 or fp16, got ", dtype_name(d));
  }
  std::map<std::string, Shape> shapes;
  std::map<std::string, DType> dtypes;
  for (const auto& t : tensors) {
    OLMO_CHECK(shapes.emplace(t.name, t.tensor.shape()).second, "export: tensor '", t.name, "' given twice");
    dtypes[t.name] = t.tensor.dtype();
  }
  check_against_registry(config, shapes, dtypes, "export to " + out_dir);
  // Registry order (= HF state-dict order) decides the sharding.
  auto reg = param_registry(config);
  std::map<std::string, const safetensors::NamedTensor*> by_name;
  for (const auto& t : tensors) by_name[t.name] = &t;
  std::vector<safetensors::NamedTensor> out;
  out.reserve(reg.size());
  for (const auto& p : reg) {
    const safetensors::NamedTensor& src = *by_name.at(p.name);
    DType target = opts.dtype ? (p.fp32_master_only ? DType::F32 : *opts.dtype) : src.tensor.dtype();
    out.push_back({p.name, src.tensor, target, src.load});  // loaded and converted while writing
  }
  io::AtomicDir publish(out_dir);
  ExportResult res;
  auto w = safetensors::write_sharded(publish.staging(), out, opts.max_shard_bytes);
  res.files = w.files;
  if (w.indexed) res.files.push_back(safetensors::kIndexFile);
  res.tensor_bytes = w.total_size;
  save_config(config, publish.file("config.json"), opts.dtype);
  res.files.push_back("config.json");
  if (!opts.copy_side_files_from.empty()) {
    for (const auto& f : hf_side_files()) {
      std::string src = opts.copy_side_files_from + "/" + f;
      std::error_code ec;
      if (!fs::is_regular_file(src, ec)) continue;
      io::write_file_atomic(publish.file(f), io::read_file(src));
      res.files.push_back(f);
    }
  }
  publish.commit();
  return res;
}

std::string model_info(const HfModel& m) {
  std::ostringstream os;
  auto pc = count_params(m.config, m.registry);
  os << "directory           " << m.dir << "\n" << config_summary(m.config);
  os << "parameters          " << pc.total;
  if (m.config.is_moe()) os << " (active per token " << pc.active << ")";
  os << "\ntensors             " << pc.tensors << "\n"
     << "stored dtypes       ";
  for (const auto& [d, n] : m.dtype_counts()) os << dtype_name(d) << " x" << n << "  ";
  os << "\nweights             " << m.files.size() << " file(s)" << (m.sharded ? " (sharded)" : "") << ", "
     << m.total_bytes() << " bytes of tensor data\n";
  return os.str();
}

}  // namespace olmosft::model
