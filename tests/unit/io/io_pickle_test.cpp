// The restricted unpickler (io/pickle.h): the values Python's pickle writes (protocols 2, 4, 5; byte strings
// below made with CPython 3.11's pickle.dumps), classes refused unless allowed (os.system by GLOBAL and by
// STACK_GLOBAL), opcodes outside the subset refused by name, and bounded work on hostile input.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "io/pickle.h"

using namespace olmosft;
using pickle::Kind;

namespace {

template <size_t N>
std::vector<uint8_t> bytes(const char (&s)[N]) {
  return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(s),
                              reinterpret_cast<const uint8_t*>(s) + N - 1);
}

std::string error_of(const std::vector<uint8_t>& b, const std::set<std::string>& allowed = {},
                     const pickle::Limits& lim = {}) {
  try {
    pickle::unpickle(b.data(), b.size(), allowed, "test.pkl", lim);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// pickle.dumps({"a": [1, -2, 300, 70000, -(2**40), 2**63 - 1], "b": (1.5, None, True, False), "c": b"xy",
//               "d": "été"}, protocol=4)
const char kDict4[] =
    "\x80\x04\x95\x56\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x01\x61\x94\x5d\x94\x28\x4b\x01\x4a\xfe\xff"
    "\xff\xff\x4d\x2c\x01\x4a\x70\x11\x01\x00\x8a\x06\x00\x00\x00\x00\x00\xff\x8a\x08\xff\xff\xff\xff\xff\xff"
    "\xff\x7f\x65\x8c\x01\x62\x94\x28\x47\x3f\xf8\x00\x00\x00\x00\x00\x00\x4e\x88\x89\x74\x94\x8c\x01\x63\x94"
    "\x43\x02\x78\x79\x94\x8c\x01\x64\x94\x8c\x05\xc3\xa9\x74\xc3\xa9\x94\x75\x2e";
// The same value, protocol 2: bytes are pickled as _codecs.encode("xy", "latin1") (GLOBAL + REDUCE).
const char kDict2[] =
    "\x80\x02\x7d\x71\x00\x28\x58\x01\x00\x00\x00\x61\x71\x01\x5d\x71\x02\x28\x4b\x01\x4a\xfe\xff\xff\xff\x4d"
    "\x2c\x01\x4a\x70\x11\x01\x00\x8a\x06\x00\x00\x00\x00\x00\xff\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x65"
    "\x58\x01\x00\x00\x00\x62\x71\x03\x28\x47\x3f\xf8\x00\x00\x00\x00\x00\x00\x4e\x88\x89\x74\x71\x04\x58\x01"
    "\x00\x00\x00\x63\x71\x05\x63\x5f\x63\x6f\x64\x65\x63\x73\x0a\x65\x6e\x63\x6f\x64\x65\x0a\x71\x06\x58\x02"
    "\x00\x00\x00\x78\x79\x71\x07\x58\x06\x00\x00\x00\x6c\x61\x74\x69\x6e\x31\x71\x08\x86\x71\x09\x52\x71\x0a"
    "\x58\x01\x00\x00\x00\x64\x71\x0b\x58\x05\x00\x00\x00\xc3\xa9\x74\xc3\xa9\x71\x0c\x75\x2e";

}  // namespace

TEST(Pickle, ReadsPythonValues) {
  auto b = bytes(kDict4);
  auto p = pickle::unpickle(b.data(), b.size(), {}, "test.pkl");
  const auto& r = p.root();
  ASSERT_TRUE(r.is(Kind::Dict));
  const auto* a = r.get("a");
  ASSERT_TRUE(a && a->is(Kind::List));
  std::vector<int64_t> ints;
  for (const auto* x : a->items) ints.push_back(x->i);
  EXPECT_EQ(ints, (std::vector<int64_t>{1, -2, 300, 70000, -(int64_t{1} << 40), INT64_MAX}));
  const auto* t = r.get("b");
  ASSERT_TRUE(t && t->is(Kind::Tuple) && t->items.size() == 4);
  EXPECT_EQ(t->items[0]->f, 1.5);
  EXPECT_TRUE(t->items[1]->is(Kind::None));
  EXPECT_TRUE(t->items[2]->b);
  EXPECT_FALSE(t->items[3]->b);
  EXPECT_TRUE(r.get("c")->is(Kind::Bytes));
  EXPECT_EQ(r.get("c")->s, "xy");
  EXPECT_EQ(r.get("d")->s, "\xc3\xa9t\xc3\xa9");
  EXPECT_EQ(r.get("zz"), nullptr);
  // Protocol 5 writes the same opcodes for these values.
  auto b5 = b;
  b5[1] = 5;
  EXPECT_NO_THROW(pickle::unpickle(b5.data(), b5.size(), {}, "test.pkl"));
}

TEST(Pickle, ClassesOnlyFromTheAllowList) {
  auto b = bytes(kDict2);
  EXPECT_NE(error_of(b).find("'_codecs.encode' is not allowed"), std::string::npos) << error_of(b);
  // Allowed, "calling" it only records the call.
  auto p = pickle::unpickle(b.data(), b.size(), {"_codecs.encode"}, "test.pkl");
  const auto* c = p.root().get("c");
  ASSERT_TRUE(c && c->is(Kind::Object));
  EXPECT_EQ(c->class_name(), "_codecs.encode");
  EXPECT_EQ(c->args->items[0]->s, "xy");
}

TEST(Pickle, RefusesOsSystemByName) {
  // GLOBAL os.system + REDUCE (protocol 2: what `pickle.dumps` of an object whose __reduce__ returns
  // (os.system, ("touch x",)) writes), and STACK_GLOBAL (protocol 4).
  const char global[] = "\x80\x02\x63os\nsystem\nX\x07\x00\x00\x00touch x\x85R.";
  const char stack[] = "\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x07touch x\x85R.";
  const char builtin[] = "\x80\x04\x8c\x08\x62uiltins\x8c\x04\x65val\x93\x8c\x01\x31\x85R.";
  for (auto b : {bytes(global), bytes(stack)}) {
    std::string e = error_of(b, {"torch.Size"});
    EXPECT_NE(e.find("test.pkl"), std::string::npos) << e;
    EXPECT_NE(e.find("class or function 'os.system' is not allowed"), std::string::npos) << e;
  }
  EXPECT_NE(error_of(bytes(builtin)).find("'builtins.eval' is not allowed"), std::string::npos);
}

TEST(Pickle, RefusesOpcodesOutsideTheSubsetByName) {
  struct Case {
    std::vector<uint8_t> b;
    const char* name;
  };
  std::vector<Case> cases = {
      {bytes("(cos\nsystem\nS'ls'\ni."), "GLOBAL"},  // protocol 0: not allowed either way
      {bytes("\x80\x02(S'ls'\ntR."), "STRING"},
      {bytes("\x80\x02(\x69os\nsystem\n."), "INST"},
      {bytes("\x80\x02\x82\x01."), "EXT1"},
      {bytes("\x80\x02Pabc\n."), "PERSID"},
      {bytes("\x80\x05\x96\x00\x00\x00\x00\x00\x00\x00\x00."), "BYTEARRAY8"},
      {bytes("\x80\x05\x97."), "NEXT_BUFFER"},
      {bytes("\x80\x04\x8f\x94."), "EMPTY_SET"},
      {bytes("\x80\x02\xff."), "unknown"},
  };
  for (const auto& c : cases) {
    std::string e = error_of(c.b, {});
    EXPECT_NE(e.find(c.name), std::string::npos) << c.name << ": " << e;
    EXPECT_NE(e.find("test.pkl"), std::string::npos) << e;
  }
  EXPECT_NE(error_of(bytes("\x80\x06N.")).find("pickle protocol 6"), std::string::npos);
}

TEST(Pickle, BoundedOnHostileInput) {
  // A length far beyond the input is refused before anything is allocated.
  auto huge = bytes("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f.");
  EXPECT_NE(error_of(huge).find("remain (truncated?)"), std::string::npos) << error_of(huge);
  // Nesting (MARK) deeper than the limit.
  std::vector<uint8_t> deep = {0x80, 0x02};
  deep.insert(deep.end(), 100, '(');
  EXPECT_NE(error_of(deep).find("nested MARKs"), std::string::npos) << error_of(deep);
  // More values than the node budget.
  std::vector<uint8_t> many = {0x80, 0x02, ']', '('};
  for (int k = 0; k < 50; ++k) many.push_back('N');
  many.insert(many.end(), {'e', '.'});
  EXPECT_NE(error_of(many, {}, {10, 64}).find("more than 10 values"), std::string::npos);
  EXPECT_EQ(error_of(many), "(no error)");
  // A memo reference that was never stored; truncation; trailing bytes; stack underflow; a missing STOP.
  EXPECT_NE(error_of(bytes("\x80\x02h\x05.")).find("memo entry 5 was never stored"), std::string::npos);
  EXPECT_NE(error_of(bytes("\x80\x02X\x05\x00\x00\x00"
                           "ab"))
                .find("truncated"),
            std::string::npos);
  EXPECT_NE(error_of(bytes("\x80\x02N.N")).find("1 bytes after the pickle's STOP"), std::string::npos);
  EXPECT_NE(error_of(bytes("\x80\x02R.")).find("stack underflow"), std::string::npos);
  EXPECT_NE(error_of(bytes("\x80\x02NN.")).find("with 2 values"), std::string::npos);
  EXPECT_NE(error_of(bytes("\x80\x02N")).find("without a STOP"), std::string::npos);
  EXPECT_NE(error_of(bytes("")).find("without a STOP"), std::string::npos);
  // A list that contains itself (memo + APPEND) is held without leaking or recursing forever.
  auto self = bytes(
      "\x80\x02]q\x00h\x00"
      "a.");
  auto p = pickle::unpickle(self.data(), self.size(), {}, "test.pkl");
  EXPECT_EQ(p.root().items.size(), 1u);
  EXPECT_EQ(p.root().items[0], &p.root());
  EXPECT_FALSE(pickle::describe(p.root()).empty());
  // BUILD only on objects, once; REDUCE only on allowed globals with a tuple.
  EXPECT_NE(error_of(bytes("\x80\x02}Nb.")).find("BUILD on a dict"), std::string::npos);
  EXPECT_NE(error_of(bytes("\x80\x02NNR.")).find("calling a None"), std::string::npos);
}
