// Crash-safe file output: a file appears under its final name only once it is complete and on disk.
// AtomicFile streams into "<path>.tmp-<pid>-<rand>" in the same directory; commit() fsyncs it, renames it
// over <path> and fsyncs the directory. AtomicDir builds a whole directory under "<dir>.tmp-<pid>-<rand>"
// and publishes it with one rename. Both remove their temporary on destruction unless committed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace olmosft::io {

// A short random hex string (from /dev/urandom-seeded std::random_device and the clock) for temp names.
std::string random_suffix();

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // fsync, rename over the final path, fsync the directory. After commit() no more writes.
  void commit();
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }
  uint64_t bytes_written() const { return written_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  uint64_t written_ = 0;
};

// Writes the whole contents atomically.
void write_file_atomic(const std::string& path, std::string_view contents);

// Reads a whole file; errors name the file and the reason (missing, a directory, unreadable).
std::string read_file(const std::string& path);
std::vector<uint8_t> read_file_bytes(const std::string& path);

// fsync a directory (so a rename or a new entry in it is durable).
void fsync_dir(const std::string& dir);
// fsync every regular file under dir (recursively), then every directory, bottom-up.
void fsync_tree(const std::string& dir);

// Builds a directory in a staging location next to `final_dir`; commit() publishes it with one rename.
// `final_dir` must not exist or be an empty directory (checked at construction and again at commit).
class AtomicDir {
 public:
  explicit AtomicDir(std::string final_dir);
  ~AtomicDir();
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  const std::string& staging() const { return staging_; }
  const std::string& final_dir() const { return final_; }
  // Path of a file inside the staging directory.
  std::string file(const std::string& name) const { return staging_ + "/" + name; }
  void commit();

 private:
  std::string final_, staging_;
  bool committed_ = false;
};

}  // namespace olmosft::io
