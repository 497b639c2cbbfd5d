#include "data/jsonl_input.h"

#include <arrow/buffer.h>
#include <arrow/io/compressed.h>
#include <arrow/io/file.h>
#include <arrow/util/compression.h>

#include <cstring>

#include "core/error.h"

namespace olmosft {

namespace {
bool ends_with(const std::string& s, const char* suf) {
  size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

constexpr int64_t kBlock = 1 << 20;
}  // namespace

struct JsonlInput::Impl {
  std::string path;
  std::unique_ptr<arrow::util::Codec> codec;
  std::shared_ptr<arrow::io::InputStream> in;
  std::string buf;  // bytes read but not yet returned as lines
  size_t pos = 0;
  bool eof = false;
  int64_t line_no = 0;

  explicit Impl(const std::string& p) : path(p) {
    auto f = arrow::io::ReadableFile::Open(p);
    if (!f.ok()) fail("input ", p, ": ", f.status().ToString());
    in = *f;
    arrow::Compression::type c = ends_with(p, ".gz")    ? arrow::Compression::GZIP
                                 : ends_with(p, ".zst") ? arrow::Compression::ZSTD
                                                        : arrow::Compression::UNCOMPRESSED;
    if (c == arrow::Compression::UNCOMPRESSED) return;
    auto cd = arrow::util::Codec::Create(c);
    if (!cd.ok()) fail("input ", p, ": ", cd.status().ToString());
    codec = std::move(*cd);
    auto cs = arrow::io::CompressedInputStream::Make(codec.get(), in);
    if (!cs.ok()) fail("input ", p, ": ", cs.status().ToString());
    in = *cs;
  }

  // Fills buf until it holds a newline after pos, or the input ends. Only the newly read bytes are searched,
  // so a line of L bytes costs O(L), not O(L^2 / kBlock).
  void fill() {
    size_t from = pos;
    while (!eof && buf.find('\n', from) == std::string::npos) {
      if (pos > 0) {
        buf.erase(0, pos);
        pos = 0;
      }
      from = buf.size();
      auto r = in->Read(kBlock);
      if (!r.ok()) fail("input ", path, " (after line ", line_no, "): ", r.status().ToString());
      if ((*r)->size() == 0) {
        eof = true;
        break;
      }
      buf.append(reinterpret_cast<const char*>((*r)->data()), static_cast<size_t>((*r)->size()));
    }
  }

  // The next line without its "\n" (and "\r"); false at the end.
  bool line(std::string& out) {
    fill();
    if (pos >= buf.size()) return false;
    size_t nl = buf.find('\n', pos);
    size_t end = nl == std::string::npos ? buf.size() : nl;
    out.assign(buf, pos, end - pos);
    if (!out.empty() && out.back() == '\r') out.pop_back();
    pos = nl == std::string::npos ? buf.size() : nl + 1;
    ++line_no;
    return true;
  }
};

JsonlInput::JsonlInput(const std::string& path) : impl_(std::make_unique<Impl>(path)) {}
JsonlInput::~JsonlInput() = default;

bool JsonlInput::next(size_t max_lines, std::vector<std::string>& lines, std::vector<int64_t>& numbers) {
  size_t added = 0;
  std::string l;
  while (added < max_lines && impl_->line(l)) {
    if (l.find_first_not_of(" \t") == std::string::npos) continue;
    lines.push_back(std::move(l));
    numbers.push_back(impl_->line_no);
    ++added;
  }
  return added > 0;
}

int64_t JsonlInput::count_lines(const std::string& path) {
  Impl in(path);
  int64_t n = 0;
  std::string l;
  while (in.line(l)) n += l.find_first_not_of(" \t") != std::string::npos;
  return n;
}

}  // namespace olmosft
