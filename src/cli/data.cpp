// `olmosft data build` and `olmosft data inspect`: see docs/data.md.
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

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

// Every statistic is read through the manifest's typed reader (a missing key or a wrong type names the file
// and the key) before anything is printed.
void print_epochs_and_histogram(const nlohmann::json& m, const olmosft::ManifestReader& rd,
                                std::ostream& out) {
  const auto& files = rd.array(m, "", "epoch_files");
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& f = files[i];
    const std::string at = "epoch_files[" + std::to_string(i) + "].";
    out << "epoch " << rd.integer(f, at, "epoch") << ": " << rd.integer(f, at, "rows") << " rows, "
        << rd.integer(f, at, "conversations") << " conversations, " << rd.integer(f, at, "tokens")
        << " tokens, " << rd.integer(f, at, "trained_tokens") << " trained, padding fraction "
        << rd.number(f, at, "padding_fraction") << "\n";
  }
  out << "best-fit-decreasing padding fraction: "
      << rd.number(rd.object(m, "", "packing"), "packing.", "best_fit_decreasing_padding_fraction") << "\n";
  out << "conversation length histogram (tokens, after truncation):\n";
  const auto& hist = rd.array(rd.object(m, "", "stats"), "stats.", "length_histogram");
  for (size_t i = 0; i < hist.size(); ++i) {
    const std::string at = "stats.length_histogram[" + std::to_string(i) + "].";
    out << "  " << std::setw(8) << rd.integer(hist[i], at, "min").get<int64_t>() << " .. " << std::setw(8)
        << rd.integer(hist[i], at, "max").get<int64_t>() << "  " << rd.integer(hist[i], at, "count") << "\n";
  }
}

void print_stats(const nlohmann::json& m, const std::string& dir) {
  const olmosft::ManifestReader rd(dir + "/manifest.json");
  std::ostringstream out;
  const auto& packing = rd.object(m, "", "packing");
  const auto& tok = rd.object(m, "", "tokenizer");
  out << "dataset: seq_len " << rd.integer(m, "", "seq_len") << ", epochs " << rd.integer(m, "", "epochs")
      << ", seed " << rd.integer(m, "", "seed", INT64_MIN) << ", packing "
      << rd.string(packing, "packing.", "algorithm")
      << ", long conversations: " << rd.string(m, "", "long_conversations") << "\n";
  out << "tokenizer: " << rd.string(tok, "tokenizer.", "spec") << " (sha256 "
      << rd.string(tok, "tokenizer.", "tokenizer_sha256") << ", template "
      << rd.string(tok, "tokenizer.", "template_sha256") << ")\n";
  out << "counts: " << rd.object(m, "", "counts").dump() << "\n";
  print_epochs_and_histogram(m, rd, out);
  out << "per source (read / kept / dropped / truncated, tokens, trained fraction):\n";
  const auto& sources = rd.object(rd.object(m, "", "stats"), "stats.", "sources");
  for (auto it = sources.begin(); it != sources.end(); ++it) {
    const std::string at = "stats.sources." + it.key() + ".";
    const auto& s = it.value();
    out << "  " << it.key() << ": " << rd.integer(s, at, "read") << " / " << rd.integer(s, at, "kept")
        << " / " << rd.integer(s, at, "dropped") << " / " << rd.integer(s, at, "truncated") << ", "
        << rd.integer(s, at, "tokens") << " tokens, trained fraction " << rd.number(s, at, "trained_fraction")
        << "\n";
  }
  std::cout << out.str();
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
      print_stats(ds.manifest(), dir);
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
