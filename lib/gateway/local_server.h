// straitd's local socket: the Unix socket that ranks (libstrait, the NCCL plugin) dial to speak
// the local protocol (localproto/protocol.h), served on one Asio event loop instead of a thread
// per connection.
//
// Usage: the gateway starts one LocalServer with its hooks (how to answer a request, whether a
// request may block, where tunnel connections go, what to run periodically), StopAccepting()s it
// when it starts to shut down and Stop()s it last.
//
// Threads: one loop thread runs the acceptor, every connection's reads and writes, the refusal
// timers and the periodic tick. Requests that may block (an all-reduce, a join, a fetch: up to
// their deadline) run on a bounded pool of worker threads, started as they are needed, and their
// replies are posted back to the loop; the others run on the loop. A connection reads its next
// request only after it answered the previous one, so each client's requests run in order.
// Connections that ask for a tunnel go to `serve_tunnel` (see LocalServerHooks), which runs them
// on the same loop (`attach`).
//
// What the socket enforces (the gateway's admission; see "Jobs and isolation" in gateway.h):
// - the client's uid or gid (SO_PEERCRED) must be allowed, checked at accept: a refused client
//   gets its kPermissionDenied reply at once, before its hello, and the connection is held about
//   a second (so that the client's hello does not meet EPIPE) and then closed, at most
//   kMaxRefusedHeld at a time;
// - before its hello, a client's frames may be at most kMaxHelloFrameBytes;
// - a frame, once begun, must arrive within LocalServerOptions::io_timeout_ns, and a reply must
//   be taken within the same time; a broken frame gets an error reply and ends the connection;
// - the socket file is mode 0660; a stale socket file is replaced, any other file refused;
// - out of descriptors (EMFILE, ENFILE), accepting pauses and retries on a timer.
#ifndef STRAIT_LIB_GATEWAY_LOCAL_SERVER_H_
#define STRAIT_LIB_GATEWAY_LOCAL_SERVER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "localproto/protocol.h"
#include "strait/status.h"

namespace asio {
class io_context;
}  // namespace asio

namespace strait::gateway {

struct LocalServerOptions {
  std::string path;  // the socket file (local.socket)
  // Who may connect: a client whose uid or gid is listed (local.allowed_uids / allowed_gids).
  std::vector<uint32_t> allowed_uids;
  std::vector<uint32_t> allowed_gids;
  // The most requests that run at once on workers; 0 means max(16, 2 x hardware threads).
  // Workers start when a request needs one and none is idle, so idle connections cost none.
  size_t max_workers = 0;
  // How long a begun frame may take to arrive, and a reply to be taken.
  int64_t io_timeout_ns = int64_t{30'000'000'000};
  // How long a refused connection is held open after its refusal went out.
  int64_t refused_hold_ns = int64_t{1'000'000'000};
  // How often LocalServerHooks::tick runs.
  int64_t tick_ns = int64_t{500'000'000};
};

// What the server calls; every hook must be set.
struct LocalServerHooks {
  // Whether a request of this type may block (it then runs on a worker, not on the loop).
  std::function<bool(localproto::MessageType)> may_block;
  // Answers a request from an admitted client that sent its hello (request.client_uid is its
  // uid). It may take the request's data (an all-reduce answers in place). Runs on the loop
  // unless may_block(type), so it must then not block.
  std::function<localproto::Message(localproto::Message& request)> handle;
  // Takes over a connection whose client asked for a tunnel (a kTunnelListen, kTunnelConnect or
  // kTunnelAccept `request`, after its hello): `fd` is now the hook's to serve and close. Runs on
  // the loop and must not block; what it starts on the loop must end when the gateway stops, for
  // Stop() waits for the loop to run out of work.
  std::function<void(int fd, const localproto::Message& request)> serve_tunnel;
  // Called once by Start, before the loop runs: lets another service put its work on the loop
  // (TunnelService::Start).
  std::function<void(asio::io_context& loop)> attach;
  // Runs on the loop every LocalServerOptions::tick_ns (e.g. redialing ended links); must not
  // block for long.
  std::function<void()> tick;
};

// The gateway's counters that the socket feeds (they appear in its stats and metrics).
struct LocalServerCounters {
  std::atomic<uint64_t>* connections = nullptr;  // admitted
  std::atomic<uint64_t>* refused = nullptr;      // refused at accept (credentials)
  std::atomic<uint64_t>* bad_requests = nullptr; // broken frames, undecodable or out-of-order
  std::atomic<int64_t>* shm_regions = nullptr;    // shared regions mapped now (kAttachShm)
};

class LocalServer {
 public:
  // A refused connection held this many at most; the oldest is closed first.
  static constexpr size_t kMaxRefusedHeld = 256;
  // The largest frame a client may send before its hello (a hello is a few hundred bytes).
  static constexpr uint32_t kMaxHelloFrameBytes = 64u << 10;

  // Binds and listens on options.path, then starts the loop. kFailedPrecondition when the path
  // holds a file that is not a socket, kUnavailable when the socket cannot be made. Blocks only
  // for the setup.
  static StatusOr<std::unique_ptr<LocalServer>> Start(LocalServerOptions options,
                                                      LocalServerHooks hooks,
                                                      LocalServerCounters counters);
  // Stop().
  ~LocalServer();
  LocalServer(const LocalServer&) = delete;
  LocalServer& operator=(const LocalServer&) = delete;

  // Stops accepting: closes the socket, removes its file, closes refused and idle connections and
  // stops the tick; requests running finish and send their replies. Blocks until the loop did
  // so. Idempotent; thread-safe; not from the loop or a hook.
  void StopAccepting();
  // StopAccepting(), then waits for the requests running on workers, lets the last replies go
  // out, closes every connection and waits for the loop to run out of work (the tunnels end). Idempotent;
  // thread-safe; not from the loop or a hook.
  void Stop();

  // Whether the socket accepts (false once StopAccepting began). Thread-safe.
  bool serving() const;
  // Connections open now (admitted, not handed to a tunnel), and workers started so far.
  // Thread-safe.
  size_t open_connections() const;
  size_t workers_started() const;

  class Core;  // the loop's state (local_server.cc)

 private:
  explicit LocalServer(std::unique_ptr<Core> core);
  std::unique_ptr<Core> core_;
};

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_LOCAL_SERVER_H_
