// Tokenizer encode throughput on the golden corpus (tests/golden/tok/dolma2_corpus.jsonl.zst, repeated to a
// few MB) with the real dolma2 tokenizer.json: ours with 1 and 2 threads, and, in the same run, the upstream
// Rust library, Hugging Face `tokenizers` (bench/tokenizer_hf.py: encode_batch on 1 and 2 rayon threads),
// when the reference venv deps/venv-reference exists (scripts/install-deps.sh --reference); otherwise a
// "skipped" line. Usage: build/bench_tokenizer [MB]   (default 8 MB of text)
#include "data/tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/threads.h"
#include "data/tokenizer_util.h"
#include "io/atomic_file.h"

using namespace olmosft;

namespace {
std::vector<std::string> load_docs(const std::string& src, double target_mb, size_t* bytes) {
  std::vector<std::string> base, docs;
  std::string all = tok::read_zstd_file(src + "/tests/golden/tok/dolma2_corpus.jsonl.zst");
  for (size_t p = 0; p < all.size();) {
    size_t e = all.find('\n', p);
    if (e == std::string::npos) e = all.size();
    if (e > p) {
      auto j = nlohmann::json::parse(all.substr(p, e - p));
      if (j.contains("text")) base.push_back(j["text"].get<std::string>());
    }
    p = e + 1;
  }
  *bytes = 0;
  while (*bytes < target_mb * 1e6)
    for (auto& s : base) {
      docs.push_back(s);
      *bytes += s.size();
    }
  return docs;
}

// Runs the HF peer for `threads`; returns its tokens/seconds via the printed line, echoing it.
bool run_hf(const std::string& python, const std::string& src, const std::string& tokenizer_json,
            const std::string& docs_file, int threads, size_t bytes, size_t our_tokens) {
  std::string cmd = "'" + python + "' '" + src + "/bench/tokenizer_hf.py' '" + tokenizer_json + "' '" +
                    docs_file + "' " + std::to_string(threads) + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return false;
  char buf[1024];
  std::string out;
  while (fgets(buf, sizeof buf, p)) out += buf;
  int rc = pclose(p);
  char version[64] = {0};
  int t = 0;
  size_t b = 0, n = 0;
  double s = 0;
  if (rc != 0 || std::sscanf(out.c_str(), "hf %63s threads=%d bytes=%zu tokens=%zu seconds=%lf", version, &t,
                             &b, &n, &s) != 5) {
    std::printf("HF tokenizers, %d thread(s): failed (rc %d): %s\n", threads, rc, out.c_str());
    return false;
  }
  std::printf(
      "HF tokenizers %s (Rust, encode_batch), %d thread(s): %.2f MB/s (%.2f Mtok/s, %zu tokens, %.2f s)%s\n",
      version, threads, b / 1e6 / s, n / 1e6 / s, n, s,
      n == our_tokens && b == bytes ? "" : "  WARNING: token/byte counts differ from olmosft's");
  return true;
}
// One word of n repeated characters is one pre-tokenizer piece, so its encode time is the BPE merge loop's
// cost in the word's length (issue #17: the former pair scan per merge was quadratic). Prints the time per
// length and the log-log slope between consecutive lengths (1 = linear, 2 = quadratic).
void long_run_scaling(const Tokenizer& t) {
  set_threads(1);
  double prev_n = 0, prev_s = 0;
  for (size_t n : {size_t(1) << 16, size_t(1) << 17, size_t(1) << 18, size_t(1) << 20}) {
    const std::string word(n, 'a');
    double best = 1e30;
    size_t ids = 0;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      ids = t.encode(word).size();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("BENCH bpe_long_run chars=%zu tokens=%zu seconds=%.4f", n, ids, best);
    if (prev_n > 0) std::printf(" slope=%.2f", std::log(best / prev_s) / std::log(double(n) / prev_n));
    std::printf("\n");
    prev_n = double(n);
    prev_s = best;
  }
}

}  // namespace

int main(int argc, char** argv) {
  double target_mb = argc > 1 ? std::atof(argv[1]) : 8.0;
  const std::string src = OLMOSFT_SOURCE_DIR;
  const std::string tokenizer_json = src + "/deps/dolma2/allenai_dolma2.json";
  size_t bytes = 0;
  std::vector<std::string> docs = load_docs(src, target_mb, &bytes);
  std::printf("corpus: %zu docs, %.2f MB (golden corpus repeated), tokenizer %s\n", docs.size(), bytes / 1e6,
              tokenizer_json.c_str());
  Tokenizer t = Tokenizer::from_hf_json_file(tokenizer_json);
  size_t ntok = 0;
  for (int threads : {1, 2}) {
    set_threads(threads);
    std::vector<size_t> counts(docs.size());
    for (size_t k = 0; k < 200 && k < docs.size(); ++k) t.encode(docs[k]);  // warm-up, like the peer's
    auto t0 = std::chrono::steady_clock::now();
    parallel_for(static_cast<int64_t>(docs.size()), [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) counts[k] = t.encode(docs[k]).size();
    });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ntok = 0;
    for (auto c : counts) ntok += c;
    std::printf("olmosft encode, %d thread(s): %.2f MB/s (%.2f Mtok/s, %zu tokens, %.2f s)\n", threads,
                bytes / 1e6 / s, ntok / 1e6 / s, ntok, s);
  }
  long_run_scaling(t);
  const std::string python = src + "/deps/venv-reference/bin/python";
  if (!std::filesystem::exists(python) ||
      std::system(("'" + python + "' -c 'import tokenizers' >/dev/null 2>&1").c_str()) != 0) {
    std::printf(
        "HF tokenizers: skipped: %s with the tokenizers package not found "
        "(scripts/install-deps.sh --reference installs it)\n",
        python.c_str());
    return 0;
  }
  std::string docs_file =
      (std::filesystem::temp_directory_path() / ("olmosft_bench_tok_" + std::to_string(getpid()) + ".json"))
          .string();
  io::write_file_atomic(docs_file, nlohmann::json(docs).dump());
  bool ok = true;
  for (int threads : {1, 2}) ok = run_hf(python, src, tokenizer_json, docs_file, threads, bytes, ntok) && ok;
  std::remove(docs_file.c_str());
  return ok ? 0 : 1;
}
