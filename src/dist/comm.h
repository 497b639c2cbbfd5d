// Communicator for data-parallel and fully sharded (ZeRO-3 style) training: a small interface with a
// single-process implementation and an OpenMPI one (mpi_comm.cpp), chosen at run time by make_comm().
// Room for NCCL: an NcclComm would implement the same pointer-based collectives on device buffers
// (unique id broadcast over this interface's broadcast(), see docs/dist.md).
//
// Determinism (the point of this layer): sums are NOT delegated to MPI_Allreduce / MPI_Reduce_scatter,
// whose reduction order is implementation-defined and changes with the rank count. reduce_scatter_sum
// exchanges chunks point-to-point (same bytes on the wire as a ring: (N-1)/N of the buffer per rank)
// and every owner adds the N contributions in a fixed pairwise tree over rank index
// (tree_sum below). all_reduce_sum = reduce_scatter_sum + all_gather. Hence:
//   * every rank gets bit-identical results;
//   * for N a power of two, the cross-rank tree is the upper part of the perfect binary tree over
//     "virtual shards" (see PairwiseSum in sharded.h), so sums over 2^k leaves are bit-identical for
//     1, 2, 4, ... ranks.
//
// Failure handling: every collective is posted non-blocking and polled against a deadline
// (timeout_seconds(), env OLMOSFT_DIST_TIMEOUT_S, default 300). A collective that does not finish in
// time (a peer died or hangs) prints one line naming the rank and operation and calls abort(), which
// terminates the whole job (MPI_Abort) with exit code kAbortExitCode. A rank killed by a signal is
// also detected by mpirun itself, which then kills the other ranks.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace olmosft::dist {

constexpr int kAbortExitCode = 86;  // MPI_Abort code used by the watchdog and abort()

// Payload bytes this rank SENT, per kind of collective (for the communication-volume bench).
struct CommStats {
  uint64_t all_reduce = 0, reduce_scatter = 0, all_gather = 0, broadcast = 0;
  uint64_t calls = 0;
  uint64_t total() const { return all_reduce + reduce_scatter + all_gather + broadcast; }
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "single" or "mpi"

  // In-place sum over ranks of n elements (deterministic, bit-identical on every rank).
  virtual void all_reduce_sum(float* data, int64_t n) = 0;
  virtual void all_reduce_sum(double* data, int64_t n) = 0;
  // `in` holds size()*n elements on every rank; `out` (n elements) receives, on rank r, the sum over
  // ranks of in[r*n, (r+1)*n). in and out must not overlap.
  virtual void reduce_scatter_sum(const float* in, float* out, int64_t n) = 0;
  virtual void reduce_scatter_sum(const double* in, double* out, int64_t n) = 0;
  // Every rank contributes `bytes` bytes; out (size()*bytes) receives rank r's block at r*bytes.
  virtual void all_gather_bytes(const void* in, void* out, int64_t bytes) = 0;
  void all_gather(const float* in, float* out, int64_t n) { all_gather_bytes(in, out, n * 4); }
  void all_gather(const double* in, double* out, int64_t n) { all_gather_bytes(in, out, n * 8); }
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Ends the whole job with a non-zero exit code (MPI_Abort; std::_Exit for the single process).
  [[noreturn]] virtual void abort(int code, const std::string& why) = 0;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }
  double timeout_seconds() const { return timeout_s_; }
  void set_timeout_seconds(double s);

  // Convenience: true on every rank iff `ok` is true on every rank (a collective).
  bool all_ok(bool ok);
  // Convenience: rank `root`'s string on every rank (a collective; s is ignored elsewhere).
  std::string broadcast_string(std::string s, int root = 0);

 protected:
  CommStats stats_;
  double timeout_s_ = 300;
};

// Single process: size() == 1, collectives are copies.
std::unique_ptr<Comm> make_single_comm();
// OpenMPI (MPI_COMM_WORLD). Initialises MPI (MPI_THREAD_FUNNELED) if needed and finalises it in the
// destructor when it initialised it; MPI cannot be re-initialised, so create at most one per process.
std::unique_ptr<Comm> make_mpi_comm();
// MPI when launched under mpirun (OMPI_COMM_WORLD_SIZE set in the environment), else single-process.
// The timeout comes from OLMOSFT_DIST_TIMEOUT_S when set (seconds, > 0; validated).
std::unique_ptr<Comm> make_comm();
bool launched_under_mpi();

// Sum of `count` buffers of n elements, bufs[0..count), in the fixed pairwise tree
// t(lo,hi) = t(lo,mid) + t(mid,hi), mid = lo + (hi-lo+1)/2 (perfect binary tree for powers of two).
// out may alias bufs[0] only if that buffer may be overwritten.
void tree_sum(const float* const* bufs, int count, float* out, int64_t n);
void tree_sum(const double* const* bufs, int count, double* out, int64_t n);

// Balanced split of `total` items over `parts`: part p gets [p*total/parts, (p+1)*total/parts).
inline int64_t split_begin(int64_t total, int64_t parts, int64_t p) { return total * p / parts; }

}  // namespace olmosft::dist
