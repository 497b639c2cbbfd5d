// A minimal protocol-buffers wire-format writer: just what olmosft sends to PJRT plugins (varint, bool and
// length-delimited fields; nested messages). Fields are written in call order.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace olmosft::xla {

class ProtoWriter {
 public:
  // int32/int64/uint64 field (negative int64 as its 10-byte two's complement varint, as protobuf does).
  ProtoWriter& int_field(int field, int64_t value);
  ProtoWriter& bool_field(int field, bool value) { return int_field(field, value ? 1 : 0); }
  // bytes/string field, or a nested message given as its serialized bytes.
  ProtoWriter& bytes_field(int field, std::string_view bytes);
  ProtoWriter& message_field(int field, const ProtoWriter& m) { return bytes_field(field, m.bytes()); }
  const std::string& bytes() const { return out_; }

 private:
  void varint(uint64_t v);
  void tag(int field, int wire_type);
  std::string out_;
};

}  // namespace olmosft::xla
