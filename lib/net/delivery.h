// The bookkeeping behind reliable, ordered, exactly-once delivery over a pool of streams,
// kept free of sockets so that it is unit-tested on its own.
//
// SendBook (sender side): messages wait whole in a queue per channel and are cut into chunks only
// when a stream asks for one (Next), so the chunk size can follow the link and a slow stream simply
// asks less often (work stealing). Channels take turns chunk by chunk (round-robin over the
// channels that have something to cut): a 1 GiB message on one channel delays a small one on
// another by one chunk per busy channel, not by the whole gigabyte, which is how several jobs (each
// on its own channel) share a link fairly. Within a channel, messages are cut one after another in
// send order, so per-channel order is what the receiver sees anyway. Every chunk gets the next
// link-wide sequence number and stays "unacked" until an ack covers it. When a stream dies, its
// unacked chunks go to a resend queue that every stream drains before cutting new chunks. A message
// completes when all of its chunks are acked. The book starts no new message while the messages the
// receiver may still be holding (started, and not yet acked together with every earlier message on
// their channel) would exceed the receiver's partial-message budget, so an honest sender never
// trips that limit. When the channel whose turn it is cannot start its next message for that
// reason, no other channel starts a new one either until it could (channels with a message already
// started keep cutting), so a large message waits only for what was started before it and is never
// starved by small ones.
//
// ReceiveBook (receiver side): de-duplicates chunks by sequence number (a resent chunk may have
// arrived already), builds the cumulative + selective ack, copies payloads into their message,
// and hands out whole messages in per-channel order.
//
// Thread safety: none; each book belongs to one link and is used on its I/O thread only.
#ifndef STRAIT_LIB_NET_DELIVERY_H_
#define STRAIT_LIB_NET_DELIVERY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "net/wire.h"
#include "strait/status.h"

namespace strait::net {

// Called once per message with OK (every chunk acknowledged) or why it failed.
using SendDone = std::function<void(Status)>;

// A callback to run after the book is consistent again (never from inside the book).
struct Completion {
  SendDone done;
  Status status;
};

struct OutMessage {
  uint32_t channel = 0;
  uint64_t id = 0;  // per channel; assigned when the first chunk is cut
  std::vector<uint8_t> data;
  uint64_t cut = 0;          // bytes already cut into chunks
  bool started = false;      // the first chunk has been cut
  uint64_t outstanding = 0;  // chunks cut but not yet acked
  int64_t deadline_ns = INT64_MAX;
  SendDone done;
  bool finished = false;  // done has been scheduled
  bool acked = false;     // every chunk was cut and acknowledged

  bool fully_cut() const { return started && cut == data.size(); }
};

struct OutChunk {
  uint64_t seq = 0;
  std::shared_ptr<OutMessage> message;
  uint64_t offset = 0;
  uint32_t length = 0;
  int stream = -1;  // the stream it was last written to; -1 while waiting in the resend queue

  DataHeader header() const {
    return DataHeader{seq, message->channel, message->id, message->data.size(), offset};
  }
  const uint8_t* payload() const { return message->data.data() + offset; }
};

class SendBook {
 public:
  // The receiver's budget for partial messages (LinkOptions::max_partial_bytes). A message
  // larger than the budget is still started when nothing else is held.
  void set_max_started_bytes(uint64_t bytes) { max_started_bytes_ = bytes; }

  // Queues a message. `deadline_ns` is in MonotonicNanos time.
  void Enqueue(uint32_t channel, std::vector<uint8_t> data, int64_t deadline_ns, SendDone done);

  // The next chunk for `stream` (resends first, then new cuts of at most `chunk_bytes`), or null
  // when there is nothing to send or the stream already has `max_inflight` unacked bytes.
  // The pointer stays valid until the chunk is acked or the book is failed.
  const OutChunk* Next(int stream, uint32_t chunk_bytes, uint64_t max_inflight);

  // Applies an ack. Fails (and changes nothing) when it covers a sequence number never sent.
  // `acked_bytes` receives the payload bytes newly acknowledged.
  Status OnAck(const Ack& ack, uint64_t* acked_bytes, std::vector<Completion>* completions);

  // The stream died: its unacked chunks go to the resend queue. Returns how many.
  size_t OnStreamLost(int stream);

  // Completes every unfinished message whose deadline passed with kDeadlineExceeded. Messages
  // not yet started are dropped (never sent); started ones keep going, because the receiver
  // needs every message id on a channel to keep order, and may still deliver them.
  void ExpireDeadlines(int64_t now_ns, const std::string& peer,
                       std::vector<Completion>* completions);

  // Fails every unfinished message with `status` and forgets all chunks.
  void FailAll(const Status& status, std::vector<Completion>* completions);

  uint64_t inflight_bytes(int stream) const;
  uint64_t queued_bytes() const { return queued_bytes_; }  // not yet cut
  // Bytes of messages the receiver may be holding (see the class comment).
  uint64_t started_bytes() const { return started_bytes_; }
  size_t unacked_chunks() const { return unacked_.size(); }
  size_t resend_queue() const { return resend_.size(); }
  uint64_t chunks_resent() const { return chunks_resent_; }
  uint64_t next_seq() const { return next_seq_; }
  bool has_work() const { return !resend_.empty() || uncut_messages_ > 0; }
  bool idle() const { return uncut_messages_ == 0 && unacked_.empty(); }

  // Counting windows for the link's adaptation rounds: the payload acknowledged of the chunks
  // whose sequence numbers were cut inside a window, however late their acks come. A round's
  // goodput read this way counts neither data sent before the round (TCP releases data held
  // behind a loss in a burst, which read as goodput of the round it landed in) nor loses the
  // tail still in flight at the round's end (its acks count once they arrive).
  // Opens a window at the next sequence number to be cut, dropping a window still open.
  void OpenSeqWindow();
  // Closes the open window at the next sequence number; later acks of its chunks still count.
  void CloseSeqWindow();
  // The acknowledged bytes of the oldest closed window, which is forgotten; 0 when none.
  uint64_t PopSeqWindow();

 private:
  void Acked(std::map<uint64_t, OutChunk>::iterator it, uint64_t* acked_bytes,
             std::vector<Completion>* completions);
  void Release(uint32_t channel);

  uint64_t next_seq_ = 0;
  std::unordered_map<uint32_t, uint64_t> next_message_id_;
  // Messages not fully cut, per channel in send order, and the channels that have any in the
  // order they get their next turn (the front is next; a channel served goes to the back).
  std::unordered_map<uint32_t, std::deque<std::shared_ptr<OutMessage>>> uncut_;
  std::deque<uint32_t> turns_;
  size_t uncut_messages_ = 0;
  std::deque<std::shared_ptr<OutMessage>> live_;   // not finished, in send order (deadlines)
  std::map<uint64_t, OutChunk> unacked_;
  std::set<uint64_t> resend_;
  std::unordered_map<int, uint64_t> inflight_;
  uint64_t queued_bytes_ = 0;
  uint64_t chunks_resent_ = 0;
  // Started messages per channel in id order, until they and all before them are acked.
  std::unordered_map<uint32_t, std::deque<std::shared_ptr<OutMessage>>> started_;
  uint64_t started_bytes_ = 0;
  uint64_t max_started_bytes_ = UINT64_MAX;
  struct SeqWindow {
    uint64_t begin = 0;
    uint64_t end = UINT64_MAX;  // open while UINT64_MAX
    uint64_t acked_bytes = 0;
  };
  std::deque<SeqWindow> windows_;  // oldest first; at most a closed one and an open one
};

struct Delivery {
  uint32_t channel = 0;
  std::vector<uint8_t> data;
};

class ReceiveBook {
 public:
  // Sequence numbers further than this above the cumulative point are a protocol error: the
  // sender's in-flight limits keep honest peers far below it, and it bounds the ack state.
  static constexpr uint64_t kMaxSeqWindow = uint64_t{1} << 22;
  // Messages being assembled at once, over all channels.
  static constexpr size_t kMaxPartialMessages = 1 << 16;
  // Gaps inside partial messages remembered at once, over all messages: a chunk that would open
  // one more is refused (kResourceExhausted). Each gap waits for an unacknowledged chunk of at
  // least LinkOptions::min_chunk_bytes (only a message's last chunk is shorter, and a gap lies
  // before a received chunk), so an honest sender keeps at most 64 streams x 8 MiB in flight /
  // 64 KiB = 8192 open; without a cap, 1-byte chunks a byte apart would cost ~32 bytes of
  // bookkeeping per message byte. The cap bounds that to ~16 MiB.
  static constexpr size_t kMaxHoles = 1 << 18;

  // `max_partial_bytes` bounds the bytes allocated for messages being assembled (or complete
  // and waiting for an earlier message of their channel); a chunk that would start a message
  // beyond it is refused with kResourceExhausted, which closes the stream as a protocol error.
  explicit ReceiveBook(uint64_t max_message_bytes, uint64_t max_partial_bytes = UINT64_MAX)
      : max_message_bytes_(max_message_bytes), max_partial_bytes_(max_partial_bytes) {}

  // Whether `seq` was received already (so its payload need not be looked at).
  bool IsDuplicate(uint64_t seq) const;

  // Takes one chunk. A duplicate sets *duplicate and is otherwise ignored. Completed messages
  // that are next in their channel's order are appended to `deliveries`. A chunk that
  // contradicts earlier ones, or would exceed the limits, is an error (the stream is closed).
  Status OnChunk(const DataHeader& header, std::span<const uint8_t> payload, bool* duplicate,
                 std::vector<Delivery>* deliveries);

  // The ack describing everything received (at most kMaxAckRanges selective ranges: the lowest
  // ones, which are the ones a sender is most likely waiting on).
  Ack MakeAck() const;

  uint64_t cumulative() const { return cumulative_; }
  size_t partial_messages() const { return partial_count_; }
  uint64_t partial_bytes() const { return partial_bytes_; }

 private:
  // A message being assembled. `data` holds its bytes up to the furthest chunk's end: chunks
  // that arrive in order are appended, so the buffer (reserved whole) is never zero-filled first;
  // only a gap left by a chunk that overtook an earlier one is. `holes` lists those gaps, as
  // disjoint [begin, end) ranges below data.size() that no chunk wrote yet: a chunk below the
  // end must fill part of one hole exactly, so that any overlap is refused wherever it lies
  // (counting bytes alone misses an overlap that leaves a hole inside the message). In order,
  // the map stays empty.
  struct Partial {
    std::vector<uint8_t> data;
    std::map<uint64_t, uint64_t> holes;
    uint64_t length = 0;
    bool complete = false;
  };
  struct Channel {
    uint64_t next_id = 0;
    std::map<uint64_t, Partial> messages;
  };
  void MarkReceived(uint64_t seq);

  uint64_t max_message_bytes_;
  uint64_t max_partial_bytes_;
  uint64_t partial_bytes_ = 0;
  size_t holes_ = 0;  // Partial::holes entries, over all messages
  uint64_t cumulative_ = 0;
  std::map<uint64_t, uint64_t> above_;  // disjoint [begin, end) ranges, all above cumulative_
  std::unordered_map<uint32_t, Channel> channels_;
  size_t partial_count_ = 0;
};

}  // namespace strait::net

#endif  // STRAIT_LIB_NET_DELIVERY_H_
