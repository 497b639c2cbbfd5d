// A restricted unpickler: reads Python pickles (protocols 2-5) into a small value tree without running
// any code. Only the opcodes that checkpoint metadata and torch.save archives use are accepted; a class
// or function may be named (GLOBAL / STACK_GLOBAL) only when it is on the caller's allow-list, and
// "calling" it (REDUCE, NEWOBJ) or setting its state (BUILD) only records the arguments in an Object
// node. Everything else is refused with an error naming the opcode or the class. Allocation is bounded
// by the input size and a node budget; persistent ids (torch.save's storage references) become PersId
// nodes. Format: Python's Lib/pickletools.py (opcode table), docs/io.md "Restricted unpickler".
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace olmosft::pickle {

enum class Kind { None, Bool, Int, Float, Str, Bytes, Tuple, List, Dict, Global, Object, PersId };
const char* kind_name(Kind k);

// One node. Children are non-owning pointers into the Pickle that owns every node (memo references may
// share nodes, and a hostile pickle may even make a container hold itself: nothing here recurses
// without a depth limit).
struct Value {
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // Str / Bytes; Global: "module.name"
  // Tuple / List / PersId (its tuple's items); Dict: keys and values alternating, in insertion order.
  std::vector<const Value*> items;
  const Value* cls = nullptr;    // Object: the Global it was made from
  const Value* args = nullptr;   // Object: the argument tuple (REDUCE / NEWOBJ)
  const Value* state = nullptr;  // Object: BUILD's state (nullptr if none)

  bool is(Kind k) const { return kind == k; }
  // Dict lookup by string key (nullptr if absent or not a dict).
  const Value* get(const std::string& key) const;
  // "module.name" of an Object's class ("" for other kinds).
  std::string class_name() const;
};

struct Limits {
  size_t max_nodes = 20'000'000;  // values created (about 100 bytes each; also bounds the memo)
  size_t max_depth = 64;          // nesting of MARK frames
};

class Pickle {
 public:
  const Value& root() const { return *root_; }
  size_t nodes() const { return nodes_.size(); }

 private:
  friend class Unpickler;
  std::vector<std::unique_ptr<Value>> nodes_;
  const Value* root_ = nullptr;
};

// Parses `data` (one pickle, ending with STOP; trailing bytes are an error). `allowed` lists the classes
// and functions that may be named, as "module.name". `context` (the file, or file + entry) starts every
// error message.
Pickle unpickle(const uint8_t* data, size_t size, const std::set<std::string>& allowed,
                const std::string& context, const Limits& limits = {});

// A short one-line rendering for error messages (depth- and length-limited).
std::string describe(const Value& v, int depth = 3);

}  // namespace olmosft::pickle
