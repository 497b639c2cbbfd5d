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

// A manifest value `j[key]` (j's own path in the manifest is `at`) that exists and has the expected kind:
// 'i' an integer, 'n' a number, 's' a string, 'a' an array, 'o' an object. Otherwise an error naming the file
// and the key. `data build` writes them all; a hand-edited or foreign manifest is caught here, not printed as
// "null" or read out of bounds.
struct ManifestReader {
  std::string file;
  const nlohmann::json& operator()(const nlohmann::json& j, const std::string& at, const std::string& key,
                                   char kind) const {
    const std::string path = at.empty() ? key : at + "." + key;
    OLMO_CHECK(j.is_object() && j.contains(key), file, ": key '", path, "' is missing");
    const nlohmann::json& v = j[key];
    const bool ok = kind == 'i'   ? v.is_number_integer()
                    : kind == 'n' ? v.is_number()
                    : kind == 's' ? v.is_string()
                    : kind == 'a' ? v.is_array()
                                  : v.is_object();
    static const char* const kNames[] = {"an integer", "a number", "a string", "an array", "an object"};
    OLMO_CHECK(ok, file, ": key '", path, "' must be ", kNames[std::string("insao").find(kind)], ", got ",
               v.type_name());
    return v;
  }
};

void print_epochs_and_histogram(const nlohmann::json& m, const ManifestReader& get, std::ostream& out) {
  const auto& files = get(m, "", "epoch_files", 'a');
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& f = files[i];
    const std::string at = "epoch_files[" + std::to_string(i) + "]";
    out << "epoch " << get(f, at, "epoch", 'i') << ": " << get(f, at, "rows", 'i') << " rows, "
        << get(f, at, "conversations", 'i') << " conversations, " << get(f, at, "tokens", 'i') << " tokens, "
        << get(f, at, "trained_tokens", 'i') << " trained, padding fraction "
        << get(f, at, "padding_fraction", 'n') << "\n";
  }
  out << "best-fit-decreasing padding fraction: "
      << get(get(m, "", "packing", 'o'), "packing", "best_fit_decreasing_padding_fraction", 'n') << "\n";
  out << "conversation length histogram (tokens, after truncation):\n";
  const auto& stats = get(m, "", "stats", 'o');
  const auto& hist = get(stats, "stats", "length_histogram", 'a');
  for (size_t i = 0; i < hist.size(); ++i) {
    const std::string at = "stats.length_histogram[" + std::to_string(i) + "]";
    out << "  " << std::setw(8) << get(hist[i], at, "min", 'i').get<int64_t>() << " .. " << std::setw(8)
        << get(hist[i], at, "max", 'i').get<int64_t>() << "  " << get(hist[i], at, "count", 'i') << "\n";
  }
}

// Everything is read (and checked) before anything is printed.
void print_stats(const nlohmann::json& m, const std::string& dir) {
  const ManifestReader get{dir + "/manifest.json"};
  std::ostringstream out;
  const auto& packing = get(m, "", "packing", 'o');
  const auto& tok = get(m, "", "tokenizer", 'o');
  out << "dataset: seq_len " << get(m, "", "seq_len", 'i') << ", epochs " << get(m, "", "epochs", 'i')
      << ", seed " << get(m, "", "seed", 'i') << ", packing " << get(packing, "packing", "algorithm", 's')
      << ", long conversations: " << get(m, "", "long_conversations", 's') << "\n";
  out << "tokenizer: " << get(tok, "tokenizer", "spec", 's') << " (sha256 "
      << get(tok, "tokenizer", "tokenizer_sha256", 's') << ", template "
      << get(tok, "tokenizer", "template_sha256", 's') << ")\n";
  out << "counts: " << get(m, "", "counts", 'o').dump() << "\n";
  print_epochs_and_histogram(m, get, out);
  out << "per source (read / kept / dropped / truncated, tokens, trained fraction):\n";
  const auto& sources = get(get(m, "", "stats", 'o'), "stats", "sources", 'o');
  for (auto it = sources.begin(); it != sources.end(); ++it) {
    const std::string at = "stats.sources." + it.key();
    const auto& s = it.value();
    out << "  " << it.key() << ": " << get(s, at, "read", 'i') << " / " << get(s, at, "kept", 'i') << " / "
        << get(s, at, "dropped", 'i') << " / " << get(s, at, "truncated", 'i') << ", "
        << get(s, at, "tokens", 'i') << " tokens, trained fraction " << get(s, at, "trained_fraction", 'n')
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
