// The C++ client of straitd's local protocol, for any rank process (and the NCCL plugin).
//
// Usage:
//   auto client = Client::Connect("/run/strait/straitd.sock", Deadline::AfterSeconds(5));
//   auto policy = (*client)->RegisterJob("job-42", "int8,ef", Deadline::AfterSeconds(5));
//   Status s = (*client)->AllReduce("job-42", "layer3.grad", DataType::kFloat32, ReduceOp::kSum,
//                                   data, count, Deadline::AfterSeconds(60));
//
// Every call blocks the calling thread until the gateway answers or the deadline passes. One
// request is in flight per Client; calls from several threads are serialised by a mutex (use one
// Client per thread for concurrency). An error the gateway reports comes back with its code and
// message; a transport failure (gateway gone, deadline) leaves the connection unusable, and
// later calls fail with kUnavailable; connect again.
#ifndef STRAIT_LIB_LOCALPROTO_CLIENT_H_
#define STRAIT_LIB_LOCALPROTO_CLIENT_H_

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "localproto/protocol.h"
#include "localproto/shm.h"
#include "strait/status.h"
#include "strait/types.h"

namespace strait::localproto {

class Client {
 public:
  // Connects to the gateway's socket and exchanges hellos. kUnavailable when nothing listens,
  // kPermissionDenied when the gateway refuses this process's credentials, kFailedPrecondition
  // when it does not serve `shard` (the shard this client's requests go to; kAnyShard: the
  // gateway's only one).
  static StatusOr<std::unique_ptr<Client>> Connect(const std::string& socket_path,
                                                   Deadline deadline,
                                                   const std::string& client_name = "",
                                                   uint32_t shard = kAnyShard);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Registers `job` with a policy string (see policy_grammar.h; "" = the gateway's default) and
  // returns the policy the gateway resolved, e.g. "int8+ef (...)". Registering again replaces it.
  StatusOr<std::string> RegisterJob(const std::string& job, const std::string& policy,
                                    Deadline deadline);

  // Joins `job`'s next generation with every other region's gateway of this shard (blocks
  // until they all joined it, or `deadline`: kDeadlineExceeded naming the missing regions) and
  // numbers this client's next all-reduces of the job 0, 1, 2, ... within it (see "Operation
  // identity" in protocol.h). A comm calls it once when it is created. The all-reduce
  // calls below join by themselves when the job was not joined yet, or when an earlier
  // all-reduce of the job failed on this client (every region failed that step too, and the
  // next one starts a new generation with them).
  // `resume`: 0, or 1 + the all-reduces of the job this rank's process completed before (so
  // that regions whose ranks would go on at different steps are told, instead of mixing them).
  StatusOr<uint64_t> JoinJob(const std::string& job, Deadline deadline, uint64_t resume = 0);

  // All-reduces `count` elements of `dtype` at `data` in place across the regions, under `job`'s
  // policy. Every region's ranks must issue the same (job, tensor key) sequence in the same
  // order. The gateway gives up at `deadline`; this call waits up to a moment longer (10%, at
  // least half a second) for the gateway's reason. The tensor is sent from `data` and the result
  // read straight back into it (no tensor-sized copy). An error the gateway reports leaves `data`
  // unchanged; a connection that fails while the result arrives may leave it partly overwritten
  // (the call fails with kDataLoss, kUnavailable or kDeadlineExceeded; reconnect).
  Status AllReduce(const std::string& job, const std::string& tensor_key, DataType dtype,
                   ReduceOp op, void* data, size_t count, Deadline deadline);

  // Whether all-reduces of kShmMinBytes and more move through a shared region (shm.h) instead of
  // the socket: on by default. The first such all-reduce attaches a region (grown by attaching
  // a larger one when a larger tensor comes); a gateway that refuses regions (an older one)
  // turns it off for this client, which then keeps using the socket. Results are the same
  // either way.
  void UseSharedMemory(bool on);
  // The bytes of the shared region attached now (0: none; the socket carries the tensors).
  size_t shared_region_bytes();
  // Zero-copy all-reduce: the tensor lives in the region shared with the gateway, so neither
  // side copies it (AllReduce copies it in and the result out, which on a host shared by many
  // ranks costs milliseconds per call). SharedBuffer returns `bytes` of the region (attaching or
  // growing it); write the tensor there, call AllReduceShared, read the result there. The span
  // is valid until a call that grows the region (SharedBuffer or AllReduce of more bytes) or
  // UseSharedMemory(false). kFailedPrecondition when this gateway takes no shared region (an
  // older one, or no memfd here): use AllReduce. AllReduceShared errors as AllReduce's, and
  // kFailedPrecondition when the tensor does not fit the region; after an error the buffer's
  // contents are unspecified (the gateway may have reduced part of it in place).
  StatusOr<std::span<uint8_t>> SharedBuffer(size_t bytes, Deadline deadline);
  Status AllReduceShared(const std::string& job, const std::string& tensor_key, DataType dtype,
                         ReduceOp op, size_t count, Deadline deadline);

  // The region all-reduce (CollNet mode): like AllReduce, but the gateways of this region first
  // reduce-scatter the tensor among themselves over the LAN, each all-reduces its shard across
  // the regions, and they all-gather the result (see gateway.h). Every node head of every region
  // (one per gateway of the config's [peers.<own region>]) must issue the same (job, tensor key)
  // sequence with the same dtype, op and count; all of them get the same bytes.
  Status RegionAllReduce(const std::string& job, const std::string& tensor_key, DataType dtype,
                         ReduceOp op, void* data, size_t count, Deadline deadline);

  // Library mode: all-reduces a frame the rank quantized itself (see kAllReduceFrame in
  // protocol.h): `frame_in` is one lossy codec frame (int8, int4 or fp8, not zstd-chained;
  // its header gives dtype and count), `op` sum or avg. On success `*frame_out` holds the result
  // frame (same codec, block size and count; dtype float32), byte-identical on every rank of
  // every region; decode it with Decoder::Decode. Blocks like AllReduce; errors as AllReduce's,
  // plus the frame's own (kDataLoss for a corrupt one) and kFailedPrecondition when the job's
  // policy does not give the frame's codec. `*frame_out` is untouched on error.
  Status AllReduceFrame(const std::string& job, const std::string& tensor_key, ReduceOp op,
                        std::span<const uint8_t> frame_in, std::vector<uint8_t>* frame_out,
                        Deadline deadline);

  // Result recovery (kFetchResult in protocol.h): the reply data of the committed step
  // (generation, sequence) of `job` -- the tensor, or the result frame -- from this gateway or,
  // through it, from another region's. kNotFound when the step failed in every region.
  StatusOr<std::vector<uint8_t>> FetchResult(const std::string& job, uint64_t generation,
                                             uint64_t sequence, Deadline deadline);
  // Whether the connection failed (the gateway went away or broke the framing): later calls
  // fail; connect again. And the (generation, sequence) of the job's last request sent, (0, 0)
  // if none: what FetchResult asks for after the gateway went away during that request.
  bool broken();
  std::pair<uint64_t, uint64_t> LastIdentity(const std::string& job);

  // The gateway's counters as text.
  StatusOr<std::string> Stats(Deadline deadline);

  // Test hook: sends raw bytes (a frame or garbage) and reads one reply frame.
  StatusOr<Message> SendRawForTest(const std::vector<uint8_t>& bytes, Deadline deadline);

 private:
  explicit Client(int fd) : fd_(fd) {}
  StatusOr<Message> Call(const Message& request, Deadline deadline);
  StatusOr<Message> ReadReply(MessageType expect, Deadline deadline);
  // Reads an all-reduce's reply (to `type`), its result straight into `data` (`bytes` long).
  // *refused: the gateway refused the request before its step was used (an error reply's marker).
  Status ReadAllReduceReply(MessageType type, void* data, size_t bytes, Deadline deadline,
                            bool* refused);
  // AllReduce and RegionAllReduce: a request of `type` (kAllReduce or kRegionAllReduce).
  Status AllReduceAs(MessageType type, const std::string& job, const std::string& tensor_key,
                     DataType dtype, ReduceOp op, void* data, size_t count, Deadline deadline);

  // The job's generation and the sequence of its next all-reduce on this client.
  struct Session {
    uint64_t generation = 0;
    uint64_t next = 0;
    bool rejoin = true;
    std::pair<uint64_t, uint64_t> last{0, 0};  // (generation, sequence) of the last request
  };
  StatusOr<uint64_t> JoinLocked(const std::string& job, Deadline deadline, uint64_t resume = 0);
  // Fills m's (generation, sequence), joining first where needed.
  Status NextIdentity(const std::string& job, Deadline deadline, Message* m);
  // Returns `s`; a failed step marks the job for a new generation, a refused one (the gateway
  // never used it) gives its step number back.
  Status Finished(const std::string& job, Status s, bool refused);

  // kAttachShm of a region of at least `bytes` (shm_ replaced). A gateway's refusal turns
  // shared memory off (shm_off_) and returns OK; a transport failure breaks the connection.
  Status AttachLocked(size_t bytes, Deadline deadline);
  // The region AllReduceAs uses for `bytes` now, or null: the socket carries the tensor.
  ShmRegion* RegionFor(size_t bytes, Deadline deadline, Status* error);
  // Sends `m` (its tensor already in the region) as kAllReduceShm and reads the reply.
  Status SharedAllReduceLocked(const std::string& job, Message* m, Deadline reply_by);

  std::mutex mu_;
  int fd_ = -1;
  bool broken_ = false;
  std::unique_ptr<ShmRegion> shm_;
  bool shm_off_ = false;
  std::map<std::string, Session> sessions_;
};

// ---- Tunnels ----------------------------------------------------------------------------------
// Blocking clients of straitd's cross-region tunnels (see "Tunnels" in protocol.h), for
// tests and tools; the NCCL plugin speaks the same frames from its event loop instead.
//
//   auto listener = TunnelListener::Listen(socket_a, Deadline::AfterSeconds(5));    // region A
//   // publish (*listener)->region(), shard(), listen_id() to the peer, e.g. in a handle
//   auto conn = TunnelConnection::Connect(socket_b, region, shard, listen_id, deadline); // B
//   auto peer = (*listener)->Accept(Deadline::AfterSeconds(30));                    // A
//   (*conn)->Send(bytes, /*tag=*/7, deadline);   auto m = (*peer)->Receive(deadline);
//
// Each listener and each tunnel holds a Unix connection of its own.

struct TunnelMessage {
  uint32_t tag = 0;
  std::vector<uint8_t> data;
};

// One end of an open tunnel: messages in both directions, boundaries, order and tags kept.
// Thread-safety: one thread may Send while another Receives; concurrent Sends (or Receives)
// are serialised. Closing (Close or the destructor) ends the tunnel for the peer too, after
// everything sent before reached it.
class TunnelConnection {
 public:
  // Opens a tunnel from this region to `listen_id` of `region`, reached through the gateway at
  // `socket_path`, whose shard must equal `shard`. Blocks until the listener accepted or the
  // gateway gave up (it is told the deadline); errors as listed under kTunnelConnect.
  static StatusOr<std::unique_ptr<TunnelConnection>> Connect(const std::string& socket_path,
                                                             const std::string& region,
                                                             uint32_t shard, uint64_t listen_id,
                                                             Deadline deadline);
  ~TunnelConnection();
  TunnelConnection(const TunnelConnection&) = delete;
  TunnelConnection& operator=(const TunnelConnection&) = delete;

  uint64_t tunnel_id() const { return tunnel_id_; }
  const std::string& peer_region() const { return peer_region_; }

  // Writes one message (at most kDefaultMaxMessageBytes - kTunnelDataOverhead bytes). Blocks
  // while the tunnel's window is full (the peer reads slowly) up to `deadline`; a deadline hit
  // in the middle of a message breaks the connection (later calls fail with kUnavailable).
  Status Send(std::span<const uint8_t> data, uint32_t tag, Deadline deadline);

  // The next message. kDeadlineExceeded when none arrived by `deadline` (nothing is lost; call
  // again). When the tunnel ended: kOutOfRange "tunnel closed by the peer ..." after a clean
  // close by the other rank, or the error that ended it (kUnavailable: peer gateway gone, ...);
  // every later call returns the same.
  StatusOr<TunnelMessage> Receive(Deadline deadline);

  // Ends the tunnel (the peer's Receive returns kOutOfRange once it has read everything sent
  // before). Idempotent; does not block.
  void Close();

 private:
  friend class TunnelListener;
  TunnelConnection(int fd, uint64_t tunnel_id, std::string peer_region)
      : fd_(fd), tunnel_id_(tunnel_id), peer_region_(std::move(peer_region)) {}

  int fd_ = -1;
  const uint64_t tunnel_id_;
  const std::string peer_region_;
  std::mutex send_mu_;
  bool send_broken_ = false;
  std::mutex recv_mu_;
  Status ended_;  // set once the tunnel ended (as Receive reports it)
  bool has_ended_ = false;
};

// A listen: tells the gateway to take connects for a fresh listen id.
class TunnelListener {
 public:
  static StatusOr<std::unique_ptr<TunnelListener>> Listen(const std::string& socket_path,
                                                          Deadline deadline);
  ~TunnelListener();
  TunnelListener(const TunnelListener&) = delete;
  TunnelListener& operator=(const TunnelListener&) = delete;

  // What a connector needs: the gateway's region and shard, and the listen id.
  uint64_t listen_id() const { return listen_id_; }
  const std::string& region() const { return region_; }
  uint32_t shard() const { return shard_; }

  // Waits for the next incoming tunnel until `deadline` and accepts it on a new connection.
  // kDeadlineExceeded when none came; the listen's own errors otherwise. Not thread-safe.
  StatusOr<std::unique_ptr<TunnelConnection>> Accept(Deadline deadline);

 private:
  TunnelListener(std::string socket_path, int fd) : socket_path_(std::move(socket_path)), fd_(fd) {}

  const std::string socket_path_;
  int fd_ = -1;
  uint64_t listen_id_ = 0;
  std::string region_;
  uint32_t shard_ = 0;
};

}  // namespace strait::localproto

#endif  // STRAIT_LIB_LOCALPROTO_CLIENT_H_
