// The region phases of the hierarchical all-reduce on their own (RegionReduceScatter,
// RegionAllGather: what library mode's host backend runs), m members over one in-process world:
// their results, their documented message format byte by byte, their errors, the region plan
// and phase two's deadline. HierarchicalAllReduce itself is tested in hierarchical_test.cc.
#include "collective/hierarchical.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>

#include "collective/local_transport.h"
#include "common/endian.h"
#include "strait/codec.h"
#include "strait/reduce.h"
#include "tests/collective/hierarchical_inputs.h"

namespace strait::collective {
namespace {

// ---- The region phases on their own (m members over one in-process world) ----

// The documented phase-1 reduction of `in` (one buffer per member) over members 0..m-1 in order:
// fp32 for sum/avg of float types (avg / m), rounded once; exactly otherwise (avg sums).
std::vector<uint8_t> RegionReference(const Buffers& in, size_t count, DataType dtype, ReduceOp op) {
  const int m = static_cast<int>(in.size());
  if (IsFloatReduction(dtype, op)) {
    std::vector<float> acc(count, 0.0f);
    for (int g = 0; g < m; ++g) {
      const std::vector<float> f = ToFloats(in[size_t(g)], dtype);
      for (size_t i = 0; i < count; ++i) acc[i] = g == 0 ? f[i] : acc[i] + f[i];
    }
    if (op == ReduceOp::kAvg) {
      for (float& x : acc) x /= static_cast<float>(m);
    }
    return ToBytes(acc, dtype);
  }
  EXPECT_EQ(dtype, DataType::kInt32);
  std::vector<int32_t> acc(count);
  std::memcpy(acc.data(), in[0].data(), count * 4);
  for (int g = 1; g < m; ++g) {
    std::vector<int32_t> v(count);
    std::memcpy(v.data(), in[size_t(g)].data(), count * 4);
    for (size_t i = 0; i < count; ++i) {
      acc[i] = op == ReduceOp::kMax ? std::max(acc[i], v[i]) : acc[i] + v[i];
    }
  }
  std::vector<uint8_t> out(count * 4);
  std::memcpy(out.data(), acc.data(), out.size());
  return out;
}

// Member g's RegionOperation over `world` for `data` (one op id for all).
RegionOperation RegionOp(LocalWorld& world, int g, const Plan& plan, std::vector<uint8_t>& data,
                         DataType dtype, ReduceOp op) {
  RegionOperation o;
  o.transport = &world.transport(g);
  o.op_id = 11;
  o.plan = &plan;
  o.data = data.data();
  o.dtype = dtype;
  o.op = op;
  o.deadline = Deadline::AfterSeconds(20);
  return o;
}

// The 16-byte header the file comment of hierarchical.h documents, written field by field here
// (not with the library's code) so that a change of the wire format fails this test.
std::vector<uint8_t> DocumentedMessage(uint8_t version, uint8_t kind, DataType dtype, ReduceOp op,
                                       uint64_t count, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> msg(16, 0);
  msg[0] = version;
  msg[1] = kind;
  msg[2] = static_cast<uint8_t>(dtype);
  msg[3] = static_cast<uint8_t>(op);
  PutU64(&msg[8], count);
  msg.insert(msg.end(), payload.begin(), payload.end());
  return msg;
}

TEST(RegionPhases, ReduceScatterReducesEachShardInMemberOrderAndAllGatherSharesIt) {
  struct Case {
    DataType dtype;
    ReduceOp op;
  };
  const Case cases[] = {{DataType::kFloat32, ReduceOp::kSum},
                        {DataType::kBfloat16, ReduceOp::kAvg},
                        {DataType::kInt32, ReduceOp::kMax},
                        {DataType::kInt32, ReduceOp::kAvg}};
  // 1001 elements: shards of 334, 334, 333, chunks of at most 100. 60001 in chunks of 20000:
  // a chunk spans several of the reduction's 8192-element blocks, the last one partial.
  const std::pair<size_t, size_t> sizes[] = {{1001, 100}, {60001, 20000}};
  for (const auto& [count, chunk_elements] : sizes) {
    for (const int m : {1, 3}) {
      for (const Case& c : cases) {
        const std::string what = std::string(DataTypeName(c.dtype)) + " " + ReduceOpName(c.op) +
                                 ", m = " + std::to_string(m) + ", " + std::to_string(count) +
                                 " elements";
        const size_t elem = DataTypeSize(c.dtype);
        auto plan = RegionPlan(count, m, chunk_elements);
        ASSERT_TRUE(plan.ok()) << plan.status();
        const Buffers inputs = Inputs(1, m, count, c.dtype);
        const std::vector<uint8_t> want = RegionReference(inputs, count, c.dtype, c.op);
        LocalWorld world(m);
        Buffers data = inputs;
        Buffers after_scatter(static_cast<size_t>(m));
        std::vector<RegionOperation> ops;
        std::vector<size_t> tracked(size_t(m), 0);
        auto failed_sends = std::make_shared<std::atomic<int>>(0);
        for (int g = 0; g < m; ++g) {
          ops.push_back(RegionOp(world, g, *plan, data[size_t(g)], c.dtype, c.op));
          ops.back().track_send = [&tracked, g, failed_sends] {
            ++tracked[size_t(g)];
            return SendDone([failed_sends](const Status& s) {
              if (!s.ok()) ++*failed_sends;
            });
          };
        }
        std::vector<Status> st(static_cast<size_t>(m));
        std::vector<std::thread> threads;
        for (int g = 0; g < m; ++g) {
          threads.emplace_back([&, g] {
            st[size_t(g)] = RegionReduceScatter(ops[size_t(g)]);
            after_scatter[size_t(g)] = data[size_t(g)];
            if (st[size_t(g)].ok()) st[size_t(g)] = RegionAllGather(ops[size_t(g)]);
          });
        }
        for (auto& t : threads) t.join();
        EXPECT_EQ(*failed_sends, 0) << what;
        for (int g = 0; g < m; ++g) {
          ASSERT_TRUE(st[size_t(g)].ok()) << what << ", member " << g << ": " << st[size_t(g)];
          // After phase 1: the member's own shard is reduced; the rest is still its input.
          const Shard shard = plan->shards[size_t(g)];
          for (size_t i = 0; i < count * elem; ++i) {
            const bool own = i >= shard.begin * elem && i < (shard.begin + shard.count) * elem;
            ASSERT_EQ(after_scatter[size_t(g)][i], own ? want[i] : inputs[size_t(g)][i])
                << what << ", member " << g << ", byte " << i;
          }
          // After phase 3: everything is the reduction, on every member.
          EXPECT_TRUE(data[size_t(g)] == want) << what << ", member " << g;
          // Phase 1 sends one message per chunk of every other shard, phase 3 one per own chunk
          // and other member; every message is the 16-byte header plus the chunk.
          const size_t own_chunks = plan->ChunkCount(g);
          const size_t other_chunks = plan->chunks.size() - own_chunks;
          EXPECT_EQ(tracked[size_t(g)], other_chunks + own_chunks * size_t(m - 1)) << what;
          const uint64_t sent = (count - shard.count) * elem + 16 * other_chunks +
                                uint64_t(m - 1) * (shard.count * elem + 16 * own_chunks);
          const uint64_t received = uint64_t(m - 1) * (shard.count * elem + 16 * own_chunks) +
                                    (count - shard.count) * elem + 16 * other_chunks;
          EXPECT_EQ(ops[size_t(g)].bytes_sent, sent) << what << ", member " << g;
          EXPECT_EQ(ops[size_t(g)].bytes_received, received) << what << ", member " << g;
          EXPECT_FALSE(ops[size_t(g)].peer_aborted) << what;
        }
        for (int g = 0; g < m; ++g) EXPECT_EQ(world.BufferedMessages(g), 0u) << what;
      }
    }
  }
}

TEST(RegionPhases, AcceptTheDocumentedMessageFormat) {
  // Member 1 is played by the test: its part of shard 0 (the first 2 of 4 int32) goes out in the
  // documented layout; member 0 must add it, and its own all-gather message must be that layout.
  LocalWorld world(2);
  auto plan = RegionPlan(4, 2, 16);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<int32_t> mine = {1, 2, 3, 4};
  std::vector<uint8_t> data(16);
  std::memcpy(data.data(), mine.data(), 16);
  RegionOperation o = RegionOp(world, 0, *plan, data, DataType::kInt32, ReduceOp::kSum);
  const std::vector<int32_t> theirs = {10, 20};
  std::vector<uint8_t> payload(8);
  std::memcpy(payload.data(), theirs.data(), 8);
  const Chunk& chunk0 = plan->ChunkOf(0, 0);
  world.transport(1).Send(
      0, MakeTag(o.op_id, TagPhase::kMeshScatter, chunk0.id),
      DocumentedMessage(kHierarchicalVersion, 0, DataType::kInt32, ReduceOp::kSum, 4, payload),
      o.deadline, [](const Status&) {});
  ASSERT_TRUE(RegionReduceScatter(o).ok());
  std::vector<int32_t> got(4);
  std::memcpy(got.data(), data.data(), 16);
  EXPECT_EQ(got, (std::vector<int32_t>{11, 22, 3, 4}));
  // Member 0's part of shard 1 and, after the all-gather, its result are documented messages.
  std::vector<uint8_t> msg;
  const Chunk& chunk1 = plan->ChunkOf(1, 0);
  ASSERT_TRUE(world.transport(1)
                  .Recv(0, MakeTag(o.op_id, TagPhase::kMeshScatter, chunk1.id), o.deadline, &msg)
                  .ok());
  std::vector<uint8_t> part(data.begin() + 8, data.end());
  EXPECT_EQ(msg, DocumentedMessage(2, 0, DataType::kInt32, ReduceOp::kSum, 4, part));
  std::memcpy(payload.data(), theirs.data(), 8);  // shard 1's result, as member 1 would send it
  world.transport(1).Send(0, MakeTag(o.op_id, TagPhase::kMeshGather, chunk1.id),
                          DocumentedMessage(2, 1, DataType::kInt32, ReduceOp::kSum, 4, payload),
                          o.deadline, [](const Status&) {});
  ASSERT_TRUE(RegionAllGather(o).ok());
  ASSERT_TRUE(world.transport(1)
                  .Recv(0, MakeTag(o.op_id, TagPhase::kMeshGather, chunk0.id), o.deadline, &msg)
                  .ok());
  const std::vector<uint8_t> result(data.begin(), data.begin() + 8);
  EXPECT_EQ(msg, DocumentedMessage(2, 1, DataType::kInt32, ReduceOp::kSum, 4, result));
  std::memcpy(got.data(), data.data(), 16);
  EXPECT_EQ(got, (std::vector<int32_t>{11, 22, 10, 20}));
}

TEST(RegionPhases, MalformedMessagesAreDataLossNamingThePeer) {
  struct Case {
    std::vector<uint8_t> message;
    const char* says;
  };
  const std::vector<uint8_t> two(8, 0);
  const Case cases[] = {
      {{1, 0, 7}, "shorter than the 16-byte header"},
      {DocumentedMessage(1, 0, DataType::kInt32, ReduceOp::kSum, 4, two), "version 1"},
      {DocumentedMessage(3, 0, DataType::kInt32, ReduceOp::kSum, 4, two), "version 3"},
      {DocumentedMessage(2, 1, DataType::kInt32, ReduceOp::kSum, 4, two), "kind 1"},
      // A result frame belongs to phase 3 only.
      {DocumentedMessage(2, 2, DataType::kInt32, ReduceOp::kSum, 4, two), "kind 2"},
      {DocumentedMessage(2, 0, DataType::kInt32, ReduceOp::kSum, 4, {1, 2, 3, 4}), "sent 4 bytes"},
  };
  for (const Case& c : cases) {
    LocalWorld world(2);
    auto plan = RegionPlan(4, 2, 16);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<uint8_t> data(16, 0);
    RegionOperation o = RegionOp(world, 0, *plan, data, DataType::kInt32, ReduceOp::kSum);
    world.transport(1).Send(0, MakeTag(o.op_id, TagPhase::kMeshScatter, plan->ChunkOf(0, 0).id),
                            c.message, o.deadline, [](const Status&) {});
    const Status s = RegionReduceScatter(o);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << c.says << ": " << s;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s;
    EXPECT_NE(s.message().find("region gateway"), std::string::npos) << s;
    EXPECT_FALSE(o.peer_aborted);
  }
}

TEST(RegionPhases, AllGatherTakesAMembersShardAsOneFrameAndRefusesABadOne) {
  // Member 1 (the test) sends its shard, elements 300..599 of 600 bfloat16, as the documented
  // kind-2 message: one int8 frame under the tag of the shard's first chunk. Member 0 must
  // decode it into place exactly as Decoder does, for every chunk of that shard at once.
  const size_t count = 600;
  auto plan = RegionPlan(count, 2, 128);  // three chunks per shard
  ASSERT_TRUE(plan.ok()) << plan.status();
  const Shard theirs = plan->shards[1];
  std::vector<float> values(theirs.count);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(float(i)) * 3.0f;
  CodecOptions int8;
  int8.codec = CodecId::kInt8;
  std::vector<uint8_t> frame;
  ASSERT_TRUE(Encoder().Encode(values.data(), values.size(), DataType::kFloat32, int8, &frame).ok());
  std::vector<uint8_t> want(theirs.count * 2);
  ASSERT_TRUE(Decoder().Decode(frame, want.data(), theirs.count, DataType::kBfloat16).ok());

  std::vector<uint8_t> corrupt = frame;
  corrupt.back() ^= 0x5a;  // a code byte: the payload's checksum no longer holds
  std::vector<uint8_t> lossless;
  ASSERT_TRUE(Encoder().Encode(values.data(), values.size(), DataType::kFloat32, CodecOptions{},
                               &lossless).ok());
  std::vector<uint8_t> short_one;  // a frame of one element fewer than the shard
  ASSERT_TRUE(Encoder().Encode(values.data(), values.size() - 1, DataType::kFloat32, int8,
                               &short_one).ok());
  struct Case {
    const std::vector<uint8_t>* frame;
    const char* says;  // empty: decodes
  };
  const Case cases[] = {{&frame, ""},
                        {&corrupt, "corrupted frame payload"},
                        {&lossless, "only a lossy one belongs"},
                        {&short_one, "does not decode to it"}};
  for (const Case& c : cases) {
    LocalWorld world(2);
    std::vector<uint8_t> data(count * 2, 0);
    RegionOperation o = RegionOp(world, 0, *plan, data, DataType::kBfloat16, ReduceOp::kSum);
    world.transport(1).Send(
        0, MakeTag(o.op_id, TagPhase::kMeshGather, plan->ChunkOf(1, 0).id),
        DocumentedMessage(2, 2, DataType::kBfloat16, ReduceOp::kSum, count, *c.frame), o.deadline,
        [](const Status&) {});
    const Status s = RegionAllGather(o);
    if (*c.says == 0) {
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(std::equal(want.begin(), want.end(), data.begin() + theirs.begin * 2));
      EXPECT_EQ(world.BufferedMessages(0), 0u);
      continue;
    }
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << c.says << ": " << s;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s;
    EXPECT_NE(s.message().find("region gateway"), std::string::npos) << s;
  }
}
TEST(RegionPhases, MembersThatDisagreeGetTheMismatchErrorInTheCallersWords) {
  LocalWorld world(2);
  Buffers data = Inputs(1, 2, 1001, DataType::kFloat32);
  // Member 1 was asked for one element more; one chunk per shard, so that the chunk ids agree.
  auto plan0 = RegionPlan(1000, 2, 1 << 20);
  auto plan1 = RegionPlan(1001, 2, 1 << 20);
  ASSERT_TRUE(plan0.ok() && plan1.ok());
  std::vector<Status> st(2);
  std::vector<std::thread> threads;
  for (int g = 0; g < 2; ++g) {
    threads.emplace_back([&, g] {
      RegionOperation o = RegionOp(world, g, g == 0 ? *plan0 : *plan1, data[size_t(g)],
                                   DataType::kFloat32, ReduceOp::kSum);
      o.names.peer = [](int peer) { return "rank #" + std::to_string(peer); };
      o.names.self = "this rank";
      o.names.members = "rank";
      o.names.mismatch_code = StatusCode::kFailedPrecondition;
      st[size_t(g)] = RegionReduceScatter(o);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(st[0].code(), StatusCode::kFailedPrecondition) << st[0];
  EXPECT_NE(st[0].message().find("every rank must issue the same all-reduces in the same order, "
                                 "but rank #1 runs one of 1001 float32 (sum) and this rank one "
                                 "of 1000 float32 (sum)"),
            std::string::npos)
      << st[0];
  EXPECT_EQ(st[1].code(), StatusCode::kFailedPrecondition) << st[1];
  EXPECT_NE(st[1].message().find("rank #0 runs one of 1000"), std::string::npos) << st[1];
}

TEST(RegionPhases, APeersAbortEndsTheWaitAndIsReported) {
  LocalWorld world(2);
  auto plan = RegionPlan(100, 2, 10);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<uint8_t> data(400, 0);
  RegionOperation o = RegionOp(world, 0, *plan, data, DataType::kInt32, ReduceOp::kSum);
  world.transport(1).Abort(o.op_id, UnavailableError("member 1 lost its gateway"));
  const Status s = RegionReduceScatter(o);
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("member 1 lost its gateway"), std::string::npos) << s;
  EXPECT_TRUE(o.peer_aborted);
}

TEST(RegionPhases, BadOperationsAreRefusedBeforeAnyMessage) {
  LocalWorld world(2);
  auto plan3 = RegionPlan(10, 3, 4);
  auto plan2 = RegionPlan(10, 2, 4);
  ASSERT_TRUE(plan3.ok() && plan2.ok());
  std::vector<uint8_t> data(40, 0);
  RegionOperation o = RegionOp(world, 0, *plan3, data, DataType::kInt32, ReduceOp::kSum);
  EXPECT_EQ(RegionReduceScatter(o).code(), StatusCode::kInvalidArgument);  // 3 shards, 2 members
  EXPECT_EQ(RegionAllGather(o).code(), StatusCode::kInvalidArgument);
  o.plan = nullptr;
  EXPECT_EQ(RegionReduceScatter(o).code(), StatusCode::kInvalidArgument);
  o.plan = &*plan2;
  o.data = nullptr;
  EXPECT_EQ(RegionReduceScatter(o).code(), StatusCode::kInvalidArgument);
  o.data = data.data();
  o.transport = nullptr;
  EXPECT_EQ(RegionAllGather(o).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(world.BufferedMessages(1), 0u);
}

TEST(RegionPhases, PlanAndPhaseTwoDeadline) {
  auto plan = RegionPlan(10, 3, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->shards.size(), 3u);
  const std::vector<Shard> shards = RegionShards(10, 3);
  for (size_t g = 0; g < 3; ++g) {
    EXPECT_EQ(plan->shards[g].begin, shards[g].begin);
    EXPECT_EQ(plan->shards[g].count, shards[g].count);
  }
  EXPECT_EQ(plan->ChunkCount(0), 2u);  // 4 elements in chunks of 2
  EXPECT_FALSE(RegionPlan(10, 0, 2).ok());
  EXPECT_FALSE(RegionPlan(10, 2, 0).ok());

  EXPECT_TRUE(CrossPhaseDeadline(Deadline::Infinite(), 4).IsInfinite());
  const Deadline d = Deadline::AfterSeconds(100);
  EXPECT_EQ(CrossPhaseDeadline(d, 1).at_nanos(), d.at_nanos());  // nobody to tell
  // A tenth of the time left, at most 2 s, earlier.
  // (The bounds allow for the time between the two clock readings.)
  const int64_t big = d.at_nanos() - CrossPhaseDeadline(d, 2).at_nanos();
  EXPECT_GT(big, 1'900'000'000);
  EXPECT_LE(big, 2'000'000'000);
  const Deadline soon = Deadline::AfterSeconds(1);
  const int64_t margin = soon.at_nanos() - CrossPhaseDeadline(soon, 2).at_nanos();
  EXPECT_GT(margin, 50'000'000);
  EXPECT_LE(margin, 100'000'000);

  EXPECT_TRUE(IsFloatReduction(DataType::kBfloat16, ReduceOp::kAvg));
  EXPECT_FALSE(IsFloatReduction(DataType::kFloat32, ReduceOp::kMax));
  EXPECT_FALSE(IsFloatReduction(DataType::kInt32, ReduceOp::kSum));
}

}  // namespace
}  // namespace strait::collective
