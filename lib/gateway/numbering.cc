// How an all-reduce is numbered (see numbering.h): FNV-1a over the identity, the job's lane in
// the low bits.
#include "gateway/numbering.h"

#include <algorithm>

#include "collective/channels.h"
#include "common/hash.h"
#include "gateway/gateway.h"

namespace strait::gateway {

uint32_t JobLane(const std::string& job) {
  const uint64_t h = Fnv1a64(job.data(), job.size());
  return static_cast<uint32_t>((h ^ (h >> 32)) % collective::kCollectiveChannelCount);
}

uint64_t OperationId(const std::string& job, const std::string& tensor_key, uint64_t sequence) {
  uint64_t h = kFnv1a64Offset;
  const uint64_t sizes[2] = {job.size(), tensor_key.size()};
  h = Fnv1a64(sizes, sizeof(sizes), h);  // lengths first, so ("ab","c") differs from ("a","bc")
  h = Fnv1a64(job.data(), job.size(), h);
  h = Fnv1a64(tensor_key.data(), tensor_key.size(), h);
  h = Fnv1a64(&sequence, sizeof(sequence), h);
  // The low bits carry the job's lane, so NetTransport sends all of a job's ops on one channel.
  constexpr uint64_t kLanes = collective::kCollectiveChannelCount;
  static_assert(((uint64_t{1} << 38) % kLanes) == 0, "lanes must divide the op id space");
  const uint64_t mixed = (h ^ (h >> 38)) & ((uint64_t{1} << 38) - 1);
  return mixed - mixed % kLanes + JobLane(job);
}

std::string GenerationKey(const std::string& job, uint64_t scope) {
  return scope == 0 ? job : job + "\x1f#" + std::to_string(scope);
}

uint64_t IdentityWord(uint64_t generation, uint64_t sequence) {
  return Mix64(Mix64(generation) ^ sequence);
}

std::string IdentityText(const localproto::Message& request, const FrameInfo* frame) {
  // A tensor in shared memory is the same operation as one on the socket: regions pair them.
  std::string t = std::string(localproto::MessageTypeName(localproto::OnTheSocket(request.type))) +
                  " key=" + request.tensor_key + " count=" + std::to_string(request.count) +
                  " dtype=" + DataTypeName(request.dtype) + " op=" + ReduceOpName(request.op);
  if (frame != nullptr) {
    t += " frame=" + std::string(CodecName(frame->codec)) + "/" + std::to_string(frame->block_size);
  }
  if (request.scope != 0) t += " scope=" + std::to_string(request.scope);
  return t;
}

std::string GatewayIdentityText(size_t chunk_elements) {
  return kChunkIdentityMarker + std::to_string(chunk_elements);
}

std::string RanksIdentityPart(const std::string& identity) {
  return identity.substr(
      0, std::min(identity.find(kChunkIdentityMarker), identity.find(kWeightsIdentityMarker)));
}

// The two region derivations below hash a "key" that no tensor key of a plain all-reduce can
// equal: the identity text of a plain one starts with its message type's name, and these start
// with (or contain) the unit separator \x1f. Their exact bytes are part of the wire.
uint64_t RegionSideOpId(const std::string& job, const std::string& tensor_key, uint64_t scope,
                        uint64_t word) {
  return OperationId(job, "\x1fregion-side/" + tensor_key + "/" + std::to_string(scope), word);
}

uint64_t RegionCrossOpId(const std::string& job, const std::string& tensor_key, int region_size,
                         uint64_t op_id) {
  return OperationId(job, tensor_key + "\x1fregion/" + std::to_string(region_size), op_id);
}

}  // namespace strait::gateway
