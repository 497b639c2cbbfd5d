// `olmosft data build` as a library: conversations (Parquet/JSONL via DuckDB) -> validation -> chat encoding
// and loss masks (a ChatEncoder, in parallel) -> canonical order -> optional source mix -> per-epoch seeded
// conversation shuffle -> packing into rows of exactly seq_len tokens -> row files + manifest.json (see
// dataset.h), built in a temporary directory and published by rename.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/chat.h"

namespace olmosft {

struct BuildOptions {
  std::vector<std::string> inputs;  // globs
  std::string out_dir;              // must not exist, or be an empty directory
  int64_t seq_len = 4096;
  uint64_t seed = 0;
  int epochs = 1;
  std::string sql;                       // optional SELECT over the view `input` (see docs/data.md)
  std::string mix;                       // optional "SOURCE=WEIGHT,...,*=WEIGHT" (see docs/data.md)
  std::string source_column;             // empty = auto (source_dataset, source, file name)
  std::string long_policy = "truncate";  // "truncate" (keep the first seq_len tokens) or "drop"
  std::string packing = "first-fit";     // "first-fit" or "best-fit-decreasing"
  std::string revision;                  // dataset revision recorded in the manifest
  std::string tokenizer_spec;            // recorded in the manifest (a directory or builtin:bytes)
  std::ostream* log = nullptr;           // progress lines (stderr in the CLI); null = quiet
  size_t batch_rows = 8192;              // conversations read and encoded per batch
};

// Builds the dataset and returns its manifest (also written to out_dir/manifest.json).
nlohmann::json build_dataset(const BuildOptions& opts, const ChatEncoder& encoder);

// Parses a --mix spec into (source, weight) pairs; "*" is the default for unlisted sources (1 if absent).
std::vector<std::pair<std::string, double>> parse_mix(const std::string& spec);

}  // namespace olmosft
