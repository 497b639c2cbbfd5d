#include "data/build.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <ostream>
#include <set>

#include "core/error.h"
#include "core/threads.h"
#include "data/conversation_reader.h"
#include "data/dataset.h"
#include "data/pack.h"
#include "data/shuffle.h"
#include "data/source.h"
#include "io/atomic_file.h"
#include "io/hash.h"

namespace fs = std::filesystem;

namespace olmosft {

namespace {

using Clock = std::chrono::steady_clock;

// One greppable line per event on the log stream:
//   progress data-build stage=encode done=12000 total=100000 rate=5321.0/s eta=16.5s elapsed=2.3s
class Progress {
 public:
  Progress(std::ostream* os, std::string stage, int64_t total, std::string unit)
      : os_(os),
        stage_(std::move(stage)),
        unit_(std::move(unit)),
        total_(total),
        start_(Clock::now()),
        last_(start_) {}
  void update(int64_t done, bool final = false) {
    if (!os_) return;
    auto now = Clock::now();
    if (!final && std::chrono::duration<double>(now - last_).count() < 1.0) return;
    last_ = now;
    double el = std::chrono::duration<double>(now - start_).count();
    double rate = el > 0 ? static_cast<double>(done) / el : 0.0;
    char buf[256];
    if (total_ > 0 && rate > 0 && !final) {
      double eta = static_cast<double>(total_ - done) / rate;
      std::snprintf(buf, sizeof buf, "stage=%s %s=%lld/%lld rate=%.1f/s eta=%.1fs elapsed=%.1fs",
                    stage_.c_str(), unit_.c_str(), static_cast<long long>(done),
                    static_cast<long long>(total_), rate, eta, el);
    } else {
      std::snprintf(buf, sizeof buf, "stage=%s %s=%lld rate=%.1f/s elapsed=%.1fs%s", stage_.c_str(),
                    unit_.c_str(), static_cast<long long>(done), rate, el, final ? " done" : "");
    }
    *os_ << "progress data-build " << buf << "\n" << std::flush;
  }

 private:
  std::ostream* os_;
  std::string stage_, unit_;
  int64_t total_;
  Clock::time_point start_, last_;
};

struct Item {
  int64_t offset = 0;  // into Store::tokens / trained
  int32_t length = 0;
  int32_t source = 0;
  int64_t trained = 0;  // trained tokens (mask = 1)
  int64_t targets = 0;  // trained tokens at position >= 1 (those a next-token loss can use)
  bool truncated = false;
  std::array<uint8_t, 32> key{};
};

struct SourceStats {
  int64_t read = 0, kept = 0, dropped = 0, truncated = 0, tokens = 0, trained = 0;
};

struct Encoded {
  Skip skip = Skip::kNone;
  std::string why;
  EncodedConversation ec;
  bool truncated = false;
  std::array<uint8_t, 32> key{};
};

// Removes the temporary build directory unless released.
// The build's temporary directory. While the build runs it holds an exclusive flock on the directory
// itself, so a later build can tell a live build's directory (locked) from one a killed build left behind
// (unlocked; removed by remove_leftover_builds). The lock goes with the process, however it ends.
struct TempDirGuard {
  std::string path;
  int lock_fd = -1;
  ~TempDirGuard() {
    if (!path.empty()) {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
    if (lock_fd >= 0) ::close(lock_fd);
  }
};

// Encoded tokens and masks of kept conversations, appended to two files in the build's temp directory and
// then memory-mapped for packing: the build's memory stays bounded by the OS page cache rather than the
// dataset size.
class TokenSpill {
 public:
  explicit TokenSpill(const std::string& dir)
      : tok_path_(dir + "/tokens.spill"), mask_path_(dir + "/mask.spill") {
    tok_ = std::fopen(tok_path_.c_str(), "wb");
    mask_ = std::fopen(mask_path_.c_str(), "wb");
    OLMO_CHECK(tok_ && mask_, "cannot create spill files in ", dir, ": ", std::strerror(errno));
    std::setvbuf(tok_, nullptr, _IOFBF, 1 << 22);
    std::setvbuf(mask_, nullptr, _IOFBF, 1 << 20);
  }
  ~TokenSpill() {
    if (tok_) std::fclose(tok_);
    if (mask_) std::fclose(mask_);
    if (tok_map_ != MAP_FAILED) ::munmap(tok_map_, static_cast<size_t>(n_) * 4);
    if (mask_map_ != MAP_FAILED) ::munmap(mask_map_, static_cast<size_t>(n_));
  }
  // Returns the offset (in tokens) of the appended conversation.
  int64_t append(const std::vector<int32_t>& tok, const std::vector<uint8_t>& mask) {
    int64_t off = n_;
    std::vector<uint8_t> m(mask.size());
    for (size_t k = 0; k < mask.size(); ++k) m[k] = mask[k] ? 1 : 0;
    bool ok = std::fwrite(tok.data(), 4, tok.size(), tok_) == tok.size() &&
              std::fwrite(m.data(), 1, m.size(), mask_) == m.size();
    OLMO_CHECK(ok, "cannot write spill file ", tok_path_, ": ", std::strerror(errno), " (disk full?)");
    n_ += static_cast<int64_t>(tok.size());
    return off;
  }
  // Flushes, maps both files read-only and unlinks them (the mappings stay valid).
  void seal() {
    OLMO_CHECK(std::fclose(tok_) == 0 && std::fclose(mask_) == 0, "cannot write spill file ", tok_path_, ": ",
               std::strerror(errno));
    tok_ = mask_ = nullptr;
    tok_map_ = map(tok_path_, static_cast<size_t>(n_) * 4);
    mask_map_ = map(mask_path_, static_cast<size_t>(n_));
    ::unlink(tok_path_.c_str());
    ::unlink(mask_path_.c_str());
  }
  const int32_t* tokens() const { return static_cast<const int32_t*>(tok_map_); }
  const uint8_t* mask() const { return static_cast<const uint8_t*>(mask_map_); }

 private:
  static void* map(const std::string& path, size_t bytes) {
    if (bytes == 0) return MAP_FAILED;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    OLMO_CHECK(fd >= 0, "cannot open spill file ", path, ": ", std::strerror(errno));
    void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    OLMO_CHECK(p != MAP_FAILED, "cannot map spill file ", path, ": ", std::strerror(errno));
    return p;
  }
  std::string tok_path_, mask_path_;
  FILE* tok_ = nullptr;
  FILE* mask_ = nullptr;
  void* tok_map_ = MAP_FAILED;
  void* mask_map_ = MAP_FAILED;
  int64_t n_ = 0;
};

void check_out_dir(const std::string& out) {
  OLMO_CHECK(!out.empty(), "--out: an output directory is required");
  std::error_code ec;
  auto st = fs::symlink_status(out, ec);
  if (ec || st.type() == fs::file_type::not_found) return;
  OLMO_CHECK(st.type() == fs::file_type::directory, "--out ", out, ": exists and is not a directory");
  OLMO_CHECK(fs::is_empty(out), "--out ", out,
             ": directory is not empty (the output directory must be new or empty)");
}

nlohmann::json round6(double v) { return std::round(v * 1e6) / 1e6; }

void check_options(const BuildOptions& opts) {
  OLMO_CHECK(opts.seq_len >= 8 && opts.seq_len <= (1 << 20), "--seq-len ", opts.seq_len,
             ": expected 8..1048576");
  OLMO_CHECK(opts.epochs >= 1 && opts.epochs <= 1000, "--epochs ", opts.epochs, ": expected 1..1000");
  OLMO_CHECK(opts.long_policy == "truncate" || opts.long_policy == "drop", "--long ", opts.long_policy,
             ": expected truncate or drop");
  OLMO_CHECK(opts.packing == "first-fit" || opts.packing == "best-fit-decreasing", "--packing ", opts.packing,
             ": expected first-fit or best-fit-decreasing");
}

// Removes ".NAME.building-*" directories next to the output that no running build holds (left by a build
// that was killed: SIGTERM, SIGKILL, a lost node), one log line each; refuses to start while another build
// for the same output is running.
void remove_leftover_builds(const fs::path& out, std::ostream* log) {
  const std::string prefix = "." + out.filename().string() + ".building-";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !e.is_directory(ec) || e.is_symlink(ec)) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0) continue;
    const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (!free) {
      ::close(fd);
      fail("another data build is writing ", out.string(), " (its temporary directory ", e.path().string(),
           " is in use); wait for it or choose another --out");
    }
    uintmax_t bytes = 0;
    for (const auto& f : fs::recursive_directory_iterator(e.path(), ec))
      if (f.is_regular_file(ec)) bytes += f.file_size(ec);
    fs::remove_all(e.path(), ec);
    ::close(fd);
    if (log)
      *log << "data-build removed-leftover dir=" << e.path().string() << " bytes=" << bytes
           << (ec ? " (not all of it: " + ec.message() + ")" : std::string()) << "\n";
  }
}

// Creates the temporary build directory next to the output (published by rename when complete) and locks
// it; guard owns it. Returns the normalised output path.
fs::path make_build_dir(const std::string& out_dir, TempDirGuard& guard, std::ostream* log) {
  fs::path out = fs::absolute(out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();  // "dir/" -> "dir"
  fs::create_directories(out.parent_path());
  remove_leftover_builds(out, log);
  std::string tmpl = (out.parent_path() / ("." + out.filename().string() + ".building-XXXXXX")).string();
  std::vector<char> tb(tmpl.begin(), tmpl.end());
  tb.push_back('\0');
  OLMO_CHECK(::mkdtemp(tb.data()) != nullptr, "cannot create a temporary directory next to ", out.string(),
             ": ", std::strerror(errno));
  guard.path = tb.data();
  ::chmod(guard.path.c_str(), 0755);  // mkdtemp creates 0700
  guard.lock_fd = ::open(guard.path.c_str(), O_RDONLY | O_DIRECTORY);
  OLMO_CHECK(guard.lock_fd >= 0 && ::flock(guard.lock_fd, LOCK_EX | LOCK_NB) == 0, "cannot lock ", guard.path,
             ": ", std::strerror(errno));
  return out;
}

// ---- phase 1: read, validate, encode

// What the encode phase produced: the kept conversations (their tokens and masks in the spill) in read
// order, the sources in order of first appearance, and the counts of what was read and dropped.
struct EncodedSet {
  std::vector<Item> items;
  std::map<std::string, int32_t> source_ids;
  std::vector<std::string> source_names;
  std::vector<SourceStats> sstats;
  std::array<int64_t, static_cast<int>(Skip::kCount)> dropped{};
  std::map<std::string, std::set<std::pair<std::string, std::string>>>
      examples;  // reason -> smallest (id, why)
  int64_t read = 0, truncated = 0;
};

// Validates, hashes and encodes one conversation into r (r.skip says why it is dropped); long conversations
// are truncated to seq_len or dropped per --long.
void encode_one(const RawConversation& raw, const ChatEncoder& enc, const BuildOptions& opts, int64_t vocab,
                Encoded& r) {
  const int64_t N = opts.seq_len;
  Conversation conv;
  r.skip = parse_conversation(raw, conv, &r.why);
  if (r.skip != Skip::kNone) return;
  try {
    std::string canon = canonical_json(conv);
    io::Sha256 h;
    h.update(canon);
    std::string d = h.digest();
    std::memcpy(r.key.data(), d.data(), 32);
    r.ec = enc.encode(conv);
  } catch (const std::exception& e) {
    r.skip = Skip::kEncodeError;
    r.why = e.what();
    return;
  } catch (...) {
    r.skip = Skip::kEncodeError;
    r.why = "the chat encoder threw a non-standard exception";
    return;
  }
  auto& ec = r.ec;
  if (ec.tokens.size() != ec.trained.size()) {
    r.skip = Skip::kEncodeError;
    r.why = "encoder returned " + std::to_string(ec.tokens.size()) + " tokens but " +
            std::to_string(ec.trained.size()) + " mask entries";
    return;
  }
  for (int32_t t : ec.tokens) {
    if (t < 0 || t >= vocab) {
      r.skip = Skip::kEncodeError;
      r.why = "encoder returned token id " + std::to_string(t) + " outside the vocabulary [0, " +
              std::to_string(vocab) + ")";
      break;
    }
  }
  if (r.skip != Skip::kNone) return;
  if (static_cast<int64_t>(ec.tokens.size()) > N) {
    if (opts.long_policy == "drop") {
      r.skip = Skip::kTooLong;
      r.why = std::to_string(ec.tokens.size()) + " tokens > seq_len " + std::to_string(N);
      return;
    }
    ec.tokens.resize(static_cast<size_t>(N));
    ec.trained.resize(static_cast<size_t>(N));
    r.truncated = true;
  }
  bool any = false;
  for (size_t k = 1; k < ec.trained.size(); ++k) any |= ec.trained[k] != 0;
  if (!any) {
    r.skip = Skip::kNoTrainedTokens;
    r.why = r.truncated ? "no trained token within the first seq_len tokens"
                        : "no trained token after position 0";
  }
}

// Counts one encoded conversation against its source; a kept one is appended to the spill and to s.items.
void record(EncodedSet& s, const RawConversation& raw, const Encoded& r, TokenSpill& spill) {
  auto [it, fresh] = s.source_ids.emplace(raw.source, static_cast<int32_t>(s.source_names.size()));
  if (fresh) {
    s.source_names.push_back(raw.source);
    s.sstats.emplace_back();
  }
  SourceStats& ss = s.sstats[it->second];
  ++ss.read;
  ++s.read;
  if (r.skip != Skip::kNone) {
    ++s.dropped[static_cast<int>(r.skip)];
    ++ss.dropped;
    auto& ex = s.examples[skip_name(r.skip)];
    ex.emplace(raw.id, r.why);
    if (ex.size() > 5) ex.erase(std::prev(ex.end()));
    return;
  }
  Item it2;
  it2.offset = spill.append(r.ec.tokens, r.ec.trained);
  it2.length = static_cast<int32_t>(r.ec.tokens.size());
  it2.source = it->second;
  it2.truncated = r.truncated;
  it2.key = r.key;
  for (size_t k = 0; k < r.ec.trained.size(); ++k) {
    it2.trained += r.ec.trained[k] != 0;
    it2.targets += k > 0 && r.ec.trained[k] != 0;
  }
  s.truncated += r.truncated;
  ++ss.kept;
  ss.truncated += r.truncated;
  ss.tokens += it2.length;
  ss.trained += it2.trained;
  s.items.push_back(it2);
}

// Fails, naming the drop reasons and one example, when no conversation was kept.
void check_kept(const EncodedSet& s) {
  if (!s.items.empty()) return;
  std::string why;
  for (int k = 1; k < static_cast<int>(Skip::kCount); ++k) {
    if (s.dropped[k])
      why += std::string(" ") + skip_name(static_cast<Skip>(k)) + "=" + std::to_string(s.dropped[k]);
  }
  std::string example;
  if (!s.examples.empty()) {
    const auto& [reason, ex] = *s.examples.begin();
    example = "; e.g. " + reason + " (row id " + ex.begin()->first + ")" + ": " + ex.begin()->second;
  }
  fail("no conversation kept out of ", s.read, " read", why.empty() ? "" : " (dropped:" + why + ")",
       s.read == 0 ? "; the inputs/selection are empty" : example);
}

// Reads every conversation (batches encoded in parallel, results recorded in read order), then seals the
// spill for packing.
EncodedSet encode_all(ConversationReader& reader, int64_t total_rows, const BuildOptions& opts,
                      const ChatEncoder& enc, TokenSpill& spill) {
  EncodedSet s;
  const int64_t vocab = enc.vocab_size();
  Progress prog(opts.log, "encode", total_rows, "conversations");
  std::vector<RawConversation> batch;
  while (true) {
    batch.clear();
    bool more = reader.next(batch, opts.batch_rows);
    if (batch.empty() && !more) break;
    const int64_t n = static_cast<int64_t>(batch.size());
    std::vector<Encoded> res(static_cast<size_t>(n));
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t i = 0; i < n; ++i) encode_one(batch[i], enc, opts, vocab, res[i]);
    for (int64_t i = 0; i < n; ++i) record(s, batch[i], res[i], spill);
    prog.update(s.read);
    if (!more) break;
  }
  prog.update(s.read, true);
  spill.seal();
  check_kept(s);
  return s;
}

// ---- phase 2: canonical order and source mix

// The conversations each epoch trains on: the kept ones in canonical order (SHA-256 of the canonical
// conversation JSON, then source name: independent of input format and file order), repeated or subsampled
// per source by the --mix weights, copies adjacent.
struct Pool {
  std::vector<std::string> sorted_sources;
  std::vector<int64_t> conv;  // indices into EncodedSet::items
  std::vector<int32_t> len;   // their lengths
  int64_t tokens = 0, trained = 0, targets = 0;
  int64_t bfd_rows = 0;  // rows best-fit-decreasing packing would give (recorded for comparison)
  nlohmann::json mix_json = nlohmann::json::object();
};

std::vector<int64_t> canonical_order(const EncodedSet& s) {
  std::vector<int64_t> canon(s.items.size());
  std::iota(canon.begin(), canon.end(), int64_t{0});
  std::sort(canon.begin(), canon.end(), [&](int64_t a, int64_t b) {
    int c = std::memcmp(s.items[a].key.data(), s.items[b].key.data(), 32);
    if (c != 0) return c < 0;
    return s.source_names[s.items[a].source] < s.source_names[s.items[b].source];
  });
  return canon;
}

Pool mix_pool(const EncodedSet& s, const std::vector<std::pair<std::string, double>>& mix,
              const BuildOptions& opts) {
  const std::vector<int64_t> canon = canonical_order(s);
  Pool P;
  P.sorted_sources = s.source_names;
  std::sort(P.sorted_sources.begin(), P.sorted_sources.end());
  std::map<std::string, double> weight;
  double default_w = 1.0;
  for (const auto& [name, w] : mix) {
    if (name == "*") {
      default_w = w;
      continue;
    }
    if (!s.source_ids.count(name)) {
      std::string avail;
      for (const auto& src : P.sorted_sources) avail += " " + src;
      fail("--mix: unknown source '", name, "'; sources in the selection:", avail);
    }
    weight[name] = w;
  }
  std::vector<int64_t>& pool = P.conv;
  for (size_t si = 0; si < P.sorted_sources.size(); ++si) {
    const std::string& name = P.sorted_sources[si];
    int32_t sid = s.source_ids.at(name);
    std::vector<int64_t> L;
    for (int64_t c : canon) {
      if (s.items[c].source == sid) L.push_back(c);
    }
    double w = weight.count(name) ? weight[name] : default_w;
    auto whole = static_cast<int64_t>(std::floor(w));
    double frac = w - static_cast<double>(whole);
    for (int64_t k = 0; k < whole; ++k) pool.insert(pool.end(), L.begin(), L.end());
    auto m = static_cast<int64_t>(std::llround(frac * static_cast<double>(L.size())));
    if (m > 0) {
      auto perm = seeded_permutation(static_cast<int64_t>(L.size()), opts.seed, mix_subset_stream(si));
      std::vector<int64_t> pick(perm.begin(), perm.begin() + m);
      std::sort(pick.begin(), pick.end());
      for (int64_t p : pick) pool.push_back(L[p]);
    }
    P.mix_json[name] = {
        {"weight", w}, {"kept", L.size()}, {"per_epoch", whole * static_cast<int64_t>(L.size()) + m}};
  }
  OLMO_CHECK(!pool.empty(), "--mix ", opts.mix, ": every source has weight 0; nothing to train on");
  {
    // Pool in canonical order (copies adjacent) so it is independent of how sources were listed.
    std::vector<int64_t> rank(s.items.size());
    for (size_t r = 0; r < canon.size(); ++r) rank[canon[r]] = static_cast<int64_t>(r);
    std::stable_sort(pool.begin(), pool.end(), [&](int64_t a, int64_t b) { return rank[a] < rank[b]; });
  }
  P.len.resize(pool.size());
  for (size_t k = 0; k < pool.size(); ++k) {
    P.len[k] = s.items[pool[k]].length;
    P.tokens += P.len[k];
    P.trained += s.items[pool[k]].trained;
    P.targets += s.items[pool[k]].targets;
  }
  P.bfd_rows = static_cast<int64_t>(pack_best_fit_decreasing(P.len, opts.seq_len).size());
  return P;
}

// ---- phase 3: per epoch, shuffle conversations, pack, shuffle rows, write

// Writes epoch e's row file into dir; returns its manifest entry.
nlohmann::json write_epoch(int e, const EncodedSet& s, const Pool& P, const TokenSpill& spill,
                           const BuildOptions& opts, int32_t pad, const std::string& dir) {
  const int64_t N = opts.seq_len;
  const int64_t rb = row_record_bytes(N);
  const std::vector<int64_t>& pool = P.conv;
  auto perm =
      seeded_permutation(static_cast<int64_t>(pool.size()), opts.seed, conversation_shuffle_stream(e));
  std::vector<int64_t> stream(pool.size());
  std::vector<int32_t> lens(pool.size());
  for (size_t k = 0; k < pool.size(); ++k) {
    stream[k] = pool[perm[k]];
    lens[k] = s.items[stream[k]].length;
  }
  Bins bins = opts.packing == "first-fit" ? pack_first_fit(lens, N) : pack_best_fit_decreasing(lens, N);
  const auto nrows = static_cast<int64_t>(bins.size());
  auto row_perm = seeded_permutation(nrows, opts.seed, row_shuffle_stream(e));
  std::string fname = epoch_file_name(e);
  RowFileWriter w(dir + "/" + fname, e, N, nrows);
  Progress wp(opts.log, "write-epoch-" + std::to_string(e), nrows, "rows");
  const int64_t chunk = std::max<int64_t>(1, (64 << 20) / rb);
  std::vector<uint8_t> buf(static_cast<size_t>(std::min(chunk, std::max<int64_t>(nrows, 1)) * rb));
  std::vector<uint64_t> sums(static_cast<size_t>(std::min(chunk, std::max<int64_t>(nrows, 1))));
  int64_t max_segments = 0;
  for (int64_t r0 = 0; r0 < nrows; r0 += chunk) {
    const int64_t cnt = std::min(chunk, nrows - r0);
    std::string err;
#pragma omp parallel for schedule(dynamic, 1) reduction(max : max_segments)
    for (int64_t r = 0; r < cnt; ++r) {
      const auto& bin = bins[row_perm[r0 + r]];
      std::vector<RowSegment> segs;
      segs.reserve(bin.size());
      for (int64_t k : bin) {
        const Item& it = s.items[stream[k]];
        segs.push_back({spill.tokens() + it.offset, spill.mask() + it.offset, it.length});
      }
      max_segments = std::max<int64_t>(max_segments, static_cast<int64_t>(segs.size()));
      try {
        sums[r] = fill_record(buf.data() + r * rb, N, segs, pad);
      } catch (const std::exception& ex) {
#pragma omp critical
        err = ex.what();
      }
    }
    OLMO_CHECK(err.empty(), err);
    w.add_rows(buf.data(), sums.data(), cnt);
    wp.update(r0 + cnt);
  }
  std::string sum = w.finish();
  wp.update(nrows, true);
  return {{"file", fname},
          {"epoch", e},
          {"rows", nrows},
          {"record_bytes", rb},
          {"file_bytes", kRowsHeaderBytes + nrows * (rb + 8)},
          {"checksums_sha256", sum},
          {"conversations", pool.size()},
          {"tokens", P.tokens},
          {"trained_tokens", P.trained},
          {"target_tokens", P.targets},
          {"max_conversations_per_row", max_segments},
          {"padding_fraction", round6(padding_fraction(P.len, nrows, N))}};
}

// ---- phase 4: manifest and publication

// The manifest's "stats": length histogram of the kept conversations and per-source counts.
nlohmann::json stats_json(const EncodedSet& s, const Pool& P) {
  std::map<int, int64_t> hist;  // bucket b: lengths in [2^b, 2^(b+1))
  for (const Item& it : s.items) hist[std::bit_width(static_cast<uint32_t>(it.length)) - 1]++;
  nlohmann::json hist_json = nlohmann::json::array();
  for (auto [b, c] : hist) {
    hist_json.push_back({{"min", int64_t{1} << b}, {"max", (int64_t{1} << (b + 1)) - 1}, {"count", c}});
  }
  nlohmann::json sources_json = nlohmann::json::object();
  for (const auto& name : P.sorted_sources) {
    const SourceStats& st = s.sstats[s.source_ids.at(name)];
    sources_json[name] = {
        {"read", st.read},
        {"kept", st.kept},
        {"dropped", st.dropped},
        {"truncated", st.truncated},
        {"tokens", st.tokens},
        {"trained_tokens", st.trained},
        {"trained_fraction", round6(st.tokens ? static_cast<double>(st.trained) / st.tokens : 0.0)}};
  }
  return {{"length_histogram", hist_json}, {"sources", sources_json}};
}

nlohmann::json make_manifest(const BuildOptions& opts, const ChatEncoder& enc,
                             const ConversationReader& reader, const std::vector<InputFile>& files,
                             const EncodedSet& s, const Pool& P, const nlohmann::json& epoch_files,
                             int64_t rows) {
  nlohmann::json dropped_json = nlohmann::json::object();
  for (int k = 1; k < static_cast<int>(Skip::kCount); ++k)
    dropped_json[skip_name(static_cast<Skip>(k))] = s.dropped[k];
  nlohmann::json examples_json = nlohmann::json::object();
  for (const auto& [reason, ex] : s.examples) {
    for (const auto& [id, why] : ex) examples_json[reason].push_back({{"id", id}, {"error", why}});
  }
  nlohmann::json inputs_json = nlohmann::json::array();
  for (const auto& f : files) {
    inputs_json.push_back({{"path", f.path}, {"kind", f.kind}, {"size", f.size}, {"sha256", f.sha256}});
  }
  int64_t kept_tokens = 0;
  for (const Item& it : s.items) kept_tokens += it.length;
  const int64_t dropped_total = std::accumulate(s.dropped.begin(), s.dropped.end(), int64_t{0});
  const int64_t N = opts.seq_len;

  nlohmann::json m;
  m["format"] = "olmosft-packed-sft";
  m["format_version"] = kManifestFormatVersion;
  m["row_format_version"] = kRowsFormatVersion;
  m["created_by"] = "olmosft data build (" + reader.readers() + ")";
  m["inputs"] = inputs_json;
  m["dataset_revision"] = opts.revision;
  m["tokenizer"] = {{"spec", opts.tokenizer_spec},
                    {"tokenizer_sha256", enc.tokenizer_hash()},
                    {"template_sha256", enc.template_hash()},
                    {"vocab_size", enc.vocab_size()},
                    {"eos_id", enc.eos_id()},
                    {"pad_id", enc.pad_id()}};
  m["selection"] = {{"sql", opts.sql},
                    {"source_expression", reader.source_expression()},
                    {"mix", opts.mix},
                    {"mix_per_source", P.mix_json}};
  m["seed"] = opts.seed;
  m["seq_len"] = N;
  m["epochs"] = opts.epochs;
  m["long_conversations"] = opts.long_policy;
  m["packing"] = {{"algorithm", opts.packing},
                  {"row_order", "seeded permutation of packed rows (stream 2*epoch+1)"},
                  {"best_fit_decreasing_rows", P.bfd_rows},
                  {"best_fit_decreasing_padding_fraction", round6(padding_fraction(P.len, P.bfd_rows, N))}};
  m["counts"] = {{"conversations_read", s.read},
                 {"conversations_kept", static_cast<int64_t>(s.items.size())},
                 {"conversations_dropped", dropped_total},
                 {"dropped", dropped_json},
                 {"truncated", s.truncated},
                 {"conversations_per_epoch", P.conv.size()},
                 {"rows", rows},
                 {"kept_tokens", kept_tokens},
                 {"trained_tokens_per_epoch", P.trained},
                 {"padding_fraction", epoch_files[0]["padding_fraction"]}};
  m["skipped_examples"] = examples_json;
  m["epoch_files"] = epoch_files;
  m["stats"] = stats_json(s, P);
  return m;
}

// Renames the complete temporary directory onto the output path (an existing empty directory is replaced)
// and syncs the parent directory.
void publish(const std::string& out_dir, const fs::path& out, TempDirGuard& guard) {
  const std::string tmp = guard.path;
  check_out_dir(out_dir);
  if (::rename(tmp.c_str(), out.c_str()) != 0) {
    fail("cannot move the finished dataset from ", tmp, " to ", out.string(), ": ", std::strerror(errno));
  }
  guard.path.clear();
  int fd = ::open(out.parent_path().c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

std::vector<std::pair<std::string, double>> parse_mix(const std::string& spec) {
  std::vector<std::pair<std::string, double>> out;
  if (spec.empty()) return out;
  std::set<std::string> seen;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string part = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t eq = part.rfind('=');
    OLMO_CHECK(eq != std::string::npos && eq > 0, "--mix: '", part, "' is not SOURCE=WEIGHT");
    std::string name = part.substr(0, eq), w = part.substr(eq + 1);
    char* end = nullptr;
    double v = std::strtod(w.c_str(), &end);
    OLMO_CHECK(!w.empty() && end == w.c_str() + w.size() && std::isfinite(v) && v >= 0 && v <= 1000,
               "--mix: weight '", w, "' of ", name, " is not a number in [0, 1000]");
    OLMO_CHECK(seen.insert(name).second, "--mix: source ", name, " given twice");
    out.emplace_back(name, v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

nlohmann::json build_dataset(const BuildOptions& opts, const ChatEncoder& enc) {
  const auto t0 = Clock::now();
  check_options(opts);
  auto mix = parse_mix(opts.mix);
  check_out_dir(opts.out_dir);
  std::ostream* log = opts.log;

  auto files = resolve_inputs(opts.inputs);
  {
    Progress p(log, "hash", static_cast<int64_t>(files.size()), "files");
    hash_inputs(files);
    p.update(static_cast<int64_t>(files.size()), true);
  }
  TempDirGuard guard;
  const fs::path out = make_build_dir(opts.out_dir, guard, log);
  const std::string tmp = guard.path;

  SourceOptions so;
  so.sql = opts.sql;
  so.source_column = opts.source_column;
  so.work_dir = tmp;
  so.threads = std::max(1, num_threads());
  ConversationReader reader(files, so);
  const int64_t total_rows = reader.count_rows();

  TokenSpill spill(tmp);
  const EncodedSet s = encode_all(reader, total_rows, opts, enc, spill);
  const Pool P = mix_pool(s, mix, opts);
  nlohmann::json epoch_files = nlohmann::json::array();
  int64_t total_rows_written = 0;
  for (int e = 0; e < opts.epochs; ++e) {
    epoch_files.push_back(write_epoch(e, s, P, spill, opts, enc.pad_id(), tmp));
    total_rows_written += epoch_files.back()["rows"].get<int64_t>();
  }
  nlohmann::json m = make_manifest(opts, enc, reader, files, s, P, epoch_files, total_rows_written);
  io::write_file_atomic(tmp + "/manifest.json", m.dump(2) + "\n");
  publish(opts.out_dir, out, guard);
  if (log) {
    double el = std::chrono::duration<double>(Clock::now() - t0).count();
    char buf[256];
    std::snprintf(buf, sizeof buf, "stage=done conversations=%lld kept=%lld rows=%lld elapsed=%.1fs",
                  static_cast<long long>(s.read), static_cast<long long>(s.items.size()),
                  static_cast<long long>(total_rows_written), el);
    *log << "progress data-build " << buf << "\n" << std::flush;
  }
  return m;
}

}  // namespace olmosft
