// Pure decisions a link takes from its measurements: which codec to use, how big a chunk to cut,
// how many streams to keep. Free of sockets so that each rule is unit-tested on its own.
#ifndef STRAIT_LIB_NET_ADAPT_H_
#define STRAIT_LIB_NET_ADAPT_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "net/estimates.h"
#include "strait/codec.h"
#include "strait/types.h"

namespace strait::net {

// What one codec costs and gains on this machine and this data, as measured (e.g. by
// strait-bench codec, or by the gateway timing its own encodes).
struct CodecProfile {
  CodecId codec = CodecId::kNone;
  double encode_bytes_per_s = 0;  // input bytes per second; 0 = unknown (codec not considered)
  double decode_bytes_per_s = 0;  // output bytes per second; 0 = unknown (not considered)
  double ratio = 1;               // input bytes / encoded bytes
};

// Below this ratio a codec is not worth its CPU and the raw bytes go out (CodecId::kNone).
inline constexpr double kMinUsefulRatio = 1.05;

struct CodecChoice {
  CodecId codec = CodecId::kNone;
  double expected_seconds = 0;  // for `message_bytes`, by the model below
};

// Picks, among `allowed` codecs with a profile in `profiles`, the one that minimises the
// expected transfer time of a message of `message_bytes`:
//   t = max(bytes / encode, bytes / ratio / goodput, bytes / decode)
// (encode, send and decode overlap when a message is pipelined in chunks). Raw costs
// bytes / goodput. Codecs with a ratio below kMinUsefulRatio are never chosen. When the link has
// no goodput estimate yet, `fallback_bytes_per_s` stands in for it. If nothing else qualifies,
// the choice is kNone (raw), even when kNone is not in `allowed`, since raw is always decodable.
// Pure; thread-safe.
CodecChoice ChooseCodec(const LinkEstimates& link, std::span<const CodecProfile> profiles,
                        std::span<const CodecId> allowed, uint64_t message_bytes,
                        double fallback_bytes_per_s = 125e6);

// Measures every codec on this machine: encodes and decodes a synthetic sample of
// `sample_bytes` of float32 "gradient noise" (normal values of small magnitude, the data a
// gateway mostly carries) with each codec at its default options (zstd level 1 with the byte
// shuffle, lossy codecs with block size 256 and no zstd chain) and times the faster of two
// rounds. Measured rather than taken from a table because speed depends on the CPU and on the
// vector instructions the codec library picked (AVX-512 and scalar differ by an order of
// magnitude), which no table can know; the sample is small (default 256 KiB: a few ms per codec
// in a release build) so a gateway can afford it at startup. The ratio of zstd is the sample's,
// which underrates data that compresses well (the choice then errs toward raw, never toward a
// codec slower than the link); lossy ratios follow from the format (see LossyRatio). Profiles
// are for float32 input; ProfileFor adapts them to other element types. Deterministic input, but
// timings vary from run to run. Blocks for the measurement; thread-safe.
std::vector<CodecProfile> MeasureCodecProfiles(size_t sample_bytes = 256 * 1024);

// Input bytes / frame bytes of a lossy codec for `dtype` input (float32 4, 16-bit 2 bytes an
// element) with one fp32 scale per `block_size` elements: e.g. int8 on float32 ~3.94. 1 for
// lossless codecs (their ratio depends on the data).
double LossyRatio(CodecId codec, DataType dtype, uint32_t block_size = kDefaultBlockSize);

// `profile` (measured on float32) for input of `dtype`: lossy codecs take LossyRatio for that
// type; speeds stay per input byte. Lossless profiles are returned unchanged.
CodecProfile ProfileFor(const CodecProfile& profile, DataType dtype);

// The round-trip time of the path itself: the kernel's minimum RTT over the streams
// (tcp_min_rtt_ns), else the minimum ping RTT, else the smoothed kernel or ping RTT. Pings queue
// behind up to max_inflight_per_stream of data, so their smoothed RTT measures this link's own
// queue, not the path. 0 when nothing was measured. Pure.
int64_t PathRttNs(const LinkEstimates& link);

// Chunk size that keeps each of the `streams` streams' pipes full without making a resend after a
// stream death expensive: a quarter of one stream's share of the bandwidth-delay product
// (goodput x PathRttNs), rounded to a multiple of 64 KiB and clamped to [min_bytes, max_bytes].
// Without estimates it returns `current`. Pure; thread-safe.
uint32_t ChooseChunkBytes(const LinkEstimates& link, int streams, uint32_t current,
                          uint32_t min_bytes, uint32_t max_bytes);

// What a round saw of the path besides its goodput: the queue in front of the bottleneck and the
// losses. Zeros mean unknown, and an unknown signal never stops growth.
struct RoundSignals {
  int64_t path_rtt_ns = 0;    // the path's propagation RTT (PathRttNs: the kernel's min RTT)
  int64_t stream_rtt_ns = 0;  // the streams' kernel smoothed RTT (tcpi_rtt), mean over the round
  double retrans_per_s = 0;   // TCP retransmissions per second during the round
};

// A standing queue: the streams' smoothed RTT is above the path's by more than
// kQueueRttFactor x path + kQueueSlackNs. The slack keeps a few ms of jitter on a short path
// (loopback, a LAN) from reading as a queue; the factor is what a full bottleneck shows: a one-BDP
// buffer that stays full doubles the RTT, while loss-bound streams (cubic at 0.1-1% loss, a
// per-flow policer) never fill one and read within a few percent of the path. False when either
// RTT is unknown. Pure.
inline constexpr double kQueueRttFactor = 1.25;
inline constexpr int64_t kQueueSlackNs = 5'000'000;
bool QueueBuilding(int64_t path_rtt_ns, int64_t stream_rtt_ns);

// Decides K, the number of streams, from one measurement round at a time (goodput while the
// link was busy; idle rounds change nothing):
//   - Growing: K doubles (capped at max_streams) while each doubling raised goodput by at least
//     `gain` (default 10%). A step is judged on the mean of its rounds (two; a third when the
//     mean of two gained at least half of `gain` but not all of it) against the mean of its
//     base's (the starting K's reference is its second round: the first follows the link's
//     start-up). Never on one round: cubic at 0.1% loss swings by tens of percent from round
//     to round (a loss halves one stream's window), and a step passed on its one lucky round
//     then stood as the reference the next step could not beat, which stopped K at 8
//     (55 Mbit/s on a 100 Mbit/s link where 16 streams carry 98). A round lasts max(1 s,
//     10 RTT), so the second round costs about a second per step.
//     Per-flow caps and loss-bound congestion control (cubic at 1% loss needs tens of streams)
//     are linear in K, so doubling reaches the right order in a few rounds where +1 per round
//     would stall: a 17th stream adds only 1/16. When a step's goodput grew nearly in proportion
//     to K (kLinearScaling), the next step quadruples K, so that loss-bound streams reach tens
//     within the first seconds of a transfer.
//   - A step that gained between gain / 2 and gain (over three rounds) is kept without growing
//     further; so is one that gained nothing but lost no more than gain / 2 right after a step
//     that paid (once: the next such step goes back). Near the link's capacity the base's rounds
//     read its new streams' start-up, not what it will carry (cubic at 0.1% loss: 8 streams
//     read 93 Mbit/s for 4 s, then 60-79), so the doubling cannot show its gain, and going back
//     costs a dip of seconds while the remaining streams grow into the freed share.
//   - Any other step goes back to the K before it. It never probes below that: fewer streams
//     than the start gained nothing measurable on the emulated WAN (BBR fills a path with one
//     stream but also with four), while every step down cost such a dip (bench/README.md).
//   - Then it holds for `hold_rounds` rounds (tracking the mean goodput of the last
//     kMaxRoundsPerStep there) and probes upwards again, as conditions may have changed.
//   - A full path stops growth (RoundSignals; the rounds' mean queue and loss decide, never one
//     round). While the streams' RTT shows a standing queue (QueueBuilding), more streams cannot
//     raise the bottleneck's rate, only take share from the other flows through it -- a sibling
//     link of the same gateway pair, whose controller then sees its own goodput fall and grows
//     in turn (64 streams against 4 on one region pair, 65-87k drops, links 58-64% busy where
//     one stream each filled them). So K never doubles from a queued base (the start, or a
//     held K at the end of its hold: the hold starts over), and a step that paid but shows a
//     queue is measured again as a start (two more rounds, the first left out: the start-up of
//     its new streams queues for a while) and held unless the queue is gone. A step whose
//     retransmissions per byte rose by more than kMaxAddedLoss and to over twice the base's
//     overflowed a buffer too shallow to show a queue: it is treated as queued, and goes back
//     unless it gained `gain`. A queue that stands only at the step (the base had none) does
//     not send it back by itself: the step that fills a path shows one, and the keep rules
//     apply (cubic at 0.1% loss: 16 streams 96 Mbit/s with a queue, 60 after going back). A
//     queue at the starting K holds it, without halving: 4 BBR streams stand 200 ms over a
//     100 ms path with 15% retransmitted, but going down to 2 read 90-94 Mbit/s against 93-96
//     with 4, and the zstd all-reduce of 3 regions ran 2.08-2.09x the ring with halving
//     against 2.30-2.46x without (the step down's dip). Loss-bound streams and per-flow caps
//     read no queue: growth stays as above. A step whose goodput grew nearly in proportion
//     to K (kLinearScaling) did not overflow anything, whatever its retransmissions: the
//     streams are bound each by itself (a per-flow policer dropped far more with 2 BBR
//     streams than with 1, while the pair carried 2.3x). Its queue still counts: a policer
//     drops and never queues.
// Never leaves [min_streams, max_streams]. Not thread-safe; one per link.
class StreamCountController {
 public:
  StreamCountController(int initial, int min_streams, int max_streams, double gain = 0.10,
                        int hold_rounds = 20);
  // One measurement round at the current K; returns the K to use next.
  int Update(double goodput_bytes_per_s, bool busy, const RoundSignals& signals = {});
  int streams() const { return current_; }

  // Rounds the starting K is measured (the last one is the reference), and rounds a step gets
  // before it is judged.
  static constexpr int kRoundsPerStep = 2;
  // Rounds a step gets at most (when the mean of kRoundsPerStep gained between gain / 2 and
  // gain), and the rounds a held K's reference averages.
  static constexpr int kMaxRoundsPerStep = 3;
  // A step whose goodput grew by at least this fraction of its growth in K (a doubling by 1.7x)
  // is followed by two doublings at once.
  static constexpr double kLinearScaling = 0.85;
  // Retransmitted segments per segment of goodput a step may add over its base (as well as
  // doubling the base's) before it counts as overflowing the bottleneck: random loss on the path
  // is the same fraction at any K, so only the flows' own overflow raises it.
  static constexpr double kMaxAddedLoss = 0.01;
  // Bytes per TCP segment, to turn retransmissions into a fraction of the goodput.
  static constexpr double kSegmentBytes = 1448;

 private:
  enum class Phase { kGrowing, kHolding };
  struct Round {
    double goodput = 0;
    RoundSignals signals;
  };

  static double Mean(const std::vector<Round>& rounds);
  // Whether the mean of the rounds' stream RTTs shows a standing queue (the first `skip` rounds
  // left out: start-up).
  static bool Queued(const std::vector<Round>& rounds, size_t skip = 0);
  // Retransmitted segments per segment delivered over the rounds; 0 when unknown.
  static double LossFraction(const std::vector<Round>& rounds, size_t skip = 0);
  // The step's goodput gain over the base's, as a fraction of its gain in K (1 = linear).
  double Scaling(double value) const;
  int Hold(int k);
  int Double();
  // The step to current_ paid: it becomes the base (the mean of its rounds the reference), and
  // K doubles, or quadruples after a near-linear gain.
  int Accept();

  int current_;
  int min_;
  int max_;
  double gain_;
  int hold_rounds_;
  Phase phase_ = Phase::kGrowing;
  int hold_ = 0;
  // The K a step started from and what it measured (no measurement yet: goodput 0).
  int base_k_;
  double base_goodput_ = 0;
  bool base_paid_ = false;  // the base was reached by a step that paid (not held or kept)
  double base_loss_ = 0;    // the base's LossFraction
  // The LossFraction of the base before a step that paid into a full path, while that step is
  // measured again as a start; negative otherwise.
  double loss_before_ = -1;
  // Busy rounds measured at the current K (growing), or the last few (holding).
  std::vector<Round> rounds_;
};

}  // namespace strait::net

#endif  // STRAIT_LIB_NET_ADAPT_H_
