#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/bf16.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "core/threads.h"

using namespace olmosft;

TEST(BF16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1.0p-8f), 0x3f80);               // tie -> even (down)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1.0p-8f), 0x3f82);           // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1.0p-8f + 0x1.0p-20f), 0x3f81);  // above the tie -> up
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  // The largest finite float rounds to inf in bf16 (as PyTorch does).
  EXPECT_EQ(f32_to_bf16(3.4028235e38f), 0x7f80);
  // Every bf16 value survives bf16 -> f32 -> bf16 unchanged.
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), h) << h;
  }
}

// The array conversions (vectorised, threaded above 2^20 elements) give the scalar conversion's bits for
// every kind of input: ties, NaNs with payloads, infinities, subnormals, the largest floats.
TEST(BF16, ArrayConversionsMatchTheScalarOnes) {
  for (size_t n : {size_t(1), size_t(37), size_t(1) << 10, (size_t(1) << 20) + 77}) {
    const Rng rng{n, 0};
    std::vector<float> f(n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t u = static_cast<uint32_t>(rng.bits(i));
      const uint32_t special[] = {0x7fc00001u, 0xff800000u, 0x00000001u, 0x807fffffu,
                                  0x3f808000u, 0x3f818000u, 0x7f7fffffu, u & 0xffff8000u};
      f[i] = bits_f32(i % 5 == 0 ? special[(i / 5) % 8] : u);
    }
    std::vector<uint16_t> h(n);
    f32_to_bf16(f.data(), h.data(), n);
    std::vector<float> back(n);
    bf16_to_f32(h.data(), back.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(h[i], f32_to_bf16(f[i])) << "n=" << n << " i=" << i << " bits=" << f32_bits(f[i]);
      ASSERT_EQ(f32_bits(back[i]), f32_bits(bf16_to_f32(h[i]))) << "n=" << n << " i=" << i;
    }
  }
}

TEST(F16, RoundTripAndRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << h;
  }
  EXPECT_EQ(f32_to_f16(1.0f + 0x1.0p-11f), 0x3c00);      // tie -> even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1.0p-11f), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);               // overflow to inf
  EXPECT_EQ(f16_to_f32(0x0001), 0x1.0p-24f);             // smallest subnormal
}

TEST(Tensor, ViewsShareStorageAndCopyConverts) {
  Tensor t = Tensor::from<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor tt = t.transpose(0, 1);
  EXPECT_EQ(tt.shape(), (Shape{3, 2}));
  EXPECT_FALSE(tt.is_contiguous());
  Tensor c = tt.contiguous();
  EXPECT_EQ(c.data<float>()[1], 3.0f);
  Tensor s = t.slice(1, 1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  Tensor sc = s.clone();
  EXPECT_EQ(sc.data<float>()[2], 4.0f);
  t.data<float>()[4] = 40.0f;
  EXPECT_EQ(s.contiguous().data<float>()[2], 40.0f);  // slice is a view
  EXPECT_EQ(sc.data<float>()[2], 4.0f);               // clone is not
  Tensor b = t.to(DType::BF16).to(DType::F32);
  EXPECT_EQ(b.data<float>()[4], 40.0f);
  EXPECT_EQ(t.select(0, 1).shape(), (Shape{3}));
  EXPECT_EQ(t.view({-1}).shape(), (Shape{6}));
  EXPECT_THROW(t.view({4}), Error);
  EXPECT_THROW(tt.view({6}), Error);
  EXPECT_THROW(t.data<int32_t>(), Error);
  Tensor i = Tensor::from<int64_t>({(int64_t{1} << 60) + 1, 2}, {2});
  EXPECT_EQ(i.transpose(0, 0).clone().data<int64_t>()[0], (int64_t{1} << 60) + 1);
}

TEST(Tensor, ParseDtypeNamesTheInput) {
  EXPECT_EQ(parse_dtype("BF16", "x"), DType::BF16);
  try {
    parse_dtype("Q4", "model.safetensors tensor 'w'");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors tensor 'w'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("Q4"), std::string::npos);
  }
}

TEST(Rng, PhiloxKnownAnswers) {
  // Random123 kat_vectors: philox4x32 10 rounds.
  auto z = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(z, (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  auto f = philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(f, (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  auto p = philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u});
  EXPECT_EQ(p, (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Rng, SameNumbersWhateverTheThreadCount) {
  Tensor a = Tensor::empty({100003}), b = Tensor::empty({100003});
  set_threads(1);
  fill_normal(a, Rng{42, 1}, 0.f, 1.f);
  set_threads(2);
  fill_normal(b, Rng{42, 1}, 0.f, 1.f);
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  // Moments of N(0,1) over 1e5 samples: mean within 5 sigma (0.016), variance within 0.03.
  double m = 0, v = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m += a.data<float>()[i];
  m /= a.numel();
  for (int64_t i = 0; i < a.numel(); ++i) v += (a.data<float>()[i] - m) * (a.data<float>()[i] - m);
  v /= a.numel();
  EXPECT_NEAR(m, 0.0, 0.016);
  EXPECT_NEAR(v, 1.0, 0.03);
  // Different streams differ.
  Tensor c = Tensor::empty({100003});
  fill_normal(c, Rng{42, 2}, 0.f, 1.f);
  EXPECT_GT(max_abs_diff(a, c), 0.1);
  Rng r{1, 0};
  std::set<uint64_t> seen;
  for (uint64_t i = 0; i < 1000; ++i) {
    uint64_t k = r.below(i, 10);
    ASSERT_LT(k, 10u);
    seen.insert(k);
  }
  EXPECT_EQ(seen.size(), 10u);
}

TEST(Threads, ParallelForCoversTheRangeOnce) {
  set_threads(2);
  std::vector<int> hits(1001, 0);
  parallel_for(1001, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (int h : hits) ASSERT_EQ(h, 1);
  EXPECT_EQ(num_threads(), 2);
}

// Every element of every range once, as (range, begin, end) pieces in range order within a thread's share;
// empty ranges are never visited; at 1 and 2 threads and with a minimum share that keeps it on one thread.
TEST(Threads, ParallelForRangesCoversEveryRangeOnce) {
  const std::vector<int64_t> sizes = {5, 0, 1000, 1, 0, 333, 4096};
  for (int threads : {1, 2})
    for (int64_t min_per_thread : {int64_t(1), int64_t(1) << 20}) {
      set_threads(threads);
      std::vector<std::vector<int>> hits;
      for (int64_t n : sizes) hits.emplace_back(size_t(n), 0);
      std::vector<int> pieces(sizes.size(), 0);
      parallel_for_ranges(
          sizes,
          [&](size_t r, int64_t b, int64_t e) {
            ASSERT_LT(r, sizes.size());
            ASSERT_TRUE(0 <= b && b < e && e <= sizes[r]) << r << " [" << b << ", " << e << ")";
#pragma omp atomic
            pieces[r]++;
            for (int64_t i = b; i < e; ++i) hits[r][size_t(i)]++;
          },
          min_per_thread);
      for (size_t r = 0; r < sizes.size(); ++r) {
        for (int h : hits[r]) ASSERT_EQ(h, 1) << "range " << r << " threads " << threads;
        if (sizes[r] == 0) {
          EXPECT_EQ(pieces[r], 0);
        }
        EXPECT_LE(pieces[r], threads);
      }
    }
  set_threads(2);
}
