// libFuzzer target for straitd's local protocol (lib/localproto/protocol.h): arbitrary bytes
// are decoded as one message body. Besides "no crash, no out-of-bounds read, no unbounded
// allocation" it checks that an accepted message re-encodes to exactly the same body. The bytes
// are also decoded as a tunnel event (the data of a kTunnelListen reply), which must re-encode
// the same way.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "localproto/frame_io.h"
#include "localproto/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A small limit so that the size check is reached within a fuzz input.
  constexpr uint32_t kMax = 1 << 16;
  // The same bytes as a listen reply's tunnel event (what a plugin parses from its gateway).
  auto event = strait::localproto::DecodeTunnelEvent(std::span<const uint8_t>(data, size));
  if (event.ok()) {
    const std::vector<uint8_t> again = strait::localproto::EncodeTunnelEvent(*event);
    if (again.size() != size || (size > 0 && std::memcmp(again.data(), data, size) != 0)) {
      std::abort();
    }
  }
  auto message = strait::localproto::DecodeMessage(std::span<const uint8_t>(data, size), kMax);
  if (!message.ok()) return 0;
  auto frame = strait::localproto::EncodeMessage(*message, kMax);
  if (!frame.ok()) std::abort();
  if (frame->size() != size + strait::localproto::kFrameLengthBytes) std::abort();
  const uint8_t* body = frame->data() + strait::localproto::kFrameLengthBytes;
  if (size > 0 && std::memcmp(body, data, size) != 0) {
    std::abort();
  }
  return 0;
}
