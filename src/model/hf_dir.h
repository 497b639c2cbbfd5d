// HF model directories: load (config.json + model.safetensors or a sharded index, every tensor checked
// against the parameter registry) and export (config.json, safetensors sharded above a size, tokenizer
// files copied from the source), published atomically into a new or empty directory.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"

namespace olmosft::model {

// Tokenizer and generation files copied verbatim from a source HF directory on export, when present.
const std::vector<std::string>& hf_side_files();

struct HfModel {
  std::string dir;
  ModelConfig config;
  std::vector<ParamSpec> registry;        // expected tensors, in HF state-dict order
  std::map<std::string, Tensor> tensors;  // stored dtype; zero-copy views over the mapped files
  std::vector<std::string> files;         // safetensors files read (names relative to dir)
  bool sharded = false;

  const Tensor& at(const std::string& name) const;
  // Registry-ordered (name, tensor) list in the stored dtypes.
  std::vector<safetensors::NamedTensor> named() const;
  // fp32 master copies (fresh storage), registry order.
  std::vector<safetensors::NamedTensor> fp32_masters() const;
  // Elements [begin, begin + n) of a tensor as fp32, read from its file with pread (only those bytes;
  // safetensors::Reader::read_f32), for loading one shard per rank.
  void read_f32(const std::string& name, int64_t begin, int64_t n, float* out) const;
  std::map<DType, size_t> dtype_counts() const;  // tensors per stored dtype
  uint64_t total_bytes() const;

 private:
  friend HfModel load_hf_dir(const std::string& dir);
  std::vector<std::shared_ptr<safetensors::Reader>> readers_;  // keep the mappings alive
  // Registry tensors stored under other names (hf::import_alias): the stored names in order, with their
  // element counts (several: concatenated along dim 0).
  std::map<std::string, std::vector<std::pair<std::string, int64_t>>> pieces_;
};

// Loads and validates; errors name the directory/file and list every missing, unexpected, mis-shaped or
// wrongly typed tensor (up to 20 of each, with totals). Accepted stored dtypes: F32, BF16, F16. Tensors a
// family's real writers store under other names (hf::import_alias: olmo_hybrid's renamed norms and split
// conv) are mapped to the registry's names first; a tensor given both ways, or a piece missing, is refused
// by name.
HfModel load_hf_dir(const std::string& dir);

// Checks a set of tensors against the registry of `config` (same rules and messages as loading).
void check_against_registry(const ModelConfig& config, const std::map<std::string, Shape>& shapes,
                            const std::map<std::string, DType>& dtypes, const std::string& context);

struct ExportOptions {
  std::optional<DType> dtype;  // nullopt: keep each tensor's dtype; else BF16 / F32 / F16
  uint64_t max_shard_bytes = safetensors::kDefaultMaxShardSize;
  std::string copy_side_files_from;  // source HF dir for tokenizer/generation files ("" = none)
};

// The export verbs' --dtype (bf16, fp32, fp16 or keep) and --shard-size (safetensors::parse_size) as options;
// anything else throws olmosft::Error naming the flag.
ExportOptions parse_export_options(const std::string& dtype, const std::string& shard_size);

struct ExportResult {
  std::vector<std::string> files;  // every file written, relative to the output dir
  uint64_t tensor_bytes = 0;
};

// Writes an HF directory at out_dir (which must not exist or be empty) through a staging directory and
// one rename. Tensors must match the registry of `config` exactly. When converting, the KDA A_log and
// dt_bias tensors stay fp32 (as the reference exporter writes them); everything else gets opts.dtype.
// config.json is the original JSON with torch_dtype updated when a dtype is given.
ExportResult export_hf_dir(const std::string& out_dir, const ModelConfig& config,
                           const std::vector<safetensors::NamedTensor>& tensors, const ExportOptions& opts);

// Multi-line report for `olmosft model info`.
std::string model_info(const HfModel& m);

}  // namespace olmosft::model
