// safetensors reader (mmap, fully validated) and writer (deterministic layout, atomic), plus sharded
// checkpoints (model.safetensors.index.json). Format: docs/reference/formats.md §1 / huggingface/safetensors
// README.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace olmosft::safetensors {

// Largest header accepted (the reference Rust reader's MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderSize = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // [begin, end) relative to the start of the byte buffer
  uint64_t nbytes() const { return end - begin; }
};

struct Header {
  uint64_t header_size = 0;  // N: the JSON length in bytes (including padding)
  uint64_t data_size = 0;    // size of the byte buffer = file size - 8 - N
  std::map<std::string, std::string> metadata;
  std::vector<TensorInfo> tensors;  // sorted by data offset
};

// Parses and validates a complete safetensors image held in memory: header length bounded by the
// size and kMaxHeaderSize, UTF-8 JSON object starting with '{', no duplicate keys, each entry's dtype /
// shape / data_offsets consistent, ranges neither overlapping nor leaving holes, the buffer entirely
// indexed, optional "__metadata__" a string->string map. Throws olmosft::Error naming `context`
// (the file) and the tensor.
Header parse(const uint8_t* bytes, size_t size, const std::string& context);

// A memory-mapped safetensors file (private copy-on-write mapping: views can be written without
// touching the file). Validated on open.
class Reader {
 public:
  static std::shared_ptr<Reader> open(const std::string& path);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const TensorInfo* find(const std::string& name) const;
  const TensorInfo& at(const std::string& name) const;  // throws naming the file and tensor
  const uint8_t* data(const TensorInfo& t) const { return base_ + 8 + header_.header_size + t.begin; }
  // Zero-copy view over the mapping (the Reader must outlive it) when the data is aligned for its dtype,
  // otherwise an aligned copy.
  Tensor view(const std::string& name) const;
  Tensor copy(const std::string& name) const;  // always a fresh, owned copy
  // Elements [begin, begin + n) of tensor t (flat, row-major) as fp32 (F32, BF16, F16; the conversions are
  // exact), read with pread: the mapping is not touched, so only `out` (and a 4 MiB bounce buffer for
  // 16-bit dtypes) adds to the process's resident memory. For loading one shard of a model per rank.
  void read_f32(const TensorInfo& t, int64_t begin, int64_t n, float* out) const;

 private:
  Reader() = default;
  std::string path_;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  Header header_;
  std::map<std::string, size_t> by_name_;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;  // any supported dtype; made contiguous when written
  // When set, the tensor is converted to this dtype as it is written (one tensor at a time, so a whole
  // model is never held twice in memory).
  std::optional<DType> store_as = std::nullopt;
  // When set, `tensor` only describes the shape and dtype (a placeholder(), never read) and load() supplies
  // the data when the tensor is written, so a writer holds one tensor at a time (distcp import). The
  // loaded tensor must have the placeholder's shape and dtype.
  std::function<Tensor()> load = nullptr;
  DType stored_dtype() const { return store_as.value_or(tensor.dtype()); }
  uint64_t stored_nbytes() const {
    return static_cast<uint64_t>(tensor.numel()) * dtype_size(stored_dtype());
  }
};

// A tensor of this shape and dtype that owns no storage and must not be read: the `tensor` of a
// NamedTensor with `load`.
Tensor placeholder(const Shape& shape, DType dtype);

// Serialises to bytes in memory (tests, fuzz seeds). Layout as `write`.
std::vector<uint8_t> serialize(const std::vector<NamedTensor>& tensors,
                               const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
// Writes one file atomically. Layout as the reference writer: tensors sorted by dtype size (largest
// first), then by name, so every offset is a multiple of its element size; JSON key order "__metadata__"
// then tensors in offset order; the JSON padded with spaces to a multiple of 8 bytes. Names must be
// unique and non-empty.
void write(const std::string& path, const std::vector<NamedTensor>& tensors,
           const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// ---- Sharded checkpoints ---------------------------------------------------------------------------
// "5GB" (10^9), "500MB", "2GiB" (2^30), "64KiB", "1000" (bytes), as HF's convert_file_size_to_int.
uint64_t parse_size(const std::string& text);
constexpr uint64_t kDefaultMaxShardSize = 5'000'000'000ull;
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";

struct Index {
  bool has_total_size = false;
  uint64_t total_size = 0;
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name (in the same dir)
};
// Reads and validates an index file: "weight_map" object of string -> plain *.safetensors file name;
// optional "metadata" object whose "total_size" (if present) is a non-negative integer.
Index read_index(const std::string& path);

struct ShardedWriteResult {
  std::vector<std::string> files;  // shard file names in order
  bool indexed = false;            // false: a single model.safetensors, no index
  uint64_t total_size = 0;         // sum of tensor byte sizes
};
// Writes tensors into `dir` (existing directory) as model.safetensors, or, when they exceed max_shard_bytes,
// as model-0000i-of-0000N.safetensors plus model.safetensors.index.json. Shards are filled greedily in
// the given order; a tensor larger than the maximum gets a shard of its own. Every file is atomic.
ShardedWriteResult write_sharded(const std::string& dir, const std::vector<NamedTensor>& tensors,
                                 uint64_t max_shard_bytes = kDefaultMaxShardSize,
                                 const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace olmosft::safetensors
