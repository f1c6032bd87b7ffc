// Job policies: parsing of policy strings, clamping to the operator's limits, per-tensor choice,
// the regions' merge and its control message, the agreement between gateways, and `auto`'s
// per-link codecs (chosen from synthetic link estimates and codec profiles, then run through
// collective::AllReduce over in-process ranks to check that mixed codecs stay bit-identical).
#include "gateway/policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>

#include "collective/allreduce.h"
#include "collective/local_transport.h"

namespace strait::gateway {
namespace {

TEST(JobPolicy, TakesAnAllowedRequestAsAsked) {
  PolicyLimits limits;
  limits.default_error_feedback = false;
  auto p = ResolvePolicy("int8,ef", limits);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->codec, CodecId::kInt8);
  EXPECT_TRUE(p->error_feedback);
  EXPECT_TRUE(p->note.empty());
  auto q = ResolvePolicy("int8", limits);
  ASSERT_TRUE(q.ok());
  EXPECT_FALSE(q->error_feedback);  // the operator's default
}

TEST(JobPolicy, DisallowedCodecFallsBackToBestLossless) {
  PolicyLimits limits;
  limits.allowed_codecs = {CodecId::kNone, CodecId::kZstd, CodecId::kInt8};
  auto p = ResolvePolicy("int4,ef", limits);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->codec, CodecId::kZstd);
  EXPECT_FALSE(p->error_feedback);
  EXPECT_NE(p->note.find("int4 not allowed"), std::string::npos) << p->note;
  EXPECT_NE(p->ToString().find("int4 not allowed"), std::string::npos);

  limits.allowed_codecs = {CodecId::kNone, CodecId::kInt8};
  auto q = ResolvePolicy("zstd:3", limits);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->codec, CodecId::kNone);
  EXPECT_NE(q->note.find("zstd not allowed"), std::string::npos);
}

TEST(JobPolicy, ErrorBoundAboveTheLimitFallsBack) {
  PolicyLimits limits;
  limits.max_relative_error = 0.01;
  auto p = ResolvePolicy("fp8", limits);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->codec, CodecId::kZstd);
  EXPECT_NE(p->note.find("max_relative_error"), std::string::npos) << p->note;
  auto q = ResolvePolicy("int8", limits);  // 1/254 < 0.01
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->codec, CodecId::kInt8);
}

TEST(JobPolicy, AutoAndEmptyUseLosslessAndTheDefault) {
  PolicyLimits limits;
  auto a = ResolvePolicy("auto", limits);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->codec, CodecId::kZstd);
  EXPECT_TRUE(a->automatic);
  EXPECT_FALSE(a->error_feedback);
  EXPECT_EQ(a->ToString(), "auto (lossless per link: none, zstd:1)");
  limits.default_codec = "int8";
  auto d = ResolvePolicy("", limits);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->codec, CodecId::kInt8);
}

TEST(TensorCodec, LossyOnlyForLargeFloatSums) {
  PolicyLimits limits;
  limits.min_lossy_bytes = 4096;
  auto p = ResolvePolicy("int8,ef", limits);
  ASSERT_TRUE(p.ok());
  auto big = ChooseTensorCodec(*p, DataType::kFloat32, ReduceOp::kSum, 1024);
  EXPECT_EQ(big.codec.codec, CodecId::kInt8);
  EXPECT_TRUE(big.error_feedback);
  EXPECT_EQ(ChooseTensorCodec(*p, DataType::kBfloat16, ReduceOp::kAvg, 2048).codec.codec,
            CodecId::kInt8);
  // Too small, wrong op, wrong type: lossless, and no error feedback.
  auto small = ChooseTensorCodec(*p, DataType::kFloat32, ReduceOp::kSum, 1023);
  EXPECT_EQ(small.codec.codec, CodecId::kZstd);
  EXPECT_FALSE(small.error_feedback);
  EXPECT_EQ(ChooseTensorCodec(*p, DataType::kFloat32, ReduceOp::kMax, 4096).codec.codec,
            CodecId::kZstd);
  EXPECT_EQ(ChooseTensorCodec(*p, DataType::kInt32, ReduceOp::kSum, 4096).codec.codec,
            CodecId::kZstd);
  EXPECT_EQ(ChooseTensorCodec(*p, DataType::kFloat64, ReduceOp::kSum, 4096).codec.codec,
            CodecId::kZstd);
}

TEST(JobPolicy, AutoMayGoLossyOnlyWithinTheLimits) {
  PolicyLimits limits;
  auto a = ResolvePolicy("auto:int8,ef", limits);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->automatic);
  EXPECT_EQ(a->codec, CodecId::kInt8);
  EXPECT_TRUE(a->error_feedback);
  EXPECT_EQ(a->ToString().rfind("auto:int8+ef (lossy from 64 KiB", 0), 0u) << a->ToString();
  limits.allowed_codecs = {CodecId::kNone, CodecId::kZstd};
  auto b = ResolvePolicy("auto:int8", limits);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->automatic);
  EXPECT_EQ(b->codec, CodecId::kZstd);
  EXPECT_NE(b->note.find("int8 not allowed"), std::string::npos) << b->note;
}

// ---- The regions' merge -----------------------------------------------------------------------

PolicyOffer Offer(const std::string& region, const std::string& request,
                  PolicyLimits limits = PolicyLimits{}) {
  auto p = ResolvePolicy(request, limits);
  EXPECT_TRUE(p.ok()) << p.status();
  return PolicyOffer{region, p.ok() ? *p : JobPolicy{}};
}

// Merges every permutation of `offers` and checks that they all agree (the merge must not depend
// on the order offers arrived in); returns the merge of the given order.
StatusOr<JobPolicy> MergeAllOrders(std::vector<PolicyOffer> offers) {
  auto first = MergePolicies("job", offers);
  std::vector<size_t> order(offers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  while (std::next_permutation(order.begin(), order.end())) {
    std::vector<PolicyOffer> permuted;
    for (size_t i : order) permuted.push_back(offers[i]);
    auto m = MergePolicies("job", permuted);
    EXPECT_EQ(m.ok(), first.ok());
    if (m.ok() && first.ok()) {
      EXPECT_EQ(m->ToString(), first->ToString());
      EXPECT_EQ(EncodePolicyOffer(PolicyMessageKind::kOffer, "job", *m),
                EncodePolicyOffer(PolicyMessageKind::kOffer, "job", *first));
    } else if (!m.ok() && !first.ok()) {
      EXPECT_EQ(m.status().message(), first.status().message());
    }
  }
  return first;
}

TEST(MergePolicies, EqualPoliciesStayAsTheyAre) {
  auto m = MergeAllOrders({Offer("us", "int8,ef"), Offer("eu", "int8,ef"), Offer("ap", "int8,ef")});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->codec, CodecId::kInt8);
  EXPECT_FALSE(m->automatic);
  EXPECT_TRUE(m->error_feedback);
  EXPECT_EQ(m->lossless_fallback, CodecId::kZstd);
  EXPECT_EQ(m->note, "agreed by ap, eu, us");
}

TEST(MergePolicies, OneLosslessRegionMakesTheJobLossless) {
  PolicyLimits strict;
  strict.allowed_codecs = {CodecId::kNone, CodecId::kZstd};
  auto m = MergeAllOrders({Offer("us", "int8"), Offer("eu", "int8", strict), Offer("ap", "int8")});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->codec, CodecId::kZstd);
  EXPECT_FALSE(m->error_feedback);
  EXPECT_NE(m->note.find("eu's policy for the job is lossless"), std::string::npos) << m->note;
  // The intersection of what the regions allow is what receivers accept.
  EXPECT_EQ(m->allowed_codecs, (std::vector<CodecId>{CodecId::kNone, CodecId::kZstd}));
}

TEST(MergePolicies, TheMostAccurateLossyCodecEveryRegionAllows) {
  auto m = MergeAllOrders({Offer("us", "fp8,noef"), Offer("eu", "int8,ef"), Offer("ap", "int4")});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->codec, CodecId::kInt8);
  EXPECT_TRUE(m->error_feedback);  // any region's ef turns it on
  PolicyLimits no_int8;
  no_int8.allowed_codecs = {CodecId::kZstd, CodecId::kFp8E4M3, CodecId::kInt4};
  auto n = MergeAllOrders({Offer("us", "fp8"), Offer("eu", "int8"), Offer("ap", "int4", no_int8)});
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->codec, CodecId::kFp8E4M3);  // int8 is not allowed in ap; fp8 (1/16) < int4 (1/14)
  // A limit on the error below every lossy codec the regions use: lossless.
  PolicyLimits tight;
  tight.max_relative_error = 0.002;
  auto t = MergePolicies("job", std::vector<PolicyOffer>{Offer("us", "fp8"), Offer("eu", "fp8"),
                                                         Offer("ap", "zstd", tight)});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->codec, CodecId::kZstd);
  EXPECT_DOUBLE_EQ(t->max_relative_error, 0.002);
}

TEST(MergePolicies, AutoOnlyWhenEveryRegionSaysAuto) {
  auto a =
      MergeAllOrders({Offer("us", "auto:int8"), Offer("eu", "auto:int8"), Offer("ap", "auto")});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->automatic);
  EXPECT_EQ(a->codec, CodecId::kZstd);  // ap's auto stays lossless
  auto b = MergeAllOrders({Offer("us", "auto:int8"), Offer("eu", "auto:int8")});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->automatic);
  EXPECT_EQ(b->codec, CodecId::kInt8);
  auto c = MergeAllOrders({Offer("us", "auto:int8"), Offer("eu", "int8")});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->automatic);
  EXPECT_EQ(c->codec, CodecId::kInt8);
  auto d = MergeAllOrders({Offer("us", "auto"), Offer("eu", "none")});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->automatic);
  EXPECT_EQ(d->codec, CodecId::kNone);
}

TEST(MergePolicies, LevelsSizesAndLosslessCodec) {
  PolicyLimits big;
  big.min_lossy_bytes = 1 << 20;
  auto m = MergeAllOrders({Offer("us", "zstd:9"), Offer("eu", "zstd:3"), Offer("ap", "none", big)});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->codec, CodecId::kZstd);  // any region's zstd (all allow it)
  EXPECT_EQ(m->zstd_level, 1);          // ap's none carries the default level 1
  EXPECT_EQ(m->min_lossy_bytes, uint64_t{1} << 20);
  PolicyLimits raw_only;
  raw_only.allowed_codecs = {CodecId::kNone, CodecId::kInt8};
  auto r = MergeAllOrders({Offer("us", "zstd:9"), Offer("eu", "none", raw_only)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->codec, CodecId::kNone);  // zstd is not allowed in eu
}

TEST(MergePolicies, NoCommonLosslessCodecIsOneErrorNamingBothSides) {
  PolicyLimits raw;
  raw.allowed_codecs = {CodecId::kNone, CodecId::kInt8};
  PolicyLimits zstd;
  zstd.allowed_codecs = {CodecId::kZstd, CodecId::kInt8};
  auto m =
      MergeAllOrders({Offer("us", "int8", raw), Offer("eu", "int8", zstd), Offer("ap", "auto")});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition);
  const std::string& msg = m.status().message();
  EXPECT_NE(msg.find("job \"job\": the regions share no lossless codec: eu allows [zstd, int8], "
                     "us allows [none, int8]"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("policy.allowed_codecs"), std::string::npos) << msg;
}

// ---- The control message ------------------------------------------------------------------------

TEST(PolicyMessage, RoundTripsEveryField) {
  PolicyLimits limits;
  limits.allowed_codecs = {CodecId::kZstd, CodecId::kFp8E4M3};
  limits.min_lossy_bytes = 12345;
  limits.max_relative_error = 0.07;
  auto p = ResolvePolicy("auto:fp8,ef", limits);
  ASSERT_TRUE(p.ok());
  p->zstd_level = -3;
  const auto bytes = EncodePolicyOffer(PolicyMessageKind::kReply, "job-7", *p);
  EXPECT_EQ(bytes.size(), 26u + 5u);
  EXPECT_EQ(bytes[0], kPolicyMessageVersion);
  auto d = DecodePolicyOffer(bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kind, PolicyMessageKind::kReply);
  EXPECT_EQ(d->job, "job-7");
  EXPECT_TRUE(d->policy.automatic);
  EXPECT_TRUE(d->policy.error_feedback);
  EXPECT_EQ(d->policy.codec, CodecId::kFp8E4M3);
  EXPECT_EQ(d->policy.lossless_fallback, CodecId::kZstd);
  EXPECT_EQ(d->policy.zstd_level, -3);
  EXPECT_EQ(d->policy.allowed_codecs, limits.allowed_codecs);
  EXPECT_EQ(d->policy.min_lossy_bytes, 12345u);
  EXPECT_DOUBLE_EQ(d->policy.max_relative_error, 0.07);
}

TEST(PolicyMessage, RefusesMalformedMessages) {
  const auto good = EncodePolicyOffer(PolicyMessageKind::kOffer, "j", JobPolicy{});
  ASSERT_TRUE(DecodePolicyOffer(good).ok());
  struct Case {
    size_t offset;
    uint8_t value;
    const char* expect;
  };
  const Case cases[] = {
      {0, 1, "version 1 is not supported"},  // rates shared its channel then
      {0, 3, "version 3 is not supported"},
      {1, 9, "unknown kind 9"},
      {3, 77, "invalid codec"},
      {4, static_cast<uint8_t>(CodecId::kInt8), "invalid codec"},
      {24, 2, "job length 2 does not match"},
  };
  for (const Case& c : cases) {
    auto bad = good;
    bad[c.offset] = c.value;
    auto d = DecodePolicyOffer(bad);
    ASSERT_FALSE(d.ok()) << c.expect;
    EXPECT_EQ(d.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(d.status().message().find(c.expect), std::string::npos) << d.status();
  }
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(DecodePolicyOffer(std::span<const uint8_t>(good.data(), n)).ok()) << n;
  }
  // Any byte changed to anything: decoded or refused as kDataLoss, never out of bounds (ASan).
  for (size_t at = 0; at < good.size(); ++at) {
    for (int v : {0, 1, 2, 5, 0x7f, 0x80, 0xff}) {
      auto bad = good;
      bad[at] = static_cast<uint8_t>(v);
      auto d = DecodePolicyOffer(bad);
      if (!d.ok()) {
        EXPECT_EQ(d.status().code(), StatusCode::kDataLoss) << at << " " << v;
      }
    }
  }
}

// ---- The agreement between gateways ------------------------------------------------------------

// Three gateways' agreements wired together by a message queue (what the links do in straitd).
struct Regions {
  std::vector<std::string> world = {"ap", "eu", "us"};
  std::vector<std::unique_ptr<PolicyAgreement>> g;
  struct Msg {
    int from, to;
    std::vector<uint8_t> bytes;
  };
  std::deque<Msg> wire;
  Regions() {
    for (int r = 0; r < 3; ++r) g.push_back(std::make_unique<PolicyAgreement>(r, world));
  }
  // What a gateway does before a job's all-reduce: offer to every peer the first time (those
  // that offered already wait for ours), later only to those whose offer is missing.
  void Offer(int from, const std::string& job, bool first = true) {
    auto offer = g[static_cast<size_t>(from)]->LocalOffer(job);
    ASSERT_TRUE(offer.has_value());
    std::vector<int> to = g[static_cast<size_t>(from)]->Missing(job);
    if (first) to = {0, 1, 2};
    for (int peer : to) {
      if (peer != from) wire.push_back({from, peer, *offer});
    }
  }
  void Deliver() {
    while (!wire.empty()) {
      Msg m = std::move(wire.front());
      wire.pop_front();
      auto reply = g[static_cast<size_t>(m.to)]->OnMessage(m.from, m.bytes);
      ASSERT_TRUE(reply.ok()) << reply.status();
      if (reply->has_value()) wire.push_back({m.to, m.from, std::move(**reply)});
    }
  }
};

TEST(PolicyAgreement, EveryRegionEndsWithTheSameMergedPolicy) {
  Regions w;
  PolicyLimits strict;
  strict.allowed_codecs = {CodecId::kNone, CodecId::kZstd};
  w.g[0]->SetLocal("job", *ResolvePolicy("int8", PolicyLimits{}));
  w.g[1]->SetLocal("job", *ResolvePolicy("int8", strict));  // eu forbids lossy
  EXPECT_FALSE(w.g[0]->Agreed("job").has_value());
  w.Offer(0, "job");  // ap's first all-reduce: eu answers, us (not registered yet) keeps it
  w.Deliver();
  EXPECT_EQ(w.g[0]->Missing("job"), std::vector<int>{2});
  EXPECT_FALSE(w.g[2]->Agreed("job").has_value());
  auto waited = w.g[0]->Wait("job", Deadline::After(50'000'000));
  ASSERT_FALSE(waited.ok());
  EXPECT_EQ(waited.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(waited.status().message().find("no policy from us"), std::string::npos)
      << waited.status();
  w.g[2]->SetLocal("job", *ResolvePolicy("int8", PolicyLimits{}));
  w.Offer(2, "job");  // us registers and runs: everyone has everything
  w.Deliver();
  for (int r = 0; r < 3; ++r) {
    auto m = w.g[static_cast<size_t>(r)]->Wait("job", Deadline::AfterSeconds(1));
    ASSERT_TRUE(m.ok()) << r << ": " << m.status();
    EXPECT_EQ(m->codec, CodecId::kZstd) << r;
    EXPECT_EQ(m->ToString(),
              "zstd:1 [agreed by ap, eu, us; lossless: eu's policy for the job is "
              "lossless]");
  }
  // eu changes its limits (a restart with a new config) and offers again: everyone re-merges.
  w.g[1]->SetLocal("job", *ResolvePolicy("int8", PolicyLimits{}));
  w.wire.push_back({1, 0, *w.g[1]->LocalOffer("job")});
  w.wire.push_back({1, 2, *w.g[1]->LocalOffer("job")});
  w.Deliver();
  for (int r = 0; r < 3; ++r) {
    auto m = w.g[static_cast<size_t>(r)]->Agreed("job");
    ASSERT_TRUE(m.has_value() && m->ok()) << r;
    EXPECT_EQ((*m)->codec, CodecId::kInt8) << r;
  }
}

TEST(PolicyAgreement, RepliesOnlyToOffersAndRefusesGarbage) {
  Regions w;
  w.g[0]->SetLocal("job", JobPolicy{});
  const auto offer = EncodePolicyOffer(PolicyMessageKind::kOffer, "job", JobPolicy{});
  const auto reply = EncodePolicyOffer(PolicyMessageKind::kReply, "job", JobPolicy{});
  auto a = w.g[0]->OnMessage(1, offer);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->has_value());
  auto b = w.g[0]->OnMessage(1, reply);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->has_value());
  auto c = w.g[1]->OnMessage(0, offer);  // not registered at eu: kept, no reply
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->has_value());
  EXPECT_EQ(w.g[1]->OnMessage(0, std::vector<uint8_t>{1, 2, 3}).status().code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(w.g[1]->OnMessage(1, offer).status().code(), StatusCode::kInvalidArgument);  // itself
  EXPECT_EQ(w.g[1]->OnMessage(7, offer).status().code(), StatusCode::kInvalidArgument);
}

TEST(PolicyAgreement, ImpossibleCombinationFailsTheWaitWithTheReason) {
  Regions w;
  PolicyLimits raw;
  raw.allowed_codecs = {CodecId::kNone};
  PolicyLimits zstd;
  zstd.allowed_codecs = {CodecId::kZstd};
  w.g[0]->SetLocal("job", *ResolvePolicy("", raw));
  w.g[1]->SetLocal("job", *ResolvePolicy("", zstd));
  w.g[2]->SetLocal("job", *ResolvePolicy("", zstd));
  for (int r = 0; r < 3; ++r) w.Offer(r, "job");
  w.Deliver();
  for (int r = 0; r < 3; ++r) {
    auto m = w.g[static_cast<size_t>(r)]->Wait("job", Deadline::AfterSeconds(1));
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(m.status().message().find("ap allows [none], eu allows [zstd]"), std::string::npos)
        << m.status();
  }
}

// ---- auto: codecs per link --------------------------------------------------------------------

const std::vector<net::CodecProfile> kProfiles = {
    {CodecId::kNone, 0, 0, 1},
    {CodecId::kZstd, 800e6, 1500e6, 1.15},  // lossless on gradient noise
    {CodecId::kInt8, 1e9, 3e9, 3.94},       // measured on float32
};
constexpr double k100Mbit = 12.5e6;  // bytes per second
constexpr double k10Gbit = 1.25e9;

std::vector<net::LinkEstimates> Links(std::vector<double> goodput) {
  std::vector<net::LinkEstimates> links(goodput.size());
  for (size_t i = 0; i < goodput.size(); ++i) links[i].goodput_bytes_per_s = goodput[i];
  return links;
}

JobPolicy Auto(const std::string& request, PolicyLimits limits = PolicyLimits{}) {
  limits.min_lossy_bytes = 4096;
  auto p = ResolvePolicy(request, limits);
  EXPECT_TRUE(p.ok()) << p.status();
  return *p;
}

using Codecs = std::vector<CodecId>;
constexpr CodecId kNone = CodecId::kNone;
constexpr CodecId kZstd = CodecId::kZstd;
constexpr CodecId kInt8 = CodecId::kInt8;

TEST(ChooseLinkCodecs, SlowLinksGetZstdOrTheLossyCodecAsAllowed) {
  const auto slow = Links({0, k100Mbit, k100Mbit});
  auto lossless = ChooseLinkCodecs(Auto("auto"), DataType::kFloat32, ReduceOp::kSum, 1 << 20, 0,
                                   slow, kProfiles);
  EXPECT_EQ(lossless.codec.codec, kZstd);  // the plan's codec: the same in every region
  EXPECT_EQ(lossless.send_codecs, (Codecs{kNone, kZstd, kZstd}));  // to itself: nothing to save
  EXPECT_EQ(lossless.result_codecs, (Codecs{kNone, kZstd, kZstd}));
  EXPECT_EQ(lossless.accept_codecs, (Codecs{kNone, kZstd}));
  EXPECT_FALSE(lossless.error_feedback);
  EXPECT_EQ(lossless.ToString(), "auto: send none/zstd/zstd, result none/zstd/zstd");

  auto lossy = ChooseLinkCodecs(Auto("auto:int8,ef"), DataType::kFloat32, ReduceOp::kSum, 1 << 20,
                                0, slow, kProfiles);
  EXPECT_EQ(lossy.codec.codec, kInt8);
  EXPECT_EQ(lossy.send_codecs, (Codecs{kNone, kInt8, kInt8}));
  EXPECT_EQ(lossy.result_codecs, (Codecs{kInt8, kInt8, kInt8}));  // one frame for everyone
  EXPECT_EQ(lossy.accept_codecs, (Codecs{kNone, kZstd, kInt8}));
  EXPECT_TRUE(lossy.error_feedback);
}

TEST(ChooseLinkCodecs, FastLinksSendRaw) {
  const auto fast = Links({k10Gbit, 0, k10Gbit});
  for (const char* request : {"auto", "auto:int8"}) {
    auto t = ChooseLinkCodecs(Auto(request), DataType::kFloat32, ReduceOp::kSum, 1 << 20, 1, fast,
                              kProfiles);
    EXPECT_EQ(t.send_codecs, (Codecs{kNone, kNone, kNone})) << request;
    EXPECT_EQ(t.result_codecs, (Codecs{kNone, kNone, kNone})) << request;
    EXPECT_FALSE(t.error_feedback) << request;
  }
}

TEST(ChooseLinkCodecs, MixedLinksLosslessPerLinkLossyForAllOrNone) {
  const auto mixed = Links({0, k100Mbit, k10Gbit});
  auto lossless = ChooseLinkCodecs(Auto("auto"), DataType::kFloat32, ReduceOp::kSum, 1 << 20, 0,
                                   mixed, kProfiles);
  EXPECT_EQ(lossless.send_codecs, (Codecs{kNone, kZstd, kNone}));
  EXPECT_EQ(lossless.result_codecs, (Codecs{kNone, kZstd, kNone}));
  // The slowest link pays for int8: this owner's result goes int8 to everyone, though inputs to
  // the fast link's owner go raw.
  auto lossy = ChooseLinkCodecs(Auto("auto:int8"), DataType::kFloat32, ReduceOp::kSum, 1 << 20, 0,
                                mixed, kProfiles);
  EXPECT_EQ(lossy.send_codecs, (Codecs{kNone, kInt8, kNone}));
  EXPECT_EQ(lossy.result_codecs, (Codecs{kInt8, kInt8, kInt8}));
}

TEST(ChooseLinkCodecs, TensorsThatMayNotGoLossyStayLossless) {
  const auto slow = Links({0, k100Mbit, k100Mbit});
  for (auto [dtype, op, count] : {std::tuple{DataType::kInt32, ReduceOp::kSum, size_t{1} << 20},
                                  std::tuple{DataType::kFloat32, ReduceOp::kMax, size_t{1} << 20},
                                  std::tuple{DataType::kFloat32, ReduceOp::kSum, size_t{1023}}}) {
    auto t = ChooseLinkCodecs(Auto("auto:int8,ef"), dtype, op, count, 0, slow, kProfiles);
    EXPECT_EQ(t.codec.codec, kZstd);
    EXPECT_EQ(t.send_codecs, (Codecs{kNone, kZstd, kZstd}));
    EXPECT_EQ(t.accept_codecs, (Codecs{kNone, kZstd}));
    EXPECT_FALSE(t.error_feedback);
  }
}

TEST(ChooseLinkCodecs, NeverPicksWhatTheOperatorForbids) {
  PolicyLimits no_raw;
  no_raw.allowed_codecs = {CodecId::kZstd, CodecId::kInt8};
  auto t = ChooseLinkCodecs(Auto("auto", no_raw), DataType::kFloat32, ReduceOp::kSum, 1 << 20, 0,
                            Links({0, k10Gbit, k100Mbit}), kProfiles);
  EXPECT_EQ(t.send_codecs, (Codecs{kZstd, kZstd, kZstd}));
  EXPECT_EQ(t.accept_codecs, (Codecs{kZstd}));
  // An unmeasured link counts as the fallback bandwidth (125 MB/s: zstd at 800 MB/s pays).
  auto u = ChooseLinkCodecs(Auto("auto"), DataType::kFloat32, ReduceOp::kSum, 1 << 20, 0,
                            Links({0, 0, 0}), kProfiles);
  EXPECT_EQ(u.send_codecs, (Codecs{kNone, kZstd, kZstd}));
  // A fixed policy has no per-link codecs.
  auto f = ChooseLinkCodecs(Auto("int8"), DataType::kFloat32, ReduceOp::kSum, 1 << 20, 0,
                            Links({0, k10Gbit, k100Mbit}), kProfiles);
  EXPECT_EQ(f.codec.codec, kInt8);
  EXPECT_TRUE(f.send_codecs.empty() && f.result_codecs.empty() && f.accept_codecs.empty());
}

// auto's choices run through the all-reduce: three in-process ranks, each with its own view of
// its links (so their per-link codecs differ), still end bit-identical; lossless choices give
// the exact fp32 sum in rank order; a frame outside the accepted codecs is refused by name.
std::vector<float> Input(int r, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = std::sin(0.01f * static_cast<float>(i) * static_cast<float>(r + 1)) + 0.1f * r;
  }
  return v;
}

std::vector<Status> RunAuto(
    const JobPolicy& policy, const std::vector<std::vector<double>>& view,
    std::vector<std::vector<float>>* data,
    const std::function<void(int, collective::AllReduceRequest&)>& tweak = nullptr) {
  constexpr int kWorld = 3;
  const size_t n = 3001;
  collective::LocalWorld world(kWorld);
  std::vector<Status> status(kWorld);
  std::vector<ErrorFeedbackStore> stores(kWorld);
  data->assign(kWorld, {});
  for (int r = 0; r < kWorld; ++r) (*data)[static_cast<size_t>(r)] = Input(r, n);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      const size_t i = static_cast<size_t>(r);
      const TensorCodec tc = ChooseLinkCodecs(policy, DataType::kFloat32, ReduceOp::kSum, n, r,
                                              Links(view[i]), kProfiles);
      collective::AllReduceRequest req;
      req.job = "job";
      req.tensor_key = "t";
      req.op_id = 7;
      req.count = n;
      req.data = (*data)[i].data();
      req.codec = tc.codec;
      req.error_feedback = tc.error_feedback;
      req.feedback = &stores[i];
      req.send_codecs = tc.send_codecs;
      req.result_codecs = tc.result_codecs;
      req.accept_codecs = tc.accept_codecs;
      req.chunk_elements = 512;
      req.deadline = Deadline::AfterSeconds(20);
      if (tweak) tweak(r, req);
      status[i] = collective::AllReduce(world.transport(r), req);
    });
  }
  for (auto& t : threads) t.join();
  return status;
}

TEST(ChooseLinkCodecs, MixedCodecsThroughAllReduceStayBitIdentical) {
  // Each rank sees its links differently: rank 0 slow to 1, fast to 2; rank 1 slow to both;
  // rank 2 fast to both.
  const std::vector<std::vector<double>> view = {
      {0, k100Mbit, k10Gbit}, {k100Mbit, 0, k100Mbit}, {k10Gbit, k10Gbit, 0}};
  std::vector<std::vector<float>> out;
  auto status = RunAuto(Auto("auto"), view, &out);
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(status[r].ok()) << r << ": " << status[r];
  const auto a = Input(0, 3001), b = Input(1, 3001), c = Input(2, 3001);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(out[0][i], (a[i] + b[i]) + c[i]) << i;
  EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), 3001 * 4), 0);
  EXPECT_EQ(std::memcmp(out[0].data(), out[2].data(), 3001 * 4), 0);

  // auto:int8: rank 1's results go int8 (its links are slow), rank 2's raw: still bit-identical.
  auto lossy_status = RunAuto(Auto("auto:int8,ef"), view, &out);
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(lossy_status[r].ok()) << r << ": " << lossy_status[r];
  size_t inexact = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float want = (a[i] + b[i]) + c[i];
    ASSERT_NEAR(out[0][i], want, 0.05) << i;
    inexact += out[0][i] != want;
  }
  EXPECT_GT(inexact, 0u) << "no int8 frame was used";
  EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), 3001 * 4), 0);
  EXPECT_EQ(std::memcmp(out[0].data(), out[2].data(), 3001 * 4), 0);
}

TEST(ChooseLinkCodecs, AFrameOutsideTheAcceptedCodecsIsRefused) {
  const std::vector<std::vector<double>> view = {
      {0, k100Mbit, k100Mbit}, {k100Mbit, 0, k100Mbit}, {k100Mbit, k100Mbit, 0}};
  std::vector<std::vector<float>> out;
  // Rank 2 sends int8 although the agreed policy is lossless (as a peer with another policy
  // would): the owners refuse its frames instead of summing them.
  auto status = RunAuto(Auto("auto"), view, &out, [](int r, collective::AllReduceRequest& req) {
    if (r == 2) req.send_codecs = {kInt8, kInt8, kNone};
  });
  bool named = false;
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(status[r].ok()) << r;
    named = named || status[r].message().find(
                         "codec mismatch: the frame is int8, this operation "
                         "accepts none, zstd") != std::string::npos;
  }
  EXPECT_TRUE(named) << status[0] << " / " << status[1];
}

TEST(ChooseLinkCodecs, RequestChecksRefuseMixedLossyResults) {
  std::vector<std::vector<float>> out;
  const std::vector<std::vector<double>> view(3, std::vector<double>(3, k100Mbit));
  auto status = RunAuto(Auto("auto:int8"), view, &out, [](int, collective::AllReduceRequest& req) {
    req.result_codecs = {kInt8, kNone, kInt8};
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(status[r].code(), StatusCode::kInvalidArgument) << status[r];
    EXPECT_NE(status[r].message().find("result_codecs mixes int8 and none"), std::string::npos)
        << status[r];
  }
}

// ---- Shard weights from measured link rates ----------------------------------------------------

TEST(MeasuredWeights, OfferFlagRoundTripsAndMergesToAll) {
  JobPolicy p = *ResolvePolicy("zstd", PolicyLimits{});
  p.measured_weights = true;
  auto d = DecodePolicyOffer(EncodePolicyOffer(PolicyMessageKind::kOffer, "job", p));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->policy.measured_weights);
  // Without the bit (a region with configured weights, or an older gateway): not measured.
  JobPolicy q = p;
  q.measured_weights = false;
  std::vector<PolicyOffer> offers = {{"a", p}, {"b", p}, {"c", p}};
  EXPECT_TRUE(MergePolicies("job", offers)->measured_weights);
  offers[1].policy = q;
  EXPECT_FALSE(MergePolicies("job", offers)->measured_weights);
}

TEST(MeasuredWeights, RatesMessageRoundTripsAndRefusesMalformedOnes) {
  const WeightsRound round{0x1234567890abcdefull, 3, 7};
  const std::vector<uint64_t> rates = {0, 25'000'000, 6'250'000};
  const std::vector<uint8_t> m = EncodeRatesOffer("job-1", round, rates);
  auto d = DecodeRatesOffer(m);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->job, "job-1");
  EXPECT_EQ(d->round, round);
  EXPECT_EQ(d->rates, rates);
  // Every truncation, another version or kind, and a count that does not match the bytes.
  for (size_t n = 0; n < m.size(); ++n) {
    EXPECT_EQ(DecodeRatesOffer(std::span(m.data(), n)).status().code(), StatusCode::kDataLoss) << n;
  }
  std::vector<uint8_t> bad = m;
  bad[0] = 1;  // version 1 travelled on the policy channel
  EXPECT_NE(DecodeRatesOffer(bad).status().message().find("version 1"), std::string::npos);
  bad = m;
  bad[1] = static_cast<uint8_t>(PolicyMessageKind::kOffer);
  EXPECT_EQ(DecodeRatesOffer(bad).status().code(), StatusCode::kDataLoss);
  bad = m;
  bad[2] = 200;  // 200 rates claimed
  EXPECT_EQ(DecodeRatesOffer(bad).status().code(), StatusCode::kDataLoss);
  bad = m;
  bad.push_back(0);
  EXPECT_EQ(DecodeRatesOffer(bad).status().code(), StatusCode::kDataLoss);
  // A policy decoder refuses it (kind 3 is not an offer), and the rates decoder a policy offer.
  EXPECT_FALSE(DecodePolicyOffer(m).ok());
  EXPECT_FALSE(DecodeRatesOffer(EncodePolicyOffer(PolicyMessageKind::kOffer, "job",
                                                  *ResolvePolicy("zstd", PolicyLimits{})))
                   .ok());
}

TEST(MeasuredWeights, AnOlderPeersMessagesAreRefusedByVersionAndNamedInTheWait) {
  // Version 1 sent rates on the policy channel (kind 3) and offers of version 1 there too: a
  // version-2 gateway refuses both by their version byte instead of misparsing them, and a job
  // waiting for that region's policy says why it never came.
  const JobPolicy zstd = *ResolvePolicy("zstd", PolicyLimits{});
  std::vector<uint8_t> old_offer = EncodePolicyOffer(PolicyMessageKind::kOffer, "job", zstd);
  old_offer[0] = 1;
  std::vector<uint8_t> old_rates = EncodeRatesOffer("job", WeightsRound{0, 1, 0}, {0, 5});
  old_rates[0] = 1;
  PolicyAgreement a(0, {"us", "eu"});
  a.SetLocal("job", zstd);
  for (const auto& m : {old_offer, old_rates}) {
    auto r = a.OnMessage(1, m);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("version 1 is not supported"), std::string::npos)
        << r.status();
    EXPECT_NE(r.status().message().find("upgrade the older gateway"), std::string::npos);
  }
  auto waited = a.Wait("job", Deadline::After(10'000'000));
  ASSERT_FALSE(waited.ok());
  EXPECT_EQ(waited.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(waited.status().message().find("eu's refused: policy message version 1"),
            std::string::npos)
      << waited.status();
  // Once the peer speaks version 2, the refusal is forgotten and the job agrees.
  ASSERT_TRUE(a.OnMessage(1, EncodePolicyOffer(PolicyMessageKind::kOffer, "job", zstd)).ok());
  EXPECT_TRUE(a.Wait("job", Deadline::AfterSeconds(1)).ok());
  // And the rates channel's decoder takes only rates of its own version.
  EXPECT_EQ(DecodeRatesOffer(old_rates).status().code(), StatusCode::kDataLoss);
}

TEST(MeasuredWeights, RatesChangedBy25Percent) {
  const std::vector<uint64_t> base = {0, 100, 100, 100, 0, 100, 100, 100, 0};
  std::vector<uint64_t> now = base;
  EXPECT_FALSE(RatesChanged(base, now, 25));
  now[1] = 125;  // exactly 25%: not more
  now[5] = 76;
  EXPECT_FALSE(RatesChanged(base, now, 25));
  now[0] = 999;  // the diagonal does not count
  EXPECT_FALSE(RatesChanged(base, now, 25));
  now[1] = 126;
  EXPECT_TRUE(RatesChanged(base, now, 25));
  now = base;
  now[7] = 0;  // known -> unknown
  EXPECT_TRUE(RatesChanged(base, now, 25));
  EXPECT_TRUE(RatesChanged({}, base, 25));
}

// Three gateways' agreements wired to each other by hand (the gateway sends over its links).
struct Trio {
  std::vector<std::unique_ptr<WeightsAgreement>> g;
  Trio() {
    for (int r = 0; r < 3; ++r) g.push_back(std::make_unique<WeightsAgreement>(r, 3));
  }
  // Rank `from` offers `rates` for the round; delivered to every other rank unless `deliver`.
  bool Offer(int from, const std::string& job, const WeightsRound& round,
             std::vector<uint64_t> rates, bool deliver = true) {
    auto m = g[static_cast<size_t>(from)]->Offer(job, round, std::move(rates));
    if (!m.has_value()) return false;
    for (int to = 0; deliver && to < 3; ++to) {
      if (to != from) {
        EXPECT_TRUE(g[static_cast<size_t>(to)]->OnMessage(from, *m).ok());
      }
    }
    return true;
  }
  std::vector<std::vector<uint64_t>> Weights(const std::string& job, const WeightsRound& round) {
    std::vector<std::vector<uint64_t>> w;
    for (auto& a : g) {
      auto r = a->Weights(job, round, Deadline::AfterSeconds(5));
      EXPECT_TRUE(r.ok()) << r.status();
      w.push_back(r.ok() ? *r : std::vector<uint64_t>{999});
    }
    return w;
  }
};

// Egress rows of 0-1 200, 0-2 100, 1-2 50 (any unit), scaled by `f` percent.
std::vector<uint64_t> Row(int rank, uint64_t f = 100) {
  const uint64_t pair[3][3] = {{0, 200, 100}, {200, 0, 50}, {100, 50, 0}};
  std::vector<uint64_t> row(3);
  for (int c = 0; c < 3; ++c) row[static_cast<size_t>(c)] = pair[rank][c] * f / 100;
  return row;
}

TEST(MeasuredWeights, EveryGatewayComputesTheSameWeights) {
  Trio t;
  const WeightsRound r0{42, 0, 0};
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(t.Offer(r, "j", r0, Row(r)));
  const auto w = t.Weights("j", r0);
  EXPECT_EQ(w[0], (std::vector<uint64_t>{200, 100, 1}));
  EXPECT_EQ(w[1], w[0]);
  EXPECT_EQ(w[2], w[0]);
  // The first offer of a round wins: a second one is not sent, and a late duplicate from a
  // peer changes nothing.
  EXPECT_FALSE(t.Offer(0, "j", r0, Row(0, 10)));
  ASSERT_TRUE(t.g[1]->OnMessage(0, EncodeRatesOffer("j", r0, Row(0, 10))).ok());
  EXPECT_EQ(*t.g[1]->Weights("j", r0, Deadline::AfterSeconds(1)), w[0]);
  // Other jobs are apart.
  EXPECT_EQ(t.g[0]->Missing("other", r0), (std::vector<int>{0, 1, 2}));
}

TEST(MeasuredWeights, UnknownOrEqualRatesGiveEqualShards) {
  Trio t;
  const WeightsRound r0{42, 0, 0};
  // Rank 2 has measured nothing yet.
  ASSERT_TRUE(t.Offer(0, "j", r0, Row(0)));
  ASSERT_TRUE(t.Offer(1, "j", r0, Row(1)));
  ASSERT_TRUE(t.Offer(2, "j", r0, {0, 0, 0}));
  for (const auto& w : t.Weights("j", r0)) EXPECT_TRUE(w.empty());
  const WeightsRound e1{42, 1, 0};
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(t.Offer(r, "j", e1, {100, 100, 100}));
  for (const auto& w : t.Weights("j", e1)) EXPECT_TRUE(w.empty());
}

TEST(MeasuredWeights, WeightsMoveOnlyWhenARateMovesByMoreThan25Percent) {
  Trio t;
  WeightsRound round{42, 0, 0};
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(t.Offer(r, "j", round, Row(r)));
  const auto first = t.Weights("j", round)[0];
  ASSERT_EQ(first, (std::vector<uint64_t>{200, 100, 1}));
  // Round 1: every rate 20% lower: the weights stay (the old matrix's weights, not new ones).
  round.round = 1;
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(t.Offer(r, "j", round, Row(r, 80)));
  for (const auto& w : t.Weights("j", round)) EXPECT_EQ(w, first);
  // Round 2: rank 0's egress to 2 drops to 30: recomputed everywhere. Pairs 0-1 200, 0-2 30
  // (the slower direction), 1-2 50: x0 <= 30 - x2, x1 <= 50 - x2, so x = (30, 50, 0).
  round.round = 2;
  for (int r = 0; r < 3; ++r) {
    std::vector<uint64_t> row = Row(r);
    if (r == 0) row[2] = 30;
    ASSERT_TRUE(t.Offer(r, "j", round, row));
  }
  const auto moved = t.Weights("j", round);
  EXPECT_EQ(moved[0], (std::vector<uint64_t>{60, 100, 1}));
  EXPECT_EQ(moved[1], moved[0]);
  EXPECT_EQ(moved[2], moved[0]);
  // Asking again for an earlier round gives what it gave then.
  round.round = 1;
  EXPECT_EQ(*t.g[2]->Weights("j", round, Deadline::AfterSeconds(1)), first);
}

TEST(MeasuredWeights, WaitsForEveryRankAndNamesTheMissingOnes) {
  Trio t;
  const WeightsRound r0{7, 0, 0};
  ASSERT_TRUE(t.Offer(0, "j", r0, Row(0)));
  ASSERT_TRUE(t.Offer(1, "j", r0, Row(1), /*deliver=*/false));  // lost on the way
  auto w = t.g[0]->Weights("j", r0, Deadline::After(100'000'000));
  EXPECT_EQ(w.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(w.status().message().find("rank(s) 1, 2"), std::string::npos) << w.status();
  EXPECT_EQ(t.g[0]->Missing("j", r0), (std::vector<int>{1, 2}));
  // Rank 1 sends its offer again (the gateway does for missing peers); rank 2 offers late,
  // while rank 0 waits.
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(t.g[0]->OnMessage(1, *t.g[1]->LocalOffer("j", r0)).ok());
    t.Offer(2, "j", r0, Row(2));
  });
  auto later = t.g[0]->Weights("j", r0, Deadline::AfterSeconds(10));
  late.join();
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(*later, (std::vector<uint64_t>{200, 100, 1}));
  // Messages from outside the world or of the wrong size are refused.
  EXPECT_FALSE(t.g[0]->OnMessage(0, EncodeRatesOffer("j", r0, Row(1))).ok());
  EXPECT_FALSE(t.g[0]->OnMessage(3, EncodeRatesOffer("j", r0, Row(1))).ok());
  EXPECT_EQ(t.g[0]->OnMessage(1, EncodeRatesOffer("j", r0, {1, 2})).code(),
            StatusCode::kDataLoss);
}

TEST(MeasuredWeights, KeepsOnlyTheLatestRounds) {
  WeightsAgreement a(0, 3);
  for (uint64_t r = 0; r < 100; ++r) {
    ASSERT_TRUE(a.Offer("j", WeightsRound{1, 0, r}, {0, 5, 5}).has_value());
  }
  EXPECT_FALSE(a.LocalOffer("j", WeightsRound{1, 0, 0}).has_value());
  EXPECT_TRUE(a.LocalOffer("j", WeightsRound{1, 0, 99}).has_value());
  EXPECT_TRUE(
      a.LocalOffer("j", WeightsRound{1, 0, 100 - WeightsAgreement::kKeptRounds}).has_value());
  // A new epoch's rounds start again at 0: they are the newest, so the old epoch's go first.
  ASSERT_TRUE(a.Offer("j", WeightsRound{1, 1, 0}, {0, 5, 5}).has_value());
  EXPECT_TRUE(a.LocalOffer("j", WeightsRound{1, 1, 0}).has_value());
  EXPECT_FALSE(
      a.LocalOffer("j", WeightsRound{1, 0, 100 - WeightsAgreement::kKeptRounds}).has_value());
}

}  // namespace
}  // namespace strait::gateway
