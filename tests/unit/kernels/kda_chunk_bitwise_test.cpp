// Bit-identity guards for the chunked KDA delta rule (kda_chunk_forward / kda_chunk_backward), each comparing
// runs made in the same test on the same machine (docs/numerics.md): the thread count changes no bit; a
// document's outputs and gradients have the same bits whether it is packed in a row with others (boundaries
// inside chunks, padding) or run alone; a run repeats. Float and double, on both fp32 GEMM libraries.
// Agreement with the recurrent reference and float64 is kda_chunk_test's job (stated tolerances), not this
// file's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/threads.h"
#include "kda_test_util.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"

using namespace olmosft::kda;

namespace {

using kdatest::Outs;

// Segment ids of a [B, L] batch: row r holds documents of the given lengths, the rest is padding (-1).
std::vector<int32_t> packed(const std::vector<std::vector<int64_t>>& docs, int64_t L) {
  std::vector<int32_t> s(docs.size() * size_t(L), -1);
  for (size_t r = 0; r < docs.size(); ++r) {
    int64_t t = 0;
    int32_t id = 0;
    for (int64_t len : docs[r]) {
      for (int64_t p = 0; p < len; ++p, ++t) s[r * size_t(L) + size_t(t)] = id;
      ++id;
    }
  }
  return s;
}

// Entries [t0, t0 + n) of every row-0 tensor of width w per token and head.
template <typename T>
std::vector<T> tokens(const std::vector<T>& x, int64_t t0, int64_t n, int64_t H, int64_t w) {
  return std::vector<T>(x.begin() + t0 * H * w, x.begin() + (t0 + n) * H * w);
}

// Exact equality of every element; names the tensor and the first differing index.
template <typename T>
void expect_bits(const std::vector<T>& want, const std::vector<T>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&want[i], &got[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " differs (" << double(want[i]) << " vs "
                    << double(got[i]) << ")";
      return;
    }
}

template <typename T>
void expect_outs(const Outs<T>& a, const Outs<T>& b, const std::string& what) {
  expect_bits(a.o, b.o, what + " o");
  expect_bits(a.dq, b.dq, what + " dq");
  expect_bits(a.dk, b.dk, what + " dk");
  expect_bits(a.dv, b.dv, what + " dv");
  expect_bits(a.dg, b.dg, what + " dg");
  expect_bits(a.db, b.db, what + " dbeta");
}

const char* lib_name(olmosft::GemmLib lib) {
  return lib == olmosft::GemmLib::OpenBLAS ? "openblas" : "onednn";
}

template <typename T>
const char* type_name() {
  return sizeof(T) == 4 ? "f32" : "f64";
}

// The model's head sizes (dk 128, dv 256, chunk 64): full and partial chunks, a 1-token document, padding;
// and small odd heads (remainder loops), chunk 16.
struct Shape {
  KdaDims d;
  std::vector<std::vector<int64_t>> docs;
  int64_t chunk;
};
std::vector<Shape> shapes() {
  return {{{2, 300, 2, 128, 256}, {{70, 130, 1, 80}, {64, 200, 29}}, 64},
          {{2, 77, 3, 24, 40}, {{37, 3, 30}, {2, 60, 15}}, 16}};
}

template <typename T>
void threads_change_no_bit() {
  for (auto lib : {olmosft::GemmLib::OpenBLAS, olmosft::GemmLib::OneDNN}) {
    const olmosft::ScopedCpuGemm pin({lib, olmosft::ComputeDtype::F32});
    for (const Shape& s : shapes())
      for (bool vn :
           {false, true}) {  // the backward recomputing Vn, or given the forward's (the model's way)
        kdatest::KdaInputs<T> in(s.d, packed(s.docs, s.d.L), 200);
        const auto dout = kdatest::randn<T>(size_t(s.d.B * s.d.L * s.d.H * s.d.V), 211);
        olmosft::set_threads(1);
        const Outs<T> one = kdatest::run_kda(in, dout, true, s.chunk, vn);
        olmosft::set_threads(2);
        const Outs<T> two = kdatest::run_kda(in, dout, true, s.chunk, vn);
        const Outs<T> again = kdatest::run_kda(in, dout, true, s.chunk, vn);
        olmosft::set_threads(1);
        const std::string what = std::string(type_name<T>()) + " " + lib_name(lib) +
                                 " K=" + std::to_string(s.d.K) + (vn ? " saved vn" : "");
        expect_outs(one, two, what + ", 2 threads vs 1:");
        expect_outs(two, again, what + ", repeated:");
      }
  }
}

template <typename T>
void packed_equals_alone() {
  for (auto lib : {olmosft::GemmLib::OpenBLAS, olmosft::GemmLib::OneDNN}) {
    const olmosft::ScopedCpuGemm pin({lib, olmosft::ComputeDtype::F32});
    for (const Shape& s : shapes())
      for (bool vn : {false, true}) {
        KdaDims d = s.d;
        d.B = 1;  // row 0 of the shape
        kdatest::KdaInputs<T> in(d, packed({s.docs[0]}, d.L), 300);
        const auto dout = kdatest::randn<T>(size_t(d.L * d.H * d.V), 311);
        const Outs<T> row = kdatest::run_kda(in, dout, true, s.chunk, vn);
        int64_t t0 = 0;
        for (int64_t n : s.docs[0]) {
          kdatest::KdaInputs<T> one = in;
          one.d = {1, n, d.H, d.K, d.V};
          one.seg.clear();
          one.q = tokens(in.q, t0, n, d.H, d.K);
          one.k = tokens(in.k, t0, n, d.H, d.K);
          one.g = tokens(in.g, t0, n, d.H, d.K);
          one.v = tokens(in.v, t0, n, d.H, d.V);
          one.beta = tokens(in.beta, t0, n, d.H, 1);
          const Outs<T> alone = kdatest::run_kda(one, tokens(dout, t0, n, d.H, d.V), true, s.chunk, vn);
          Outs<T> part{tokens(row.o, t0, n, d.H, d.V),  tokens(row.dq, t0, n, d.H, d.K),
                       tokens(row.dk, t0, n, d.H, d.K), tokens(row.dv, t0, n, d.H, d.V),
                       tokens(row.dg, t0, n, d.H, d.K), tokens(row.db, t0, n, d.H, 1)};
          expect_outs(part, alone,
                      std::string(type_name<T>()) + " " + lib_name(lib) + " K=" + std::to_string(d.K) +
                          (vn ? " saved vn" : "") + ", document at " + std::to_string(t0) + " (" +
                          std::to_string(n) + " tokens) packed vs alone:");
          t0 += n;
        }
      }
  }
}

}  // namespace

TEST(KdaChunkBitwise, ThreadCountChangesNoBit) {
  threads_change_no_bit<float>();
  threads_change_no_bit<double>();
}

TEST(KdaChunkBitwise, PackedDocumentEqualsAlone) {
  packed_equals_alone<float>();
  packed_equals_alone<double>();
}
