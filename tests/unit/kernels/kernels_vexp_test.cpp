// The vectorised exp (kernels/vexp.h): its accuracy against exp in double, in ulps of the float result, over
// the whole float range (strided over all 2^32 bit patterns, dense in the subnormal and overflow regions;
// OLMOSFT_VEXP_EXHAUSTIVE=1 sweeps all of them), the special values (-inf from masked logits, +inf, NaN),
// and that every path (scalar, AVX2, AVX-512; each forced with vexp_set_path) gives the same bits, for
// elements and for the row reductions, independently of an element's position in the row.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/vexp.h"

using namespace olmosft;

namespace {

struct PathGuard {
  VexpPath saved;
  explicit PathGuard(VexpPath p) : saved(vexp_set_path(p)) {}
  ~PathGuard() { vexp_set_path(saved); }
};

std::vector<VexpPath> vector_paths() {  // the polynomial paths this CPU runs
  std::vector<VexpPath> out;
  for (VexpPath p : {VexpPath::kScalar, VexpPath::kAvx2, VexpPath::kAvx512})
    if (vexp_path_supported(p)) out.push_back(p);
  return out;
}

// |y - exp(x)| in units of the last place of the float nearest exp(x) (2^-149 below the normal range).
double ulp_error(float x, float y) {
  const double e = std::exp(double(x));
  if (std::isnan(x)) return std::isnan(y) ? 0 : 1e9;
  if (e > double(std::numeric_limits<float>::max())) {  // overflows when rounded (or nearly): must be inf
    const double top = std::ldexp(1.0, 128) * (1 - std::ldexp(1.0, -25));
    if (e >= top) return std::isinf(y) ? 0 : 1e9;
  }
  if (std::isinf(y)) return 1e9;
  int ex;
  std::frexp(e, &ex);  // e in [2^(ex-1), 2^ex)
  const double ulp = std::ldexp(1.0, std::max(ex - 1, -126) - 23);
  return std::abs(double(y) - e) / ulp;
}

struct Sweep {
  double max_ulp = 0, max_ulp_sub = 0;  // normal (and 0 / inf) results; results below 2^-126
  float worst = 0, worst_sub = 0;
  uint64_t count = 0;
};

// Evaluates exp on the bit patterns [b0, b1) with the given stride, in blocks.
void sweep(uint64_t b0, uint64_t b1, uint64_t stride, Sweep& s) {
  std::vector<float> x, y;
  x.reserve(4096);
  auto flush = [&] {
    y.resize(x.size());
    vexp(x.data(), y.data(), int64_t(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const double u = ulp_error(x[i], y[i]);
      const bool sub = std::exp(double(x[i])) < 0x1p-126;
      double& m = sub ? s.max_ulp_sub : s.max_ulp;
      if (u > m) {
        m = u;
        (sub ? s.worst_sub : s.worst) = x[i];
      }
    }
    s.count += x.size();
    x.clear();
  };
  for (uint64_t b = b0; b < b1; b += stride) {
    x.push_back(std::bit_cast<float>(uint32_t(b)));
    if (x.size() == 4096) flush();
  }
  flush();
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

}  // namespace

// Accuracy. Normal results, bound 0.9 ulp: the final fma rounds once (0.5 ulp); r = x - n ln2 is rounded to
// float (2^-26 absolute at |r| -> ln2/2, 0.18 ulp of p there, where p -> sqrt 2 has the coarse ulp 2^-23);
// the inner Horner value rounds (0.17 ulp after the multiplication by r); the polynomial's relative error
// is 3.8e-9 (0.03-0.06 ulp); the scaling by 2^n is exact.
// Subnormal results (x < -87.34), bound 1 ulp: p is rounded to float (<= 0.6 ulp of p) and then once more
// to the subnormal grid (0.5 ulp); p's error counts in full only just below 2^-126, where the grid is
// nearly as fine as p's. Measured on all 2^32 inputs: see docs/kernels.md "Vectorised exp".
TEST(KernelsVexp, AccuracyInUlps) {
  const bool all = std::getenv("OLMOSFT_VEXP_EXHAUSTIVE") != nullptr;
  Sweep s;
  sweep(0, uint64_t(1) << 32, all ? 1 : 251, s);  // every sign, exponent and mantissa region
  // Dense: arguments whose results are subnormal or round to 0 ([-104, -87.3]), and near overflow.
  sweep(bits(-87.3f), bits(-104.0f) + 1, 1, s);
  sweep(bits(88.0f), bits(89.0f) + 1, 1, s);
  sweep(0, bits(1.0f), 97, s);                 // (0, 1]
  sweep(bits(-0.0f), bits(-1.0f) + 1, 97, s);  // [-1, -0]
  std::printf(
      "[measured] vexp (%s): %llu inputs; normal results max %.3f ulp at x = %a, subnormal results "
      "max %.3f ulp at x = %a\n",
      vexp_path_name(vexp_path()), (unsigned long long)s.count, s.max_ulp, double(s.worst), s.max_ulp_sub,
      double(s.worst_sub));
  EXPECT_LT(s.max_ulp, 0.9) << "at x = " << s.worst;
  EXPECT_LT(s.max_ulp_sub, 1.0) << "at x = " << s.worst_sub;
}

TEST(KernelsVexp, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  for (VexpPath p : vector_paths()) {
    PathGuard g(p);
    const std::vector<float> x = {-inf,    inf,      std::nanf(""), 0.0f,   -0.0f,  -1e30f, 1e30f,
                                  -104.0f, -103.97f, -87.33f,       88.72f, 88.73f, 1.0f,   -1.0f};
    std::vector<float> y(x.size());
    vexp(x.data(), y.data(), int64_t(x.size()));
    EXPECT_EQ(y[0], 0.0f) << vexp_path_name(p);
    EXPECT_FALSE(std::signbit(y[0]));
    EXPECT_EQ(y[1], inf);
    EXPECT_TRUE(std::isnan(y[2]));
    EXPECT_EQ(y[3], 1.0f);
    EXPECT_EQ(y[4], 1.0f);
    EXPECT_EQ(y[5], 0.0f);
    EXPECT_EQ(y[6], inf);
    EXPECT_EQ(y[7], 0.0f);      // exp(-104) = 6.8e-46 < 2^-150: rounds to 0
    EXPECT_GT(y[8], 0.0f);      // exp(-103.97) = 7.0e-46 rounds up to 2^-149
    EXPECT_GT(y[10], 3.3e38f);  // just below FLT_MAX
    EXPECT_EQ(y[11], inf);
    EXPECT_EQ(y[12], float(std::exp(1.0)));
    EXPECT_EQ(y[13], float(std::exp(-1.0)));
    // vexp1 is the same lane formula.
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(x[i])) continue;
      EXPECT_EQ(bits(vexp1(x[i])), bits(y[i])) << x[i];
    }
  }
}

// Every path gives the same bits: elements (through vexp, at every offset in a block of 16), the reductions
// (stored exps, float and double sums, scaled exps, max) on rows of every tail length, with -inf entries
// (masked logits) and values below the underflow threshold.
TEST(KernelsVexp, PathsAgreeBitwise) {
  const auto paths = vector_paths();
  ASSERT_FALSE(paths.empty());
  std::printf("[measured] paths on this CPU:");
  for (VexpPath p : paths) std::printf(" %s", vexp_path_name(p));
  std::printf(" (in use: %s)\n", vexp_path_name(vexp_path()));
  Rng rng{11, 2};
  std::vector<float> row(5000);
  for (size_t i = 0; i < row.size(); ++i) {
    row[i] = float(8.0 * rng.normal(i));
    if (i % 13 == 5) row[i] = -std::numeric_limits<float>::infinity();
    if (i % 29 == 7) row[i] = -120.0f + float(i % 7);
  }
  struct Out {
    std::vector<float> stored, scaled;
    std::vector<float> sums, maxes;
    std::vector<double> sums64;
  };
  auto run_all = [&](VexpPath p) {
    PathGuard g(p);
    Out o;
    for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 4096, 4099}) {
      for (int64_t off : {0, 3}) {
        std::vector<float> a(row.begin() + off, row.begin() + off + n), b = a;
        const float sub = 2.5f;
        o.maxes.push_back(vmax(a.data(), n));
        o.sums64.push_back(vexp_sub_sum_f64(a.data(), n, sub));
        o.sums.push_back(vexp_sub_sum(a.data(), n, sub));
        vexp_sub_scale(b.data(), n, sub, 0.37f);
        o.stored.insert(o.stored.end(), a.begin(), a.end());
        o.scaled.insert(o.scaled.end(), b.begin(), b.end());
      }
    }
    return o;
  };
  const Out ref = run_all(paths[0]);
  for (VexpPath p : paths) {
    const Out o = run_all(p);
    ASSERT_EQ(o.stored.size(), ref.stored.size());
    for (size_t i = 0; i < ref.stored.size(); ++i) {
      ASSERT_EQ(bits(o.stored[i]), bits(ref.stored[i])) << vexp_path_name(p) << " element " << i;
      ASSERT_EQ(bits(o.scaled[i]), bits(ref.scaled[i])) << vexp_path_name(p) << " element " << i;
    }
    for (size_t i = 0; i < ref.sums.size(); ++i) {
      EXPECT_EQ(bits(o.sums[i]), bits(ref.sums[i])) << vexp_path_name(p) << " row " << i;
      EXPECT_EQ(std::bit_cast<uint64_t>(o.sums64[i]), std::bit_cast<uint64_t>(ref.sums64[i]))
          << vexp_path_name(p) << " row " << i;
      EXPECT_EQ(bits(o.maxes[i]), bits(ref.maxes[i])) << vexp_path_name(p) << " row " << i;
    }
  }
  // A stored exp is the lane formula of its element, wherever the element sits in the row.
  PathGuard g(paths.back());
  std::vector<float> a(row.begin(), row.begin() + 37);
  vexp_sub_sum(a.data(), 37, -1.25f);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(bits(a[i]), bits(vexp1(row[i] + 1.25f))) << i;
}

// The reductions against double arithmetic, and the libm path against std::exp.
TEST(KernelsVexp, ReductionsAndLibmPath) {
  Rng rng{5, 9};
  std::vector<float> row(4099);
  for (size_t i = 0; i < row.size(); ++i) row[i] = float(3.0 * rng.normal(i));
  double ref = 0, mx = -1e300;
  for (float v : row) {
    ref += std::exp(double(v) - 1.0);
    mx = std::max(mx, double(v));
  }
  for (VexpPath p : {VexpPath::kLibm, vexp_path()}) {
    PathGuard g(p);
    std::vector<float> a = row;
    // Each term within 0.6 ulp (relative 2^-24 * 1.2); a float sum of 4099 terms in 16 lanes (~256 each).
    EXPECT_NEAR(vexp_sub_sum_f64(a.data(), int64_t(a.size()), 1.0f) / ref, 1.0, 1e-7) << vexp_path_name(p);
    EXPECT_NEAR(vexp_sub_sum(a.data(), int64_t(a.size()), 1.0f) / ref, 1.0, 3e-5) << vexp_path_name(p);
    EXPECT_EQ(double(vmax(row.data(), int64_t(row.size()))), mx);
  }
  PathGuard g(VexpPath::kLibm);
  std::vector<float> y(row.size());
  vexp(row.data(), y.data(), int64_t(row.size()));
  for (size_t i = 0; i < row.size(); ++i) ASSERT_EQ(bits(y[i]), bits(std::exp(row[i])));
  EXPECT_EQ(std::string(vexp_path_name(VexpPath::kAvx512)), "avx512");
}
