#include "dist/sharded.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/threads.h"

namespace olmosft::dist {

const char* mode_name(ShardMode m) { return m == ShardMode::Sharded ? "zero3" : "dp"; }

ShardMode parse_mode(const std::string& s) {
  if (s == "dp" || s == "replicated") return ShardMode::Replicated;
  if (s == "zero3" || s == "sharded") return ShardMode::Sharded;
  fail("dist: unknown parallel mode '", s, "'; expected dp | replicated | zero3 | sharded");
}

int64_t leaf_of(ShardMode mode, int64_t leaves, int size, int rank, int64_t m) {
  OLMO_CHECK(size >= 1 && rank >= 0 && rank < size && leaves % size == 0 && m >= 0 && m < leaves / size,
             "dist: leaf ", m, " of rank ", rank, " of ", size, " with ", leaves,
             " leaves per step is out of range");
  return mode == ShardMode::Sharded ? m * size + rank : int64_t(rank) * (leaves / size) + m;
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------- PairwiseSum
std::vector<float> PairwiseSum::take() {
  if (pool_.empty()) return std::vector<float>(static_cast<size_t>(n_));
  std::vector<float> v = std::move(pool_.back());
  pool_.pop_back();
  return v;
}

void PairwiseSum::push(const float* leaf) {
  std::vector<float> cur = take();
  std::memcpy(cur.data(), leaf, static_cast<size_t>(n_) * 4);
  int64_t cnt = 1;
  while (!stack_.empty() && stack_.back().first == cnt) {
    const std::vector<float>& left = stack_.back().second;
    for (int64_t i = 0; i < n_; ++i) cur[size_t(i)] = left[size_t(i)] + cur[size_t(i)];
    cnt *= 2;
    pool_.push_back(std::move(stack_.back().second));
    stack_.pop_back();
  }
  stack_.emplace_back(cnt, std::move(cur));
  ++pushed_;
}

void PairwiseSum::finish(float* out) {
  if (stack_.empty()) {
    std::fill(out, out + n_, 0.0f);
  } else {
    std::vector<float> cur = std::move(stack_.back().second);
    for (size_t k = stack_.size() - 1; k-- > 0;) {
      const std::vector<float>& left = stack_[k].second;
      for (int64_t i = 0; i < n_; ++i) cur[size_t(i)] = left[size_t(i)] + cur[size_t(i)];
    }
    std::memcpy(out, cur.data(), size_t(n_) * 4);
    pool_.push_back(std::move(cur));
    for (size_t k = 0; k + 1 < stack_.size(); ++k) pool_.push_back(std::move(stack_[k].second));
  }
  stack_.clear();
  pushed_ = 0;
}

// ---------------------------------------------------------------- ShardedParams
namespace {
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// A run of elements owned by this rank that belongs to one tensor.
struct Segment {
  int unit;
  int tensor;
  int64_t local;    // index into the unit's owned buffers
  int64_t logical;  // element index in the checkpoint layout
  int64_t n;
};
}  // namespace

ShardedParams::ShardedParams(Comm& comm, std::vector<TensorSpec> specs, ShardMode mode)
    : comm_(comm), specs_(std::move(specs)), mode_(mode) {
  OLMO_CHECK(!specs_.empty(), "ShardedParams: no tensors");
  std::set<std::string> names;
  int max_unit = -1;
  for (const auto& s : specs_) {
    OLMO_CHECK(!s.name.empty(), "ShardedParams: a tensor has an empty name");
    OLMO_CHECK(names.insert(s.name).second, "ShardedParams: duplicate tensor name '", s.name, "'");
    OLMO_CHECK(s.unit >= 0, "ShardedParams: tensor '", s.name, "' has negative unit ", s.unit);
    for (int64_t d : s.shape)
      OLMO_CHECK(d > 0, "ShardedParams: tensor '", s.name, "' has a non-positive dim");
    max_unit = std::max(max_unit, s.unit);
  }
  units_.resize(size_t(max_unit + 1));
  toff_.resize(specs_.size());
  for (size_t t = 0; t < specs_.size(); ++t) {
    Unit& U = units_[size_t(specs_[t].unit)];
    toff_[t] = U.numel;
    U.numel += specs_[t].numel();
  }
  const int64_t N = comm_.size();
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& U = units_[u];
    OLMO_CHECK(U.numel > 0, "ShardedParams: unit ", u, " has no tensors (units must be numbered 0..U-1)");
    if (mode_ == ShardMode::Sharded) {
      U.padded = round_up(U.numel, N * kAlign);
      U.shard = U.padded / N;
    } else {
      U.padded = round_up(U.numel, kAlign);
      U.shard = U.padded;
    }
    U.p.assign(size_t(U.shard), 0.0f);
    U.g.assign(size_t(U.shard), 0.0f);
    U.m.assign(size_t(U.shard), 0.0f);
    U.v.assign(size_t(U.shard), 0.0f);
  }
}

int ShardedParams::tensor_index(const std::string& name) const {
  for (size_t t = 0; t < specs_.size(); ++t)
    if (specs_[t].name == name) return int(t);
  fail("ShardedParams: unknown tensor '", name, "'");
}

int64_t ShardedParams::owned_begin(const Unit& U) const {
  return mode_ == ShardMode::Sharded ? int64_t(comm_.rank()) * U.shard : 0;
}

void ShardedParams::set_param(int t, const float* full) {
  OLMO_CHECK(t >= 0 && size_t(t) < specs_.size(), "ShardedParams::set_param: tensor ", t, " out of range");
  Unit& U = units_[size_t(specs_[size_t(t)].unit)];
  const int64_t ob = owned_begin(U), b = toff_[size_t(t)], e = b + specs_[size_t(t)].numel();
  for (int64_t i = std::max(ob, b); i < std::min(ob + U.shard, e); ++i) U.p[size_t(i - ob)] = full[i - b];
}

void ShardedParams::reset_optimizer() {
  for (auto& U : units_) {
    std::fill(U.m.begin(), U.m.end(), 0.0f);
    std::fill(U.v.begin(), U.v.end(), 0.0f);
    std::fill(U.g.begin(), U.g.end(), 0.0f);
  }
  adam_step_ = 0;
}

void ShardedParams::track_transient() {
  int64_t t = 0;
  for (const auto& U : units_) t += int64_t(U.gathered.size() + U.full_grad.size()) * 4;
  transient_ = t;
  peak_transient_ = std::max(peak_transient_, t);
}

float* ShardedParams::gather(int u) {
  OLMO_CHECK(u >= 0 && u < units(), "ShardedParams::gather: unit ", u, " out of range");
  Unit& U = units_[size_t(u)];
  if (mode_ == ShardMode::Replicated) return U.p.data();
  if (!U.is_gathered) {
    U.gathered.resize(size_t(U.padded));
    comm_.all_gather(U.p.data(), U.gathered.data(), U.shard);
    U.is_gathered = true;
    track_transient();
  }
  return U.gathered.data();
}

void ShardedParams::release(int u) {
  OLMO_CHECK(u >= 0 && u < units(), "ShardedParams::release: unit ", u, " out of range");
  Unit& U = units_[size_t(u)];
  if (mode_ == ShardMode::Replicated) return;
  std::vector<float>().swap(U.gathered);
  U.is_gathered = false;
  track_transient();
}

const float* ShardedParams::param(int t) const {
  const Unit& U = units_[size_t(specs_[size_t(t)].unit)];
  if (mode_ == ShardMode::Replicated) return U.p.data() + toff_[size_t(t)];
  OLMO_CHECK(U.is_gathered, "ShardedParams::param: unit ", specs_[size_t(t)].unit, " of tensor '",
             specs_[size_t(t)].name, "' is not gathered");
  return U.gathered.data() + toff_[size_t(t)];
}

float* ShardedParams::grad_buffer(int u) {
  OLMO_CHECK(u >= 0 && u < units(), "ShardedParams::grad_buffer: unit ", u, " out of range");
  Unit& U = units_[size_t(u)];
  if (U.full_grad.empty()) {
    if (U.spare.size() == size_t(U.padded)) {
      U.full_grad.swap(U.spare);
      std::fill(U.full_grad.begin(), U.full_grad.end(), 0.0f);
    } else {
      U.full_grad.assign(size_t(U.padded), 0.0f);
    }
    track_transient();
  }
  return U.full_grad.data();
}

void ShardedParams::reduce_grads(int u) {
  Unit& U = units_[size_t(u)];
  grad_buffer(u);
  if (mode_ == ShardMode::Replicated) {
    comm_.all_reduce_sum(U.full_grad.data(), U.padded);
    U.g.swap(U.full_grad);
    if (U.full_grad.size() == size_t(U.padded)) U.spare.swap(U.full_grad);  // reused next step
  } else {
    U.g.resize(size_t(U.shard));
    comm_.reduce_scatter_sum(U.full_grad.data(), U.g.data(), U.shard);
  }
  std::vector<float>().swap(U.full_grad);
  track_transient();
}

double ShardedParams::grad_norm() {
  // Partial sums of squares over a fixed grid of kAlign-element chunks of each unit's flat buffer
  // (a chunk never straddles two ranks because shards are multiples of kAlign), gathered and summed
  // in global chunk order: the same sequence of doubles (up to trailing +0.0 of padding) for any N.
  int64_t per_rank = 0;
  for (const auto& U : units_) per_rank += U.shard / kAlign;
  std::vector<double> mine(static_cast<size_t>(per_rank));
  std::vector<int64_t> chunks, first;  // per unit: its chunk count, and its first chunk's index in `mine`
  for (const auto& U : units_) {
    first.push_back(chunks.empty() ? 0 : first.back() + chunks.back());
    chunks.push_back(U.shard / kAlign);
  }
  parallel_for_ranges(
      chunks,
      [&](size_t u, int64_t c0, int64_t c1) {
        const float* g = units_[u].g.data();
        for (int64_t c = c0; c < c1; ++c) mine[size_t(first[u] + c)] = sum_of_squares(g + c * kAlign, kAlign);
      },
      64);
  const int N = mode_ == ShardMode::Sharded ? comm_.size() : 1;
  std::vector<double> all(static_cast<size_t>(per_rank) * size_t(N));
  if (N > 1)
    comm_.all_gather(mine.data(), all.data(), per_rank);
  else
    all = mine;
  double total = 0;
  int64_t uoff = 0;
  for (const auto& U : units_) {
    const int64_t cu = U.shard / kAlign;
    for (int p = 0; p < N; ++p)
      for (int64_t c = 0; c < cu; ++c) total += all[size_t(int64_t(p) * per_rank + uoff + c)];
    uoff += cu;
  }
  return std::sqrt(total);
}

double ShardedParams::clip_and_step(const AdamWConfig& cfg, double max_norm, int64_t step) {
  return clip_and_step(cfg, max_norm, step, grad_norm());
}

double ShardedParams::clip_and_step(const AdamWConfig& cfg, double max_norm, int64_t step, double norm) {
  OLMO_CHECK(std::isfinite(norm), "dist: the global gradient norm is not finite (", norm, ")");
  // The clip is applied as AdamW reads each gradient (adamw_step's grad_scale: the bits of scaling the
  // gradients in place first, one pass over them fewer).
  const float coef = float(clip_coefficient(norm, max_norm));
  std::vector<AdamWParam<float>> segs;
  for (const OwnedRange& r : owned_ranges())
    segs.push_back({r.p, r.g, r.m, r.v, r.n, specs_[size_t(r.tensor)].decay});
  adamw_step(segs, cfg, step, coef);
  adam_step_ = step;
  return norm;
}

std::vector<float> ShardedParams::full_param(int t) { return full_of(t, &Unit::p); }

std::vector<float> ShardedParams::full_moment(int t, int which) {
  return full_of(t, which == 0 ? &Unit::m : &Unit::v);
}

std::vector<float> ShardedParams::full_of(int t, std::vector<float> Unit::*field) {
  Unit& U = units_[size_t(specs_[size_t(t)].unit)];
  const std::vector<float>& src = U.*field;
  std::vector<float> full(static_cast<size_t>(U.padded));
  if (mode_ == ShardMode::Sharded)
    comm_.all_gather(src.data(), full.data(), U.shard);
  else
    full = src;
  return {full.begin() + toff_[size_t(t)], full.begin() + toff_[size_t(t)] + specs_[size_t(t)].numel()};
}

std::vector<ShardedParams::OwnedRange> ShardedParams::owned_ranges() {
  std::vector<OwnedRange> out;
  for (size_t t = 0; t < specs_.size(); ++t) {
    Unit& U = units_[size_t(specs_[t].unit)];
    const int64_t ob = owned_begin(U), b = toff_[t], e = b + specs_[t].numel();
    const int64_t lo = std::max(ob, b), hi = std::min(ob + U.shard, e);
    if (lo >= hi) continue;
    const size_t l = size_t(lo - ob);
    out.push_back({int(t), lo - b, hi - lo, U.p.data() + l, U.g.data() + l, U.m.data() + l, U.v.data() + l});
  }
  return out;
}

MemoryStats ShardedParams::memory() const {
  MemoryStats s;
  int64_t real = 0;
  for (size_t t = 0; t < specs_.size(); ++t) {
    const Unit& U = units_[size_t(specs_[t].unit)];
    const int64_t ob = owned_begin(U), b = toff_[t], e = b + specs_[t].numel();
    real += std::max<int64_t>(0, std::min(ob + U.shard, e) - std::max(ob, b));
  }
  int64_t owned = 0;
  for (const auto& U : units_) owned += U.shard;
  s.persistent_bytes = 4 * owned * 4;  // p, g, m, v
  s.peak_transient_bytes = peak_transient_;
  s.padding_elements = owned - real;
  return s;
}

}  // namespace olmosft::dist
