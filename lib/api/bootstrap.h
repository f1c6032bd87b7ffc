// The rendezvous of a region's ranks when a host-backend comm is created: rank 0 listens on a
// known address (like a TCP store at MASTER_ADDR:MASTER_PORT), every other rank connects to it
// and says where its own data listener is, and rank 0 answers everyone with the whole table.
//
// Wire format (version kBootstrapVersion = 1; little-endian; a string is a u16 length + bytes):
//   join  (rank r -> rank 0): "STRB", u8 version, u8 kind = 0, u16 data port, u32 rank,
//                             u32 nranks, string job id, string region
//   reply (rank 0 -> rank r): "STRB", u8 version, u8 kind = 1, u8 ok (1) / refused (0), u8 zero,
//     ok:      u32 nranks, then per rank: u16 data port, string host ("" for rank 0: the host
//              the joining rank dialled, since rank 0 may listen on a wildcard address)
//     refused: string reason (the joining rank fails with it, naming rank 0)
// Kinds are explicit values, never renumbered. Rank 0 takes each rank's host from the address
// its join came from, so ranks need not know their own address. Rank 0 refuses a join whose
// nranks, job or region differ from its own, a duplicate rank or one out of range, and then fails
// its own rendezvous with the same reason. Every read and write is bounded by the deadline;
// ranks retry connecting to rank 0 until it listens (ranks may start in any order).
#ifndef STRAIT_LIB_API_BOOTSTRAP_H_
#define STRAIT_LIB_API_BOOTSTRAP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"
#include "strait/status.h"

namespace strait::api {

inline constexpr uint8_t kBootstrapVersion = 1;
enum class BootstrapKind : uint8_t { kJoin = 0, kReply = 1 };

struct BootstrapOptions {
  std::string root_host;  // numeric IPv4 or IPv6, as in the root address
  uint16_t root_port = 0;
  int rank = 0;
  int nranks = 1;
  std::string job;
  std::string region;
  uint16_t data_port = 0;  // where this rank's net::Endpoint listens
};

struct RankAddress {
  std::string host;
  uint16_t port = 0;
};

// Runs the rendezvous; returns every rank's data address (rank 0's host is root_host). Blocks
// until every rank joined or the deadline passed. Errors: kUnavailable (cannot bind or reach
// rank 0), kDeadlineExceeded (ranks missing: names them), kFailedPrecondition (ranks disagree:
// names the field and both values), kDataLoss (a malformed message).
StatusOr<std::vector<RankAddress>> Rendezvous(const BootstrapOptions& options, Deadline deadline);

}  // namespace strait::api

#endif  // STRAIT_LIB_API_BOOTSTRAP_H_
