// straitd's local socket on one Asio event loop (see local_server.h): the acceptor with its
// credential check, one small state machine per connection (read a frame, run the request on the
// loop or a worker, write the reply, read the next), refused connections retired by a timer, and
// the bounded worker pool.
#include "gateway/local_server.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <list>
#include <mutex>
#include <thread>
#include <utility>

#include <asio.hpp>

#include "common/endian.h"
#include "common/log.h"
#include "common/system_error.h"
#include "localproto/shm.h"
#include "net/accept_pause.h"

namespace strait::gateway {
namespace {

using localproto::Message;
using localproto::MessageType;
using Socket = asio::local::stream_protocol::socket;

constexpr const char* kLog = "gateway";
// How long an error reply to a broken frame may take before the connection just closes.
constexpr auto kErrorReplyTimeout = std::chrono::seconds(1);

Message Reply(MessageType to, const Status& status) {
  return localproto::ReplyMessage(to, status);
}

// A bounded pool of threads for requests that may block. Threads start when a task finds no idle
// one (up to `max`) and live until Join(), so a gateway that only holds idle connections runs
// none.
class WorkerPool {
 public:
  explicit WorkerPool(size_t max) : max_(max) {}
  ~WorkerPool() { Join(); }

  // Runs `task` on a worker, in order with the other tasks. Thread-safe.
  void Post(std::function<void()> task) {
    std::unique_lock<std::mutex> lock(mu_);
    if (quit_) {
      // Joined already (nothing should post then): run it here rather than lose it.
      lock.unlock();
      task();
      return;
    }
    tasks_.push_back(std::move(task));
    if (tasks_.size() > idle_ && threads_.size() < max_) {
      threads_.emplace_back([this] { Work(); });
      started_.store(threads_.size());
    } else {
      cv_.notify_one();
    }
  }
  // Runs what is queued, then ends and joins every worker. Idempotent; not from a worker.
  void Join() {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
      threads.swap(threads_);
    }
    cv_.notify_all();
    for (auto& t : threads) t.join();
  }
  size_t started() const { return started_.load(); }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [this] { return quit_ || !tasks_.empty(); });
      --idle_;
      if (tasks_.empty()) return;  // quit_, nothing left to run
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  const size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  size_t idle_ = 0;
  bool quit_ = false;
  std::vector<std::thread> threads_;
  std::atomic<size_t> started_{0};
};

class Connection;

}  // namespace

class LocalServer::Core {
 public:
  Core(LocalServerOptions options, LocalServerHooks hooks, LocalServerCounters counters)
      : options_(std::move(options)),
        hooks_(std::move(hooks)),
        counters_(counters),
        work_(asio::make_work_guard(io_)),
        acceptor_(io_),
        accept_pause_(io_.get_executor(), "a local connection", kLog),
        tick_(io_),
        refused_timer_(io_),
        workers_(options_.max_workers != 0
                     ? options_.max_workers
                     : std::max<size_t>(16, 2 * size_t{std::thread::hardware_concurrency()})) {}

  Status Bind();
  void Run() {
    hooks_.attach(io_);
    accepting_.store(true);
    Accept();
    ArmTick();
    thread_ = std::thread([this] { io_.run(); });
  }
  void StopAccepting();
  void Stop();

  // For connections (loop thread unless said otherwise).
  asio::io_context& io() { return io_; }
  const LocalServerOptions& options() const { return options_; }
  const LocalServerHooks& hooks() const { return hooks_; }
  void CountBadRequest() { ++*counters_.bad_requests; }
  void CountShmRegion(int delta) {
    if (counters_.shm_regions != nullptr) *counters_.shm_regions += delta;
  }
  bool stopping() const { return stopping_; }
  WorkerPool& workers() { return workers_; }
  void Forget(std::list<std::shared_ptr<Connection>>::iterator it) {
    connections_.erase(it);
    open_.store(connections_.size());
  }

  bool serving() const { return accepting_.load(); }
  size_t open_connections() const { return open_.load(); }
  size_t workers_started() const { return workers_.started(); }

 private:
  void Accept();
  void OnAccepted(Socket socket);
  void Refuse(Socket socket, const ucred& cred);
  void RetireRefused();
  void ArmTick();
  // On the loop: stops accepting and closes refused and idle connections.
  void CloseListening();

  const LocalServerOptions options_;
  const LocalServerHooks hooks_;
  const LocalServerCounters counters_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  asio::local::stream_protocol::acceptor acceptor_;
  net::AcceptPause accept_pause_;  // out of descriptors: pause and retry (net/accept_pause.h)
  asio::steady_timer tick_;
  // Refused connections in the order they were refused, each with when it is closed;
  // refused_timer_ runs for the oldest.
  std::deque<std::pair<Socket, std::chrono::steady_clock::time_point>> refused_;
  asio::steady_timer refused_timer_;
  // Touched on the loop only (open_ mirrors its size for other threads).
  std::list<std::shared_ptr<Connection>> connections_;
  std::atomic<size_t> open_{0};
  bool stopping_ = false;  // loop only: accepting stopped
  std::atomic<bool> accepting_{false};
  WorkerPool workers_;

  std::mutex stop_mu_;  // serialises StopAccepting and Stop
  bool accept_stopped_ = false;
  bool stopped_ = false;
  std::thread thread_;
};

namespace {

// One admitted client: reads a frame (its length, then its body under the I/O timeout), runs
// the request, writes the reply under the I/O timeout, reads the next. Its buffers live as long
// as it does: a rank sends tensor after tensor, and a fresh tensor-sized buffer per request
// (glibc mmaps those above 32 MiB) costs page faults, zeroing and unmapping on every step.
// `body_` holds the request's frame, `request_.data` its tensor, which the all-reduce reduces in
// place and the reply carries back. Runs on the loop, but for the request a worker runs; while
// it does, nothing else touches the connection.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(LocalServer::Core& core, Socket socket, uint32_t uid)
      : core_(core), socket_(std::move(socket)), timer_(core.io()), uid_(uid) {}

  void Start(std::list<std::shared_ptr<Connection>>::iterator self) {
    self_ = self;
    ReadLength();
  }
  // Closes the connection unless a request runs or its reply is going out (that one closes when
  // its reply is written, seeing the server stop).
  void CloseIfIdle() {
    if (!busy_) Close();
  }

 private:
  void ReadLength() {
    if (core_.stopping()) return Close();
    busy_ = false;
    asio::async_read(socket_, asio::buffer(length_),
                     [self = shared_from_this()](const asio::error_code& ec, size_t n) {
                       self->OnLength(ec, n);
                     });
  }

  void OnLength(const asio::error_code& ec, size_t n) {
    if (closed_) return;
    if (ec) {
      // A clean end before a frame is the client leaving; inside the length it broke the frame.
      if (ec == asio::error::eof && n > 0) {
        return Fail(DataLossError("local socket: connection closed inside a frame's length"));
      }
      return Close();
    }
    static_assert(localproto::kFrameLengthBytes == 4);
    const uint32_t len = GetU32(length_.data());
    // Until the hello, frames are small: a client that sends only a large length prefix must
    // not make the gateway reserve that much (eight 256 MiB prefixes cost 2 GB before).
    const uint32_t limit =
        greeted_ ? localproto::kDefaultMaxMessageBytes : LocalServer::kMaxHelloFrameBytes;
    if (len == 0) return Fail(InvalidArgumentError("local frame with an empty body"));
    if (len > limit) {
      return Fail(ResourceExhaustedError("local frame of " + std::to_string(len) +
                                         " bytes exceeds the limit of " + std::to_string(limit) +
                                         " bytes"));
    }
    // Within the capacity, resize() neither allocates nor touches more than the growth.
    body_.resize(len);
    ArmTimer(std::chrono::nanoseconds(core_.options().io_timeout_ns));
    asio::async_read(socket_, asio::buffer(body_),
                     [self = shared_from_this()](const asio::error_code& body_ec, size_t got) {
                       self->OnBody(body_ec, got);
                     });
  }

  void OnBody(const asio::error_code& ec, size_t n) {
    if (closed_) return;
    StopTimer();
    if (ec) {
      if (timed_out_) return Fail(DeadlineExceededError("local socket: timed out reading"));
      if (ec == asio::error::eof) {
        return Fail(DataLossError("local socket: connection closed after " + std::to_string(n) +
                                  " of " + std::to_string(body_.size()) +
                                  " bytes of a frame"));
      }
      return Close();
    }
    Dispatch();
  }

  void Dispatch() {
    busy_ = true;
    const LocalServerHooks& hooks = core_.hooks();
    if (Status decoded = localproto::DecodeMessageInto(body_, &request_); !decoded.ok()) {
      core_.CountBadRequest();
      const uint8_t t = body_[0];
      const MessageType to =
          localproto::IsRequestType(t) ? static_cast<MessageType>(t) : MessageType::kHello;
      return Write(Reply(to, decoded.WithContext("bad request")));
    }
    if (!greeted_ && request_.type != MessageType::kHello) {
      core_.CountBadRequest();
      return Write(Reply(request_.type, FailedPreconditionError("send a hello first")));
    }
    if (request_.type == MessageType::kReply) {
      core_.CountBadRequest();
      return Write(Reply(MessageType::kHello, InvalidArgumentError("clients do not send replies")));
    }
    // The shard the client named in its hello goes with each of its requests (protocol.h).
    if (request_.type == MessageType::kHello) {
      shard_ = request_.client_shard;
    } else {
      request_.client_shard = shard_;
    }
    if (request_.type == MessageType::kTunnelListen ||
        request_.type == MessageType::kTunnelConnect ||
        request_.type == MessageType::kTunnelAccept) {
      // The connection now belongs to the listen or tunnel until it ends (tunnel.h).
      asio::error_code ignored;
      const int fd = socket_.release(ignored);
      closed_ = true;
      core_.Forget(self_);
      if (fd >= 0) hooks.serve_tunnel(fd, request_);
      return;
    }
    greeted_ = true;
    request_.client_uid = uid_;
    if (request_.type == MessageType::kAttachShm) return AttachShm();
    if (localproto::InSharedRegion(request_.type)) {
      // The descriptor is checked against this connection's own region before anything runs:
      // a rank can name nothing but its own pages. Refused (marker 0): the step is not used.
      StatusOr<std::span<uint8_t>> slice =
          shm_ == nullptr
              ? StatusOr<std::span<uint8_t>>(FailedPreconditionError(
                    std::string(localproto::MessageTypeName(request_.type)) +
                    " on a connection without a shared region; attach one first (attach-shm)"))
              : shm_->Slice(request_.shm_offset,
                            request_.count * DataTypeSize(request_.dtype));
      if (!slice.ok()) {
        core_.CountBadRequest();
        Message refused = Reply(request_.type, slice.status());
        refused.data = {0};
        return Write(std::move(refused));
      }
      request_.shm_data = *slice;
    }
    if (!hooks.may_block(request_.type)) return Write(hooks.handle(request_));
    core_.workers().Post([self = shared_from_this()] {
      Message reply = self->core_.hooks().handle(self->request_);
      asio::post(self->core_.io(), [self, reply = std::move(reply)]() mutable {
        self->Write(std::move(reply));
      });
    });
  }

  // The head, then the data straight from the reply's buffer (an all-reduce's result in the
  // request's own buffer): no tensor-sized frame is assembled.
  void Write(Message reply) {
    if (closed_) return;
    reply_ = std::move(reply);
    auto head = localproto::EncodeMessageHead(reply_, reply_.data.size());
    if (!head.ok()) {
      reply_ = Reply(reply_.reply_to, head.status());
      head = localproto::EncodeMessageHead(reply_, 0);
      if (!head.ok()) return Close();
    }
    head_ = std::move(head).value();
    ArmTimer(std::chrono::nanoseconds(core_.options().io_timeout_ns));
    const std::array<asio::const_buffer, 2> buffers = {asio::buffer(head_),
                                                       asio::buffer(reply_.data)};
    asio::async_write(socket_, buffers,
                      [self = shared_from_this()](const asio::error_code& ec, size_t) {
                        if (self->closed_) return;
                        self->StopTimer();
                        if (ec) return self->Close();
                        // Keep the larger buffer for the next request (an all-reduce moved the
                        // tensor's here).
                        if (self->reply_.data.capacity() > self->request_.data.capacity()) {
                          self->request_.data = std::move(self->reply_.data);
                        }
                        self->reply_.data.clear();
                        self->ReadLength();
                      });
  }

  // kAttachShm: the memfd comes as one byte with SCM_RIGHTS right after the frame (shm.h); it
  // replaces the connection's region once it checks out. Under the I/O timeout.
  void AttachShm() {
    if (shm_ != nullptr) core_.CountShmRegion(-1);
    shm_.reset();
    // Waiting for the client like a read: a stopping server closes the connection now rather
    // than after the I/O timeout.
    busy_ = false;
    ArmTimer(std::chrono::nanoseconds(core_.options().io_timeout_ns));
    WaitForFd(request_.shm_bytes);
  }

  void WaitForFd(uint64_t bytes) {
    socket_.async_wait(asio::socket_base::wait_read,
                       [self = shared_from_this(), bytes](const asio::error_code& ec) {
                         self->OnFdReadable(ec, bytes);
                       });
  }

  void OnFdReadable(const asio::error_code& ec, uint64_t bytes) {
    if (closed_) return;
    if (ec) {
      StopTimer();
      if (timed_out_) {
        return Fail(DeadlineExceededError(
            "local socket: attach-shm was not followed by its memfd (one byte with SCM_RIGHTS) "
            "in time"));
      }
      return Close();
    }
    StatusOr<int> fd = localproto::ReceiveFd(socket_.native_handle());
    if (fd.ok() && *fd < 0) return WaitForFd(bytes);  // woken without the byte: wait on
    StopTimer();
    if (!fd.ok() && fd.status().code() == StatusCode::kUnavailable) return Close();
    StatusOr<std::unique_ptr<localproto::ShmRegion>> region =
        fd.ok() ? localproto::ShmRegion::Adopt(*fd, bytes)
                : StatusOr<std::unique_ptr<localproto::ShmRegion>>(fd.status());
    if (!region.ok()) {
      core_.CountBadRequest();
      STRAIT_LOG(kWarn, kLog) << "refused a shared region of uid " << uid_ << ": "
                              << region.status();
      return Write(Reply(MessageType::kAttachShm, region.status()));
    }
    shm_ = std::move(region).value();
    core_.CountShmRegion(+1);
    Write(Reply(MessageType::kAttachShm, Status::Ok()));
  }

  // The framing is broken (oversized, truncated, too slow): say so and drop the connection.
  void Fail(const Status& why) {
    core_.CountBadRequest();
    STRAIT_LOG(kWarn, kLog) << "local client dropped: " << why;
    busy_ = true;
    auto frame = localproto::EncodeMessage(Reply(MessageType::kHello, why));
    if (!frame.ok()) return Close();
    head_ = std::move(frame).value();
    ArmTimer(kErrorReplyTimeout);
    asio::async_write(socket_, asio::buffer(head_),
                      [self = shared_from_this()](const asio::error_code&, size_t) {
                        self->Close();
                      });
  }

  // Limits the transfer that starts next; StopTimer() when it ends. A timer that expired just as
  // its transfer ended must not cancel the next transfer: each arming has its own number.
  void ArmTimer(std::chrono::nanoseconds after) {
    timed_out_ = false;
    const uint64_t arming = ++timer_arming_;
    timer_.expires_after(after);
    timer_.async_wait([self = shared_from_this(), arming](const asio::error_code& ec) {
      // Cancelled, or stopped: the transfer finished first.
      if (ec || self->closed_ || arming != self->timer_arming_) return;
      self->timed_out_ = true;
      asio::error_code ignored;
      self->socket_.cancel(ignored);
    });
  }

  void StopTimer() {
    ++timer_arming_;
    timer_.cancel();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    StopTimer();
    // A request still running holds `self`, so the region outlives it; unmapped with the
    // connection (a killed rank's too).
    if (shm_ != nullptr) core_.CountShmRegion(-1);
    asio::error_code ignored;
    socket_.close(ignored);
    core_.Forget(self_);
  }

  LocalServer::Core& core_;
  Socket socket_;
  asio::steady_timer timer_;
  const uint32_t uid_;  // the admitted client's; jobs belong to the uid
  uint32_t shard_ = localproto::kAnyShard;  // named in the client's hello
  std::list<std::shared_ptr<Connection>>::iterator self_;
  std::array<uint8_t, localproto::kFrameLengthBytes> length_{};
  std::vector<uint8_t> body_;
  Message request_;
  Message reply_;
  std::vector<uint8_t> head_;
  // The client's shared region (kAttachShm), if any: kAllReduceShm descriptors point into it.
  std::unique_ptr<localproto::ShmRegion> shm_;
  bool greeted_ = false;
  bool busy_ = false;  // a request runs or its reply (or an error reply) is going out
  bool timed_out_ = false;
  uint64_t timer_arming_ = 0;
  bool closed_ = false;
};

}  // namespace

Status LocalServer::Core::Bind() {
  const std::string& path = options_.path;
  // A socket file left by a crashed straitd blocks bind(); nothing else may live there.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return FailedPreconditionError("local.socket " + path +
                                     " exists and is not a socket; refusing to replace it");
    }
    ::unlink(path.c_str());
  }
  asio::error_code ec;
  const asio::local::stream_protocol::endpoint endpoint(path);
  acceptor_.open(endpoint.protocol(), ec);
  if (ec) return ErrorCodeStatus("socket() for local.socket " + path, ec);
  ::fcntl(acceptor_.native_handle(), F_SETFD, FD_CLOEXEC);
  acceptor_.bind(endpoint, ec);
  if (ec) return UnavailableError("cannot bind local.socket " + path + ": " + ec.message());
  if (::chmod(path.c_str(), 0660) != 0) {
    return UnavailableError("cannot chmod 0660 local.socket " + path + ": " +
                            std::strerror(errno));
  }
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return UnavailableError("cannot listen on local.socket " + path + ": " + ec.message());
  return Status::Ok();
}

void LocalServer::Core::Accept() {
  acceptor_.async_accept([this](const asio::error_code& ec, Socket socket) {
    if (ec == asio::error::operation_aborted || stopping_) return;  // StopAccepting()
    if (ec) return accept_pause_.OnFailure(ec, [this] { Accept(); });
    accept_pause_.OnSuccess();
    OnAccepted(std::move(socket));
    Accept();
  });
}

void LocalServer::Core::OnAccepted(Socket socket) {
  const int fd = socket.native_handle();
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  ucred cred{};
  socklen_t len = sizeof(cred);
  bool allowed = false;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    const auto& uids = options_.allowed_uids;
    const auto& gids = options_.allowed_gids;
    allowed = std::find(uids.begin(), uids.end(), cred.uid) != uids.end() ||
              std::find(gids.begin(), gids.end(), cred.gid) != gids.end();
  }
  if (!allowed) return Refuse(std::move(socket), cred);
  ++*counters_.connections;
  auto connection = std::make_shared<Connection>(*this, std::move(socket), cred.uid);
  connections_.push_back(connection);
  open_.store(connections_.size());
  connection->Start(std::prev(connections_.end()));
}

void LocalServer::Core::Refuse(Socket socket, const ucred& cred) {
  ++*counters_.refused;
  STRAIT_LOG(kWarn, kLog) << "refused local client pid " << cred.pid << " uid " << cred.uid
                          << " gid " << cred.gid << ": not in local.allowed_uids/gids";
  // The refusal goes out at once, before the client's hello (it reads it as the hello's reply),
  // and nothing is read: waiting for the hello here let a refused uid's silent connections delay
  // every allowed client by a second each.
  auto frame = localproto::EncodeMessage(Reply(
      MessageType::kHello,
      PermissionDeniedError("uid " + std::to_string(cred.uid) + " gid " +
                            std::to_string(cred.gid) +
                            " is not allowed by the gateway's local.allowed_uids / "
                            "local.allowed_gids")));
  if (frame.ok()) {
    (void)!::send(socket.native_handle(), frame->data(), frame->size(),
                  MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  // It stays open for a while after its refusal was sent, so that the client's hello is still
  // accepted by the socket and it reads the refusal instead of EPIPE; then it is closed.
  // Bounded: the oldest go first.
  while (refused_.size() >= LocalServer::kMaxRefusedHeld) refused_.pop_front();
  refused_.emplace_back(std::move(socket), std::chrono::steady_clock::now() +
                                               std::chrono::nanoseconds(options_.refused_hold_ns));
  if (refused_.size() == 1) RetireRefused();
}

void LocalServer::Core::RetireRefused() {
  const auto now = std::chrono::steady_clock::now();
  while (!refused_.empty() && refused_.front().second <= now) refused_.pop_front();
  if (refused_.empty()) return;
  refused_timer_.expires_at(refused_.front().second);
  refused_timer_.async_wait([this](const asio::error_code& ec) {
    if (!ec) RetireRefused();
  });
}

void LocalServer::Core::ArmTick() {
  tick_.expires_after(std::chrono::nanoseconds(options_.tick_ns));
  tick_.async_wait([this](const asio::error_code& ec) {
    if (ec || stopping_) return;
    hooks_.tick();
    ArmTick();
  });
}

void LocalServer::Core::CloseListening() {
  stopping_ = true;
  asio::error_code ignored;
  acceptor_.close(ignored);
  accept_pause_.Cancel();
  tick_.cancel();
  refused_timer_.cancel();
  refused_.clear();
  // CloseIfIdle() unlinks the connection; iterate over a copy.
  std::list<std::shared_ptr<Connection>> open = connections_;
  for (auto& c : open) c->CloseIfIdle();
}

void LocalServer::Core::StopAccepting() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (accept_stopped_) return;
  accept_stopped_ = true;
  accepting_.store(false);
  std::promise<void> closed;
  asio::post(io_, [this, &closed] {
    CloseListening();
    closed.set_value();
  });
  if (thread_.joinable()) {
    closed.get_future().wait();
  } else {
    io_.run_one();  // never started: run the closing here
  }
  ::unlink(options_.path.c_str());
}

void LocalServer::Core::Stop() {
  StopAccepting();
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  // Requests still running finish (the gateway's stopping makes them quick) and post their
  // replies.
  workers_.Join();
  // The loop sends the last replies, then each connection closes (it sees stopping_); once
  // nothing is pending (tunnels end on the gateway's stopping too), run() returns.
  asio::post(io_, [this] {
    std::list<std::shared_ptr<Connection>> open = connections_;
    for (auto& c : open) c->CloseIfIdle();
  });
  work_.reset();
  if (thread_.joinable()) {
    thread_.join();
  } else {
    io_.run();
  }
}

StatusOr<std::unique_ptr<LocalServer>> LocalServer::Start(LocalServerOptions options,
                                                          LocalServerHooks hooks,
                                                          LocalServerCounters counters) {
  auto core = std::make_unique<Core>(std::move(options), std::move(hooks), counters);
  STRAIT_RETURN_IF_ERROR(core->Bind());
  core->Run();
  return std::unique_ptr<LocalServer>(new LocalServer(std::move(core)));
}

LocalServer::LocalServer(std::unique_ptr<Core> core) : core_(std::move(core)) {}

LocalServer::~LocalServer() { core_->Stop(); }

void LocalServer::StopAccepting() { core_->StopAccepting(); }
void LocalServer::Stop() { core_->Stop(); }
bool LocalServer::serving() const { return core_->serving(); }
size_t LocalServer::open_connections() const { return core_->open_connections(); }
size_t LocalServer::workers_started() const { return core_->workers_started(); }

}  // namespace strait::gateway
