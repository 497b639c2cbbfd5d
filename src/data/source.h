// Input side of `olmosft data build`: resolving input globs, hashing the files, the reader options and the
// raw row type (the reader itself is in data/conversation_reader.h), and validating each row into a
// Conversation (or a counted skip reason).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/chat.h"

namespace olmosft {

struct InputFile {
  std::string path;  // as resolved from the glob (absolute if the glob was)
  std::string kind;  // "parquet" or "jsonl"
  uint64_t size = 0;
  std::string sha256;
};

// Expands each glob (glob(3), no match = error naming the pattern), sorts and de-duplicates the paths, and
// classifies them by extension: .parquet -> parquet; .jsonl/.ndjson/.json (optionally .gz/.zst) -> jsonl;
// anything else = error.
std::vector<InputFile> resolve_inputs(const std::vector<std::string>& globs);
// Fills size and sha256 of every file (files hashed in parallel).
void hash_inputs(std::vector<InputFile>& files);

struct SourceOptions {
  // Optional SELECT over the view `input` (all input files, union by column name, plus a `filename` column),
  // run by DuckDB; its result must have a `messages` column. Empty = every row of every input, read by Arrow.
  std::string sql;
  // Column naming each row's source (for stats and --mix). Empty = auto, per row: source_dataset, else
  // source, else the input file's base name.
  std::string source_column;
  // Conversation-level columns passed to the chat template in Conversation::extra when present (null =
  // absent).
  std::vector<std::string> extra_columns = {"tools", "functions"};
  // Directory for the --sql result (a temporary Parquet file, deleted when the scan ends). Empty = $TMPDIR.
  std::string work_dir;
  // Threads for DuckDB (--sql).
  int threads = 1;
};

// One row as read (before validation). messages_json is the row's `messages` value as JSON text.
struct RawConversation {
  std::optional<std::string> messages_json;
  std::string source;
  std::string id;          // the `id` column when present, else "#<row number in read order>"
  std::string extra_json;  // JSON object of the extra columns ("" if none)
};

// Skip reasons (stable names recorded in manifests).
enum class Skip : int {
  kNone = 0,
  kNullMessages,     // messages is NULL
  kEmptyMessages,    // messages is []
  kMalformed,        // messages is not a list of objects with a string role and string/null content
  kNoAssistant,      // no message with role "assistant"
  kEncodeError,      // the chat encoder refused it (e.g. span derivation failed)
  kNoTrainedTokens,  // encoded, but no trained token after position 0 (nothing to learn)
  kTooLong,          // longer than seq_len and --long drop
  kCount
};
const char* skip_name(Skip s);

// Validates and converts a RawConversation. On failure returns Skip != kNone and sets *why.
Skip parse_conversation(const RawConversation& raw, Conversation& conv, std::string* why);
// Canonical JSON of a conversation (sorted keys, null fields dropped): identical for the same conversation
// whatever the input format; its SHA-256 orders conversations before the seeded shuffle.
std::string canonical_json(const Conversation& conv);

}  // namespace olmosft
