// LinkCore's streams (see link_core.h): how a stream joins the pool (Attach) and leaves it
// (Drop, StreamDown, retiring when the pool shrinks), and what each stream does while up --
// reading records and acting on them, and writing control records, acks and data chunks taken
// from the link's send book whenever the stream is idle (work stealing: a slow stream takes
// fewer chunks).
//
// Apart from link_core.cc because this is the per-stream machinery below the link's contract;
// the wire format of the records is wire.h's.
#include "net/link_core.h"

#include <algorithm>
#include <array>
#include <span>
#include <utility>

#include <asio.hpp>

#include "common/log.h"
#include "net/endpoint_core.h"
#include "net/socket_options.h"
#include "net/stream_conn.h"

namespace strait::net {

// ---- Streams up and down --------------------------------------------------------------------

void LinkCore::AttachAccepted(const std::shared_ptr<StreamConn>& stream, int index) {
  if (static_cast<size_t>(index) >= slots_.size()) slots_.resize(static_cast<size_t>(index) + 1);
  if (slots_[index]) {
    StreamDown(slots_[index], UnavailableError("replaced by a new stream from the peer"),
               false);
  }
  Attach(stream, index);
}

void LinkCore::Attach(const std::shared_ptr<StreamConn>& stream, int slot) {
  ever_attached_ = true;
  if (state_ != State::kActive) {
    stream->Close();
    return;
  }
  stream->link = shared_from_this();
  stream->slot = slot;
  stream->up = true;
  stream->last_rx_ns = MonotonicNanos();
  slots_[slot] = stream;
  redial_attempts_[slot] = 0;
  if (dial_warned_ && role_ == Role::kDialer) {
    STRAIT_LOG(kInfo, "net") << stream->peer() << " up again";
  }
  dial_warned_ = false;
  ++streams_up_;
  STRAIT_LOG(kDebug, "net") << stream->peer() << " up";
  Pace();
  ReadRecord(stream);
  Pump(stream);
  Publish();
}

void LinkCore::Pace() {
  if (options_.max_rate_bps == 0 || streams_up_ <= 0) return;
  // An equal share: the streams carry chunks from one queue, so a stream held back by its cap
  // only leaves more chunks to the others.
  const uint64_t share = std::max<uint64_t>(1, options_.max_rate_bps / 8 /
                                                   static_cast<uint64_t>(streams_up_));
  for (const auto& s : slots_) {
    if (!s || !s->up) continue;
    if (Status st = SetMaxPacingRate(s->Lowest().native_handle(), share); !st.ok()) {
      STRAIT_LOG(kWarn, "net") << s->peer() << ": cannot pace the stream (" << st.message()
                               << "); it sends as fast as TCP lets it";
    }
  }
}

bool LinkCore::Drop(std::shared_ptr<StreamConn> stream) {
  if (!stream->up) return false;
  stream->up = false;
  stream->Close();
  retrans_closed_ += stream->final_retrans_;
  const int slot = stream->slot;
  if (slot >= 0 && static_cast<size_t>(slot) < slots_.size() && slots_[slot] == stream) {
    slots_[slot].reset();
  }
  stream->link.reset();  // breaks the link <-> stream cycle
  --streams_up_;
  Pace();
  if (streams_up_ == 0) {
    no_streams_since_ = MonotonicNanos();
    if (state_ != State::kActive) endpoint_->Released(this);
  }
  return true;
}

void LinkCore::StreamDown(std::shared_ptr<StreamConn> stream, const Status& why,
                          bool protocol_error) {
  if (stream->retiring && !protocol_error) {
    // Expected: the peer closed a stream that both sides were retiring.
    STRAIT_LOG(kDebug, "net") << stream->peer() << " retired: " << why.message();
    return RetireDone(stream);
  }
  if (!Drop(stream)) return;
  const int slot = stream->slot;
  if (state_ != State::kActive) return;
  ++est_.stream_failures;
  if (protocol_error) ++est_.protocol_errors;
  last_error_ = why.message();
  const size_t requeued = send_.OnStreamLost(slot);
  STRAIT_LOG(kWarn, "net") << stream->peer() << " down: " << why.message() << "; " << requeued
                           << " unacknowledged chunks go out on the other streams";
  ScheduleRedial(slot);
  PumpAll();
  Publish();
}

// ---- Retiring streams (the pool shrinks) ------------------------------------------------------

void LinkCore::Retire(const std::shared_ptr<StreamConn>& stream) {
  if (stream->retiring || !stream->up) return;
  stream->retiring = true;
  stream->retire_sent = true;
  stream->retire_started_ns = MonotonicNanos();
  AppendRetireRecord(&stream->control);
  Pump(stream);
}

void LinkCore::MaybeFinishRetire(const std::shared_ptr<StreamConn>& stream) {
  if (!stream->retiring || !stream->up || stream->writing || !stream->control.empty()) return;
  if (send_.inflight_bytes(stream->slot) > 0) return;
  if (!stream->retire_sent) {
    stream->retire_sent = true;
    AppendRetireRecord(&stream->control);
    Pump(stream);
    return;
  }
  if (role_ == Role::kDialer && stream->retire_received) {
    STRAIT_LOG(kDebug, "net") << stream->peer() << " retired";
    RetireDone(stream);
  }
}

void LinkCore::RetireDone(const std::shared_ptr<StreamConn>& stream) {
  if (!Drop(stream)) return;
  const int slot = stream->slot;
  // Normally nothing: chunks still unacknowledged here (a timeout, or a peer that closed the
  // stream early) go out on the other streams.
  send_.OnStreamLost(slot);
  if (state_ == State::kActive && role_ == Role::kDialer && slot < target_streams_ &&
      !dialing_.count(slot)) {
    Dial(slot);  // the pool grew again while this stream was retiring
  }
  PumpAll();
  Publish();
}

// ---- Reading ----------------------------------------------------------------------------------

void LinkCore::ReadRecord(const std::shared_ptr<StreamConn>& stream) {
  auto self = shared_from_this();
  stream->Read(asio::buffer(stream->header), [self, stream](const asio::error_code& ec,
                                                            size_t) {
    if (!stream->up) return;
    if (ec) return self->StreamDown(stream, UnavailableError(Describe(ec)), false);
    RecordHeader header;
    if (Status s = ParseRecordHeader(stream->header, &header); !s.ok()) {
      STRAIT_LOG(kWarn, "net") << stream->peer() << ": protocol error: " << s.message();
      return self->StreamDown(stream, s, true);
    }
    stream->body.resize(header.length);
    stream->Read(asio::buffer(stream->body), [self, stream, header](
                                                 const asio::error_code& bec, size_t) {
      if (!stream->up) return;
      if (bec) return self->StreamDown(stream, UnavailableError(Describe(bec)), false);
      stream->last_rx_ns = MonotonicNanos();
      if (Status s = self->OnRecord(stream, header); !s.ok()) {
        STRAIT_LOG(kWarn, "net") << stream->peer() << ": protocol error: " << s.message();
        return self->StreamDown(stream, s, true);
      }
      if (stream->up) self->ReadRecord(stream);
    });
  });
}

Status LinkCore::OnRecord(const std::shared_ptr<StreamConn>& stream, const RecordHeader& header) {
  std::span<const uint8_t> body(stream->body);
  switch (header.type) {
    case RecordType::kData: {
      DataHeader data;
      STRAIT_RETURN_IF_ERROR(ParseDataHeader(body, &data));
      const auto payload = body.subspan(kDataHeaderBytes);
      est_.bytes_received += payload.size();
      bool duplicate = false;
      std::vector<Delivery> deliveries;
      STRAIT_RETURN_IF_ERROR(receive_.OnChunk(data, payload, &duplicate, &deliveries));
      if (duplicate) ++est_.duplicate_chunks;
      ack_pending_ = true;
      PumpAll();
      for (Delivery& d : deliveries) {
        ++est_.messages_delivered;
        if (on_message_) on_message_(d.channel, std::move(d.data));
      }
      Publish();
      return Status::Ok();
    }
    case RecordType::kAck: {
      Ack ack;
      STRAIT_RETURN_IF_ERROR(ParseAck(body, &ack));
      uint64_t acked = 0;
      std::vector<Completion> completions;
      STRAIT_RETURN_IF_ERROR(send_.OnAck(ack, &acked, &completions));
      est_.bytes_acked += acked;
      SampleDelivery(ack, acked);
      PumpAll();
      Finish(std::move(completions));
      MaybeFinishClose();
      Publish();
      return Status::Ok();
    }
    case RecordType::kPing:
      AppendPingRecord(RecordType::kPong, GetU64(body.data()), &stream->control);
      Pump(stream);
      return Status::Ok();
    case RecordType::kPong: {
      const int64_t sample = MonotonicNanos() - static_cast<int64_t>(GetU64(body.data()));
      if (sample > 0) {
        est_.rtt_min_ns = est_.rtt_min_ns == 0 ? sample : std::min(est_.rtt_min_ns, sample);
        est_.rtt_smoothed_ns =
            est_.rtt_smoothed_ns == 0 ? sample : (7 * est_.rtt_smoothed_ns + sample) / 8;
      }
      return Status::Ok();
    }
    case RecordType::kClose:
      STRAIT_LOG(kInfo, "net") << peer_name_ << " closed the link (reason "
                               << GetU32(body.data()) << ")";
      End(State::kClosed, UnavailableError("peer " + peer_name_ + " closed the link"),
          /*close_streams=*/true);
      return Status::Ok();
    case RecordType::kRetire:
      stream->retire_received = true;
      if (!stream->retiring) {
        stream->retiring = true;
        stream->retire_started_ns = MonotonicNanos();
      }
      MaybeFinishRetire(stream);
      return Status::Ok();
  }
  return DataLossError("unhandled record type");
}

// ---- Writing (work stealing) ------------------------------------------------------------------

void LinkCore::PumpAll() {
  for (auto& stream : slots_) {
    if (stream && stream->up) Pump(stream);
  }
}

void LinkCore::Pump(std::shared_ptr<StreamConn> stream) {
  if (!stream->up || stream->writing) return;
  stream->out.clear();
  stream->out_payload = 0;
  stream->out_message.reset();
  stream->out.swap(stream->control);
  if (ack_pending_ && state_ == State::kActive) {
    AppendAckRecord(receive_.MakeAck(), &stream->out);
    ack_pending_ = false;
  }
  if (state_ == State::kActive && !stream->close_after_write && !stream->retiring) {
    if (const OutChunk* chunk =
            send_.Next(stream->slot, chunk_bytes_, options_.max_inflight_per_stream)) {
      StampSent(*chunk);
      AppendDataRecordHeaders(chunk->header(), chunk->length, &stream->out);
      // The payload is written from the message itself (kept alive by the stream until the
      // write completes, even if an ack finishes the message meanwhile), not copied behind the
      // headers: that copy was one more pass over every byte the link sends.
      stream->out_message = chunk->message;
      stream->out_offset = chunk->offset;
      stream->out_payload = chunk->length;
      ++est_.chunks_sent;
    }
  }
  if (stream->out.empty()) {
    MaybeFinishRetire(stream);
    return;
  }
  stream->writing = true;
  auto self = shared_from_this();
  const std::array<asio::const_buffer, 2> buffers = {
      asio::buffer(stream->out),
      stream->out_message == nullptr
          ? asio::const_buffer()
          : asio::buffer(stream->out_message->data.data() + stream->out_offset,
                         static_cast<size_t>(stream->out_payload))};
  stream->Write(buffers, [self, stream](const asio::error_code& ec, size_t) {
    stream->writing = false;
    stream->out_message.reset();
    if (!stream->up) return;
    if (ec) return self->StreamDown(stream, UnavailableError(Describe(ec)), false);
    self->est_.bytes_sent += stream->out_payload;
    if (stream->close_after_write && stream->control.empty()) {
      self->Drop(stream);
      self->Publish();
      return;
    }
    self->Pump(stream);
  });
}

}  // namespace strait::net
