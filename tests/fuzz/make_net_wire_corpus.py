#!/usr/bin/env python3
"""Writes the seed corpus of net_wire_fuzz (tests/fuzz/corpus/net_wire).

Written from the format description in lib/net/wire.h rather than with the C++ encoders, so that
it also cross-checks them. Byte 0 of each input: bit 0 set = a hello comes first (see
net_wire_fuzz.cc). Usage: tests/fuzz/make_net_wire_corpus.py tests/fuzz/corpus/net_wire
"""
import os
import struct
import sys

MAGIC = 0x4C525453
VERSION = 1
DATA, ACK, PING, PONG, CLOSE, RETIRE = 1, 2, 3, 4, 5, 6


def hello(region=b"us-east", version=VERSION, magic=MAGIC, index=0, session=0x1234):
    return struct.pack("<IHHQHBB", magic, version, 0, session, index, len(region), 0) + region


def record(rtype, body):
    return struct.pack("<BBHI", rtype, 0, 0, len(body)) + body


def data(seq, channel, message_id, message_length, offset, payload):
    return record(DATA, struct.pack("<QIIQQQ", seq, channel, 0, message_id, message_length,
                                    offset) + payload)


def ack(cumulative, ranges):
    body = struct.pack("<QHHI", cumulative, len(ranges), 0, 0)
    for begin, end in ranges:
        body += struct.pack("<QQ", begin, end)
    return record(ACK, body)


def seeds():
    msg = bytes(range(256)) * 4  # 1024 bytes
    whole = data(0, 0, 0, len(msg), 0, msg)
    halves = data(1, 1, 0, 1024, 512, msg[512:]) + data(2, 1, 0, 1024, 0, msg[:512])
    yield "hello_then_everything", b"\x01" + hello() + whole + halves + ack(3, [(5, 9)]) + \
        record(PING, struct.pack("<Q", 42)) + record(PONG, struct.pack("<Q", 42)) + \
        record(RETIRE, b"") + record(CLOSE, struct.pack("<I", 0))
    yield "records_out_of_order_with_duplicates", b"\x00" + halves + halves + whole + \
        data(3, 0, 1, 0, 0, b"")
    yield "acks_cumulative_and_selective", b"\x00" + ack(0, []) + ack(2, [(4, 6), (8, 20)]) + \
        ack(64, [])
    yield "ack_beyond_what_was_sent", b"\x00" + ack(1000, [])
    yield "ack_ranges_unordered", b"\x00" + ack(1, [(9, 12), (4, 6)])
    yield "hello_bad_magic", b"\x01" + hello(magic=0x12345678)
    yield "hello_other_version", b"\x01" + hello(version=2)
    yield "hello_bad_region", b"\x01" + hello(region=b"US/EAST")
    yield "hello_stream_index_too_large", b"\x01" + hello(index=64)
    yield "message_larger_than_limit", b"\x00" + data(0, 0, 0, 1 << 20, 0, b"x")
    # Many 64 KiB messages started with one byte each: beyond the partial-message budget.
    yield "partial_budget_exceeded", b"\x00" + b"".join(
        data(i, i % 5, i // 5, 1 << 16, 0, b"y") for i in range(8))
    yield "chunk_outside_message", b"\x00" + data(0, 0, 0, 10, 8, b"abcd")
    yield "seq_far_ahead", b"\x00" + data(1 << 40, 0, 0, 1, 0, b"z")
    yield "truncated_record", b"\x00" + whole[:-10]
    yield "unknown_record_type", b"\x00" + record(99, b"abc")
    yield "ping_wrong_length", b"\x00" + record(PING, b"\x00" * 9)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                             "corpus", "net_wire")
    os.makedirs(out, exist_ok=True)
    for name, blob in seeds():
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(blob)


if __name__ == "__main__":
    main()
