// PyTorch Distributed Checkpoint ("distcp") reader, as OLMo-core writes it (docs/io.md "Distributed
// checkpoints", formats.md §5). A DCP directory holds `.metadata` (a pickle of torch's Metadata: per key a
// TensorStorageMetadata with dtype, global size and chunks, or a BytesStorageMetadata; per chunk a storage
// entry (file, offset, length)) and `__<rank>_<i>.distcp` files. Each tensor chunk is stored as a complete
// torch.save ZIP archive (data.pkl + the raw little-endian bytes) at (file, offset, length). Everything is
// parsed with the restricted unpickler (io/pickle.h); chunks are read with pread, one at a time, and
// reassembled into the global tensor (FSDP splits a tensor across ranks' files).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace olmosft::distcp {

constexpr const char* kMetadataFile = ".metadata";

struct Chunk {
  std::vector<int64_t> offsets, sizes;  // the box of the global tensor this chunk holds
  std::string file;                     // relative path of the .distcp file
  uint64_t offset = 0, length = 0;      // the torch.save item's byte range in that file
};

struct TensorEntry {
  std::string key;             // e.g. "model.blocks.0.attention.w_q.weight"
  std::string torch_dtype;     // e.g. "torch.bfloat16"
  std::optional<DType> dtype;  // nullopt: a dtype this reader cannot convert (named on read)
  Shape shape;                 // global size
  std::vector<Chunk> chunks;   // disjoint, covering the tensor exactly (checked on open)
  uint64_t nbytes() const { return dtype ? uint64_t(shape_numel(shape)) * dtype_size(*dtype) : 0; }
};

struct Metadata {
  std::map<std::string, TensorEntry> tensors;
  std::set<std::string> byte_entries;  // BytesStorageMetadata keys (pickled objects; never read)
};

// The pickle classes accepted in `.metadata` and in torch.save's data.pkl.
const std::set<std::string>& metadata_classes();
const std::set<std::string>& torch_save_classes();

// Parses a `.metadata` image (the pickle only; files are not checked). `context` names the file.
Metadata parse_metadata(const uint8_t* data, size_t size, const std::string& context);

// One tensor inside a torch.save ZIP archive held in memory.
struct SavedTensor {
  std::optional<DType> dtype;  // from the storage class
  std::string storage_class;   // e.g. "torch.BFloat16Storage"
  Shape shape;
  std::vector<int64_t> stride;
  int64_t storage_offset = 0;
  const uint8_t* data = nullptr;  // the storage's bytes, inside the given buffer
  uint64_t data_bytes = 0;
};
// Parses a torch.save archive (ZIP, stored entries, ZIP64 aware) holding one tensor.
SavedTensor parse_torch_save(const uint8_t* data, size_t size, const std::string& context);

class Checkpoint {
 public:
  // Opens a DCP directory (the one holding `.metadata`, e.g. STEP/model_and_optim): parses the metadata
  // and checks every chunk's file exists and holds its byte range, and that each tensor's chunks tile it.
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const Metadata& metadata() const { return meta_; }
  const std::map<std::string, TensorEntry>& tensors() const { return meta_.tensors; }
  const TensorEntry& at(const std::string& key) const;  // throws naming the directory and key
  // The whole tensor in its stored dtype. Memory: the tensor plus one chunk's item.
  Tensor read(const std::string& key) const;

 private:
  std::string dir_;
  Metadata meta_;
};

// True when `dir` holds a `.metadata` file (a DCP directory).
bool is_dcp_dir(const std::string& dir);

}  // namespace olmosft::distcp
