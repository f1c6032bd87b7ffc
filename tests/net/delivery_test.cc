// Tests of chunking, reassembly, acknowledgement and resend (the socket-free delivery books),
// including a randomized simulation of streams that reorder, die and redeliver.
#include "net/delivery.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

namespace strait::net {
namespace {

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 131 + i * 7 + (i >> 8));
  return v;
}

SendDone Record(std::vector<Status>* out) {
  return [out](Status s) { out->push_back(std::move(s)); };
}

void RunCompletions(std::vector<Completion>* completions) {
  for (auto& c : *completions) c.done(c.status);
  completions->clear();
}

TEST(SendBook, CutsMessagesIntoChunksOnDemand) {
  SendBook book;
  std::vector<Status> done;
  book.Enqueue(5, Pattern(1000, 1), INT64_MAX, Record(&done));
  std::vector<uint32_t> lengths;
  std::vector<uint64_t> offsets;
  while (const OutChunk* c = book.Next(0, 300, UINT64_MAX)) {
    EXPECT_EQ(c->seq, lengths.size());
    EXPECT_EQ(c->header().channel, 5u);
    EXPECT_EQ(c->header().message_length, 1000u);
    lengths.push_back(c->length);
    offsets.push_back(c->offset);
  }
  EXPECT_EQ(lengths, (std::vector<uint32_t>{300, 300, 300, 100}));
  EXPECT_EQ(offsets, (std::vector<uint64_t>{0, 300, 600, 900}));
  EXPECT_EQ(book.queued_bytes(), 0u);
}

TEST(SendBook, ZeroByteMessageIsOneEmptyChunk) {
  SendBook book;
  std::vector<Status> done;
  book.Enqueue(0, {}, INT64_MAX, Record(&done));
  const OutChunk* c = book.Next(0, 300, UINT64_MAX);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->length, 0u);
  EXPECT_EQ(book.Next(0, 300, UINT64_MAX), nullptr);
  uint64_t acked = 0;
  std::vector<Completion> completions;
  ASSERT_TRUE(book.OnAck(Ack{1, {}}, &acked, &completions).ok());
  RunCompletions(&completions);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok());
}

TEST(SendBook, SeqWindowsCountOnlyChunksCutInsideThemHoweverLateTheirAcks) {
  SendBook book;
  std::vector<Status> done;
  book.Enqueue(0, Pattern(1000, 1), INT64_MAX, Record(&done));
  ASSERT_NE(book.Next(0, 100, UINT64_MAX), nullptr);  // seq 0, cut before the window
  book.OpenSeqWindow();
  ASSERT_NE(book.Next(0, 100, UINT64_MAX), nullptr);  // seq 1
  ASSERT_NE(book.Next(0, 100, UINT64_MAX), nullptr);  // seq 2
  book.CloseSeqWindow();
  book.OpenSeqWindow();                               // the next round
  ASSERT_NE(book.Next(0, 100, UINT64_MAX), nullptr);  // seq 3, the next round's
  uint64_t acked = 0;
  std::vector<Completion> completions;
  // Seq 0 (before the window) and seq 3 (after it) are acked first; seq 1 and 2 come late.
  ASSERT_TRUE(book.OnAck(Ack{1, {{3, 4}}}, &acked, &completions).ok());
  EXPECT_EQ(acked, 200u);
  ASSERT_TRUE(book.OnAck(Ack{4, {}}, &acked, &completions).ok());
  EXPECT_EQ(acked, 200u);
  EXPECT_EQ(book.PopSeqWindow(), 200u);  // seq 1 and 2 only
  EXPECT_EQ(book.PopSeqWindow(), 0u);    // the open window is not popped
}

TEST(SendBook, InflightLimitMakesTheNextStreamTakeWork) {
  SendBook book;
  std::vector<Status> done;
  book.Enqueue(0, Pattern(1000, 1), INT64_MAX, Record(&done));
  ASSERT_NE(book.Next(0, 100, 200), nullptr);
  ASSERT_NE(book.Next(0, 100, 200), nullptr);
  EXPECT_EQ(book.Next(0, 100, 200), nullptr);  // stream 0 is full
  const OutChunk* c = book.Next(1, 100, 200);  // stream 1 steals the next chunk
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->seq, 2u);
  EXPECT_EQ(book.inflight_bytes(0), 200u);
  EXPECT_EQ(book.inflight_bytes(1), 100u);
}

TEST(SendBook, CompletesOnlyWhenEveryChunkIsAcked) {
  SendBook book;
  std::vector<Status> done;
  book.Enqueue(0, Pattern(400, 1), INT64_MAX, Record(&done));
  for (int i = 0; i < 4; ++i) ASSERT_NE(book.Next(i % 2, 100, UINT64_MAX), nullptr);
  uint64_t acked = 0;
  std::vector<Completion> completions;
  ASSERT_TRUE(book.OnAck(Ack{1, {{2, 4}}}, &acked, &completions).ok());  // 1 still missing
  EXPECT_EQ(acked, 300u);
  EXPECT_TRUE(completions.empty());
  ASSERT_TRUE(book.OnAck(Ack{4, {}}, &acked, &completions).ok());
  EXPECT_EQ(acked, 100u);
  RunCompletions(&completions);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok());
  EXPECT_TRUE(book.idle());
}

TEST(SendBook, AckOfUnsentChunkIsAnError) {
  SendBook book;
  uint64_t acked = 0;
  std::vector<Completion> completions;
  EXPECT_FALSE(book.OnAck(Ack{1, {}}, &acked, &completions).ok());
}

TEST(SendBook, LostStreamsChunksAreResentFirst) {
  SendBook book;
  std::vector<Status> done;
  book.Enqueue(0, Pattern(600, 1), INT64_MAX, Record(&done));
  for (int i = 0; i < 4; ++i) ASSERT_NE(book.Next(i % 2, 100, UINT64_MAX), nullptr);
  // Stream 1 carried seqs 1 and 3.
  EXPECT_EQ(book.OnStreamLost(1), 2u);
  EXPECT_EQ(book.inflight_bytes(1), 0u);
  const OutChunk* a = book.Next(0, 100, UINT64_MAX);
  const OutChunk* b = book.Next(2, 100, UINT64_MAX);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->seq, 1u);
  EXPECT_EQ(b->seq, 3u);
  EXPECT_EQ(book.chunks_resent(), 2u);
  EXPECT_EQ(book.Next(0, 100, UINT64_MAX)->seq, 4u);  // then new cuts
}

TEST(SendBook, AckedChunkLeavesTheResendQueue) {
  SendBook book;
  std::vector<Status> done;
  book.Enqueue(0, Pattern(200, 1), INT64_MAX, Record(&done));
  ASSERT_NE(book.Next(0, 100, UINT64_MAX), nullptr);
  ASSERT_NE(book.Next(0, 100, UINT64_MAX), nullptr);
  book.OnStreamLost(0);
  uint64_t acked = 0;
  std::vector<Completion> completions;
  // The ack for seq 0 was already on its way on another stream.
  ASSERT_TRUE(book.OnAck(Ack{1, {}}, &acked, &completions).ok());
  EXPECT_EQ(book.resend_queue(), 1u);
  EXPECT_EQ(book.Next(1, 100, UINT64_MAX)->seq, 1u);
}

TEST(SendBook, DeadlineDropsUnstartedAndFlagsStarted) {
  SendBook book;
  std::vector<Status> done;
  book.Enqueue(0, Pattern(200, 1), 100, Record(&done));
  book.Enqueue(0, Pattern(200, 2), 100, Record(&done));
  ASSERT_NE(book.Next(0, 100, UINT64_MAX), nullptr);  // first message started
  std::vector<Completion> completions;
  book.ExpireDeadlines(200, "region x", &completions);
  RunCompletions(&completions);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(done[0].message().find("region x"), std::string::npos);
  EXPECT_NE(done[1].message().find("not sent"), std::string::npos) << done[1];
  // The started message is still cut to the end; the unstarted one never appears.
  const OutChunk* c = book.Next(0, 100, UINT64_MAX);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->offset, 100u);
  EXPECT_EQ(book.Next(0, 100, UINT64_MAX), nullptr);
  EXPECT_EQ(book.queued_bytes(), 0u);
}

TEST(SendBook, FailAllCompletesEverythingOnce) {
  SendBook book;
  std::vector<Status> done;
  book.Enqueue(0, Pattern(200, 1), INT64_MAX, Record(&done));
  book.Enqueue(1, Pattern(200, 2), INT64_MAX, Record(&done));
  ASSERT_NE(book.Next(0, 100, UINT64_MAX), nullptr);
  std::vector<Completion> completions;
  book.FailAll(UnavailableError("gone"), &completions);
  RunCompletions(&completions);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[1].code(), StatusCode::kUnavailable);
  EXPECT_TRUE(book.idle());
}

DataHeader Chunk(uint64_t seq, uint32_t channel, uint64_t id, uint64_t length, uint64_t offset) {
  return DataHeader{seq, channel, id, length, offset};
}

TEST(ReceiveBook, ReassemblesOutOfOrderAndDeduplicates) {
  ReceiveBook book(1 << 20);
  const std::vector<uint8_t> msg = Pattern(300, 9);
  std::vector<Delivery> out;
  bool dup = false;
  ASSERT_TRUE(book.OnChunk(Chunk(2, 0, 0, 300, 200), std::span(msg).subspan(200), &dup, &out)
                  .ok());
  ASSERT_TRUE(book.OnChunk(Chunk(0, 0, 0, 300, 0), std::span(msg).first(100), &dup, &out).ok());
  EXPECT_TRUE(out.empty());
  Ack ack = book.MakeAck();
  EXPECT_EQ(ack.cumulative, 1u);
  ASSERT_EQ(ack.ranges.size(), 1u);
  EXPECT_EQ(ack.ranges[0].begin, 2u);
  ASSERT_TRUE(book.OnChunk(Chunk(0, 0, 0, 300, 0), std::span(msg).first(100), &dup, &out).ok());
  EXPECT_TRUE(dup);
  ASSERT_TRUE(
      book.OnChunk(Chunk(1, 0, 0, 300, 100), std::span(msg).subspan(100, 100), &dup, &out).ok());
  EXPECT_FALSE(dup);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].data, msg);
  EXPECT_EQ(book.MakeAck().cumulative, 3u);
  EXPECT_TRUE(book.MakeAck().ranges.empty());
}

TEST(ReceiveBook, KeepsOrderPerChannelButNotAcrossChannels) {
  ReceiveBook book(1 << 20);
  std::vector<Delivery> out;
  bool dup = false;
  const std::vector<uint8_t> a = Pattern(10, 1), b = Pattern(10, 2), c = Pattern(10, 3);
  // Channel 0 message 1 completes before message 0: held back.
  ASSERT_TRUE(book.OnChunk(Chunk(1, 0, 1, 10, 0), b, &dup, &out).ok());
  // Channel 1 message 0 is delivered at once.
  ASSERT_TRUE(book.OnChunk(Chunk(2, 1, 0, 10, 0), c, &dup, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].channel, 1u);
  ASSERT_TRUE(book.OnChunk(Chunk(0, 0, 0, 10, 0), a, &dup, &out).ok());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[1].data, a);
  EXPECT_EQ(out[2].data, b);
}

TEST(ReceiveBook, RefusesWhatContradictsOrExceedsLimits) {
  ReceiveBook book(1000);
  std::vector<Delivery> out;
  bool dup = false;
  std::vector<uint8_t> p(10);
  EXPECT_EQ(book.OnChunk(Chunk(0, 0, 0, 1001, 0), p, &dup, &out).code(),
            StatusCode::kResourceExhausted);
  ASSERT_TRUE(book.OnChunk(Chunk(0, 0, 0, 100, 0), p, &dup, &out).ok());
  EXPECT_FALSE(book.OnChunk(Chunk(1, 0, 0, 200, 10), p, &dup, &out).ok());  // other length
  EXPECT_FALSE(book.OnChunk(Chunk(ReceiveBook::kMaxSeqWindow + 5, 0, 1, 10, 0), p, &dup, &out)
                   .ok());
  std::vector<uint8_t> big(100);
  EXPECT_FALSE(book.OnChunk(Chunk(2, 0, 0, 100, 0), big, &dup, &out).ok());  // overlaps
}

// Chunks that overlap are refused the moment they arrive, wherever the overlap lies: counting
// bytes alone took [0,10) [5,15) [20,30) of a 30-byte message as complete with [15,20) unwritten.
TEST(ReceiveBook, OverlappingChunksAreRefusedWhereverTheyLie) {
  struct Case {
    const char* what;
    std::vector<std::pair<size_t, size_t>> accepted;  // (offset, length) taken first
    std::pair<size_t, size_t> refused;
  };
  const std::vector<Case> cases = {
      {"over the furthest end", {{0, 10}}, {5, 10}},
      {"over a chunk after a hole", {{0, 10}, {20, 10}}, {15, 10}},
      {"a hole's chunk reaching past it", {{0, 10}, {20, 10}}, {10, 12}},
      {"inside a written chunk", {{20, 10}}, {22, 3}},
      {"before a hole's start", {{0, 5}, {10, 5}}, {4, 3}},
      {"the hole split, then its first part again", {{0, 5}, {20, 10}, {10, 5}}, {7, 4}},
  };
  for (const Case& c : cases) {
    ReceiveBook book(1000);
    std::vector<Delivery> out;
    bool dup = false;
    const std::vector<uint8_t> m = Pattern(30, 4);
    uint64_t seq = 0;
    uint64_t taken = 0;
    for (const auto& [at, n] : c.accepted) {
      ASSERT_TRUE(book.OnChunk(Chunk(seq++, 0, 0, 30, at), std::span(m).subspan(at, n), &dup, &out)
                      .ok())
          << c.what;
      taken += n;
    }
    const auto [at, n] = c.refused;
    // Refused before anything changed: the same chunk resent on another stream is refused
    // again, and the message stays partial.
    for (int resend = 0; resend < 2; ++resend) {
      EXPECT_EQ(
          book.OnChunk(Chunk(seq, 0, 0, 30, at), std::span(m).subspan(at, n), &dup, &out).code(),
          StatusCode::kDataLoss)
          << c.what;
    }
    EXPECT_FALSE(dup);
    EXPECT_TRUE(out.empty()) << c.what;
    EXPECT_EQ(book.partial_messages(), 1u);
    EXPECT_EQ(book.partial_bytes(), 30u);
    // The refusals changed nothing: the bytes still missing, sent one at a time, complete the
    // message exactly once and whole.
    std::vector<bool> written(30, false);
    for (const auto& [o, len] : c.accepted) {
      for (size_t b = o; b < o + len; ++b) written[b] = true;
    }
    for (size_t b = 0; b < 30; ++b) {
      if (written[b]) continue;
      ASSERT_TRUE(book.OnChunk(Chunk(++seq, 0, 0, 30, b), std::span(m).subspan(b, 1), &dup, &out)
                      .ok())
          << c.what << ", byte " << b;
      taken += 1;
    }
    ASSERT_EQ(taken, 30u);
    ASSERT_EQ(out.size(), 1u) << c.what;
    EXPECT_EQ(out[0].data, m) << c.what;
    EXPECT_EQ(book.partial_bytes(), 0u);
  }
}

// A peer that cuts messages into many chunks with a byte missing between each makes the book
// remember every gap: their number is capped (kMaxHoles over all messages), and a chunk that
// would open one more, by splitting a gap or by landing beyond a message's end, is refused
// before it changes anything; one that closes a gap, or appends at the end, is still taken.
TEST(ReceiveBook, CapsTheGapsItRemembers) {
  ReceiveBook book(1u << 20);
  std::vector<Delivery> out;
  bool dup = false;
  const uint64_t length = 2 * ReceiveBook::kMaxHoles + 16;
  const std::vector<uint8_t> one = {7};
  uint64_t seq = 0;
  // The message's last byte first (one gap before it), then every other byte from 1 up: each
  // splits the remaining gap in two.
  ASSERT_TRUE(book.OnChunk(Chunk(seq++, 0, 0, length, length - 1), one, &dup, &out).ok());
  Status s;
  uint64_t at = 1;
  for (; at < length - 1; at += 2) {
    s = book.OnChunk(Chunk(seq++, 0, 0, length, at), one, &dup, &out);
    if (!s.ok()) break;
  }
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("gaps"), std::string::npos) << s.message();
  EXPECT_EQ(at, 2 * ReceiveBook::kMaxHoles - 1);  // kMaxHoles - 1 splits after the first gap
  // Beyond the end of another message: refused too.
  EXPECT_EQ(book.OnChunk(Chunk(seq++, 1, 0, 10, 5), one, &dup, &out).code(),
            StatusCode::kResourceExhausted);
  // Closing a gap ([0,1)) is taken; then there is room for one more.
  ASSERT_TRUE(book.OnChunk(Chunk(seq++, 0, 0, length, 0), one, &dup, &out).ok());
  ASSERT_TRUE(book.OnChunk(Chunk(seq++, 1, 0, 10, 5), one, &dup, &out).ok());
  EXPECT_EQ(book.OnChunk(Chunk(seq++, 0, 0, length, at), one, &dup, &out).code(),
            StatusCode::kResourceExhausted);
  // Appending at a message's furthest end opens none.
  ASSERT_TRUE(book.OnChunk(Chunk(seq++, 1, 0, 10, 6), one, &dup, &out).ok());
  EXPECT_TRUE(out.empty());
}

// Holes are filled in any order and in pieces; the message comes out whole when the last one
// closes, and not before.
TEST(ReceiveBook, HolesFillInPiecesAndInAnyOrder) {
  ReceiveBook book(1000);
  std::vector<Delivery> out;
  bool dup = false;
  const std::vector<uint8_t> m = Pattern(40, 9);
  // Appends at the furthest end while gaps are open, a zero-length chunk inside written bytes
  // (nothing to write: taken), and gaps closed from either side and in the middle.
  const std::vector<std::pair<size_t, size_t>> chunks = {
      {20, 5}, {0, 4}, {25, 5}, {2, 0}, {30, 10}, {12, 6}, {4, 2}, {18, 2}, {8, 4}, {6, 2}};
  uint64_t seq = 0;
  for (size_t k = 0; k < chunks.size(); ++k) {
    const auto [at, n] = chunks[k];
    ASSERT_TRUE(
        book.OnChunk(Chunk(seq++, 0, 0, 40, at), std::span(m).subspan(at, n), &dup, &out).ok())
        << "chunk " << k;
    EXPECT_EQ(out.size(), k + 1 == chunks.size() ? 1u : 0u) << "chunk " << k;
  }
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].data, m);
  EXPECT_EQ(book.partial_bytes(), 0u);
}

// Every arrival order of a message's chunks, gaps first included, gives the same bytes.
TEST(ReceiveBook, AnyChunkOrderGivesTheSameMessage) {
  const std::vector<uint8_t> m = Pattern(40, 6);
  std::vector<int> order = {0, 1, 2, 3};
  do {
    ReceiveBook book(1000);
    std::vector<Delivery> out;
    bool dup = false;
    for (int k : order) {
      const size_t at = static_cast<size_t>(k) * 10;
      ASSERT_TRUE(book.OnChunk(Chunk(static_cast<uint64_t>(k), 0, 0, 40, at),
                               std::span(m).subspan(at, 10), &dup, &out)
                      .ok());
    }
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].data, m) << order[0] << order[1] << order[2] << order[3];
  } while (std::next_permutation(order.begin(), order.end()));
}

// Random simulation: K streams that reorder chunks between themselves, lose acks and die
// mid-flight (resending their unacked chunks elsewhere); every message must arrive exactly once,
// intact, in order per channel, and every send must complete OK.
TEST(ReceiveBook, CapsBytesHeldForPartialMessages) {
  ReceiveBook book(1000, 2500);
  bool dup = false;
  std::vector<Delivery> out;
  const std::vector<uint8_t> byte(1, 7);
  // Two 1000-byte messages started on channel 0 and a third on channel 1: 3000 > 2500.
  ASSERT_TRUE(book.OnChunk(DataHeader{0, 0, 0, 1000, 0}, byte, &dup, &out).ok());
  ASSERT_TRUE(book.OnChunk(DataHeader{1, 0, 1, 1000, 0}, byte, &dup, &out).ok());
  EXPECT_EQ(book.partial_bytes(), 2000u);
  const Status s = book.OnChunk(DataHeader{2, 1, 0, 1000, 0}, byte, &dup, &out);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("max_partial_bytes"), std::string::npos) << s;
  EXPECT_EQ(book.partial_bytes(), 2000u);
  // A small one still fits, and delivering frees what a message held.
  ASSERT_TRUE(book.OnChunk(DataHeader{3, 1, 0, 400, 0}, std::vector<uint8_t>(400, 1), &dup, &out)
                  .ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(book.partial_bytes(), 2000u);
  ASSERT_TRUE(book.OnChunk(DataHeader{4, 0, 0, 1000, 1}, std::vector<uint8_t>(999, 2), &dup, &out)
                  .ok());
  EXPECT_EQ(book.partial_bytes(), 1000u);
  EXPECT_TRUE(book.OnChunk(DataHeader{5, 1, 1, 1000, 0}, byte, &dup, &out).ok());
}

TEST(SendBook, HoldsNewMessagesBackWithinTheReceiversPartialBudget) {
  SendBook book;
  book.set_max_started_bytes(2500);
  std::vector<Status> done;
  for (int i = 0; i < 3; ++i) book.Enqueue(0, Pattern(1000, i), INT64_MAX, Record(&done));
  // Two messages fit; the third waits although streams could take it.
  const OutChunk* a = book.Next(0, 1000, UINT64_MAX);
  const OutChunk* b = book.Next(1, 1000, UINT64_MAX);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(book.Next(2, 1000, UINT64_MAX), nullptr);
  EXPECT_EQ(book.started_bytes(), 2000u);
  // Acking the second message does not free it: the receiver holds it until the first arrives.
  uint64_t acked = 0;
  std::vector<Completion> completions;
  ASSERT_TRUE(book.OnAck(Ack{0, {AckRange{1, 2}}}, &acked, &completions).ok());
  RunCompletions(&completions);
  EXPECT_EQ(done.size(), 1u);
  EXPECT_EQ(book.Next(2, 1000, UINT64_MAX), nullptr);
  ASSERT_TRUE(book.OnAck(Ack{2, {}}, &acked, &completions).ok());
  RunCompletions(&completions);
  EXPECT_EQ(book.started_bytes(), 0u);
  EXPECT_NE(book.Next(2, 1000, UINT64_MAX), nullptr);
  // A message larger than the budget still goes when nothing else is held.
  SendBook big;
  big.set_max_started_bytes(100);
  big.Enqueue(0, Pattern(1000, 9), INT64_MAX, Record(&done));
  EXPECT_NE(big.Next(0, 64, UINT64_MAX), nullptr);
}

TEST(SendBook, ChannelsTakeTurnsChunkByChunkKeepingOrderWithinEach) {
  SendBook book;
  std::vector<Status> done;
  // A big job's message on channel 16 is queued first, then two small ones on channel 17.
  book.Enqueue(16, Pattern(1000, 1), INT64_MAX, Record(&done));
  book.Enqueue(16, Pattern(200, 2), INT64_MAX, Record(&done));
  book.Enqueue(17, Pattern(250, 3), INT64_MAX, Record(&done));
  book.Enqueue(17, Pattern(100, 4), INT64_MAX, Record(&done));
  struct Cut {
    uint32_t channel;
    uint64_t id;
    uint64_t offset;
    bool operator==(const Cut&) const = default;
  };
  std::vector<Cut> cuts;
  while (const OutChunk* c = book.Next(0, 100, UINT64_MAX)) {
    cuts.push_back(Cut{c->header().channel, c->header().message_id, c->offset});
  }
  // Channel 17's 350 bytes go out within the first 8 chunks instead of after channel 16's
  // 1200; each channel's messages and offsets stay in order.
  const std::vector<Cut> want = {
      {16, 0, 0},   {17, 0, 0},   {16, 0, 100}, {17, 0, 100}, {16, 0, 200}, {17, 0, 200},
      {16, 0, 300}, {17, 1, 0},   {16, 0, 400}, {16, 0, 500}, {16, 0, 600}, {16, 0, 700},
      {16, 0, 800}, {16, 0, 900}, {16, 1, 0},   {16, 1, 100},
  };
  ASSERT_EQ(cuts.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(cuts[i] == want[i]) << "chunk " << i << ": channel " << cuts[i].channel
                                    << " message " << cuts[i].id << " offset " << cuts[i].offset;
  }
  EXPECT_EQ(book.queued_bytes(), 0u);
  EXPECT_FALSE(book.has_work());
  // A channel that joins later gets its turn after the channels already waiting.
  SendBook late;
  late.Enqueue(1, Pattern(300, 5), INT64_MAX, Record(&done));
  ASSERT_EQ(late.Next(0, 100, UINT64_MAX)->header().channel, 1u);
  late.Enqueue(2, Pattern(300, 6), INT64_MAX, Record(&done));
  std::vector<uint32_t> channels;
  for (int i = 0; i < 4; ++i) channels.push_back(late.Next(0, 100, UINT64_MAX)->header().channel);
  EXPECT_EQ(channels, (std::vector<uint32_t>{1, 2, 1, 2}));
}

TEST(SendBook, AChannelWaitingForBudgetIsNotOvertakenByNewStarts) {
  SendBook book;
  book.set_max_started_bytes(1000);
  std::vector<Status> done;
  book.Enqueue(1, Pattern(800, 1), INT64_MAX, Record(&done));  // started first
  book.Enqueue(2, Pattern(500, 2), INT64_MAX, Record(&done));  // does not fit beside it
  book.Enqueue(3, Pattern(100, 3), INT64_MAX, Record(&done));  // would fit, but queued later
  std::vector<uint32_t> channels;
  while (const OutChunk* c = book.Next(0, 400, UINT64_MAX)) channels.push_back(c->message->channel);
  EXPECT_EQ(channels, (std::vector<uint32_t>{1, 1}));
  uint64_t acked = 0;
  std::vector<Completion> completions;
  ASSERT_TRUE(book.OnAck(Ack{2, {}}, &acked, &completions).ok());
  RunCompletions(&completions);
  channels.clear();
  while (const OutChunk* c = book.Next(0, 400, UINT64_MAX)) channels.push_back(c->message->channel);
  // Channel 2 starts first; channel 3's 100 bytes fit beside its 500 and go in turn.
  EXPECT_EQ(channels, (std::vector<uint32_t>{2, 3, 2}));
}

TEST(Delivery, SurvivesReorderingStreamDeathAndDuplicates) {
  // Without and with a partial-message budget (which holds channels' starts back).
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    const uint64_t budget = seed % 2 == 0 ? 8000 : UINT64_MAX;
    std::mt19937 rng(seed);
    SendBook send;
    send.set_max_started_bytes(budget);
    ReceiveBook receive(1 << 20, budget);
    std::vector<Status> done;
    std::map<uint32_t, std::vector<std::vector<uint8_t>>> sent, received;
    for (uint32_t i = 0; i < 30; ++i) {
      const uint32_t channel = rng() % 3;
      std::vector<uint8_t> m = Pattern(rng() % 5000, seed * 100 + i);
      sent[channel].push_back(m);
      send.Enqueue(channel, std::move(m), INT64_MAX, Record(&done));
    }
    constexpr int kStreams = 3;
    std::vector<std::vector<OutChunk>> wire(kStreams);  // chunks in flight per stream
    for (int step = 0; step < 100000 && done.size() < 30; ++step) {
      const int s = static_cast<int>(rng() % kStreams);
      const int action = static_cast<int>(rng() % 10);
      if (action < 5) {
        if (const OutChunk* c = send.Next(s, 700, 4000)) wire[s].push_back(*c);
      } else if (action < 9 && !wire[s].empty()) {
        // Deliver the oldest chunk on stream s (in order within a stream, like TCP).
        OutChunk c = wire[s].front();
        wire[s].erase(wire[s].begin());
        bool dup = false;
        std::vector<Delivery> out;
        std::span<const uint8_t> payload(c.payload(), c.length);
        ASSERT_TRUE(receive.OnChunk(c.header(), payload, &dup, &out).ok());
        for (auto& d : out) received[d.channel].push_back(std::move(d.data));
        if (rng() % 3 != 0) {  // some acks are lost
          uint64_t acked = 0;
          std::vector<Completion> completions;
          ASSERT_TRUE(send.OnAck(receive.MakeAck(), &acked, &completions).ok());
          RunCompletions(&completions);
        }
      } else if (rng() % 8 == 0) {
        wire[s].clear();  // the stream dies with its chunks
        send.OnStreamLost(s);
      }
      if (step % 50 == 0) {  // an ack eventually gets through
        uint64_t acked = 0;
        std::vector<Completion> completions;
        ASSERT_TRUE(send.OnAck(receive.MakeAck(), &acked, &completions).ok());
        RunCompletions(&completions);
      }
    }
    ASSERT_EQ(done.size(), 30u) << "seed " << seed;
    for (const Status& s : done) EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(received, sent) << "seed " << seed;
  }
}

}  // namespace
}  // namespace strait::net
