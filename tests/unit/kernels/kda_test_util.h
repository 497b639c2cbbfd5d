// Shared helpers for the KDA kernel tests (random inputs, error measures, finite differences).
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels/gradcheck.h"
#include "kernels/kda.h"

namespace kdatest {

template <typename T>
std::vector<T> randn(size_t n, uint64_t seed, double sd = 1.0, double mean = 0.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(mean, sd);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

template <typename T>
std::vector<T> uniform(size_t n, uint64_t seed, double lo, double hi) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

// max |a - b| / max(max |b|, tiny): an error relative to the tensor's scale.
template <typename A, typename B>
double rel_err(const std::vector<A>& a, const std::vector<B>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / std::max(den, 1e-30);
}

template <typename T>
bool all_finite(const std::vector<T>& v) {
  return std::all_of(v.begin(), v.end(), [](T x) { return std::isfinite(x); });
}

template <typename T>
double dot(const std::vector<T>& a, const std::vector<T>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

// Central finite differences of loss() w.r.t. every entry of p (perturbed in place and restored);
// returns max |fd - analytic| / max(max |analytic|, 1e-8).
inline double fd_check(std::vector<double>& p, const std::function<double()>& loss,
                       const std::vector<double>& analytic, double h = 1e-6) {
  return olmosft::fd_max_rel_err(loss, p.data(), static_cast<int64_t>(p.size()), analytic.data(), h, 1e-8);
}

// A realistic KDA input set: q, k L2-normalised, g from the gate with A_log ~ log U[1,16], beta in (0,2).
template <typename T>
struct KdaInputs {
  olmosft::kda::KdaDims d;
  std::vector<T> q, k, v, g, beta;
  std::vector<int32_t> seg;
  KdaInputs(olmosft::kda::KdaDims d_, std::vector<int32_t> seg_, uint64_t seed)
      : d(d_), seg(std::move(seg_)) {
    using namespace olmosft::kda;
    const size_t NH = size_t(d.B * d.L * d.H);
    auto qr = randn<T>(NH * d.K, seed + 1), kr = randn<T>(NH * d.K, seed + 2);
    q.resize(qr.size());
    k.resize(kr.size());
    l2norm_forward(qr.data(), int64_t(NH), d.K, T(kL2NormEps), q.data());
    l2norm_forward(kr.data(), int64_t(NH), d.K, T(kL2NormEps), k.data());
    v = randn<T>(NH * d.V, seed + 3);
    auto f = randn<T>(NH * d.K, seed + 4);
    std::vector<T> A_log(size_t(d.H)), dtb(size_t(d.H * d.K), T(0));
    auto u = uniform<double>(size_t(d.H), seed + 5, 1.0, 16.0);
    for (int64_t h = 0; h < d.H; ++h) A_log[h] = T(std::log(u[h]));
    g.resize(NH * d.K);
    kda_gate_forward(f.data(), A_log.data(), dtb.data(), int64_t(d.B * d.L), d.H, d.K, g.data());
    auto b = randn<T>(NH, seed + 6);
    beta.resize(NH);
    kda_beta_forward(b.data(), int64_t(NH), true, beta.data());
  }
};

// The six outputs of a KDA forward + backward.
template <typename T>
struct Outs {
  std::vector<T> o, dq, dk, dv, dg, db;
};

// Forward then backward, chunked (chunk size `chunk`) or the recurrent reference; every output starts as a
// sentinel (-7) so an entry left unwritten shows.
// saved_vn: the chunked forward hands its pseudo-values to the backward (kda.h), as the model runs it;
// otherwise the backward recomputes them.
template <typename T>
Outs<T> run_kda(const KdaInputs<T>& in, const std::vector<T>& dout, bool chunked, int64_t chunk,
                bool saved_vn = false) {
  const auto& d = in.d;
  const size_t NH = size_t(d.B * d.L * d.H);
  Outs<T> r;
  r.o.assign(NH * d.V, T(-7));  // sentinel: every entry must be written
  r.dq.assign(NH * d.K, T(-7));
  r.dk.assign(NH * d.K, T(-7));
  r.dg.assign(NH * d.K, T(-7));
  r.dv.assign(NH * d.V, T(-7));
  r.db.assign(NH, T(-7));
  const T scale = T(1) / std::sqrt(T(d.K));
  const int32_t* seg = in.seg.empty() ? nullptr : in.seg.data();
  if (chunked) {
    std::vector<T> vn(saved_vn ? NH * d.V : 0, T(-7));
    T* vnp = saved_vn ? vn.data() : nullptr;
    olmosft::kda::kda_chunk_forward(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), seg,
                                    d, scale, r.o.data(), chunk, vnp);
    olmosft::kda::kda_chunk_backward(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), seg,
                                     d, scale, dout.data(), r.dq.data(), r.dk.data(), r.dv.data(),
                                     r.dg.data(), r.db.data(), chunk, vnp);
  } else {
    olmosft::kda::kda_recurrent_forward(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                                        seg, d, scale, r.o.data());
    olmosft::kda::kda_recurrent_backward(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                                         seg, d, scale, dout.data(), r.dq.data(), r.dk.data(), r.dv.data(),
                                         r.dg.data(), r.db.data(), 16);
  }
  return r;
}

}  // namespace kdatest
