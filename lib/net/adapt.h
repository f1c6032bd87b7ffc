// Pure decisions a link takes from its measurements: which codec to use, how big a chunk to cut,
// how many streams to keep. Free of sockets so that each rule is unit-tested on its own.
#ifndef STRAIT_LIB_NET_ADAPT_H_
#define STRAIT_LIB_NET_ADAPT_H_

#include <cstdint>
#include <span>

#include "net/estimates.h"
#include "strait/codec.h"

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

// Chunk size that keeps each of the `streams` streams' pipes full without making a resend after a
// stream death expensive: a quarter of one stream's share of the bandwidth-delay product, rounded
// to a multiple of 64 KiB and clamped to [min_bytes, max_bytes]. Without estimates it returns
// `current`. Pure; thread-safe.
uint32_t ChooseChunkBytes(const LinkEstimates& link, int streams, uint32_t current,
                          uint32_t min_bytes, uint32_t max_bytes);

// Decides K, the number of streams, by hill climbing on goodput: add a stream while each added
// stream raised goodput by more than `gain` (a fraction, default 5%); when one did not, go back
// to the best K seen and hold there for `hold_rounds` rounds before probing again. Only rounds in
// which the link was busy (had a backlog) count. Not thread-safe; one per link.
class StreamCountController {
 public:
  StreamCountController(int initial, int min_streams, int max_streams, double gain = 0.05,
                        int hold_rounds = 20);
  // One measurement round at the current K; returns the K to use next.
  int Update(double goodput_bytes_per_s, bool busy);
  int streams() const { return current_; }

 private:
  int current_;
  int min_;
  int max_;
  double gain_;
  int hold_rounds_;
  int hold_ = 0;
  int best_k_;
  double best_goodput_ = 0;
  bool probing_up_ = true;
};

}  // namespace strait::net

#endif  // STRAIT_LIB_NET_ADAPT_H_
