// libFuzzer target for the gateway-to-gateway tunnel wire format (lib/gateway/tunnel.h):
// arbitrary bytes are decoded as one tunnel message, the way a gateway reads what a peer sent on
// a tunnel channel. Besides "no crash, no out-of-bounds read, no unbounded allocation" it checks
// that an accepted message re-encodes to exactly the same bytes, and that a data payload the
// decoder accepted either decodes to its raw size or fails with an error (never a wrong size).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "gateway/tunnel.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A small limit so that the size check is reached within a fuzz input.
  constexpr uint64_t kMax = 1 << 16;
  auto wire = strait::gateway::DecodeTunnelWire(std::span<const uint8_t>(data, size), kMax);
  if (!wire.ok()) return 0;
  const std::vector<uint8_t> again = strait::gateway::EncodeTunnelWire(*wire);
  if (again.size() != size || (size > 0 && std::memcmp(again.data(), data, size) != 0)) {
    std::abort();
  }
  if (wire->kind == strait::gateway::TunnelWireKind::kData) {
    strait::Decoder decoder;
    std::vector<uint8_t> out;
    const uint64_t raw = wire->raw_size;
    if (strait::gateway::TunnelCodec::Decode(decoder, *wire, &out).ok() && out.size() != raw) {
      std::abort();
    }
  }
  return 0;
}
