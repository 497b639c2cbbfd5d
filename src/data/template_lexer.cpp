// The two lexers of the Jinja2 subset: the template lexer (text / {{ }} / {% %} / {# #} with whitespace
// control, trim_blocks and lstrip_blocks) and the expression lexer (names, numbers, string literals with
// Python escapes, operators).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "core/error.h"
#include "data/template_internal.h"

namespace olmosft::tmpl {

namespace {

// A string literal starting at src[p] (the quote); advances p past the closing quote. Python escapes, incl.
// \xHH, \uHHHH and \UHHHHHHHH (encoded as UTF-8).
std::string lex_string(const std::string& src, size_t& p,
                       const std::function<void(const std::string&)>& err) {
  const size_t n = src.size();
  const char c = src[p];
  std::string s;
  ++p;
  bool closed = false;
  while (p < n) {
    char d = src[p++];
    if (d == c) {
      closed = true;
      break;
    }
    if (d == '\\' && p < n) {
      char e = src[p++];
      switch (e) {
        case 'n':
          s += '\n';
          break;
        case 't':
          s += '\t';
          break;
        case 'r':
          s += '\r';
          break;
        case '\\':
          s += '\\';
          break;
        case '\'':
          s += '\'';
          break;
        case '"':
          s += '"';
          break;
        case '0':
          s += '\0';
          break;
        case 'x':
        case 'u':
        case 'U': {  // \xHH, \uHHHH, \UHHHHHHHH (Python string literal escapes)
          size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (p + len > n) err("truncated \\" + std::string(1, e) + " escape");
          uint32_t cp = 0;
          for (size_t k = 0; k < len; ++k) {
            char h = src[p + k];
            int v = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
            if (v < 0) err("bad \\" + std::string(1, e) + " escape");
            cp = cp * 16 + static_cast<uint32_t>(v);
          }
          p += len;
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) err("escape is not a Unicode scalar value");
          if (cp < 0x80) {
            s += static_cast<char>(cp);
          } else if (cp < 0x800) {
            s += static_cast<char>(0xC0 | (cp >> 6));
            s += static_cast<char>(0x80 | (cp & 0x3F));
          } else if (cp < 0x10000) {
            s += static_cast<char>(0xE0 | (cp >> 12));
            s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            s += static_cast<char>(0x80 | (cp & 0x3F));
          } else {
            s += static_cast<char>(0xF0 | (cp >> 18));
            s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            s += static_cast<char>(0x80 | (cp & 0x3F));
          }
          break;
        }
        default:
          s += '\\';
          s += e;
      }
    } else {
      s += d;
    }
  }
  if (!closed) err("unterminated string literal");
  return s;
}

}  // namespace

std::vector<Tok> lex_expr(const std::string& src, const std::function<void(const std::string&)>& err) {
  std::vector<Tok> out;
  size_t p = 0, n = src.size();
  while (p < n) {
    char c = src[p];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++p;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t b = p;
      while (p < n && (std::isalnum(static_cast<unsigned char>(src[p])) || src[p] == '_')) ++p;
      out.push_back({Tok::Name, src.substr(b, p - b)});
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t b = p;
      while (p < n && (std::isdigit(static_cast<unsigned char>(src[p])) || src[p] == '_')) ++p;
      bool is_float = false;
      if (p + 1 < n && src[p] == '.' && std::isdigit(static_cast<unsigned char>(src[p + 1]))) {
        is_float = true;
        ++p;
        while (p < n && std::isdigit(static_cast<unsigned char>(src[p]))) ++p;
      }
      if (p < n && (src[p] == 'e' || src[p] == 'E')) {
        size_t q = p + 1;
        if (q < n && (src[q] == '+' || src[q] == '-')) ++q;
        if (q < n && std::isdigit(static_cast<unsigned char>(src[q]))) {
          is_float = true;
          p = q;
          while (p < n && std::isdigit(static_cast<unsigned char>(src[p]))) ++p;
        }
      }
      std::string t = src.substr(b, p - b);
      t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
      Tok tk{is_float ? Tok::Float : Tok::Int, t};
      // Python has big integers and reads 1e999 as inf; this engine has 64-bit integers and refuses what
      // does not fit rather than throwing std::out_of_range from stoll/stod.
      errno = 0;
      if (is_float)
        tk.f = std::strtod(t.c_str(), nullptr);
      else
        tk.i = std::strtoll(t.c_str(), nullptr, 10);
      if (errno == ERANGE && !is_float)
        err("integer literal '" + t.substr(0, 40) + "' is out of range (this engine has 64-bit integers)");
      out.push_back(tk);
      continue;
    }
    if (c == '\'' || c == '"') {
      out.push_back({Tok::Str, lex_string(src, p, err)});
      continue;
    }
    static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                ">",  "|",  ".",  ",",  ":",  "(",  ")", "[", "]", "{", "}", "=", nullptr};
    bool found = false;
    for (int k = 0; ops[k]; ++k) {
      size_t l = std::char_traits<char>::length(ops[k]);
      if (src.compare(p, l, ops[k]) == 0) {
        out.push_back({Tok::Op, ops[k]});
        p += l;
        found = true;
        break;
      }
    }
    if (!found) err(std::string("unexpected character '") + c + "' in expression");
  }
  out.push_back({Tok::End, ""});
  return out;
}

// Splits the source into text / output / statement pieces, applying -, + and trim/lstrip_blocks.
std::vector<TplTok> lex_template(const std::string& src, const std::string& origin) {
  std::vector<TplTok> out;
  size_t p = 0, n = src.size();
  int line = 1;
  auto line_at = [&](size_t upto) {
    return line + static_cast<int>(std::count(src.begin() + static_cast<ptrdiff_t>(p),
                                              src.begin() + static_cast<ptrdiff_t>(upto), '\n'));
  };
  bool strip_next_ws = false, trim_next_nl = false;
  while (p <= n) {
    size_t open = std::string::npos;
    for (size_t q = src.find('{', p); q != std::string::npos && q + 1 < n; q = src.find('{', q + 1)) {
      char c = src[q + 1];
      if (c == '{' || c == '%' || c == '#') {
        open = q;
        break;
      }
    }
    size_t text_end = open == std::string::npos ? n : open;
    std::string text = src.substr(p, text_end - p);
    size_t text_start = p;
    if (strip_next_ws) {
      size_t k = text.find_first_not_of(" \t\n\r\f\v");
      text = k == std::string::npos ? "" : text.substr(k);
      text_start = text_end - text.size();
    } else if (trim_next_nl && !text.empty() && text[0] == '\n') {
      text = text.substr(1);
      text_start += 1;
    } else if (trim_next_nl && text.size() >= 2 && text[0] == '\r' && text[1] == '\n') {
      text = text.substr(2);
      text_start += 2;
    }
    strip_next_ws = trim_next_nl = false;
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({TplTok::Text, text, line});
      break;
    }
    char kind = src[open + 1];
    const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    int tag_line = line_at(open);
    size_t inner = open + 2;
    char lmod = inner < n ? src[inner] : 0;
    if (lmod == '-' || lmod == '+') ++inner;
    size_t cl = src.find(close, inner);
    if (cl == std::string::npos) fail(origin, " line ", tag_line, ": unclosed '", src.substr(open, 2), "'");
    size_t inner_end = cl;
    char rmod = inner_end > inner ? src[inner_end - 1] : 0;
    if (rmod == '-' || rmod == '+')
      --inner_end;
    else
      rmod = 0;
    bool block = kind != '{';
    // left side
    if (lmod == '-') {
      size_t k = text.find_last_not_of(" \t\n\r\f\v");
      text = k == std::string::npos ? "" : text.substr(0, k + 1);
    } else if (block && lmod != '+') {  // lstrip_blocks
      size_t nl = text.rfind('\n');
      size_t from = nl == std::string::npos ? 0 : nl + 1;
      bool line_start =
          nl != std::string::npos || text_start == 0 || (text_start > 0 && src[text_start - 1] == '\n');
      if (line_start && text.find_first_not_of(" \t\r\f\v", from) == std::string::npos) text.resize(from);
    }
    if (!text.empty()) out.push_back({TplTok::Text, text, line});
    std::string body = src.substr(inner, inner_end - inner);
    if (kind == '{')
      out.push_back({TplTok::Out, body, tag_line});
    else if (kind == '%')
      out.push_back({TplTok::Stmt, body, tag_line});
    // right side
    if (rmod == '-')
      strip_next_ws = true;
    else if (block && rmod != '+')
      trim_next_nl = true;
    line = line_at(cl + 2);
    p = cl + 2;
  }
  return out;
}

}  // namespace olmosft::tmpl
