// The tunnel wire format between gateways and the WAN-hop codec (lib/gateway/tunnel.h): round
// trips of every kind, exact offsets, every truncation and bad field refused with a clear error,
// zstd chosen where it pays and raw where it does not, and corrupt payloads caught.
#include "gateway/tunnel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace strait::gateway {
namespace {

std::vector<TunnelWire> EveryKind() {
  std::vector<TunnelWire> all;
  TunnelWire w;
  w.tunnel_id = 0x1122334455667788ull;
  w.kind = TunnelWireKind::kOpen;
  w.shard = 3;
  w.listen_id = 0xdeadbeefcafef00dull;
  w.window = 16u << 20;
  all.push_back(w);
  w = {};
  w.tunnel_id = 9;
  w.kind = TunnelWireKind::kOpenOk;
  w.window = 1234;
  all.push_back(w);
  w = {};
  w.tunnel_id = 9;
  w.kind = TunnelWireKind::kOpenRefused;
  w.code = StatusCode::kNotFound;
  w.text = "no listen id 5";
  all.push_back(w);
  w = {};
  w.tunnel_id = 9;
  w.kind = TunnelWireKind::kClose;
  w.code = StatusCode::kOk;
  all.push_back(w);
  w = {};
  w.tunnel_id = 9;
  w.kind = TunnelWireKind::kData;
  w.tag = 77;
  w.raw_size = 5;
  w.payload = {1, 2, 3, 4, 5};
  all.push_back(w);
  w = {};
  w.tunnel_id = 9;
  w.kind = TunnelWireKind::kData;  // an empty message
  all.push_back(w);
  w = {};
  w.tunnel_id = 9;
  w.kind = TunnelWireKind::kCredit;
  w.credit = 1u << 30;
  all.push_back(w);
  return all;
}

TEST(TunnelWire, RoundTripsEveryKind) {
  for (const TunnelWire& w : EveryKind()) {
    const std::vector<uint8_t> bytes = EncodeTunnelWire(w);
    ASSERT_GE(bytes.size(), kTunnelWireHeaderSize);
    EXPECT_EQ(bytes[0], kTunnelWireVersion);
    EXPECT_EQ(bytes[1], static_cast<uint8_t>(w.kind));
    auto d = DecodeTunnelWire(bytes);
    ASSERT_TRUE(d.ok()) << static_cast<int>(w.kind) << ": " << d.status();
    EXPECT_EQ(d->kind, w.kind);
    EXPECT_EQ(d->tunnel_id, w.tunnel_id);
    EXPECT_EQ(d->shard, w.shard);
    EXPECT_EQ(d->listen_id, w.listen_id);
    EXPECT_EQ(d->window, w.window);
    EXPECT_EQ(d->code, w.code);
    EXPECT_EQ(d->text, w.text);
    EXPECT_EQ(d->tag, w.tag);
    EXPECT_EQ(d->raw_size, w.raw_size);
    EXPECT_EQ(d->payload, w.payload);
    EXPECT_EQ(d->credit, w.credit);
    EXPECT_EQ(EncodeTunnelWire(*d), bytes);
  }
}

TEST(TunnelWire, OpenLayoutIsAsDocumented) {
  const std::vector<uint8_t> b = EncodeTunnelWire(EveryKind()[0]);
  ASSERT_EQ(b.size(), 16u + 4 + 8 + 8);
  EXPECT_EQ(b[2], 0);     // codec
  EXPECT_EQ(b[8], 0x88);  // tunnel id, little-endian
  EXPECT_EQ(b[15], 0x11);
  EXPECT_EQ(b[16], 3);      // shard
  EXPECT_EQ(b[20], 0x0d);   // listen id
  EXPECT_EQ(b[28 + 3], 1);  // window 16 MiB = 0x01000000
}

TEST(TunnelWire, EveryTruncationIsRefused) {
  for (const TunnelWire& w : EveryKind()) {
    const std::vector<uint8_t> bytes = EncodeTunnelWire(w);
    for (size_t n = 0; n < bytes.size(); ++n) {
      std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
      auto d = DecodeTunnelWire(cut);
      ASSERT_FALSE(d.ok()) << static_cast<int>(w.kind) << " cut at " << n;
      EXPECT_TRUE(d.status().code() == StatusCode::kDataLoss ||
                  d.status().code() == StatusCode::kInvalidArgument)
          << d.status();
    }
  }
}

TEST(TunnelWire, BadFieldsGiveDistinctErrors) {
  std::vector<uint8_t> data = EncodeTunnelWire(EveryKind()[4]);
  auto bad = data;
  bad[0] = 2;
  EXPECT_EQ(DecodeTunnelWire(bad).status().code(), StatusCode::kUnimplemented);
  bad = data;
  bad[1] = 7;
  EXPECT_NE(DecodeTunnelWire(bad).status().message().find("unknown tunnel message kind 7"),
            std::string::npos);
  bad = data;
  bad[2] = static_cast<uint8_t>(CodecId::kInt8);  // lossy codecs never cross a tunnel
  EXPECT_NE(DecodeTunnelWire(bad).status().message().find("only lossless"), std::string::npos);
  bad = data;
  bad[16] = 6;  // raw size 6, 5 bytes carried
  EXPECT_NE(DecodeTunnelWire(bad).status().message().find("carries 5"), std::string::npos);
  EXPECT_NE(DecodeTunnelWire(data, 4).status().message().find("exceeds the limit"),
            std::string::npos);
  // Trailing bytes after a fixed-size kind; an unknown status code; a codec on a control kind.
  bad = EncodeTunnelWire(EveryKind()[6]);
  bad.push_back(0);
  EXPECT_NE(DecodeTunnelWire(bad).status().message().find("1 trailing bytes"), std::string::npos);
  bad = EncodeTunnelWire(EveryKind()[2]);
  bad[16] = 99;
  EXPECT_NE(DecodeTunnelWire(bad).status().message().find("unknown status code 99"),
            std::string::npos);
  bad = EncodeTunnelWire(EveryKind()[1]);
  bad[2] = 1;
  EXPECT_EQ(DecodeTunnelWire(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST(TunnelWire, ChannelsAreTheReservedRange) {
  for (uint64_t id : {uint64_t{0}, uint64_t{1}, uint64_t{255}, uint64_t{256}, ~uint64_t{0}}) {
    EXPECT_TRUE(collective::kTunnelChannels.Contains(TunnelChannel(id))) << id;
  }
  EXPECT_FALSE(collective::kTunnelChannels.Contains(16));  // the collectives'
  EXPECT_FALSE(collective::kTunnelChannels.Contains(collective::kTunnelChannels.first - 1));
  EXPECT_FALSE(collective::kTunnelChannels.Contains(collective::kTunnelChannels.end()));
}

std::vector<uint8_t> FloatRamp(size_t bytes) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    const float f = static_cast<float>(i % 8192) * 0.5f;
    std::memcpy(&v[i], &f, 4);
  }
  return v;
}

std::vector<uint8_t> Random(size_t bytes) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> v(bytes);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Encodes through the codec, then sends the wire bytes through the decoder, as the gateways do.
std::vector<uint8_t> ThroughTheWan(TunnelCodec& codec, const std::vector<uint8_t>& data,
                                   const net::LinkEstimates& link, CodecId* used) {
  TunnelWire w;
  w.tunnel_id = 1;
  codec.Encode(data, link, &w);
  *used = w.codec;
  auto d = DecodeTunnelWire(EncodeTunnelWire(w));
  EXPECT_TRUE(d.ok()) << d.status();
  Decoder decoder;
  std::vector<uint8_t> out;
  Status s = TunnelCodec::Decode(decoder, *d, &out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(TunnelCodec, ZstdWherePaysRawWhereNot) {
  net::LinkEstimates slow;
  slow.goodput_bytes_per_s = 1e6;  // 8 Mbit/s: any compression pays
  net::LinkEstimates fast;
  fast.goodput_bytes_per_s = 1e12;  // faster than any encoder
  TunnelCodec codec(/*zstd_allowed=*/true);
  CodecId used;
  // Small messages always go raw.
  const auto small = FloatRamp(1000);
  EXPECT_EQ(ThroughTheWan(codec, small, slow, &used), small);
  EXPECT_EQ(used, CodecId::kNone);
  // Compressible floats on a slow link: zstd, and the bytes come back exact. Odd sizes too.
  for (size_t size : {size_t{1} << 20, (size_t{1} << 20) + 2, (size_t{1} << 20) + 3}) {
    const auto ramp = FloatRamp(size);
    EXPECT_EQ(ThroughTheWan(codec, ramp, slow, &used), ramp) << size;
    EXPECT_EQ(used, CodecId::kZstd) << size;
  }
  // On a link faster than the encoder, raw (until the periodic re-probe).
  EXPECT_EQ(ThroughTheWan(codec, FloatRamp(1 << 20), fast, &used), FloatRamp(1 << 20));
  EXPECT_EQ(used, CodecId::kNone);
  // Incompressible bytes: raw even on a slow link.
  TunnelCodec fresh(true);
  const auto noise = Random(1 << 20);
  EXPECT_EQ(ThroughTheWan(fresh, noise, slow, &used), noise);
  EXPECT_EQ(used, CodecId::kNone);
  // Not allowed by the policy: never zstd.
  TunnelCodec none(false);
  EXPECT_EQ(ThroughTheWan(none, FloatRamp(1 << 20), slow, &used), FloatRamp(1 << 20));
  EXPECT_EQ(used, CodecId::kNone);
}

TEST(TunnelCodec, CorruptOrMismatchedFramesAreRefused) {
  TunnelCodec codec(true);
  codec.ForceZstdForTest();
  TunnelWire w;
  codec.Encode(FloatRamp(1 << 18), net::LinkEstimates{}, &w);
  ASSERT_EQ(w.codec, CodecId::kZstd);
  Decoder decoder;
  std::vector<uint8_t> out;
  TunnelWire flipped = w;
  flipped.payload[flipped.payload.size() / 2] ^= 0x40;
  EXPECT_EQ(TunnelCodec::Decode(decoder, flipped, &out).code(), StatusCode::kDataLoss);
  TunnelWire wrong_size = w;
  wrong_size.raw_size += 4;
  EXPECT_EQ(TunnelCodec::Decode(decoder, wrong_size, &out).code(), StatusCode::kDataLoss);
  TunnelWire garbage = w;
  garbage.payload = Random(100);
  EXPECT_FALSE(TunnelCodec::Decode(decoder, garbage, &out).ok());
  ASSERT_TRUE(TunnelCodec::Decode(decoder, w, &out).ok());
  EXPECT_EQ(out, FloatRamp(1 << 18));
}

}  // namespace
}  // namespace strait::gateway
