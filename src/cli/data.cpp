// `olmosft data build` and `olmosft data inspect`: see docs/data.md.
#include <cstdio>
#include <iomanip>
#include <iostream>

#include "cli/verb.h"
#include "core/error.h"
#include "data/build.h"
#include "data/build_bytes_encoder.h"
#include "data/dataset.h"

namespace {

int build_main(int argc, char** argv) {
  CLI::App app{"Build a packed, shuffled SFT dataset from Parquet/JSONL conversations", "data build"};
  olmosft::BuildOptions o;
  std::string tokenizer;
  bool quiet = false;
  app.add_option("--input", o.inputs, "input files or globs (.parquet, .jsonl/.ndjson/.json[.gz|.zst])")
      ->required()
      ->expected(1, -1);
  app.add_option("--tokenizer", tokenizer,
                 "HF tokenizer directory (tokenizer.json + tokenizer_config.json / chat_template.jinja), "
                 "or builtin:bytes (the byte-level test encoder)")
      ->required();
  app.add_option("--seq-len", o.seq_len, "tokens per packed row")->required();
  app.add_option("--seed", o.seed, "shuffle seed (0 .. 2^64-1)")->required()->check(CLI::NonNegativeNumber);
  app.add_option("--out", o.out_dir, "output directory (must be new or empty)")->required();
  app.add_option("--epochs", o.epochs, "epochs to lay out (each with its own conversation shuffle)");
  app.add_option("--sql", o.sql, "SELECT over the view `input` choosing/filtering rows (DuckDB SQL)");
  app.add_option("--mix", o.mix,
                 "per-source weights: SOURCE=W,...,*=W (W copies; fractional part = seeded subset)");
  app.add_option("--source-column", o.source_column, "column naming each row's source (default: auto)");
  app.add_option("--long", o.long_policy,
                 "over-long conversations: truncate (keep first seq-len tokens) or drop")
      ->check(CLI::IsMember({"truncate", "drop"}));
  app.add_option("--packing", o.packing, "first-fit (stream order) or best-fit-decreasing")
      ->check(CLI::IsMember({"first-fit", "best-fit-decreasing"}));
  app.add_option("--revision", o.revision, "dataset revision to record in the manifest");
  app.add_flag("--quiet", quiet, "no progress lines");
  return olmosft::cli::run_app(app, argc, argv, [&] {
    auto enc = olmosft::open_chat_encoder(tokenizer);
    o.tokenizer_spec = tokenizer;
    o.log = quiet ? nullptr : &std::cerr;
    auto m = olmosft::build_dataset(o, *enc);
    const auto& c = m["counts"];
    std::cout << "wrote " << o.out_dir << ": " << c["rows"] << " rows of " << o.seq_len << " tokens x "
              << o.epochs << " epoch(s); conversations read " << c["conversations_read"] << ", kept "
              << c["conversations_kept"] << ", dropped " << c["conversations_dropped"] << ", truncated "
              << c["truncated"] << "; padding fraction " << c["padding_fraction"]
              << " (best-fit decreasing: " << m["packing"]["best_fit_decreasing_padding_fraction"] << ")\n";
    return 0;
  });
}

void print_stats(const nlohmann::json& m) {
  std::cout << "dataset: seq_len " << m["seq_len"] << ", epochs " << m["epochs"] << ", seed " << m["seed"]
            << ", packing " << m["packing"]["algorithm"]
            << ", long conversations: " << m["long_conversations"] << "\n";
  std::cout << "tokenizer: " << m["tokenizer"]["spec"] << " (sha256 " << m["tokenizer"]["tokenizer_sha256"]
            << ", template " << m["tokenizer"]["template_sha256"] << ")\n";
  std::cout << "counts: " << m["counts"].dump() << "\n";
  for (const auto& f : m["epoch_files"]) {
    std::cout << "epoch " << f["epoch"] << ": " << f["rows"] << " rows, " << f["conversations"]
              << " conversations, " << f["tokens"] << " tokens, " << f["trained_tokens"]
              << " trained, padding fraction " << f["padding_fraction"] << "\n";
  }
  std::cout << "best-fit-decreasing padding fraction: "
            << m["packing"]["best_fit_decreasing_padding_fraction"] << "\n";
  std::cout << "conversation length histogram (tokens, after truncation):\n";
  for (const auto& h : m["stats"]["length_histogram"]) {
    std::cout << "  " << std::setw(8) << h["min"].get<int64_t>() << " .. " << std::setw(8)
              << h["max"].get<int64_t>() << "  " << h["count"] << "\n";
  }
  std::cout << "per source (read / kept / dropped / truncated, tokens, trained fraction):\n";
  for (auto it = m["stats"]["sources"].begin(); it != m["stats"]["sources"].end(); ++it) {
    const auto& s = it.value();
    std::cout << "  " << it.key() << ": " << s["read"] << " / " << s["kept"] << " / " << s["dropped"] << " / "
              << s["truncated"] << ", " << s["tokens"] << " tokens, trained fraction "
              << s["trained_fraction"] << "\n";
  }
}

int inspect_main(int argc, char** argv) {
  CLI::App app{"Show a packed dataset's statistics, or one row decoded with trained tokens marked",
               "data inspect"};
  std::string dir, tokenizer;
  int64_t row = -1;
  int epoch = 0;
  bool verify = false;
  app.add_option("dir", dir, "dataset directory (from data build)")->required();
  app.add_option("--row", row, "row index to show")->check(CLI::NonNegativeNumber);
  app.add_option("--epoch", epoch, "epoch of --row")->check(CLI::NonNegativeNumber);
  app.add_option("--tokenizer", tokenizer,
                 "tokenizer dir or builtin:bytes to decode (default: show token ids)");
  app.add_flag("--verify", verify, "check every row's checksum");
  return olmosft::cli::run_app(app, argc, argv, [&] {
    auto ds = olmosft::PackedDataset::open(dir);
    if (verify) {
      ds.verify_all();
      std::cout << "verify: all rows of " << ds.epochs() << " epoch(s) match their checksums\n";
    }
    if (row < 0) {
      print_stats(ds.manifest());
      return 0;
    }
    std::unique_ptr<olmosft::ChatEncoder> enc;
    if (!tokenizer.empty()) {
      enc = olmosft::open_chat_encoder(tokenizer);
      const auto& t = ds.manifest()["tokenizer"];
      if (t["tokenizer_sha256"] != enc->tokenizer_hash() || t["template_sha256"] != enc->template_hash()) {
        std::cerr << "olmosft data inspect: warning: --tokenizer " << tokenizer
                  << " differs from the one the dataset was built with (" << t["spec"] << ")\n";
      }
    }
    auto r = ds.row(epoch, row);
    auto pos = r.positions();
    std::cout << "epoch " << epoch << " row " << row << " of " << ds.rows(epoch) << ": " << r.num_segments()
              << " conversation(s); trained tokens are shown inside [[ ]]\n";
    int64_t t = 0;
    while (t < r.seq_len) {
      int64_t s = t;
      while (t < r.seq_len && r.segment_ids[t] == r.segment_ids[s]) ++t;
      if (r.segment_ids[s] == 0) {
        std::cout << "--- padding: " << (t - s) << " tokens\n";
        continue;
      }
      int64_t ntr = 0;
      for (int64_t k = s; k < t; ++k) ntr += r.trained(k);
      std::cout << "--- segment " << r.segment_ids[s] << ": " << (t - s) << " tokens (positions " << pos[s]
                << ".." << pos[t - 1] << "), " << ntr << " trained\n";
      int64_t k = s;
      while (k < t) {
        int64_t k0 = k;
        bool tr = r.trained(k);
        while (k < t && r.trained(k) == tr) ++k;
        std::vector<int32_t> ids(r.tokens + k0, r.tokens + k);
        std::string text;
        if (enc) {
          text = enc->decode(ids);
        } else {
          for (size_t q = 0; q < ids.size(); ++q) text += (q ? " " : "") + std::to_string(ids[q]);
        }
        std::cout << (tr ? "[[" : "") << text << (tr ? "]]" : "");
      }
      std::cout << "\n";
    }
    return 0;
  });
}

}  // namespace

OLMOSFT_VERB("data build", "build a packed, shuffled SFT dataset from Parquet/JSONL (see docs/data.md)",
             build_main);
OLMOSFT_VERB("data inspect", "show a packed dataset's statistics or a decoded row", inspect_main);
