// `olmosft data rows`: packed dataset rows as `olmosft forward` inputs (tokens.json, segments.json,
// trained.json), so a reference forward can score exactly what the trainer scores (docs/train.md).
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/verb.h"
#include "core/error.h"
#include "data/dataset.h"
#include "io/atomic_file.h"

namespace {

using olmosft::fail;

int rows_main(int argc, char** argv) {
  CLI::App app{"Write packed dataset rows as `olmosft forward` inputs (tokens/segments/trained JSON)",
               "data rows"};
  std::string data_dir, range, out_dir;
  int epoch = 0;
  app.add_option("--data", data_dir, "dataset directory (olmosft data build)")->required();
  app.add_option("--epoch", epoch, "epoch (default 0)");
  app.add_option("--rows", range, "row range A:B (rows A..B-1 of the epoch)")->required();
  app.add_option("--out-dir", out_dir, "output directory (tokens.json, segments.json, trained.json)")
      ->required();
  return olmosft::cli::run_app(app, argc, argv, [&] {
    using namespace olmosft;
    PackedDataset ds = PackedDataset::open(data_dir);
    OLMO_CHECK(epoch >= 0 && epoch < ds.epochs(), "--epoch ", epoch, ": dataset ", data_dir, " has ",
               ds.epochs(), " epoch(s)");
    const size_t colon = range.find(':');
    int64_t a = -1, b = -1;
    try {
      OLMO_CHECK(colon != std::string::npos, "no colon");
      size_t used = 0;
      a = std::stoll(range.substr(0, colon), &used);
      OLMO_CHECK(used == colon, "trailing characters");
      b = std::stoll(range.substr(colon + 1), &used);
      OLMO_CHECK(used == range.size() - colon - 1, "trailing characters");
    } catch (const std::exception&) {
      fail("--rows ", range, ": expected A:B with integers A < B");
    }
    const int64_t n = ds.rows(epoch);
    OLMO_CHECK(a >= 0 && a < b && b <= n, "--rows ", range, ": need 0 <= A < B <= ", n, " (rows of epoch ",
               epoch, " of ", data_dir, ")");
    nlohmann::json toks = nlohmann::json::array(), segs = nlohmann::json::array(),
                   trained = nlohmann::json::array();
    int64_t targets = 0;
    for (int64_t i = a; i < b; ++i) {
      PackedRow r = ds.row(epoch, i);
      // Padding (segment 0) is only at the end of a packed row; forward takes rows of any length, no padding.
      int64_t len = r.seq_len;
      while (len > 0 && r.segment_ids[len - 1] == 0) --len;
      OLMO_CHECK(len > 0, data_dir, ": epoch ", epoch, " row ", i, " is all padding");
      nlohmann::json t = nlohmann::json::array(), s = nlohmann::json::array(), m = nlohmann::json::array();
      for (int64_t k = 0; k < len; ++k) {
        OLMO_CHECK(r.segment_ids[k] != 0, data_dir, ": epoch ", epoch, " row ", i, ": padding at position ",
                   k, " before the end of the row's documents");
        t.push_back(r.tokens[k]);
        s.push_back(r.segment_ids[k]);
        m.push_back(r.trained(k) ? 1 : 0);
      }
      for (int32_t x : r.targets(-100)) targets += x != -100;
      toks.push_back(std::move(t));
      segs.push_back(std::move(s));
      trained.push_back(std::move(m));
    }
    std::filesystem::create_directories(out_dir);
    io::write_file_atomic(out_dir + "/tokens.json", toks.dump() + "\n");
    io::write_file_atomic(out_dir + "/segments.json", segs.dump() + "\n");
    io::write_file_atomic(out_dir + "/trained.json", trained.dump() + "\n");
    std::cout << "data rows: epoch " << epoch << " rows " << a << ":" << b << " (" << (b - a) << " rows, "
              << targets << " trained targets) -> " << out_dir << "/{tokens,segments,trained}.json\n";
    return 0;
  });
}

}  // namespace

OLMOSFT_VERB("data rows",
             "write packed dataset rows as `olmosft forward` inputs (tokens/segments/trained JSON)",
             rows_main);
