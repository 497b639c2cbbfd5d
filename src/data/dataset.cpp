#include "data/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/hash.h"
#include "io/json.h"

static_assert(std::endian::native == std::endian::little, "the row file format is little-endian");

namespace olmosft {

namespace {
constexpr char kMagic[8] = {'O', 'L', 'M', 'O', 'R', 'O', 'W', 'S'};

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t epoch;
  uint64_t seq_len;
  uint64_t rows;
  uint64_t record_bytes;
  uint64_t rows_offset;
  uint64_t checksums_offset;
  uint64_t reserved;
};
static_assert(sizeof(Header) == kRowsHeaderBytes);

// The manifest's `tokenizer` section, read by the trainer and `data inspect`: an object whose known fields
// have their types (a string eos_id made the trainer's value() throw nlohmann's type_error).
void check_tokenizer_section(const nlohmann::json& m, const std::string& mpath) {
  auto it = m.find("tokenizer");
  if (it == m.end()) return;  // the trainer reports a missing section itself
  OLMO_CHECK(it->is_object(), mpath, ": 'tokenizer' must be an object, got ", io::json_excerpt(*it));
  for (const char* k : {"eos_id", "pad_id", "vocab_size"}) {
    auto f = it->find(k);
    OLMO_CHECK(f == it->end() || f->is_number_integer(), mpath, ": 'tokenizer.", k,
               "' must be an integer, got ", io::json_excerpt(*f));
  }
  for (const char* k : {"spec", "tokenizer_sha256", "template_sha256"}) {
    auto f = it->find(k);
    OLMO_CHECK(f == it->end() || f->is_string(), mpath, ": 'tokenizer.", k, "' must be a string, got ",
               io::json_excerpt(*f));
  }
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("cannot write ", path, ": ", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}
}  // namespace

int64_t row_record_bytes(int64_t seq_len) {
  int64_t b = seq_len * 4 + seq_len * 2 + (seq_len + 7) / 8;
  return (b + 63) / 64 * 64;
}

std::string epoch_file_name(int epoch) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "epoch-%05d.rows", epoch);
  return buf;
}

void PackedRow::positions(int32_t* out) const {
  int32_t pos = 0;
  for (int64_t t = 0; t < seq_len; ++t) {
    if (segment_ids[t] == 0) {
      out[t] = 0;
      pos = 0;
      continue;
    }
    if (t > 0 && segment_ids[t] != segment_ids[t - 1]) pos = 0;
    out[t] = pos++;
  }
}

std::vector<int32_t> PackedRow::positions() const {
  std::vector<int32_t> v(static_cast<size_t>(seq_len));
  positions(v.data());
  return v;
}

void PackedRow::targets(int32_t* out, int32_t ignore_index) const {
  for (int64_t t = 0; t < seq_len; ++t) {
    bool ok =
        t + 1 < seq_len && segment_ids[t] != 0 && segment_ids[t + 1] == segment_ids[t] && trained(t + 1);
    out[t] = ok ? tokens[t + 1] : ignore_index;
  }
}

std::vector<int32_t> PackedRow::targets(int32_t ignore_index) const {
  std::vector<int32_t> v(static_cast<size_t>(seq_len));
  targets(v.data(), ignore_index);
  return v;
}

int32_t PackedRow::num_segments() const {
  int32_t m = 0;
  for (int64_t t = 0; t < seq_len; ++t) m = std::max<int32_t>(m, segment_ids[t]);
  return m;
}

uint64_t fill_record(uint8_t* record, int64_t seq_len, const std::vector<RowSegment>& segments,
                     int32_t pad_id) {
  const int64_t rb = row_record_bytes(seq_len);
  std::memset(record, 0, static_cast<size_t>(rb));
  auto* tok = reinterpret_cast<int32_t*>(record);
  auto* seg = reinterpret_cast<uint16_t*>(record + 4 * seq_len);
  uint8_t* bits = record + 6 * seq_len;
  OLMO_CHECK(segments.size() <= 65535, "packing: a row holds ", segments.size(),
             " conversations, more than the format's 65535 segment ids");
  int64_t t = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    const auto& sg = segments[s];
    OLMO_CHECK(t + sg.length <= seq_len, "packing: row overflow (internal error)");
    std::memcpy(tok + t, sg.tokens, static_cast<size_t>(sg.length) * 4);
    for (int32_t k = 0; k < sg.length; ++k, ++t) {
      seg[t] = static_cast<uint16_t>(s + 1);
      if (sg.trained[k]) bits[t >> 3] |= static_cast<uint8_t>(1u << (t & 7));
    }
  }
  for (; t < seq_len; ++t) tok[t] = pad_id;
  return io::sha256_u64(record, static_cast<size_t>(rb));
}

// ---------------------------------------------------------------------------------------------------------------
RowFileWriter::RowFileWriter(const std::string& path, int epoch, int64_t seq_len, int64_t rows)
    : path_(path), epoch_(epoch), seq_len_(seq_len), rows_(rows), record_bytes_(row_record_bytes(seq_len)) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create ", path, ": ", std::strerror(errno));
  Header h{};  // placeholder, rewritten by finish()
  write_all(fd_, &h, sizeof h, path_);
  checksums_.reserve(static_cast<size_t>(rows));
}

RowFileWriter::~RowFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void RowFileWriter::add_rows(const uint8_t* records, const uint64_t* checksums, int64_t count) {
  OLMO_CHECK(written_ + count <= rows_, path_, ": more rows written than declared (internal error)");
  write_all(fd_, records, static_cast<size_t>(count * record_bytes_), path_);
  checksums_.insert(checksums_.end(), checksums, checksums + count);
  written_ += count;
}

std::string RowFileWriter::finish() {
  OLMO_CHECK(written_ == rows_, path_, ": ", written_, " rows written, ", rows_,
             " declared (internal error)");
  write_all(fd_, checksums_.data(), checksums_.size() * 8, path_);
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kRowsFormatVersion;
  h.epoch = static_cast<uint32_t>(epoch_);
  h.seq_len = static_cast<uint64_t>(seq_len_);
  h.rows = static_cast<uint64_t>(rows_);
  h.record_bytes = static_cast<uint64_t>(record_bytes_);
  h.rows_offset = kRowsHeaderBytes;
  h.checksums_offset = static_cast<uint64_t>(kRowsHeaderBytes + rows_ * record_bytes_);
  if (::pwrite(fd_, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h))
    fail("cannot write ", path_, ": ", std::strerror(errno));
  if (::fsync(fd_) != 0) fail("cannot fsync ", path_, ": ", std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  return io::sha256_hex(checksums_.data(), checksums_.size() * 8);
}

// ---------------------------------------------------------------------------------------------------------------
struct PackedDataset::Mapping {
  void* addr = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (addr != MAP_FAILED) ::munmap(addr, size);
  }
};

const nlohmann::json& ManifestReader::get(const nlohmann::json& obj, const std::string& where,
                                          const std::string& key) const {
  auto it = obj.find(key);  // end() for a non-object too
  OLMO_CHECK(it != obj.end(), path_, ": missing key '", where, key, "'");
  return *it;
}

const nlohmann::json& ManifestReader::integer(const nlohmann::json& obj, const std::string& where,
                                              const std::string& key, int64_t lo, int64_t hi) const {
  const nlohmann::json& v = get(obj, where, key);
  OLMO_CHECK(v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi &&
                 !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)),
             path_, ": '", where, key, "' must be an integer in [", lo, ", ", hi, "], got ",
             io::json_excerpt(v));
  return v;
}

namespace {
const nlohmann::json& of_kind(const nlohmann::json& v, bool ok, const std::string& path,
                              const std::string& where, const std::string& key, const char* kind) {
  OLMO_CHECK(ok, path, ": '", where, key, "' must be ", kind, ", got ", io::json_excerpt(v));
  return v;
}
}  // namespace

const nlohmann::json& ManifestReader::string(const nlohmann::json& obj, const std::string& where,
                                             const std::string& key) const {
  const nlohmann::json& v = get(obj, where, key);
  return of_kind(v, v.is_string(), path_, where, key, "a string");
}

const nlohmann::json& ManifestReader::number(const nlohmann::json& obj, const std::string& where,
                                             const std::string& key) const {
  const nlohmann::json& v = get(obj, where, key);
  return of_kind(v, v.is_number(), path_, where, key, "a number");
}

const nlohmann::json& ManifestReader::object(const nlohmann::json& obj, const std::string& where,
                                             const std::string& key) const {
  const nlohmann::json& v = get(obj, where, key);
  return of_kind(v, v.is_object(), path_, where, key, "an object");
}

const nlohmann::json& ManifestReader::array(const nlohmann::json& obj, const std::string& where,
                                            const std::string& key) const {
  const nlohmann::json& v = get(obj, where, key);
  return of_kind(v, v.is_array(), path_, where, key, "a list");
}

PackedDataset PackedDataset::open(const std::string& dir, Options opts) {
  PackedDataset ds;
  ds.dir_ = dir;
  ds.opts_ = opts;
  std::string mpath = dir + "/manifest.json";
  std::ifstream in(mpath);
  OLMO_CHECK(in, mpath, ": cannot open (not a packed dataset, or an incomplete build)");
  std::stringstream ss;
  ss << in.rdbuf();
  ds.manifest_ = io::parse_json(ss.str(), mpath);
  const auto& m = ds.manifest_;
  // Typed reads: a wrong type or range is an error naming the key (nlohmann's get<>() threw its own
  // type_error, and rows * record_bytes could overflow).
  const ManifestReader rd(mpath);
  OLMO_CHECK(m.is_object(), mpath, ": expected a JSON object");
  OLMO_CHECK(rd.get(m, "", "format") == "olmosft-packed-sft", mpath,
             ": 'format' is not \"olmosft-packed-sft\"");
  const auto& ver = rd.get(m, "", "format_version");
  OLMO_CHECK(ver.is_number_integer() && ver.get<int64_t>() == kManifestFormatVersion, mpath,
             ": format_version ", io::json_excerpt(ver), " is not supported (this build reads version ",
             kManifestFormatVersion, ")");
  ds.seq_len_ = rd.integer(m, "", "seq_len", 1, kMaxSeqLen).get<int64_t>();
  check_tokenizer_section(m, mpath);
  const auto& files = rd.get(m, "", "epoch_files");
  OLMO_CHECK(files.is_array() && !files.empty(), mpath, ": 'epoch_files' must be a non-empty list");
  for (size_t e = 0; e < files.size(); ++e) {
    const auto& f = files[e];
    const std::string where = "epoch_files[" + std::to_string(e) + "].";
    OLMO_CHECK(f.is_object(), mpath, ": epoch_files[", e, "] is not an object");
    EpochFile ef;
    std::string name = rd.string(f, where, "file").get<std::string>();
    OLMO_CHECK(name == epoch_file_name(static_cast<int>(e)), mpath, ": ", where, "file is ",
               io::json_excerpt(name), ", expected ", epoch_file_name(static_cast<int>(e)));
    ef.path = dir + "/" + name;
    ef.record_bytes = rd.integer(f, where, "record_bytes", 0, INT64_MAX).get<int64_t>();
    OLMO_CHECK(ef.record_bytes == row_record_bytes(ds.seq_len_), ef.path, ": record_bytes ", ef.record_bytes,
               " does not match seq_len ", ds.seq_len_);
    // rows such that the file size (header + rows x (record + checksum)) fits in an int64
    ef.rows = rd.integer(f, where, "rows", 0, (INT64_MAX - kRowsHeaderBytes) / (ef.record_bytes + 8))
                  .get<int64_t>();
    const std::string checksums_sha256 = rd.string(f, where, "checksums_sha256").get<std::string>();
    const int64_t want = kRowsHeaderBytes + ef.rows * (ef.record_bytes + 8);
    int fd = ::open(ef.path.c_str(), O_RDONLY | O_CLOEXEC);
    OLMO_CHECK(fd >= 0, ef.path, ": cannot open: ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size != want) {
      ::close(fd);
      fail(ef.path, ": size ", st.st_size, " bytes, expected ", want, " (", ef.rows, " rows of ",
           ef.record_bytes, " bytes + header + checksums): truncated or not from this manifest");
    }
    ef.map = std::make_shared<Mapping>();
    ef.map->size = static_cast<size_t>(want);
    ef.map->addr = ::mmap(nullptr, ef.map->size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    OLMO_CHECK(ef.map->addr != MAP_FAILED, ef.path, ": mmap failed: ", std::strerror(errno));
    ef.base = static_cast<const uint8_t*>(ef.map->addr);
    Header h;
    std::memcpy(&h, ef.base, sizeof h);
    OLMO_CHECK(std::memcmp(h.magic, kMagic, 8) == 0, ef.path, ": bad magic (not an olmosft row file)");
    OLMO_CHECK(h.version == kRowsFormatVersion, ef.path, ": row format version ", h.version,
               " is not supported");
    OLMO_CHECK(h.epoch == e && h.seq_len == static_cast<uint64_t>(ds.seq_len_) &&
                   h.rows == static_cast<uint64_t>(ef.rows) &&
                   h.record_bytes == static_cast<uint64_t>(ef.record_bytes) &&
                   h.rows_offset == kRowsHeaderBytes &&
                   h.checksums_offset == static_cast<uint64_t>(kRowsHeaderBytes + ef.rows * ef.record_bytes),
               ef.path, ": header does not match the manifest");
    ef.checksums = reinterpret_cast<const uint64_t*>(ef.base + h.checksums_offset);
    std::string sum = io::sha256_hex(ef.checksums, static_cast<size_t>(ef.rows) * 8);
    OLMO_CHECK(sum == checksums_sha256, ef.path,
               ": checksum table SHA-256 does not match the manifest (file modified or from another build)");
    ds.files_.push_back(std::move(ef));
  }
  return ds;
}

int64_t PackedDataset::rows(int epoch) const {
  OLMO_CHECK(epoch >= 0 && epoch < epochs(), dir_, ": epoch ", epoch, " out of range (dataset built for ",
             epochs(), " epochs)");
  return files_[epoch].rows;
}

PackedRow PackedDataset::row(int epoch, int64_t i) const {
  const int64_t n = rows(epoch);
  OLMO_CHECK(i >= 0 && i < n, dir_, ": row ", i, " out of range (epoch ", epoch, " has ", n, " rows)");
  const EpochFile& f = files_[epoch];
  const uint8_t* rec = f.base + kRowsHeaderBytes + i * f.record_bytes;
  if (opts_.verify_rows) {
    OLMO_CHECK(io::sha256_u64(rec, static_cast<size_t>(f.record_bytes)) == f.checksums[i], f.path, ": row ",
               i, " fails its checksum (corrupt file)");
  }
  PackedRow r;
  r.seq_len = seq_len_;
  r.tokens = reinterpret_cast<const int32_t*>(rec);
  r.segment_ids = reinterpret_cast<const uint16_t*>(rec + 4 * seq_len_);
  r.trained_bits = rec + 6 * seq_len_;
  return r;
}

void PackedDataset::verify_all() const {
  for (int e = 0; e < epochs(); ++e) {
    const EpochFile& f = files_[e];
    std::string bad;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < f.rows; ++i) {
      const uint8_t* rec = f.base + kRowsHeaderBytes + i * f.record_bytes;
      if (io::sha256_u64(rec, static_cast<size_t>(f.record_bytes)) != f.checksums[i]) {
#pragma omp critical
        if (bad.empty()) bad = std::to_string(i);
      }
    }
    OLMO_CHECK(bad.empty(), f.path, ": row ", bad, " fails its checksum (corrupt file)");
  }
}

}  // namespace olmosft
