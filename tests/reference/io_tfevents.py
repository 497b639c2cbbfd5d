#!/usr/bin/python3
"""Reference for the TensorBoard event writer (src/io/tensorboard.cpp).

Encodes Events with Google's protobuf runtime (Debian python3-protobuf; the tensorflow.Event /
Summary / Summary.Value messages are declared here with their field numbers, see docs/reference/formats.md §4)
and frames them as TFRecords with a bitwise CRC-32C, then writes tests/golden/io/tb_records.json:
a list of {wall_time, step, values: [[tag, value]], record_hex}. io_tensorboard_test compares the C++
encoder with these bytes.

Usage: /usr/bin/python3 tests/reference/io_tfevents.py            (regenerate the fixture)
       /usr/bin/python3 tests/reference/io_tfevents.py EVENTFILE  (decode and print an event file)
"""
import json
import os
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def build_messages():
    fd = descriptor_pb2.FileDescriptorProto(name="olmosft_event.proto", package="tensorflow", syntax="proto3")
    summary = fd.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    value.oneof_decl.add(name="value")
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL, oneof_index=0)
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tensorflow.Summary.Value")
    event = fd.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.oneof_decl.add(name="what")
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, oneof_index=0,
                    type_name=".tensorflow.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    get = getattr(message_factory, "GetMessageClass", None)
    if get is None:
        factory = message_factory.MessageFactory(pool)
        return factory.GetPrototype(pool.FindMessageTypeByName("tensorflow.Event"))
    return get(pool.FindMessageTypeByName("tensorflow.Event"))


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data):
    n = struct.pack("<Q", len(data))
    return n + struct.pack("<I", masked(n)) + data + struct.pack("<I", masked(data))


def decode_file(path, Event):
    raw = open(path, "rb").read()
    pos = 0
    while pos < len(raw):
        (n,) = struct.unpack_from("<Q", raw, pos)
        assert struct.unpack_from("<I", raw, pos + 8)[0] == masked(raw[pos:pos + 8]), "length CRC"
        data = raw[pos + 12:pos + 12 + n]
        assert struct.unpack_from("<I", raw, pos + 12 + n)[0] == masked(data), "data CRC"
        e = Event()
        e.ParseFromString(data)
        print(e.wall_time, e.step, e.file_version,
              [(v.tag, v.simple_value) for v in e.summary.value])
        pos += 12 + n + 4


def main():
    Event = build_messages()
    if len(sys.argv) > 1:
        decode_file(sys.argv[1], Event)
        return
    assert crc32c(b"123456789") == 0xE3069283
    cases = [
        (1.5, None, None),  # file_version event
        (2.0, 10, [["loss", 0.5]]),
        (1733140000.25, 0, [["train/loss", 2.75]]),
        (1733140001.5, 1000000000000, [["train/lr", 5e-05], ["train/grad_norm", 0.0]]),
        (1733140002.0, -3, [["neg", -1.25]]),
        (1733140003.0, 7, [["unicode/λ", 3.4028234663852886e38]]),
    ]
    out = []
    for wall, step, values in cases:
        e = Event()
        e.wall_time = wall
        if values is None:
            e.file_version = "brain.Event:2"
        else:
            e.step = step
            for tag, v in values:
                sv = e.summary.value.add()
                sv.tag = tag
                sv.simple_value = v
            if not values:
                e.summary.SetInParent()
        out.append({"wall_time": wall, "step": step, "values": values,
                    "record_hex": frame(e.SerializeToString()).hex()})
    dst = os.path.join(os.path.dirname(__file__), "..", "golden", "io", "tb_records.json")
    with open(dst, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("wrote", os.path.normpath(dst), len(out), "records")


if __name__ == "__main__":
    main()
