// The template value model (see template_internal.h): conversion from JSON, Python str()/repr(), HF's
// tojson, truthiness and equality.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "data/template_internal.h"

namespace olmosft::tmpl {

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (auto& x : j) l.push_back(from_json(x));
      return Value::make_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), from_json(it.value()));
      return Value::make_dict(std::move(d));
    }
    default:
      fail("unsupported JSON value in template variables");
  }
}

std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x);
  std::string s(buf, r.ptr);
  // Python repr: scientific when exponent < -4 or >= 16; to_chars picks the shortest form instead.
  int exp10 = x == 0 ? 0 : static_cast<int>(std::floor(std::log10(std::fabs(x))));
  if (exp10 < -4 || exp10 >= 16) {
    r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
    s.assign(buf, r.ptr);
    auto e = s.find('e');
    std::string mant = s.substr(0, e), ex = s.substr(e + 1);
    char sign = ex[0] == '-' ? '-' : '+';
    if (ex[0] == '-' || ex[0] == '+') ex = ex.substr(1);
    while (ex.size() > 1 && ex[0] == '0') ex = ex.substr(1);
    if (ex.size() < 2) ex = "0" + ex;
    return mant + "e" + sign + ex;
  }
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

namespace {

std::string py_repr_str(const std::string& s) {
  bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
  char q = has_sq && !has_dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == static_cast<unsigned char>(q))
      out += std::string("\\") + static_cast<char>(q);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else
      out += static_cast<char>(c);
  }
  return out + q;
}

}  // namespace

std::string to_str(const Value& v) {  // Python str()
  switch (v.kind) {
    case Value::Undef:
      return "";
    case Value::None:
      return "None";
    case Value::Bool:
      return v.b ? "True" : "False";
    case Value::Int:
      return std::to_string(v.i);
    case Value::Float:
      return py_float(v.f);
    case Value::Str:
      return v.s;
    default:
      return repr(v);
  }
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Value::Str:
      return py_repr_str(v.s);
    case Value::ListK: {
      std::string o = "[";
      for (size_t k = 0; k < v.list->size(); ++k) o += (k ? ", " : "") + repr((*v.list)[k]);
      return o + "]";
    }
    case Value::DictK: {
      if (v.is_namespace) return "<Namespace>";
      std::string o = "{";
      for (size_t k = 0; k < v.dict->size(); ++k)
        o += (k ? ", " : "") + py_repr_str((*v.dict)[k].first) + ": " + repr((*v.dict)[k].second);
      return o + "}";
    }
    case Value::FnK:
      return "<function>";
    default:
      return to_str(v);
  }
}

namespace {

void json_str(std::string& o, const std::string& s) {  // json.dumps(ensure_ascii=False)
  o += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        o += "\\\"";
        break;
      case '\\':
        o += "\\\\";
        break;
      case '\n':
        o += "\\n";
        break;
      case '\r':
        o += "\\r";
        break;
      case '\t':
        o += "\\t";
        break;
      case '\b':
        o += "\\b";
        break;
      case '\f':
        o += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  o += '"';
}

}  // namespace

void to_json(std::string& o, const Value& v, int indent, int depth, bool sort_keys) {
  auto nl = [&](int d) {
    if (indent >= 0) {
      o += '\n';
      o.append(static_cast<size_t>(indent * d), ' ');
    }
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case Value::Undef:
    case Value::None:
      o += "null";
      return;
    case Value::Bool:
      o += v.b ? "true" : "false";
      return;
    case Value::Int:
      o += std::to_string(v.i);
      return;
    case Value::Float:
      o += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : py_float(v.f);
      return;
    case Value::Str:
      json_str(o, v.s);
      return;
    case Value::ListK:
      if (v.list->empty()) {
        o += "[]";
        return;
      }
      o += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) o += item_sep;
        nl(depth + 1);
        to_json(o, (*v.list)[k], indent, depth + 1, sort_keys);
      }
      nl(depth);
      o += ']';
      return;
    case Value::DictK: {
      if (v.dict->empty()) {
        o += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (auto& kv : *v.dict) items.push_back(&kv);
      if (sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      o += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) o += item_sep;
        nl(depth + 1);
        json_str(o, items[k]->first);
        o += ": ";
        to_json(o, items[k]->second, indent, depth + 1, sort_keys);
      }
      nl(depth);
      o += '}';
      return;
    }
    case Value::FnK:
      fail("tojson: cannot serialize a function");
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Undef:
    case Value::None:
      return false;
    case Value::Bool:
      return v.b;
    case Value::Int:
      return v.i != 0;
    case Value::Float:
      return v.f != 0;
    case Value::Str:
      return !v.s.empty();
    case Value::ListK:
      return !v.list->empty();
    case Value::DictK:
      return v.is_namespace || !v.dict->empty();
    case Value::FnK:
      return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_num() && b.is_num()) {
    if (a.kind == Value::Float || b.kind == Value::Float) return a.num() == b.num();
    return (a.kind == Value::Int ? a.i : a.b) == (b.kind == Value::Int ? b.i : b.b);
  }
  if ((a.kind == Value::None || a.kind == Value::Undef) && (b.kind == Value::None || b.kind == Value::Undef))
    return a.kind == b.kind;
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Str:
      return a.s == b.s;
    case Value::ListK:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::DictK:
      if (a.dict->size() != b.dict->size()) return false;
      for (auto& [k, v] : *a.dict) {
        const Value* o = b.get(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    case Value::FnK:
      return a.fn == b.fn;
    default:
      return false;
  }
}

const char* type_name(const Value& v) {
  static const char* n[] = {"undefined", "NoneType", "bool", "int",     "float",
                            "str",       "list",     "dict", "function"};
  return n[v.kind];
}

List utf8_chars(const std::string& s) {  // a Python str indexes code points
  List l;
  for (size_t k = 0; k < s.size();) {
    size_t n = 1;
    while (k + n < s.size() && (static_cast<unsigned char>(s[k + n]) & 0xC0) == 0x80) ++n;
    l.push_back(Value::str(s.substr(k, n)));
    k += n;
  }
  return l;
}

}  // namespace olmosft::tmpl
