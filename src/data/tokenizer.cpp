// Byte-level BPE (see tokenizer.h). The pre-tokenizer regex is PCRE2 with UTF + UCP and the JIT.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/tokenizer_util.h"
#include "io/atomic_file.h"
#include "io/json.h"

namespace olmosft {

const char* const kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------------- UTF-8

namespace {
// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 if invalid; on invalid, *bad is the
// length of the maximal invalid subpart to replace by one U+FFFD (WHATWG decoder / Unicode "best practice").
size_t utf8_seq(const unsigned char* s, size_t n, size_t i, size_t* bad) {
  unsigned char c = s[i];
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *bad = 1;
    return 0;
  }
  size_t k = 1;
  for (; k <= need; ++k) {
    if (i + k >= n) break;
    unsigned char d = s[i + k];
    if (d < lo || d > hi) break;
    lo = 0x80;
    hi = 0xBF;
  }
  if (k == need + 1) return need + 1;
  *bad = k;  // lead byte plus the valid continuation bytes seen before the failure
  return 0;
}
}  // namespace

bool is_valid_utf8(std::string_view sv) {
  auto s = reinterpret_cast<const unsigned char*>(sv.data());
  size_t n = sv.size(), i = 0, bad = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    size_t l = utf8_seq(s, n, i, &bad);
    if (!l) return false;
    i += l;
  }
  return true;
}

std::string sanitize_utf8(std::string_view sv) {
  if (is_valid_utf8(sv)) return std::string(sv);
  auto s = reinterpret_cast<const unsigned char*>(sv.data());
  size_t n = sv.size(), i = 0;
  std::string out;
  out.reserve(n + 16);
  while (i < n) {
    size_t bad = 0, l = utf8_seq(s, n, i, &bad);
    if (l) {
      out.append(sv.data() + i, l);
      i += l;
    } else {
      out += "\xEF\xBF\xBD";
      i += bad;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------- regex

// HF tokenizers runs Split regexes on Oniguruma, whose \s (Unicode) is the White_Space property. PCRE2's \s
// with PCRE2_UCP also matches U+180E (MONGOLIAN VOWEL SEPARATOR, a space before Unicode 6.3), which changes
// the pieces of text containing it. So \s and \S are compiled as \p{White_Space} and \P{White_Space}
// (PCRE2 >= 10.40; both forms also work inside character classes). Other escapes are copied as they are.
namespace {
std::string pcre2_pattern(const std::string& hf) {
  std::string out;
  out.reserve(hf.size() + 64);
  for (size_t i = 0; i < hf.size(); ++i) {
    if (hf[i] != '\\' || i + 1 == hf.size()) {
      out += hf[i];
      continue;
    }
    char c = hf[++i];
    if (c == 's') {
      out += "\\p{White_Space}";
    } else if (c == 'S') {
      out += "\\P{White_Space}";
    } else {
      out += '\\';
      out += c;
    }
  }
  return out;
}
}  // namespace

class Regex {
 public:
  explicit Regex(const std::string& hf_pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    const std::string pattern = pcre2_pattern(hf_pattern);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                          &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof buf);
      fail("pre-tokenizer regex does not compile (PCRE2, offset ", off, "): ", reinterpret_cast<char*>(buf),
           "; pattern: ", pattern);
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls fn(begin, end, is_match) for every match and every gap between matches, in order.
  template <typename F>
  void split(std::string_view text, F&& fn) const {
    thread_local struct Scratch {
      pcre2_match_data* md = nullptr;
      pcre2_match_context* mc = nullptr;
      pcre2_jit_stack* js = nullptr;
      ~Scratch() {
        if (md) pcre2_match_data_free(md);
        if (mc) pcre2_match_context_free(mc);
        if (js) pcre2_jit_stack_free(js);
      }
    } scratch;
    if (!scratch.md) {
      scratch.md = pcre2_match_data_create(4, nullptr);
      scratch.mc = pcre2_match_context_create(nullptr);
      scratch.js = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
      pcre2_jit_stack_assign(scratch.mc, nullptr, scratch.js);
    }
    auto subj = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t n = text.size(), pos = 0, gap = 0;
    while (pos <= n) {
      int rc = jit_ ? pcre2_jit_match(code_, subj, n, pos, 0, scratch.md, scratch.mc)
                    : pcre2_match(code_, subj, n, pos, PCRE2_NO_UTF_CHECK, scratch.md, scratch.mc);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(rc, buf, sizeof buf);
        fail("pre-tokenizer regex failed on a ", n, "-byte text: ", reinterpret_cast<char*>(buf));
      }
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.md);
      size_t b = ov[0], e = ov[1];
      if (e == b) {  // empty match: skip one character
        if (b >= n) break;
        size_t step = 1;
        while (b + step < n && (static_cast<unsigned char>(text[b + step]) & 0xC0) == 0x80) ++step;
        pos = b + step;
        continue;
      }
      if (b > gap) fn(gap, b, false);
      fn(b, e, true);
      pos = gap = e;
    }
    if (gap < n) fn(gap, n, false);
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// ---------------------------------------------------------------------------------------------- byte level

namespace {
// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 + k.
const std::array<uint32_t, 256>& byte_to_cp() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> m{};
    uint32_t k = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      m[b] = printable ? static_cast<uint32_t>(b) : 256 + k++;
    }
    return m;
  }();
  return t;
}

// Byte-level string (as stored in tokenizer.json vocab/merges) -> raw bytes; false if a character is
// outside the 256-character byte alphabet.
bool unbyte_level(const std::string& s, std::string& out) {
  static const std::unordered_map<uint32_t, unsigned char> inv = [] {
    std::unordered_map<uint32_t, unsigned char> m;
    for (int b = 0; b < 256; ++b) m[byte_to_cp()[b]] = static_cast<unsigned char>(b);
    return m;
  }();
  out.clear();
  auto p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0, bad = 0;
  while (i < n) {
    size_t l = utf8_seq(p, n, i, &bad);
    if (!l) return false;
    uint32_t cp = l == 1   ? p[i]
                  : l == 2 ? ((p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F)
                  : l == 3 ? ((p[i] & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F)
                           : ((p[i] & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) | ((p[i + 2] & 0x3F) << 6) |
                                 (p[i + 3] & 0x3F);
    auto it = inv.find(cp);
    if (it == inv.end()) return false;
    out += static_cast<char>(it->second);
    i += l;
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------- Tokenizer

namespace {
std::atomic<uint64_t> g_next_instance{1};
}

Tokenizer::Tokenizer() : instance_id_(g_next_instance.fetch_add(1)) {
  std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

void Tokenizer::finish_setup() {
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_id_.find(std::string(1, static_cast<char>(b)));
    if (it == bytes_id_.end()) fail("byte-level vocabulary lacks a token for byte ", b);
    byte_id_[b] = it->second;
  }
  int32_t max_id = -1;
  for (auto& [b, id] : bytes_id_) max_id = std::max(max_id, id);
  for (auto& a : added_) max_id = std::max(max_id, a.id);
  // The id -> bytes table has max_id + 1 slots: an id far beyond the number of tokens (2^31 - 1 in a small
  // vocab) would allocate gigabytes for holes. Real vocabularies are dense (HF adds tokens at the end).
  const size_t entries = bytes_id_.size() + added_.size();
  if (static_cast<size_t>(max_id) >= 2 * entries + 1024)
    fail("token id ", max_id, " is far beyond the ", entries,
         " tokens of the vocabulary and added tokens (ids must be nearly dense)");
  id_bytes_.assign(static_cast<size_t>(max_id) + 1, std::string());
  special_flag_.assign(id_bytes_.size(), 0);
  for (auto& [b, id] : bytes_id_) id_bytes_[id] = b;
  for (auto& a : added_) {
    id_bytes_[a.id] = a.content;
    special_flag_[a.id] = a.special ? 1 : 0;
  }
  // Longest first, so that matching at a position prefers the longest added token (HF: leftmost-longest).
  std::stable_sort(added_.begin(), added_.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  if (!pattern_.empty()) regex_ = std::make_unique<Regex>(pattern_);
}

Tokenizer Tokenizer::from_hf_json_file(const std::string& path) {
  return from_hf_json(io::read_file(path), path);
}

// Reads the parts of an HF tokenizer.json into a Tokenizer (a friend of it: it fills the private tables).
// Every failure names the origin and the key.
struct HfJsonLoader {
  using json = nlohmann::json;
  Tokenizer& t;
  const std::string& origin;
  std::string desc;  // the pre-tokenizer part of the description
  bool byte_level = false;

  std::string where(const std::string& k) const { return origin + ": " + k; }

  // obj[key] as a string / flag, `def` when absent or null; anything else is an error naming `section.key`
  // (json::value() threw nlohmann's type_error for a wrong type or a non-object).
  std::string str_of(const json& obj, const char* section, const char* key,
                     const std::string& def = "") const {
    const json* v = field(obj, section, key);
    if (!v) return def;
    if (!v->is_string())
      fail(where(std::string(section) + "." + key), ": expected a string, got ", io::json_excerpt(*v));
    return v->get<std::string>();
  }
  bool flag_of(const json& obj, const char* section, const char* key, bool def) const {
    const json* v = field(obj, section, key);
    if (!v) return def;
    if (!v->is_boolean())
      fail(where(std::string(section) + "." + key), ": expected true or false, got ", io::json_excerpt(*v));
    return v->get<bool>();
  }
  const json* field(const json& obj, const char* section, const char* key) const {
    if (!obj.is_object()) fail(where(section), ": expected an object, got ", io::json_excerpt(obj));
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }

  void normalizer(const json& j) {
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      const json& nz = j["normalizer"];
      bool ok = nz.is_object() && str_of(nz, "normalizer", "type") == "Sequence" &&
                nz.contains("normalizers") && nz["normalizers"].is_array() && nz["normalizers"].empty();
      if (!ok)
        fail(where("normalizer"), ": unsupported normalizer ", nz.dump().substr(0, 200),
             " (only null is implemented; a normalizer would change ids silently)");
    }
  }

  // model.type and its flags, then model.vocab.
  void model(const json& m) {
    std::string mtype = str_of(m, "model", "type");
    if (mtype.empty() && m.contains("merges")) mtype = "BPE";
    if (mtype != "BPE")
      fail(where("model.type"), ": unsupported tokenizer model '", mtype,
           "' (only byte-level BPE is implemented; WordPiece/Unigram/WordLevel are not)");
    if (flag_of(m, "model", "byte_fallback", false))
      fail(where("model.byte_fallback"), ": byte_fallback BPE is not supported");
    if (m.contains("dropout") && !m["dropout"].is_null())
      fail(where("model.dropout"), ": BPE dropout is not supported");
    if (!str_of(m, "model", "continuing_subword_prefix").empty() ||
        !str_of(m, "model", "end_of_word_suffix").empty())
      fail(where("model"), ": continuing_subword_prefix/end_of_word_suffix are not supported");
    if (!m.contains("vocab") || !m["vocab"].is_object()) fail(where("model.vocab"), ": expected an object");
    std::string raw;
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
      if (!it.value().is_number_integer())
        fail(where("model.vocab"), ": id of '", it.key(), "' is not an integer");
      int64_t id = it.value().get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max()) fail(where("model.vocab"), ": bad id ", id);
      if (!unbyte_level(it.key(), raw))
        fail(where("model.vocab"), ": token '", it.key(),
             "' is not in the byte-level alphabet (not a byte-level BPE; unsupported)");
      t.bytes_id_[raw] = static_cast<int32_t>(id);
    }
  }

  // model.merges ("left right" strings or [left, right] pairs) and model.ignore_merges; returns the count.
  uint32_t merges(const json& m) {
    if (!m.contains("merges") || !m["merges"].is_array()) fail(where("model.merges"), ": expected an array");
    std::string lb, rb;
    uint32_t rank = 0;
    for (const json& mg : m["merges"]) {
      std::string l, r;
      if (mg.is_string()) {
        const std::string& s = mg.get_ref<const std::string&>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          fail(where("model.merges"), "[", rank, "]: expected 'left right', got '", s, "'");
        l = s.substr(0, sp);
        r = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
        l = mg[0].get<std::string>();
        r = mg[1].get<std::string>();
      } else {
        fail(where("model.merges"), "[", rank, "]: expected a string or a pair of strings");
      }
      if (!unbyte_level(l, lb) || !unbyte_level(r, rb))
        fail(where("model.merges"), "[", rank, "]: not byte-level encoded");
      auto li = t.bytes_id_.find(lb), ri = t.bytes_id_.find(rb), mi = t.bytes_id_.find(lb + rb);
      if (li == t.bytes_id_.end() || ri == t.bytes_id_.end() || mi == t.bytes_id_.end())
        fail(where("model.merges"), "[", rank, "]: '", l, " ", r,
             "' refers to a token missing from the vocab");
      uint64_t key = (static_cast<uint64_t>(li->second) << 32) | static_cast<uint32_t>(ri->second);
      t.merges_.emplace(key, (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(mi->second));
      ++rank;
    }
    t.whole_piece_lookup_ = flag_of(m, "model", "ignore_merges", false);
    return rank;
  }

  void split(const json& p) {
    if (!p.contains("pattern") || !p["pattern"].is_object() || !p["pattern"].contains("Regex"))
      fail(where("pre_tokenizer"), ": Split with a non-regex pattern is not supported");
    std::string beh = str_of(p, "pre_tokenizer", "behavior");
    bool inv = flag_of(p, "pre_tokenizer", "invert", false);
    if (beh == "Removed" && inv) {
      t.split_keep_gaps_ = false;
    } else if (beh == "Isolated" && !inv) {
      t.split_keep_gaps_ = true;
    } else {
      fail(where("pre_tokenizer"), ": Split behavior '", beh, "' with invert=", inv,
           " is not supported (Removed+invert or Isolated)");
    }
    if (!t.pattern_.empty()) fail(where("pre_tokenizer"), ": more than one regex split is not supported");
    t.pattern_ = str_of(p["pattern"], "pre_tokenizer.pattern", "Regex");
    desc += "Split(regex) + ";
  }

  void bytelevel(const json& p) {
    if (flag_of(p, "pre_tokenizer", "add_prefix_space", false))
      fail(where("pre_tokenizer"), ": ByteLevel add_prefix_space=true is not supported");
    if (flag_of(p, "pre_tokenizer", "use_regex", true)) {
      if (!t.pattern_.empty())
        fail(where("pre_tokenizer"), ": ByteLevel use_regex=true after a Split is not supported");
      t.pattern_ = kGpt2Pattern;
      desc += "ByteLevel(GPT-2 regex)";
    } else {
      desc += "ByteLevel";
    }
    byte_level = true;
  }

  // pre_tokenizer: ByteLevel, or a Sequence of an optional regex Split then ByteLevel.
  void pre_tokenizer(const json& j) {
    const json pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
    if (pre.is_null())
      fail(where("pre_tokenizer"), ": missing (a byte-level BPE needs a ByteLevel pre-tokenizer)");
    std::string ptype = str_of(pre, "pre_tokenizer", "type");
    if (ptype == "ByteLevel") {
      bytelevel(pre);
    } else if (ptype == "Sequence") {
      const json* steps = field(pre, "pre_tokenizer", "pretokenizers");
      if (steps && !steps->is_array())
        fail(where("pre_tokenizer.pretokenizers"), ": expected a list, got ", io::json_excerpt(*steps));
      for (const json& p : steps ? *steps : json::array()) {
        std::string ty = str_of(p, "pre_tokenizer.pretokenizers[]", "type");
        if (byte_level) fail(where("pre_tokenizer"), ": a pre-tokenizer after ByteLevel is not supported");
        if (ty == "Split") {
          split(p);
        } else if (ty == "ByteLevel") {
          bytelevel(p);
        } else {
          fail(where("pre_tokenizer"), ": unsupported pre-tokenizer '", ty, "' in Sequence");
        }
      }
    } else {
      fail(where("pre_tokenizer"), ": unsupported pre-tokenizer '", ptype, "'");
    }
    if (!byte_level) fail(where("pre_tokenizer"), ": no ByteLevel step (only byte-level BPE is supported)");
  }

  void decoder(const json& j) {
    if (j.contains("decoder") && !j["decoder"].is_null() &&
        str_of(j["decoder"], "decoder", "type") != "ByteLevel")
      fail(where("decoder"), ": unsupported decoder '", str_of(j["decoder"], "decoder", "type"),
           "' (ByteLevel expected)");
  }

  void added_tokens(const json& j) {
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      size_t k = 0;
      for (const json& a : j["added_tokens"]) {
        AddedToken at;
        try {
          const json& id = a.at("id");
          if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX ||
              (id.is_number_unsigned() && id.get<uint64_t>() > INT32_MAX))
            fail(where("added_tokens"), "[", k, "].id: expected an integer in [0, 2^31), got ",
                 io::json_excerpt(id));
          at.id = id.get<int32_t>();
          at.content = a.at("content").get<std::string>();
          at.special = flag_of(a, "added_tokens[]", "special", false);
          at.lstrip = flag_of(a, "added_tokens[]", "lstrip", false);
          at.rstrip = flag_of(a, "added_tokens[]", "rstrip", false);
        } catch (const json::exception& e) {
          fail(where("added_tokens"), "[", k, "]: ", e.what());
        }
        if (flag_of(a, "added_tokens[]", "single_word", false))
          fail(where("added_tokens"), "[", k, "] '", at.content, "': single_word=true is not supported");
        if (at.content.empty() || at.id < 0)
          fail(where("added_tokens"), "[", k, "]: empty content or negative id");
        // An added token whose content is also a model token with the same id is just a marker on it.
        t.added_.push_back(at);
        ++k;
      }
    }
    for (auto& a : t.added_) {
      auto it = t.bytes_id_.find(a.content);
      if (it != t.bytes_id_.end() && it->second != a.id)
        fail(where("added_tokens"), ": '", a.content, "' has id ", a.id, " but the vocab says ", it->second);
    }
  }
};

Tokenizer Tokenizer::from_hf_json(const std::string& json_text, const std::string& origin) {
  using nlohmann::json;
  const json j = io::parse_json(json_text, origin);
  if (!j.is_object() || !j.contains("model")) fail(origin, ": not an HF tokenizer.json (no \"model\")");
  Tokenizer t;
  HfJsonLoader ld{t, origin, {}, false};
  ld.normalizer(j);
  const json& m = j["model"];
  ld.model(m);
  uint32_t rank = ld.merges(m);
  std::string desc = "HF BPE (" + std::to_string(t.bytes_id_.size()) + " vocab, " + std::to_string(rank) +
                     " merges), pre-tokenizer: ";
  ld.pre_tokenizer(j);
  ld.decoder(j);
  ld.added_tokens(j);
  t.finish_setup();
  desc += ld.desc + ", " + std::to_string(t.added_.size()) + " added tokens";
  t.description_ = desc;
  return t;
}

int32_t Tokenizer::token_to_id(std::string_view bytes) const {
  for (auto& a : added_)
    if (a.content == bytes) return a.id;
  auto it = bytes_id_.find(std::string(bytes));
  return it == bytes_id_.end() ? -1 : it->second;
}

const std::string& Tokenizer::id_to_bytes(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_bytes_.size()))
    fail("token id ", id, " outside the vocabulary");
  return id_bytes_[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < static_cast<int32_t>(special_flag_.size()) && special_flag_[id];
}

void Tokenizer::bpe_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (whole_piece_lookup_) {
    thread_local std::string key;
    key.assign(piece.data(), piece.size());
    auto it = bytes_id_.find(key);
    if (it != bytes_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Per-thread cache of recent pieces (words repeat a lot); keyed by this tokenizer's instance id so
  // tokenizers never see each other's entries. Bounded: cleared when it grows past kCacheMax entries.
  constexpr size_t kCacheMax = 1 << 16;
  thread_local uint64_t cache_owner = 0;
  thread_local std::unordered_map<std::string, std::vector<int32_t>> cache;
  if (cache_owner != instance_id_ || cache.size() > kCacheMax) {
    cache.clear();
    cache_owner = instance_id_;
  }
  thread_local std::string key;
  key.assign(piece.data(), piece.size());
  auto it = cache.find(key);
  if (it != cache.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  size_t before = out.size();
  bpe_merge(piece, std::numeric_limits<uint32_t>::max(), out);
  if (piece.size() <= 64)
    cache.emplace(key, std::vector<int32_t>(out.begin() + static_cast<ptrdiff_t>(before), out.end()));
}

// Merges a piece's bytes by rank: the lowest-ranked adjacent pair first, the leftmost on ties (HF tokenizers'
// word.rs merge order). Parts form a linked list over the byte positions and candidate pairs sit in a
// min-heap keyed by (rank, left position), so a piece of n bytes costs O(n log n): a linear scan for the
// best pair per merge was quadratic (a 256 KiB run of one character took minutes). A heap entry is stale
// once either of its parts has merged; it is then skipped.
void Tokenizer::bpe_merge(std::string_view piece, uint32_t max_rank, std::vector<int32_t>& out) const {
  struct Cand {
    uint64_t key;  // rank << 32 | left position: the heap's order
    uint32_t right;
    int32_t left_id, right_id, merged;
    bool operator>(const Cand& o) const { return key > o.key; }
  };
  thread_local std::vector<int32_t> id;
  thread_local std::vector<uint32_t> next, prev;
  thread_local std::vector<Cand> heap;
  constexpr uint32_t kEnd = std::numeric_limits<uint32_t>::max();
  const uint32_t n = static_cast<uint32_t>(piece.size());
  id.resize(n);
  next.resize(n);
  prev.resize(n);
  heap.clear();
  for (uint32_t i = 0; i < n; ++i) {
    id[i] = byte_id_[static_cast<unsigned char>(piece[i])];
    next[i] = i + 1 < n ? i + 1 : kEnd;
    prev[i] = i > 0 ? i - 1 : kEnd;
  }
  auto push = [&](uint32_t left) {
    const uint32_t right = next[left];
    if (left == kEnd || right == kEnd) return;
    const uint64_t pair = (static_cast<uint64_t>(id[left]) << 32) | static_cast<uint32_t>(id[right]);
    auto it = merges_.find(pair);
    if (it == merges_.end() || (it->second >> 32) >= max_rank) return;
    heap.push_back({(it->second & ~uint64_t{0xFFFFFFFFu}) | left, right, id[left], id[right],
                    static_cast<int32_t>(it->second & 0xFFFFFFFFu)});
    std::push_heap(heap.begin(), heap.end(), std::greater<Cand>());
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Cand>());
    const Cand c = heap.back();
    heap.pop_back();
    const uint32_t left = static_cast<uint32_t>(c.key & 0xFFFFFFFFu);
    if (next[left] != c.right || id[left] != c.left_id || id[c.right] != c.right_id) continue;  // stale
    id[left] = c.merged;
    next[left] = next[c.right];
    if (next[left] != kEnd) prev[next[left]] = left;
    next[c.right] = kEnd;
    id[c.right] = -1;  // unlinked
    push(left);
    if (prev[left] != kEnd) push(prev[left]);
  }
  for (uint32_t i = n == 0 ? kEnd : 0; i != kEnd; i = next[i]) out.push_back(id[i]);
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  if (!regex_) {
    bpe_piece(text, out);
    return;
  }
  regex_->split(text, [&](size_t b, size_t e, bool is_match) {
    if (is_match || split_keep_gaps_) bpe_piece(text.substr(b, e - b), out);
  });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text_in, bool allow_special, bool strict_utf8) const {
  std::string fixed;
  std::string_view text = text_in;
  if (!is_valid_utf8(text)) {
    if (strict_utf8) fail("text is not valid UTF-8 (", text.size(), " bytes)");
    fixed = sanitize_utf8(text);
    text = fixed;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  bool any = false;
  for (auto& a : added_) any |= allow_special || !a.special;
  if (!any) {
    encode_ordinary(text, out);
    return out;
  }
  auto is_ws = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  };
  size_t seg = 0, i = 0, n = text.size();
  while (i < n) {
    const AddedToken* hit = nullptr;
    for (auto& a : added_) {
      if (a.special && !allow_special) continue;
      if (a.content[0] == text[i] && text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t seg_end = i, next = i + hit->content.size();
    if (hit->lstrip)
      while (seg_end > seg && is_ws(text[seg_end - 1])) --seg_end;
    if (hit->rstrip)
      while (next < n && is_ws(text[next])) ++next;
    encode_ordinary(text.substr(seg, seg_end - seg), out);
    out.push_back(hit->id);
    seg = i = next;
  }
  encode_ordinary(text.substr(seg), out);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    out += id_to_bytes(id);
  }
  return out;
}

std::vector<BpeMerge> Tokenizer::merges() const {
  std::vector<std::pair<uint64_t, uint64_t>> v(merges_.begin(), merges_.end());
  std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
  std::vector<BpeMerge> out;
  out.reserve(v.size());
  for (auto& [key, val] : v)
    out.push_back({static_cast<int32_t>(key >> 32), static_cast<int32_t>(key & 0xFFFFFFFFu),
                   static_cast<int32_t>(val & 0xFFFFFFFFu)});
  return out;
}

std::vector<int32_t> Tokenizer::bpe_bytes(std::string_view bytes, uint32_t max_rank) const {
  std::vector<int32_t> out;
  if (!bytes.empty()) bpe_merge(bytes, max_rank, out);
  return out;
}

}  // namespace olmosft
