// The gateways' agreement on generations and operation identities (see generation.h).
#include "gateway/generation.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/endian.h"
#include "common/strings.h"
#include "gateway/numbering.h"

namespace strait::gateway {
namespace {

constexpr size_t kHeaderBytes = kGenerationHeaderBytes;
// Announcements kept per job: a peer's operations run at most a few steps ahead of ours.
constexpr size_t kMaxAnnouncedSteps = 256;

std::vector<uint8_t> Encode(GenerationMessageKind kind, const std::string& job, uint64_t a,
                            uint64_t b, uint64_t c, const std::string& text = {}) {
  return EncodeGenerationMessage(
      kind, job, a, b, c,
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()),
                               std::min(text.size(), kMaxIdentityBytes)));
}

// Two regions announced different identities for one step. When they differ only in what the
// gateways add (numbering.h), the ranks issued the same step and the gateways are configured or
// built differently: say that, not "issue the same all-reduces".
Status Disagreement(const std::string& step, const std::string& own_region,
                    const std::string& mine, const std::string& peer_region,
                    const std::string& theirs) {
  const std::string fix =
      RanksIdentityPart(mine) == RanksIdentityPart(theirs)
          ? "the ranks issued the same step, but the regions' gateways cut it differently: run "
            "the same straitd version with the same allreduce.chunk_elements in every region"
          : "every rank of every region must issue the same all-reduces in the same order";
  return FailedPreconditionError("regions disagree on " + step + ": this region (" + own_region +
                                 ") has " + mine + ", region " + peer_region + " has " + theirs +
                                 "; " + fix);
}

}  // namespace

std::vector<uint8_t> EncodeGenerationMessage(GenerationMessageKind kind, const std::string& job,
                                             uint64_t a, uint64_t b, uint64_t c,
                                             std::span<const uint8_t> payload) {
  const size_t j = std::min(job.size(), kMaxGenerationJobBytes);
  const size_t t = payload.size();
  std::vector<uint8_t> m(kHeaderBytes + j + t);
  m[0] = kGenerationMessageVersion;
  m[1] = static_cast<uint8_t>(kind);
  PutU16(m.data() + 2, static_cast<uint16_t>(j));
  PutU64(m.data() + 4, a);
  PutU64(m.data() + 12, b);
  PutU64(m.data() + 20, c);
  std::memcpy(m.data() + kHeaderBytes, job.data(), j);
  if (t > 0) std::memcpy(m.data() + kHeaderBytes + j, payload.data(), t);
  return m;
}

Generations::Generations(int rank, std::vector<std::string> names)
    : rank_(rank), names_(std::move(names)) {}

Generations::Job& Generations::JobLocked(const std::string& job) {
  Job& j = jobs_[job];
  if (j.peers.size() != names_.size()) j.peers.resize(names_.size());
  return j;
}

std::pair<uint64_t, int> Generations::NewestLocked(const Job& j) const {
  std::pair<uint64_t, int> newest{j.proposal, rank_};
  for (size_t p = 0; p < j.peers.size(); ++p) {
    if (static_cast<int>(p) == rank_) continue;
    const uint64_t v = std::max(j.peers[p].proposal, j.peers[p].current);
    if (v > newest.first) newest = {v, static_cast<int>(p)};
  }
  return newest;
}

std::string Generations::Describe(const std::string& job, uint64_t generation, uint64_t sequence,
                                  const std::string& identity) const {
  return "job \"" + job + "\" generation " + std::to_string(generation) + " step " +
         std::to_string(sequence) + (identity.empty() ? "" : " (" + identity + ")");
}

void Generations::SupersededLocked(const std::string& job, uint64_t newer, int by,
                                   std::vector<std::pair<uint64_t, Status>>* aborts) {
  for (const auto& [op_id, op] : ops_) {
    if (op.job != job || op.generation >= newer) continue;
    const std::string who = by == rank_ ? "this region" : "region " + names_[static_cast<size_t>(by)];
    aborts->emplace_back(
        op_id, AbortedError(who + " joined generation " + std::to_string(newer) + " of job \"" +
                            job + "\" (its ranks created a new comm, after a failure or a "
                            "gateway restart); step " + std::to_string(op.sequence) +
                            " of generation " + std::to_string(op.generation) +
                            " can no longer complete: destroy this comm and create a new one on "
                            "every rank"));
  }
}

bool Generations::RaiseLocked(Job& j) const {
  if (!j.joining) return false;
  uint64_t proposal = j.proposal;
  if (j.proposal <= j.current) {
    // A join's first proposal: above every generation agreed anywhere so far (a peer's agreed
    // generation may be one it agreed with this gateway's previous life), so only once every
    // peer's state is known.
    proposal = j.current + 1;
    for (size_t p = 0; p < j.peers.size(); ++p) {
      if (static_cast<int>(p) == rank_) continue;
      if (!j.peers[p].heard) return false;
      proposal = std::max({proposal, j.peers[p].proposal, j.peers[p].current + 1});
    }
  } else {
    // Afterwards only a peer that proposes more moves it (a peer's agreed generation equal to
    // this proposal is agreement with it: see AwaitJoin).
    for (size_t p = 0; p < j.peers.size(); ++p) {
      if (static_cast<int>(p) != rank_) proposal = std::max(proposal, j.peers[p].proposal);
    }
  }
  if (proposal == j.proposal) return false;
  j.proposal = proposal;
  return true;
}

std::vector<uint8_t> Generations::BeginJoin(const std::string& job, uint64_t resume,
                                            std::vector<std::pair<uint64_t, Status>>* aborts) {
  std::lock_guard<std::mutex> lock(mu_);
  Job& j = JobLocked(job);
  j.resume = resume;
  j.refused = Status::Ok();
  if (!j.joining) {
    j.joining = true;
    j.proposal = j.current;  // a new join computes a new proposal
  }
  if (RaiseLocked(j)) SupersededLocked(job, j.proposal, rank_, aborts);
  return Encode(GenerationMessageKind::kJoin, job, j.Offer(), j.current, j.resume);
}

StatusOr<uint64_t> Generations::AwaitJoin(const std::string& job, Deadline slice,
                                          const std::function<bool()>& stop,
                                          std::vector<std::pair<uint64_t, Status>>* aborts) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    Job& j = JobLocked(job);
    if (!j.joining && j.current > 0) {  // agreed already (e.g. on a peer's word)
      if (!j.refused.ok()) return j.refused;
      return j.current;
    }
    // A peer that proposes more wins, and a first proposal waits until every peer was heard.
    if (RaiseLocked(j)) {
      if (aborts != nullptr) SupersededLocked(job, j.proposal, rank_, aborts);
      return DeadlineExceededError("proposal raised to " + std::to_string(j.proposal));
    }
    // Every peer proposes the same, or agreed it already (which it could only with this
    // gateway's proposal: a first proposal is above every generation agreed before it).
    bool all = j.joining && j.proposal > j.current;
    for (size_t p = 0; p < j.peers.size(); ++p) {
      if (static_cast<int>(p) == rank_) continue;
      const PeerState& ps = j.peers[p];
      if (ps.proposal != j.proposal && ps.current != j.proposal) all = false;
    }
    if (all) {
      j.current = j.proposal;
      j.joining = false;
      // Announcements of older generations can never match an operation again.
      std::erase_if(j.announced, [&](const auto& kv) { return kv.first.first < j.current; });
      // Every region must go on from the same step (see "Resume positions").
      bool differ = false;
      std::string positions;
      for (size_t p = 0; p < j.peers.size(); ++p) {
        const uint64_t r = static_cast<int>(p) == rank_ ? j.resume : j.peers[p].resume;
        if (r == 0) continue;
        if (j.resume != 0 && r != j.resume) differ = true;
        AppendToList(positions, names_[p] + " " + std::to_string(r - 1));
      }
      if (differ) {
        return j.refused = FailedPreconditionError(
            "job \"" + job + "\": the regions' ranks would go on from different steps (all-reduces "
            "completed: " + positions + "): a step completed in some regions only (a gateway "
            "was lost, or a link between regions was down past the step's deadline, just as the "
            "regions confirmed it) and the others' ranks never got its result. The regions "
            "cannot continue in step: restart every rank of the job from its last checkpoint");
      }
      return j.current;
    }
    if (stop && stop()) return UnavailableError("the gateway is shutting down");
    if (slice.Expired()) {
      std::string missing;
      for (size_t p = 0; p < j.peers.size(); ++p) {
        if (static_cast<int>(p) != rank_ && j.peers[p].proposal != j.proposal &&
            j.peers[p].current != j.proposal) {
          AppendToList(missing, names_[p] + (j.peers[p].heard
                                                 ? " (at generation " +
                                                       std::to_string(j.peers[p].current) + ")"
                                                 : std::string(" (not heard from)")));
        }
      }
      const std::string which =
          j.proposal > j.current ? "generation " + std::to_string(j.proposal) : "a new generation";
      return DeadlineExceededError("job \"" + job + "\": the gateways of " + missing +
                                   " have not joined " + which +
                                   " yet: their ranks have not created their comm for this job "
                                   "(every rank of every region must create it)");
    }
    cv_.wait_for(lock, std::chrono::nanoseconds(
                           std::clamp<int64_t>(slice.RemainingNanos(), 1'000'000, 50'000'000)));
  }
}

std::vector<int> Generations::Missing(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  auto it = jobs_.find(job);
  for (size_t p = 0; p < names_.size(); ++p) {
    if (static_cast<int>(p) == rank_) continue;
    if (it == jobs_.end() || !it->second.peers[p].heard ||
        (it->second.peers[p].proposal != it->second.Offer() &&
         it->second.peers[p].current != it->second.Offer())) {
      out.push_back(static_cast<int>(p));
    }
  }
  return out;
}

std::vector<uint8_t> Generations::StateMessage(const std::string& job,
                                               GenerationMessageKind kind) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job);
  const uint64_t proposal = it == jobs_.end() ? 0 : it->second.Offer();
  const uint64_t current = it == jobs_.end() ? 0 : it->second.current;
  return Encode(kind, job, proposal, current, it == jobs_.end() ? 0 : it->second.resume);
}

uint64_t Generations::Current(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : it->second.current;
}

Status Generations::BeginOp(const std::string& job, uint64_t generation, uint64_t sequence,
                            const std::string& identity, uint64_t op_id,
                            std::vector<uint8_t>* announce) {
  std::lock_guard<std::mutex> lock(mu_);
  Job& j = JobLocked(job);
  const std::string mine = Describe(job, generation, sequence, identity);
  if (generation == 0 || generation > j.current) {
    return FailedPreconditionError(
        mine + ": this gateway never agreed generation " + std::to_string(generation) +
        " (its current one is " + std::to_string(j.current) +
        "; it restarted, or the comm did not join through it): destroy the comm and create a "
        "new one on every rank");
  }
  if (auto [newest, by] = NewestLocked(j); newest > generation) {
    const std::string who =
        by == rank_ ? "this region" : "region " + names_[static_cast<size_t>(by)];
    return AbortedError(mine + ": " + who + " joined generation " + std::to_string(newest) +
                        " since (its ranks created a new comm after a failure or a restart): "
                        "destroy this comm and create a new one on every rank");
  }
  if (auto a = j.announced.find({generation, sequence}); a != j.announced.end()) {
    for (const auto& [peer, theirs] : a->second) {
      if (theirs != identity) {
        // Refused, but still announced: a peer already running the step under its own identity
        // (so another op id, which this region's abort never reaches) learns of the mismatch
        // from the announcement and ends its step now instead of at its deadline.
        *announce =
            Encode(GenerationMessageKind::kAnnounce, job, generation, sequence, 0, identity);
        return Disagreement(Describe(job, generation, sequence, ""),
                            names_[static_cast<size_t>(rank_)], identity,
                            names_[static_cast<size_t>(peer)], theirs);
      }
    }
    j.announced.erase(a);
  }
  ops_[op_id] = Op{job, generation, sequence, identity, Status::Ok()};
  *announce = Encode(GenerationMessageKind::kAnnounce, job, generation, sequence, 0, identity);
  return Status::Ok();
}

Status Generations::EndOp(uint64_t op_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ops_.find(op_id);
  if (it == ops_.end()) return Status::Ok();
  Status mismatch = std::move(it->second.mismatch);
  ops_.erase(it);
  return mismatch;
}

size_t Generations::OpsInFlight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_.size();
}

StatusOr<Generations::Effects> Generations::OnMessage(int peer, std::span<const uint8_t> m) {
  if (m.size() < kHeaderBytes) {
    return DataLossError("generation message of " + std::to_string(m.size()) +
                         " bytes is shorter than its " + std::to_string(kHeaderBytes) +
                         "-byte header");
  }
  if (m[0] != kGenerationMessageVersion) {
    return DataLossError("generation message version " + std::to_string(m[0]) +
                         "; this gateway speaks version " +
                         std::to_string(kGenerationMessageVersion) +
                         " (upgrade every gateway of the shard together)");
  }
  const uint8_t kind = m[1];
  if (kind < 1 || kind > 3) {
    return DataLossError("unknown generation message kind " + std::to_string(kind));
  }
  const size_t job_len = GetU16(m.data() + 2);
  if (job_len == 0 || job_len > kMaxGenerationJobBytes || kHeaderBytes + job_len > m.size()) {
    return DataLossError("generation message job length " + std::to_string(job_len) +
                         " does not fit its " + std::to_string(m.size()) + " bytes");
  }
  if (peer < 0 || static_cast<size_t>(peer) >= names_.size() || peer == rank_) {
    return InvalidArgumentError("generation message from unknown rank " + std::to_string(peer));
  }
  const uint64_t a = GetU64(m.data() + 4);
  const uint64_t b = GetU64(m.data() + 12);
  const std::string job(reinterpret_cast<const char*>(m.data() + kHeaderBytes), job_len);
  Effects effects;
  std::lock_guard<std::mutex> lock(mu_);
  Job& j = JobLocked(job);
  const auto kindv = static_cast<GenerationMessageKind>(kind);
  if (kindv == GenerationMessageKind::kAnnounce) {
    if (m.size() - kHeaderBytes - job_len > kMaxIdentityBytes) {
      return DataLossError("generation announcement identity longer than " +
                           std::to_string(kMaxIdentityBytes) + " bytes");
    }
    const std::string theirs(reinterpret_cast<const char*>(m.data() + kHeaderBytes + job_len),
                             m.size() - kHeaderBytes - job_len);
    for (auto& [op_id, op] : ops_) {
      if (op.job == job && op.generation == a && op.sequence == b && op.identity != theirs) {
        Status why = Disagreement(Describe(job, a, b, ""), names_[static_cast<size_t>(rank_)],
                                  op.identity, names_[static_cast<size_t>(peer)], theirs);
        if (op.mismatch.ok()) op.mismatch = why;
        effects.aborts.emplace_back(op_id, std::move(why));
        return effects;
      }
      if (op.job == job && op.generation == a && op.sequence == b) return effects;  // matches
    }
    if (a >= j.current) {
      j.announced[{a, b}][peer] = theirs;
      while (j.announced.size() > kMaxAnnouncedSteps) j.announced.erase(j.announced.begin());
    }
    return effects;
  }
  PeerState& ps = j.peers[static_cast<size_t>(peer)];
  ps.proposal = a;
  ps.current = b;
  ps.heard = true;
  ps.resume = GetU64(m.data() + 20);
  if (const uint64_t newest = std::max(a, b); newest > j.current) {
    SupersededLocked(job, newest, peer, &effects.aborts);
  }
  if (kindv == GenerationMessageKind::kJoin) {
    effects.reply = Encode(GenerationMessageKind::kState, job, j.Offer(), j.current, j.resume);
  }
  cv_.notify_all();
  return effects;
}

}  // namespace strait::gateway
