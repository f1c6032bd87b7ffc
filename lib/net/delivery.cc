// Sender and receiver bookkeeping for reliable ordered delivery (see delivery.h).
#include "net/delivery.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

namespace strait::net {

void SendBook::Enqueue(uint32_t channel, std::vector<uint8_t> data, int64_t deadline_ns,
                       SendDone done) {
  auto message = std::make_shared<OutMessage>();
  message->channel = channel;
  message->data = std::move(data);
  message->deadline_ns = deadline_ns;
  message->done = std::move(done);
  queued_bytes_ += message->data.size();
  auto& queue = uncut_[channel];
  if (queue.empty()) turns_.push_back(channel);  // a channel joins the round at the back
  queue.push_back(message);
  ++uncut_messages_;
  live_.push_back(std::move(message));
}

const OutChunk* SendBook::Next(int stream, uint32_t chunk_bytes, uint64_t max_inflight) {
  uint64_t& inflight = inflight_[stream];
  if (inflight >= max_inflight) return nullptr;
  if (!resend_.empty()) {
    auto it = unacked_.find(*resend_.begin());
    resend_.erase(resend_.begin());
    // Every seq in resend_ is unacked: OnAck erases acked seqs from both.
    OutChunk& chunk = it->second;
    chunk.stream = stream;
    inflight += chunk.length;
    ++chunks_resent_;
    return &chunk;
  }
  // Channels in turn. A channel that cannot start its next message (the receiver's budget) keeps
  // its place and stops later channels from starting theirs, so it is served first once acks
  // make room; channels with a started message go on cutting meanwhile.
  bool start_blocked = false;
  for (size_t turn = 0; turn < turns_.size();) {
    const uint32_t channel = turns_[turn];
    auto queue_it = uncut_.find(channel);
    auto& queue = queue_it->second;
    while (!queue.empty() && queue.front()->finished && !queue.front()->started) {
      queue.pop_front();  // expired before it was started
      --uncut_messages_;
    }
    if (queue.empty()) {
      uncut_.erase(queue_it);
      turns_.erase(turns_.begin() + static_cast<std::ptrdiff_t>(turn));
      continue;
    }
    std::shared_ptr<OutMessage> message = queue.front();
    if (!message->started) {
      const uint64_t size = message->data.size();
      if (start_blocked || (started_bytes_ > 0 && (size > max_started_bytes_ ||
                                                   started_bytes_ > max_started_bytes_ - size))) {
        start_blocked = true;  // the receiver could not hold it yet; acks will make room
        ++turn;
        continue;
      }
      message->started = true;
      message->id = next_message_id_[channel]++;
      started_[channel].push_back(message);
      started_bytes_ += size;
    }
    const uint64_t left = message->data.size() - message->cut;
    const uint32_t cap = std::clamp<uint32_t>(chunk_bytes, 1, kMaxChunkPayload);
    const auto length = static_cast<uint32_t>(std::min<uint64_t>(left, cap));
    OutChunk chunk;
    chunk.seq = next_seq_++;
    chunk.message = message;
    chunk.offset = message->cut;
    chunk.length = length;
    chunk.stream = stream;
    message->cut += length;
    message->outstanding++;
    queued_bytes_ -= length;
    if (message->fully_cut()) {
      queue.pop_front();
      --uncut_messages_;
    }
    // This channel had its turn: to the back of the round (or out of it when it is done).
    turns_.erase(turns_.begin() + static_cast<std::ptrdiff_t>(turn));
    if (queue.empty()) {
      uncut_.erase(queue_it);
    } else {
      turns_.push_back(channel);
    }
    inflight += length;
    auto [it, inserted] = unacked_.emplace(chunk.seq, std::move(chunk));
    (void)inserted;
    return &it->second;
  }
  return nullptr;
}

void SendBook::Acked(std::map<uint64_t, OutChunk>::iterator it, uint64_t* acked_bytes,
                     std::vector<Completion>* completions) {
  OutChunk& chunk = it->second;
  if (chunk.stream >= 0) {
    inflight_[chunk.stream] -= chunk.length;
  } else {
    resend_.erase(chunk.seq);
  }
  *acked_bytes += chunk.length;
  for (SeqWindow& w : windows_) {
    if (chunk.seq >= w.begin && chunk.seq < w.end) w.acked_bytes += chunk.length;
  }
  OutMessage& message = *chunk.message;
  message.outstanding--;
  if (message.fully_cut() && message.outstanding == 0) {
    if (!message.finished) {
      message.finished = true;
      completions->push_back(Completion{std::move(message.done), Status::Ok()});
    }
    message.acked = true;
    const uint32_t channel = message.channel;
    unacked_.erase(it);  // may drop the last reference but one to the message
    Release(channel);
    return;
  }
  unacked_.erase(it);
}

void SendBook::OpenSeqWindow() {
  if (!windows_.empty() && windows_.back().end == UINT64_MAX) windows_.pop_back();
  windows_.push_back(SeqWindow{next_seq_, UINT64_MAX, 0});
}

void SendBook::CloseSeqWindow() {
  if (!windows_.empty() && windows_.back().end == UINT64_MAX) windows_.back().end = next_seq_;
}

uint64_t SendBook::PopSeqWindow() {
  if (windows_.empty() || windows_.front().end == UINT64_MAX) return 0;
  const uint64_t bytes = windows_.front().acked_bytes;
  windows_.pop_front();
  return bytes;
}

void SendBook::Release(uint32_t channel) {
  auto it = started_.find(channel);
  if (it == started_.end()) return;
  auto& queue = it->second;
  while (!queue.empty() && queue.front()->acked) {
    started_bytes_ -= queue.front()->data.size();
    queue.pop_front();
  }
  if (queue.empty()) started_.erase(it);
}

Status SendBook::OnAck(const Ack& ack, uint64_t* acked_bytes,
                       std::vector<Completion>* completions) {
  *acked_bytes = 0;
  uint64_t top = ack.cumulative;
  if (!ack.ranges.empty()) top = std::max(top, ack.ranges.back().end);
  if (top > next_seq_) {
    return DataLossError("peer acknowledged chunk " + std::to_string(top - 1) +
                         " but only " + std::to_string(next_seq_) + " were sent");
  }
  while (!unacked_.empty() && unacked_.begin()->first < ack.cumulative) {
    Acked(unacked_.begin(), acked_bytes, completions);
  }
  for (const AckRange& range : ack.ranges) {
    auto it = unacked_.lower_bound(range.begin);
    while (it != unacked_.end() && it->first < range.end) {
      auto next = std::next(it);
      Acked(it, acked_bytes, completions);
      it = next;
    }
  }
  while (!live_.empty() && live_.front()->finished) live_.pop_front();
  return Status::Ok();
}

size_t SendBook::OnStreamLost(int stream) {
  size_t moved = 0;
  for (auto& [seq, chunk] : unacked_) {
    if (chunk.stream != stream) continue;
    chunk.stream = -1;
    resend_.insert(seq);
    ++moved;
  }
  inflight_[stream] = 0;
  return moved;
}

void SendBook::ExpireDeadlines(int64_t now_ns, const std::string& peer,
                               std::vector<Completion>* completions) {
  for (auto& message : live_) {
    if (message->finished || message->deadline_ns > now_ns) continue;
    message->finished = true;
    std::string what = "send of " + std::to_string(message->data.size()) +
                       " bytes on channel " + std::to_string(message->channel) + " to " + peer;
    if (!message->started) {
      queued_bytes_ -= message->data.size();
      what += " passed its deadline before it could start; it was not sent";
    } else {
      what += " was not acknowledged before its deadline; the peer may still receive it";
    }
    completions->push_back(Completion{std::move(message->done), DeadlineExceededError(what)});
  }
  while (!live_.empty() && live_.front()->finished) live_.pop_front();
}

void SendBook::FailAll(const Status& status, std::vector<Completion>* completions) {
  for (auto& message : live_) {
    if (message->finished) continue;
    message->finished = true;
    completions->push_back(Completion{std::move(message->done), status});
  }
  live_.clear();
  uncut_.clear();
  turns_.clear();
  uncut_messages_ = 0;
  unacked_.clear();
  resend_.clear();
  inflight_.clear();
  started_.clear();
  started_bytes_ = 0;
  queued_bytes_ = 0;
}

uint64_t SendBook::inflight_bytes(int stream) const {
  auto it = inflight_.find(stream);
  return it == inflight_.end() ? 0 : it->second;
}

bool ReceiveBook::IsDuplicate(uint64_t seq) const {
  if (seq < cumulative_) return true;
  auto it = above_.upper_bound(seq);
  if (it == above_.begin()) return false;
  --it;
  return seq < it->second;
}

void ReceiveBook::MarkReceived(uint64_t seq) {
  // Insert [seq, seq+1) and merge with its neighbours.
  uint64_t begin = seq;
  uint64_t end = seq + 1;
  auto next = above_.lower_bound(seq);
  if (next != above_.end() && next->first == end) {
    end = next->second;
    next = above_.erase(next);
  }
  if (next != above_.begin()) {
    auto prev = std::prev(next);
    if (prev->second == begin) {
      begin = prev->first;
      above_.erase(prev);
    }
  }
  if (begin == cumulative_) {
    cumulative_ = end;
  } else {
    above_.emplace(begin, end);
  }
}

Status ReceiveBook::OnChunk(const DataHeader& header, std::span<const uint8_t> payload,
                            bool* duplicate, std::vector<Delivery>* deliveries) {
  *duplicate = false;
  if (IsDuplicate(header.seq)) {
    *duplicate = true;
    return Status::Ok();
  }
  if (header.seq - cumulative_ >= kMaxSeqWindow) {
    return DataLossError("chunk " + std::to_string(header.seq) + " is too far ahead of " +
                         std::to_string(cumulative_));
  }
  if (header.message_length > max_message_bytes_) {
    return ResourceExhaustedError("peer sends a message of " +
                                  std::to_string(header.message_length) +
                                  " bytes; this link accepts at most " +
                                  std::to_string(max_message_bytes_));
  }
  if (header.offset > header.message_length ||
      payload.size() > header.message_length - header.offset) {
    return DataLossError("chunk lies outside its message");
  }
  Channel& channel = channels_[header.channel];
  if (header.message_id < channel.next_id) {
    return DataLossError("chunk " + std::to_string(header.seq) + " belongs to message " +
                         std::to_string(header.message_id) + " on channel " +
                         std::to_string(header.channel) + ", which was already delivered");
  }
  auto it = channel.messages.find(header.message_id);
  if (it == channel.messages.end()) {
    if (partial_count_ >= kMaxPartialMessages) {
      return ResourceExhaustedError("peer has too many messages in flight");
    }
    if (partial_bytes_ > 0 && (partial_bytes_ > max_partial_bytes_ ||
                               header.message_length > max_partial_bytes_ - partial_bytes_)) {
      return ResourceExhaustedError(
          "peer starts message " + std::to_string(header.message_id) + " of " +
          std::to_string(header.message_length) + " bytes on channel " +
          std::to_string(header.channel) + " while " + std::to_string(partial_bytes_) +
          " bytes of partial messages are held; the limit is " +
          std::to_string(max_partial_bytes_) + " (max_partial_bytes)");
    }
    Partial partial;
    partial.data.reserve(header.message_length);
    partial.length = header.message_length;
    it = channel.messages.emplace(header.message_id, std::move(partial)).first;
    ++partial_count_;
    partial_bytes_ += header.message_length;
  }
  Partial& partial = it->second;
  if (partial.length != header.message_length || partial.complete) {
    return DataLossError("chunk " + std::to_string(header.seq) +
                         " disagrees with earlier chunks of message " +
                         std::to_string(header.message_id) + " on channel " +
                         std::to_string(header.channel));
  }
  const auto overlap = [&] {
    return DataLossError("chunks of message " + std::to_string(header.message_id) +
                         " on channel " + std::to_string(header.channel) + " overlap");
  };
  // Everything is checked before anything changes, so that a resend of a refused chunk is
  // refused again, not half taken.
  std::vector<uint8_t>& data = partial.data;
  const uint64_t offset = header.offset;
  const uint64_t end = offset + payload.size();
  auto hole = partial.holes.end();
  if (!payload.empty() && offset < data.size()) {
    // Below the furthest end: the chunk must lie inside one hole (holes end where a written
    // chunk begins, so one that reaches past its hole overlaps written bytes).
    hole = partial.holes.upper_bound(offset);
    if (hole == partial.holes.begin()) return overlap();
    --hole;
    if (end > hole->second) return overlap();
  }
  // Gaps the chunk opens: one beyond the end, one more when it splits a gap in two.
  const bool opens = !payload.empty() &&
                     (hole == partial.holes.end() ? offset > data.size()
                                                  : hole->first < offset && end < hole->second);
  if (opens && holes_ >= kMaxHoles) {
    return ResourceExhaustedError("peer leaves more than " + std::to_string(kMaxHoles) +
                                  " gaps open in its partial messages (chunk " +
                                  std::to_string(header.seq) + " of message " +
                                  std::to_string(header.message_id) + " on channel " +
                                  std::to_string(header.channel) + ")");
  }
  if (!payload.empty()) {
    if (hole != partial.holes.end()) {
      const auto [begin, stop] = *hole;
      std::memcpy(data.data() + offset, payload.data(), payload.size());
      partial.holes.erase(hole);
      --holes_;
      if (begin < offset) {
        partial.holes.emplace(begin, offset);
        ++holes_;
      }
      if (end < stop) {
        partial.holes.emplace(end, stop);
        ++holes_;
      }
    } else {
      if (offset > data.size()) {
        partial.holes.emplace(data.size(), offset);  // an earlier chunk is still coming
        ++holes_;
        data.resize(offset);
      }
      data.insert(data.end(), payload.begin(), payload.end());
    }
  }
  // Chunks are disjoint and inside the message: it is whole once nothing is missing.
  if (data.size() == partial.length && partial.holes.empty()) partial.complete = true;
  MarkReceived(header.seq);
  while (!channel.messages.empty() && channel.messages.begin()->first == channel.next_id &&
         channel.messages.begin()->second.complete) {
    deliveries->push_back(
        Delivery{header.channel, std::move(channel.messages.begin()->second.data)});
    partial_bytes_ -= deliveries->back().data.size();
    channel.messages.erase(channel.messages.begin());
    --partial_count_;
    ++channel.next_id;
  }
  return Status::Ok();
}

Ack ReceiveBook::MakeAck() const {
  Ack ack;
  ack.cumulative = cumulative_;
  for (const auto& [begin, end] : above_) {
    if (ack.ranges.size() == kMaxAckRanges) break;
    ack.ranges.push_back(AckRange{begin, end});
  }
  return ack;
}

}  // namespace strait::net
