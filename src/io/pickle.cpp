#include "io/pickle.h"

#include <cstring>
#include <map>
#include <sstream>

#include "core/error.h"

namespace olmosft::pickle {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::None:
      return "None";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::Str:
      return "str";
    case Kind::Bytes:
      return "bytes";
    case Kind::Tuple:
      return "tuple";
    case Kind::List:
      return "list";
    case Kind::Dict:
      return "dict";
    case Kind::Global:
      return "global";
    case Kind::Object:
      return "object";
    case Kind::PersId:
      return "persistent id";
  }
  return "?";
}

const Value* Value::get(const std::string& key) const {
  if (kind != Kind::Dict) return nullptr;
  for (size_t k = 0; k + 1 < items.size(); k += 2) {
    if (items[k]->kind == Kind::Str && items[k]->s == key) return items[k + 1];
  }
  return nullptr;
}

std::string Value::class_name() const { return kind == Kind::Object && cls ? cls->s : std::string(); }

namespace {

// Names of the pickle opcodes (Lib/pickletools.py), for error messages about refused ones.
const char* opcode_name(uint8_t op) {
  static const std::map<uint8_t, const char*> names = {{'(', "MARK"},
                                                       {'.', "STOP"},
                                                       {'0', "POP"},
                                                       {'1', "POP_MARK"},
                                                       {'2', "DUP"},
                                                       {'F', "FLOAT"},
                                                       {'I', "INT"},
                                                       {'J', "BININT"},
                                                       {'K', "BININT1"},
                                                       {'L', "LONG"},
                                                       {'M', "BININT2"},
                                                       {'N', "NONE"},
                                                       {'P', "PERSID"},
                                                       {'Q', "BINPERSID"},
                                                       {'R', "REDUCE"},
                                                       {'S', "STRING"},
                                                       {'T', "BINSTRING"},
                                                       {'U', "SHORT_BINSTRING"},
                                                       {'V', "UNICODE"},
                                                       {'X', "BINUNICODE"},
                                                       {'a', "APPEND"},
                                                       {'b', "BUILD"},
                                                       {'c', "GLOBAL"},
                                                       {'d', "DICT"},
                                                       {'}', "EMPTY_DICT"},
                                                       {'e', "APPENDS"},
                                                       {'g', "GET"},
                                                       {'h', "BINGET"},
                                                       {'i', "INST"},
                                                       {'j', "LONG_BINGET"},
                                                       {'l', "LIST"},
                                                       {']', "EMPTY_LIST"},
                                                       {'o', "OBJ"},
                                                       {'p', "PUT"},
                                                       {'q', "BINPUT"},
                                                       {'r', "LONG_BINPUT"},
                                                       {'s', "SETITEM"},
                                                       {'t', "TUPLE"},
                                                       {')', "EMPTY_TUPLE"},
                                                       {'u', "SETITEMS"},
                                                       {'G', "BINFLOAT"},
                                                       {0x80, "PROTO"},
                                                       {0x81, "NEWOBJ"},
                                                       {0x82, "EXT1"},
                                                       {0x83, "EXT2"},
                                                       {0x84, "EXT4"},
                                                       {0x85, "TUPLE1"},
                                                       {0x86, "TUPLE2"},
                                                       {0x87, "TUPLE3"},
                                                       {0x88, "NEWTRUE"},
                                                       {0x89, "NEWFALSE"},
                                                       {0x8a, "LONG1"},
                                                       {0x8b, "LONG4"},
                                                       {'B', "BINBYTES"},
                                                       {'C', "SHORT_BINBYTES"},
                                                       {0x8c, "SHORT_BINUNICODE"},
                                                       {0x8d, "BINUNICODE8"},
                                                       {0x8e, "BINBYTES8"},
                                                       {0x8f, "EMPTY_SET"},
                                                       {0x90, "ADDITEMS"},
                                                       {0x91, "FROZENSET"},
                                                       {0x92, "NEWOBJ_EX"},
                                                       {0x93, "STACK_GLOBAL"},
                                                       {0x94, "MEMOIZE"},
                                                       {0x95, "FRAME"},
                                                       {0x96, "BYTEARRAY8"},
                                                       {0x97, "NEXT_BUFFER"},
                                                       {0x98, "READONLY_BUFFER"}};
  auto it = names.find(op);
  return it == names.end() ? "unknown" : it->second;
}

}  // namespace

class Unpickler {
 public:
  Unpickler(const uint8_t* data, size_t size, const std::set<std::string>& allowed, const std::string& ctx,
            const Limits& limits)
      : p_(data), n_(size), allowed_(allowed), ctx_(ctx), lim_(limits) {}

  Pickle run() {
    while (true) {
      OLMO_CHECK(pos_ < n_, ctx_, ": pickle ends at byte ", n_, " without a STOP opcode (truncated?)");
      op_at_ = pos_;
      uint8_t op = p_[pos_++];
      if (op == '.') break;
      step(op);
    }
    OLMO_CHECK(marks_.empty() && stack_.size() == 1, ctx_, ": STOP at byte ", op_at_, " with ", stack_.size(),
               " values and ", marks_.size(), " open MARKs on the stack (expected exactly one value)");
    OLMO_CHECK(pos_ == n_, ctx_, ": ", n_ - pos_, " bytes after the pickle's STOP opcode");
    out_.root_ = stack_.back();
    return std::move(out_);
  }

 private:
  template <typename... A>
  [[noreturn]] void bad(const A&... parts) {
    fail(ctx_, ": byte ", op_at_, " (", opcode_name(p_[op_at_]), "): ", parts...);
  }

  const uint8_t* take(uint64_t k) {
    if (k > n_ - pos_) bad("needs ", k, " bytes but only ", n_ - pos_, " remain (truncated?)");
    const uint8_t* r = p_ + pos_;
    pos_ += static_cast<size_t>(k);
    return r;
  }
  uint64_t le(int bytes) {
    const uint8_t* b = take(static_cast<uint64_t>(bytes));
    uint64_t v = 0;
    for (int k = bytes - 1; k >= 0; --k) v = (v << 8) | b[k];
    return v;
  }

  Value* make(Kind k) {
    if (out_.nodes_.size() >= lim_.max_nodes) bad("more than ", lim_.max_nodes, " values (limit)");
    out_.nodes_.push_back(std::make_unique<Value>());
    out_.nodes_.back()->kind = k;
    return out_.nodes_.back().get();
  }
  void push(Value* v) { stack_.push_back(v); }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  Value* pop() {
    if (stack_.size() <= floor()) bad("stack underflow");
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value* top() {
    if (stack_.size() <= floor()) bad("stack underflow");
    return stack_.back();
  }
  // The values above the last MARK, which is removed.
  std::vector<Value*> pop_mark() {
    if (marks_.empty()) bad("no MARK on the stack");
    size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Value*> v(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return v;
  }
  Value* tuple(const std::vector<Value*>& items) {
    Value* t = make(Kind::Tuple);
    t->items.assign(items.begin(), items.end());
    return t;
  }
  Value* string(Kind k, uint64_t len) {
    const uint8_t* b = take(len);
    Value* v = make(k);
    v->s.assign(reinterpret_cast<const char*>(b), static_cast<size_t>(len));
    return v;
  }
  Value* global(const std::string& module, const std::string& name) {
    std::string full = module + "." + name;
    if (!allowed_.count(full)) bad("class or function '", full, "' is not allowed in this file");
    Value* g = make(Kind::Global);
    g->s = full;
    return g;
  }
  std::string line() {
    size_t start = pos_;
    while (pos_ < n_ && p_[pos_] != '\n' && pos_ - start < 256) ++pos_;
    if (pos_ >= n_ || p_[pos_] != '\n') bad("unterminated or over-long module/name line");
    return std::string(reinterpret_cast<const char*>(p_ + start), pos_++ - start);
  }
  void memo_put(uint64_t idx) {
    if (memo_.size() >= lim_.max_nodes && !memo_.count(idx)) bad("memo larger than ", lim_.max_nodes);
    memo_[idx] = top();
  }
  Value* memo_get(uint64_t idx) {
    auto it = memo_.find(idx);
    if (it == memo_.end()) bad("memo entry ", idx, " was never stored");
    return it->second;
  }
  void append_to(Value* list, const std::vector<Value*>& items) {
    if (!list->is(Kind::List)) bad("appending to a ", kind_name(list->kind), ", expected a list");
    list->items.insert(list->items.end(), items.begin(), items.end());
  }
  void set_items(Value* dict, const std::vector<Value*>& kv) {
    if (!dict->is(Kind::Dict)) bad("setting items on a ", kind_name(dict->kind), ", expected a dict");
    if (kv.size() % 2) bad("odd number of values for key/value pairs");
    dict->items.insert(dict->items.end(), kv.begin(), kv.end());
  }
  void call(Value* args, Value* callable) {
    if (!callable->is(Kind::Global)) bad("calling a ", kind_name(callable->kind), ", expected a class");
    if (!args->is(Kind::Tuple)) bad("arguments are a ", kind_name(args->kind), ", expected a tuple");
    Value* o = make(Kind::Object);
    o->cls = callable;
    o->args = args;
    push(o);
  }

  void step(uint8_t op);
  bool step_data(uint8_t op);

  const uint8_t* p_;
  size_t n_, pos_ = 0, op_at_ = 0;
  const std::set<std::string>& allowed_;
  const std::string& ctx_;
  Limits lim_;
  Pickle out_;
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, Value*> memo_;
};

// Opcodes that push a scalar or a string. Returns false when `op` is not one of them.
bool Unpickler::step_data(uint8_t op) {
  switch (op) {
    case 'N':
      push(make(Kind::None));
      return true;
    case 0x88:
    case 0x89: {
      Value* v = make(Kind::Bool);
      v->b = op == 0x88;
      push(v);
      return true;
    }
    case 'J':
    case 'K':
    case 'M': {
      int64_t x = op == 'K'   ? static_cast<int64_t>(le(1))
                  : op == 'M' ? static_cast<int64_t>(le(2))
                              : static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(le(4))));
      Value* v = make(Kind::Int);
      v->i = x;
      push(v);
      return true;
    }
    case 0x8a: {  // LONG1: n little-endian two's-complement bytes
      uint64_t k = le(1);
      if (k > 8) bad("integer of ", k, " bytes does not fit in 64 bits");
      uint64_t u = k ? le(static_cast<int>(k)) : 0;
      if (k > 0 && k < 8 && (u >> (8 * k - 1)) & 1) u |= ~uint64_t{0} << (8 * k);  // sign-extend
      Value* v = make(Kind::Int);
      v->i = static_cast<int64_t>(u);
      push(v);
      return true;
    }
    case 'G': {  // BINFLOAT: big-endian IEEE double
      const uint8_t* b = take(8);
      uint64_t u = 0;
      for (int k = 0; k < 8; ++k) u = (u << 8) | b[k];
      Value* v = make(Kind::Float);
      std::memcpy(&v->f, &u, 8);
      push(v);
      return true;
    }
    case 0x8c:
      push(string(Kind::Str, le(1)));
      return true;
    case 'X':
      push(string(Kind::Str, le(4)));
      return true;
    case 0x8d:
      push(string(Kind::Str, le(8)));
      return true;
    case 'C':
      push(string(Kind::Bytes, le(1)));
      return true;
    case 'B':
      push(string(Kind::Bytes, le(4)));
      return true;
    case 0x8e:
      push(string(Kind::Bytes, le(8)));
      return true;
    default:
      return false;
  }
}

void Unpickler::step(uint8_t op) {
  if (step_data(op)) return;
  switch (op) {
    case 0x80: {
      uint64_t v = le(1);
      if (v < 2 || v > 5) bad("pickle protocol ", v, " (expected 2 to 5)");
      return;
    }
    case 0x95:
      (void)le(8);
      return;  // FRAME: a length hint; the bytes follow inline
    case '(':
      if (marks_.size() >= lim_.max_depth) bad("more than ", lim_.max_depth, " nested MARKs (limit)");
      marks_.push_back(stack_.size());
      return;
    case '0':
      (void)pop();
      return;
    case '1':
      (void)pop_mark();
      return;
    case '2':
      push(top());
      return;
    case ')':
      push(make(Kind::Tuple));
      return;
    case 't':
      push(tuple(pop_mark()));
      return;
    case 0x85:
    case 0x86:
    case 0x87: {
      std::vector<Value*> v(static_cast<size_t>(op - 0x84));
      for (size_t k = v.size(); k-- > 0;) v[k] = pop();
      push(tuple(v));
      return;
    }
    case ']':
      push(make(Kind::List));
      return;
    case 'l': {
      auto items = pop_mark();
      Value* l = make(Kind::List);
      l->items.assign(items.begin(), items.end());
      push(l);
      return;
    }
    case 'a': {
      Value* x = pop();
      append_to(top(), {x});
      return;
    }
    case 'e': {
      auto items = pop_mark();
      append_to(top(), items);
      return;
    }
    case '}':
      push(make(Kind::Dict));
      return;
    case 'd': {
      auto kv = pop_mark();
      Value* d = make(Kind::Dict);
      set_items(d, kv);
      push(d);
      return;
    }
    case 's': {
      Value* v = pop();
      Value* k = pop();
      set_items(top(), {k, v});
      return;
    }
    case 'u': {
      auto kv = pop_mark();
      set_items(top(), kv);
      return;
    }
    case 'c': {
      std::string module = line();
      std::string name = line();
      push(global(module, name));
      return;
    }
    case 0x93: {
      Value* name = pop();
      Value* module = pop();
      if (!module->is(Kind::Str) || !name->is(Kind::Str)) bad("module and name must be strings");
      push(global(module->s, name->s));
      return;
    }
    case 'R': {
      Value* args = pop();
      call(args, pop());
      return;
    }
    case 0x81: {
      Value* args = pop();
      call(args, pop());
      return;
    }
    case 'b': {
      Value* state = pop();
      Value* obj = top();
      if (!obj->is(Kind::Object)) bad("BUILD on a ", kind_name(obj->kind), ", expected an object");
      if (obj->state) bad("BUILD on an object whose state is already set");
      obj->state = state;
      return;
    }
    case 'Q': {
      Value* id = pop();
      if (!id->is(Kind::Tuple)) bad("persistent id is a ", kind_name(id->kind), ", expected a tuple");
      Value* v = make(Kind::PersId);
      v->items = id->items;
      push(v);
      return;
    }
    case 'q':
      memo_put(le(1));
      return;
    case 'r':
      memo_put(le(4));
      return;
    case 0x94:
      memo_put(memo_.size());
      return;
    case 'h':
      push(memo_get(le(1)));
      return;
    case 'j':
      push(memo_get(le(4)));
      return;
    default: {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", op);
      bad("opcode ", hex, " (", opcode_name(op), ") is not allowed");
    }
  }
}

Pickle unpickle(const uint8_t* data, size_t size, const std::set<std::string>& allowed,
                const std::string& context, const Limits& limits) {
  return Unpickler(data, size, allowed, context, limits).run();
}

std::string describe(const Value& v, int depth) {
  std::ostringstream os;
  auto seq = [&](const char* open, const char* close, size_t step) {
    os << open;
    for (size_t k = 0; k < v.items.size() && k < 8 * step; k += step) {
      if (k) os << ", ";
      os << (depth > 0 ? describe(*v.items[k], depth - 1) : "...");
      if (step == 2) os << ": " << (depth > 0 ? describe(*v.items[k + 1], depth - 1) : "...");
    }
    if (v.items.size() > 8 * step) os << ", ...";
    os << close;
  };
  switch (v.kind) {
    case Kind::None:
      os << "None";
      break;
    case Kind::Bool:
      os << (v.b ? "True" : "False");
      break;
    case Kind::Int:
      os << v.i;
      break;
    case Kind::Float:
      os << v.f;
      break;
    case Kind::Str:
      os << "'" << v.s.substr(0, 64) << (v.s.size() > 64 ? "...'" : "'");
      break;
    case Kind::Bytes:
      os << "bytes[" << v.s.size() << "]";
      break;
    case Kind::Tuple:
      seq("(", ")", 1);
      break;
    case Kind::List:
      seq("[", "]", 1);
      break;
    case Kind::Dict:
      seq("{", "}", 2);
      break;
    case Kind::Global:
      os << v.s;
      break;
    case Kind::Object:
      os << v.class_name() << "(...)";
      break;
    case Kind::PersId:
      seq("persid(", ")", 1);
      break;
  }
  return os.str();
}

}  // namespace olmosft::pickle
