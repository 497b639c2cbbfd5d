// TensorBoard event-file writer for scalar metrics. Records use TFRecord framing (u64 length, masked
// CRC-32C of the length, data, masked CRC-32C of the data); each record is a hand-encoded tensorflow.Event
// protobuf. The first record carries file_version "brain.Event:2". Every event is written with one
// write(2) call (flushed to the OS per step); close() / the destructor fsyncs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace olmosft::io {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78). Hand-written: Debian 12 ships no C/C++ CRC-32C
// library (see docs/io.md). `crc` continues a previous value (0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TFRecord's masked CRC: ((c >> 15) | (c << 17)) + 0xA282EAD8.
uint32_t masked_crc32c(const void* data, size_t n);

// Encoders (exposed for tests).
std::string tb_encode_file_version_event(double wall_time);
std::string tb_encode_scalars_event(double wall_time, int64_t step,
                                    const std::vector<std::pair<std::string, float>>& values);
std::string tfrecord_frame(const std::string& data);

class TensorBoardWriter {
 public:
  // Creates logdir (and parents) if needed and a new file events.out.tfevents.<10-digit unix time>.<host>
  // (".<pid>.<n>" is appended only if that name is taken). `clock` gives each event's wall_time (seconds
  // since the epoch); empty = the system clock. A fixed clock makes the file's bytes deterministic (the
  // TensorBoard fixture of tests/unit/io/io_tb_upstream_test.cpp).
  explicit TensorBoardWriter(const std::string& logdir, std::function<double()> clock = {});
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalar(const std::string& tag, float value, int64_t step);
  // Several scalars in one event (one record) for the same step.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& values);
  void sync();   // fsync the file
  void close();  // fsync and close (idempotent)
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);
  double now() const;
  std::string path_;
  std::function<double()> clock_;
  int fd_ = -1;
};

}  // namespace olmosft::io
