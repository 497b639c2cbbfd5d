#include "dist/comm.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"

namespace olmosft::dist {

void Comm::set_timeout_seconds(double s) {
  OLMO_CHECK(std::isfinite(s) && s > 0, "dist: collective timeout must be a positive number of seconds, got ",
             s);
  timeout_s_ = s;
}

std::string Comm::broadcast_string(std::string s, int root) {
  int64_t n = static_cast<int64_t>(s.size());
  broadcast(&n, 8, root);
  s.resize(static_cast<size_t>(n));
  if (n > 0) broadcast(s.data(), n, root);
  return s;
}

bool Comm::all_ok(bool ok) {
  double v = ok ? 0.0 : 1.0;
  all_reduce_sum(&v, 1);
  return v == 0.0;
}

namespace {

template <typename T>
void tree_rec(const T* const* bufs, int lo, int hi, T* out, int64_t n) {
  if (hi - lo == 1) {
    if (out != bufs[lo]) std::memcpy(out, bufs[lo], size_t(n) * sizeof(T));
    return;
  }
  const int mid = lo + (hi - lo + 1) / 2;
  if (hi - mid == 1) {
    tree_rec(bufs, lo, mid, out, n);
    const T* r = bufs[mid];
    for (int64_t i = 0; i < n; ++i) out[i] = out[i] + r[i];
    return;
  }
  std::vector<T> right(static_cast<size_t>(n));
  tree_rec(bufs, mid, hi, right.data(), n);
  tree_rec(bufs, lo, mid, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = out[i] + right[size_t(i)];
}

class SingleComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single"; }
  void all_reduce_sum(float*, int64_t) override { ++stats_.calls; }
  void all_reduce_sum(double*, int64_t) override { ++stats_.calls; }
  void reduce_scatter_sum(const float* in, float* out, int64_t n) override { copy(in, out, n * 4); }
  void reduce_scatter_sum(const double* in, double* out, int64_t n) override { copy(in, out, n * 8); }
  void all_gather_bytes(const void* in, void* out, int64_t bytes) override { copy(in, out, bytes); }
  void broadcast(void*, int64_t, int root) override {
    OLMO_CHECK(root == 0, "dist: broadcast root ", root, " out of range for 1 rank");
    ++stats_.calls;
  }
  void barrier() override {}
  [[noreturn]] void abort(int code, const std::string& why) override {
    std::fprintf(stderr, "dist: abort (code %d): %s\n", code, why.c_str());
    std::fflush(stderr);
    std::_Exit(code == 0 ? 1 : code);
  }

 private:
  void copy(const void* in, void* out, int64_t bytes) {
    ++stats_.calls;
    if (in != out && bytes > 0) std::memmove(out, in, size_t(bytes));
  }
};

}  // namespace

void tree_sum(const float* const* bufs, int count, float* out, int64_t n) {
  OLMO_CHECK(count >= 1, "tree_sum: need at least one buffer");
  tree_rec(bufs, 0, count, out, n);
}
void tree_sum(const double* const* bufs, int count, double* out, int64_t n) {
  OLMO_CHECK(count >= 1, "tree_sum: need at least one buffer");
  tree_rec(bufs, 0, count, out, n);
}

std::unique_ptr<Comm> make_single_comm() { return std::make_unique<SingleComm>(); }

bool launched_under_mpi() {
  const char* s = std::getenv("OMPI_COMM_WORLD_SIZE");
  return s != nullptr && *s != '\0';
}

std::unique_ptr<Comm> make_comm() {
  std::unique_ptr<Comm> c = launched_under_mpi() ? make_mpi_comm() : make_single_comm();
  if (const char* t = std::getenv("OLMOSFT_DIST_TIMEOUT_S"); t && *t) {
    char* end = nullptr;
    const double v = std::strtod(t, &end);
    OLMO_CHECK(end && *end == '\0' && std::isfinite(v) && v > 0,
               "environment OLMOSFT_DIST_TIMEOUT_S: expected a positive number of seconds, got '", t, "'");
    c->set_timeout_seconds(v);
  }
  return c;
}

}  // namespace olmosft::dist
