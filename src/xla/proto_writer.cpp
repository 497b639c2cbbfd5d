#include "xla/proto_writer.h"

#include "core/error.h"
#include "xla/pjrt.h"

namespace olmosft::xla {

void ProtoWriter::varint(uint64_t v) {
  while (v >= 0x80) {
    out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out_.push_back(static_cast<char>(v));
}

void ProtoWriter::tag(int field, int wire_type) {
  OLMO_CHECK(field >= 1 && field < (1 << 29), "xla: protobuf field number ", field, " out of range");
  varint((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

ProtoWriter& ProtoWriter::int_field(int field, int64_t value) {
  tag(field, 0);
  varint(static_cast<uint64_t>(value));
  return *this;
}

ProtoWriter& ProtoWriter::bytes_field(int field, std::string_view bytes) {
  tag(field, 2);
  varint(bytes.size());
  out_.append(bytes);
  return *this;
}

// xla.CompileOptionsProto (xla/pjrt/proto/compile_options.proto): field 3 is executable_build_options, an
// xla.ExecutableBuildOptionsProto with device_ordinal = 1, num_replicas = 4, num_partitions = 5,
// use_spmd_partitioning = 6.
std::string compile_options_proto(const CompileOptions& o) {
  OLMO_CHECK(o.num_replicas >= 1 && o.num_partitions >= 1, "xla: compile options need num_replicas >= 1 and ",
             "num_partitions >= 1 (got ", o.num_replicas, ", ", o.num_partitions, ")");
  ProtoWriter build;
  build.int_field(1, o.device_ordinal).int_field(4, o.num_replicas).int_field(5, o.num_partitions);
  if (o.use_spmd_partitioning) build.bool_field(6, true);
  ProtoWriter options;
  options.message_field(3, build);
  for (const auto& [flag, value] : o.env_option_overrides) {
    OLMO_CHECK(!flag.empty(), "xla: an env_option_overrides entry without a flag name");
    ProtoWriter v, entry;
    v.bytes_field(1, value);
    entry.bytes_field(1, flag).message_field(2, v);
    options.message_field(7, entry);
  }
  return options.bytes();
}

}  // namespace olmosft::xla
