// The packed SFT dataset on disk (written by `olmosft data build`, read by the trainer).
//
// Directory:  manifest.json (written last; its presence marks a complete dataset)
//             epoch-00000.rows, epoch-00001.rows, ...  (one row file per epoch)
// Row file (all integers little-endian):
//   header, 64 bytes: magic "OLMOROWS" | u32 format_version (=1) | u32 epoch | u64 seq_len | u64 rows |
//                     u64 record_bytes | u64 rows_offset (=64) | u64 checksums_offset | 8 zero bytes
//   rows:             rows records of record_bytes each, record i at rows_offset + i * record_bytes:
//                       int32  tokens[seq_len]        (padding = the tokenizer's pad id)
//                       uint16 segment_ids[seq_len]   (1, 2, ... per conversation in the row; 0 = padding)
//                       uint8  trained_bits[ceil(seq_len / 8)]  (bit t % 8 of byte t / 8, LSB first:
//                                                        1 = token t is a training target)
//                       zero padding to a multiple of 64 bytes
//   checksums:        u64 checksum[rows] = first 8 bytes (LE) of SHA-256 of each record
// Positions are not stored: position t = t - (first index of t's segment); padding positions are 0.
// manifest.json records, per epoch, the file name, rows, record_bytes, file size and SHA-256 of the checksum
// table, so open() can validate the chain manifest -> checksum table -> rows cheaply; rows are checked
// lazily.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace olmosft {

inline constexpr uint32_t kRowsFormatVersion = 1;
inline constexpr uint32_t kManifestFormatVersion = 1;
inline constexpr int64_t kRowsHeaderBytes = 64;
// The largest seq_len a manifest may declare (token positions are int32).
inline constexpr int64_t kMaxSeqLen = INT32_MAX;

int64_t row_record_bytes(int64_t seq_len);
std::string epoch_file_name(int epoch);

// A row as views into the mapped file (valid while the PackedDataset lives).
struct PackedRow {
  int64_t seq_len = 0;
  const int32_t* tokens = nullptr;
  const uint16_t* segment_ids = nullptr;
  const uint8_t* trained_bits = nullptr;

  bool trained(int64_t t) const { return (trained_bits[t >> 3] >> (t & 7)) & 1; }
  // out[seq_len]: position of each token within its conversation (0 for padding).
  void positions(int32_t* out) const;
  std::vector<int32_t> positions() const;
  // out[seq_len]: next-token targets: out[t] = tokens[t+1] when tokens t and t+1 are in the same conversation
  // (same non-zero segment) and token t+1 is trained; otherwise ignore_index. The last position of every
  // segment is thus never trained across a conversation boundary.
  void targets(int32_t* out, int32_t ignore_index = -100) const;
  std::vector<int32_t> targets(int32_t ignore_index = -100) const;
  int32_t num_segments() const;
};

// Typed reads of a manifest's JSON, for PackedDataset::open and `data inspect`: each returns obj[key] once it
// exists and has the kind asked for; otherwise an error naming the manifest file and the key's path
// ("missing key 'epoch_files[0].rows'", "'epoch_files[0].rows' must be an integer in [0, ...], got \"x\"").
// `where` is obj's own path with a trailing '.' ("" at the top, "epoch_files[0].").
class ManifestReader {
 public:
  explicit ManifestReader(std::string path) : path_(std::move(path)) {}
  const nlohmann::json& get(const nlohmann::json& obj, const std::string& where,
                            const std::string& key) const;
  const nlohmann::json& integer(const nlohmann::json& obj, const std::string& where, const std::string& key,
                                int64_t lo = 0, int64_t hi = INT64_MAX) const;
  const nlohmann::json& string(const nlohmann::json& obj, const std::string& where,
                               const std::string& key) const;
  const nlohmann::json& number(const nlohmann::json& obj, const std::string& where,
                               const std::string& key) const;
  const nlohmann::json& object(const nlohmann::json& obj, const std::string& where,
                               const std::string& key) const;
  const nlohmann::json& array(const nlohmann::json& obj, const std::string& where,
                              const std::string& key) const;

 private:
  std::string path_;
};

class PackedDataset {
 public:
  struct Options {
    bool verify_rows = true;  // check each row's SHA-256 checksum when it is accessed
  };
  // Validates the manifest (format, version), every row file's header and size against it, and the SHA-256 of
  // each checksum table. Throws olmosft::Error naming the file and the mismatch.
  static PackedDataset open(const std::string& dir, Options opts);
  static PackedDataset open(const std::string& dir) { return open(dir, Options{}); }

  int64_t seq_len() const { return seq_len_; }
  int epochs() const { return static_cast<int>(files_.size()); }
  int64_t rows(int epoch) const;
  // O(1): row i of epoch e (epoch in [0, epochs()), i in [0, rows(e))). Throws on a bad index or a checksum
  // mismatch.
  PackedRow row(int epoch, int64_t i) const;
  // Checks every row of every epoch against its checksum (what `data inspect --verify` runs).
  void verify_all() const;
  const nlohmann::json& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }

 private:
  struct Mapping;
  struct EpochFile {
    std::shared_ptr<Mapping> map;
    int64_t rows = 0;
    int64_t record_bytes = 0;
    const uint8_t* base = nullptr;
    const uint64_t* checksums = nullptr;
    std::string path;
  };
  std::string dir_;
  nlohmann::json manifest_;
  int64_t seq_len_ = 0;
  Options opts_;
  std::vector<EpochFile> files_;
};

// Writes one epoch's row file sequentially: add_rows() any number of times, then finish(). Not thread-safe;
// the caller fills records (e.g. in parallel with fill_record) and hands them over in order.
class RowFileWriter {
 public:
  RowFileWriter(const std::string& path, int epoch, int64_t seq_len, int64_t rows);
  ~RowFileWriter();
  RowFileWriter(const RowFileWriter&) = delete;
  RowFileWriter& operator=(const RowFileWriter&) = delete;
  // records: count * record_bytes bytes; checksums: their checksums.
  void add_rows(const uint8_t* records, const uint64_t* checksums, int64_t count);
  // Writes the checksum table and header, fsyncs and closes; returns the SHA-256 (hex) of the checksum table.
  std::string finish();
  int64_t record_bytes() const { return record_bytes_; }

 private:
  std::string path_;
  int fd_ = -1;
  int epoch_;
  int64_t seq_len_, rows_, record_bytes_, written_ = 0;
  std::vector<uint64_t> checksums_;
};

// One conversation placed in a row.
struct RowSegment {
  const int32_t* tokens;
  const uint8_t* trained;
  int32_t length;
};
// Fills one record (record_bytes, zeroed by the function first) from the row's conversations; returns its
// checksum.
uint64_t fill_record(uint8_t* record, int64_t seq_len, const std::vector<RowSegment>& segments,
                     int32_t pad_id);

}  // namespace olmosft
