// OpenMPI implementation of Comm. Point-to-point exchanges with a fixed summation order (comm.h) and
// a deadline on every collective (non-blocking requests polled with MPI_Testall).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/comm.h"

namespace olmosft::dist {
namespace {

constexpr int kTag = 7301;

template <typename T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype mpi_type<double>() {
  return MPI_DOUBLE;
}

class MpiComm final : public Comm {
 public:
  MpiComm() {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    OLMO_CHECK(!finalized, "dist: MPI was already finalised in this process; create one Comm per process");
    if (!inited) {
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        fail("dist: MPI_Init_thread failed");
      owns_mpi_ = true;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  void all_reduce_sum(float* d, int64_t n) override { all_reduce_t(d, n); }
  void all_reduce_sum(double* d, int64_t n) override { all_reduce_t(d, n); }
  void reduce_scatter_sum(const float* in, float* out, int64_t n) override {
    stats_.reduce_scatter += rs_t(in, out, n, "reduce_scatter");
  }
  void reduce_scatter_sum(const double* in, double* out, int64_t n) override {
    stats_.reduce_scatter += rs_t(in, out, n, "reduce_scatter");
  }
  void all_gather_bytes(const void* in, void* out, int64_t bytes) override {
    stats_.all_gather += ag_bytes(in, out, bytes, "all_gather");
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    OLMO_CHECK(root >= 0 && root < size_, "dist: broadcast root ", root, " out of range for ", size_,
               " ranks");
    check_count(bytes, "broadcast");
    ++stats_.calls;
    MPI_Request req;
    check(MPI_Ibcast(data, int(bytes), MPI_BYTE, root, comm_, &req), "broadcast");
    wait({req}, "broadcast");
    if (rank_ == root) stats_.broadcast += uint64_t(bytes) * uint64_t(size_ - 1);
  }
  void barrier() override {
    ++stats_.calls;
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "barrier");
    wait({req}, "barrier");
  }
  [[noreturn]] void abort(int code, const std::string& why) override {
    std::fprintf(stderr, "dist: rank %d of %d: aborting the job (code %d): %s\n", rank_, size_, code,
                 why.c_str());
    std::fflush(stderr);
    MPI_Abort(comm_, code == 0 ? 1 : code);
    std::_Exit(code == 0 ? 1 : code);
  }

 private:
  void check(int rc, const char* op) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    abort(kAbortExitCode, std::string(op) + ": MPI error: " + std::string(msg, size_t(len)));
  }
  void check_count(int64_t n, const char* op) {
    OLMO_CHECK(n >= 0 && n <= INT_MAX, "dist: ", op, ": ", n, " elements exceed one MPI message (2^31-1); ",
               "split the buffer");
  }
  // Polls until every request completes; past the deadline the job is aborted (a peer died or hangs).
  void wait(std::vector<MPI_Request> reqs, const char* op) {
    if (reqs.empty()) return;
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    for (int spin = 0;; ++spin) {
      int flag = 0;
      check(MPI_Testall(int(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), op);
      if (flag) return;
      // Spin briefly (latency), then back off so an idle rank does not burn a shared core.
      if (spin > 2000) std::this_thread::sleep_for(std::chrono::microseconds(spin > 20000 ? 500 : 20));
      if ((spin & 63) == 0) {
        const double el = std::chrono::duration<double>(clock::now() - t0).count();
        if (el > timeout_s_) {
          char buf[256];
          std::snprintf(
              buf, sizeof buf,
              "collective '%s' did not complete within %.1f s (OLMOSFT_DIST_TIMEOUT_S); a peer rank "
              "died or hangs",
              op, timeout_s_);
          abort(kAbortExitCode, buf);
        }
      }
    }
  }
  template <typename T>
  uint64_t rs_t(const T* in, T* out, int64_t n, const char* op) {
    check_count(n, op);
    ++stats_.calls;
    const int N = size_, me = rank_;
    std::vector<T> recv(static_cast<size_t>(n) * size_t(N > 1 ? N - 1 : 0));
    std::vector<const T*> parts(static_cast<size_t>(N));
    std::vector<MPI_Request> reqs;
    reqs.reserve(size_t(2 * N));
    for (int q = 0, slot = 0; q < N; ++q) {
      if (q == me) {
        parts[size_t(q)] = in + int64_t(me) * n;
        continue;
      }
      T* dst = recv.data() + size_t(slot++) * size_t(n);
      parts[size_t(q)] = dst;
      reqs.emplace_back();
      check(MPI_Irecv(dst, int(n), mpi_type<T>(), q, kTag, comm_, &reqs.back()), op);
    }
    for (int q = 0; q < N; ++q) {
      if (q == me) continue;
      reqs.emplace_back();
      check(MPI_Isend(in + int64_t(q) * n, int(n), mpi_type<T>(), q, kTag, comm_, &reqs.back()), op);
    }
    wait(std::move(reqs), op);
    tree_sum(parts.data(), N, out, n);
    return uint64_t(N - 1) * uint64_t(n) * sizeof(T);
  }
  uint64_t ag_bytes(const void* in, void* out, int64_t bytes, const char* op) {
    check_count(bytes, op);
    ++stats_.calls;
    const int N = size_, me = rank_;
    char* o = static_cast<char*>(out);
    if (o + int64_t(me) * bytes != in) std::memmove(o + int64_t(me) * bytes, in, size_t(bytes));
    std::vector<MPI_Request> reqs;
    reqs.reserve(size_t(2 * N));
    for (int q = 0; q < N; ++q) {
      if (q == me) continue;
      reqs.emplace_back();
      check(MPI_Irecv(o + int64_t(q) * bytes, int(bytes), MPI_BYTE, q, kTag + 1, comm_, &reqs.back()), op);
    }
    for (int q = 0; q < N; ++q) {
      if (q == me) continue;
      reqs.emplace_back();
      check(MPI_Isend(o + int64_t(me) * bytes, int(bytes), MPI_BYTE, q, kTag + 1, comm_, &reqs.back()), op);
    }
    wait(std::move(reqs), op);
    return uint64_t(N - 1) * uint64_t(bytes);
  }
  // all-reduce = deterministic reduce-scatter over equal chunks (padded) + all-gather.
  template <typename T>
  void all_reduce_t(T* d, int64_t n) {
    const int N = size_;
    const int64_t chunk = (n + N - 1) / N;
    std::vector<T> in(static_cast<size_t>(chunk * N), T(0)), out(size_t(chunk * N));
    std::memcpy(in.data(), d, size_t(n) * sizeof(T));
    const uint64_t s1 = rs_t(in.data(), out.data() + int64_t(rank_) * chunk, chunk, "all_reduce");
    const uint64_t s2 =
        ag_bytes(out.data() + int64_t(rank_) * chunk, out.data(), chunk * int64_t(sizeof(T)), "all_reduce");
    stats_.all_reduce += s1 + s2;
    std::memcpy(d, out.data(), size_t(n) * sizeof(T));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  bool owns_mpi_ = false;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm() { return std::make_unique<MpiComm>(); }

}  // namespace olmosft::dist
