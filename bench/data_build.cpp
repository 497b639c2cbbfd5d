// Data build throughput: generates N synthetic conversations (default 100,000) as JSONL and as zstd Parquet
// (written by DuckDB), then times `build_dataset` on each with the built-in byte-level test encoder
// (builtin:bytes: one token per UTF-8 byte, so tokenisation itself is nearly free; a real BPE tokenizer will
// be slower). Usage: bench_data_build [N] [seq_len] [scratch_dir]
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include "core/threads.h"
#include "data/build.h"
#include "data/build_bytes_encoder.h"
#include "data/duckdb_cli.h"

namespace fs = std::filesystem;
using namespace olmosft;

// CPU seconds (user + system, all threads) used by this process so far: the machine may be shared, so wall
// time alone understates throughput.
static double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 100000;
  const int64_t seq = argc > 2 ? std::atoll(argv[2]) : 4096;
  std::string dir = argc > 3 ? argv[3] : (fs::temp_directory_path() / "olmosft-bench-data").string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  set_threads(0);

  // Synthetic conversations: 1-4 user/assistant turns, words from a small multilingual vocabulary, 3 sources.
  const char* words[] = {"the",   "model", "answer", "is",     "because", "λ",    "x",  "=",
                         "42",    "def",   "return", "日本語", "think",   "step", "so", "therefore",
                         "proof", "code",  "print(", ")",      "résumé",  "🙂"};
  std::mt19937_64 g(1);
  auto sentence = [&](int len) {
    std::string s;
    for (int i = 0; i < len; ++i)
      s += std::string(i ? " " : "") + words[g() % (sizeof words / sizeof *words)];
    return s;
  };
  const std::string jsonl = dir + "/convs.jsonl";
  {
    std::ofstream out(jsonl);
    for (int64_t i = 0; i < n; ++i) {
      nlohmann::json msgs = nlohmann::json::array();
      int turns = 1 + static_cast<int>(g() % 4);
      for (int t = 0; t < turns; ++t) {
        msgs.push_back({{"role", "user"}, {"content", sentence(5 + static_cast<int>(g() % 60))}});
        msgs.push_back({{"role", "assistant"}, {"content", sentence(10 + static_cast<int>(g() % 200))}});
      }
      out << nlohmann::json{{"id", "c" + std::to_string(i)},
                            {"source_dataset", "src" + std::to_string(i % 3)},
                            {"messages", msgs}}
                 .dump()
          << "\n";
    }
  }
  const std::string parquet = dir + "/convs.parquet";
  duckdb::run_sql("COPY (SELECT * FROM read_json(" + duckdb::sql_string(jsonl) +
                      ", format='newline_delimited')) TO " + duckdb::sql_string(parquet) +
                      " (FORMAT parquet, COMPRESSION zstd)",
                  "writing the bench Parquet file", num_threads());
  std::printf(
      "bench data_build: %lld conversations, JSONL %.1f MB, Parquet %.1f MB, seq_len %lld, %d threads, "
      "encoder builtin:bytes\n",
      static_cast<long long>(n), fs::file_size(jsonl) / 1e6, fs::file_size(parquet) / 1e6,
      static_cast<long long>(seq), num_threads());
  BytesChatEncoder enc;
  for (const auto& [name, path] :
       {std::pair<std::string, std::string>{"jsonl", jsonl}, {"parquet", parquet}}) {
    BuildOptions o;
    o.inputs = {path};
    o.out_dir = dir + "/out-" + name;
    o.seq_len = seq;
    o.seed = 1;
    o.tokenizer_spec = "builtin:bytes";
    o.log = std::getenv("BENCH_VERBOSE") ? &std::cerr : nullptr;
    auto t0 = std::chrono::steady_clock::now();
    double c0 = cpu_seconds();
    auto m = build_dataset(o, enc);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double c = cpu_seconds() - c0;
    int64_t toks = m["counts"]["kept_tokens"];
    std::printf(
        "  %-8s wall %.2f s: %.0f conversations/s, %.2f M tokens/s | CPU %.2f s: %.0f conversations/CPU-s, "
        "%.2f M tokens/CPU-s | rows %lld, padding %.4f (BFD %.4f)\n",
        name.c_str(), s, static_cast<double>(n) / s, static_cast<double>(toks) / s / 1e6, c,
        static_cast<double>(n) / c, static_cast<double>(toks) / c / 1e6,
        static_cast<long long>(m["counts"]["rows"].get<int64_t>()),
        m["counts"]["padding_fraction"].get<double>(),
        m["packing"]["best_fit_decreasing_padding_fraction"].get<double>());
  }
  fs::remove_all(dir);
  return 0;
}
