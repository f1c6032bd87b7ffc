// Internal to lib/gateway: how a gateway numbers the all-reduces of each (job, tensor key) so that
// the same operation gets the same collective op id on every gateway, also after failures and
// restarts, without a coordination round trip per operation. See gateway.h ("Operations") for the
// rule and why it cannot leave gateways permanently out of step. Header-only; not installed.
//
// A number is (world, epoch, sequence):
//   world     the hash of the incarnations of every gateway of the shard (WorldIncarnation): it
//             changes when any of them restarts, so that a restarted gateway (whose sequences
//             are gone) and the survivors all start again at epoch 0, sequence 0.
//   epoch     per (job, world): raised to e + 1 when an operation of the job numbered in epoch e
//             fails, here or on any peer (its abort carries Note()), which restarts the job's
//             sequences; raising is idempotent (max), so the same failure seen twice counts once.
//             A peer's failure of an operation this gateway has not numbered yet (its client has
//             not sent that step) is held until it does: that step then gets the failed
//             operation's number, so it meets the abort the transport remembers for it and fails
//             at once, and the epoch moves then. Moving at once would give this gateway's step s
//             the number the failing peer gives its step s + 1: two different steps summed.
//   sequence  per (job, world, epoch, tensor key): 0, 1, 2, ...
// Word() folds a number into the 64-bit value OperationId() takes as its sequence.
//
// Thread-safe.
#ifndef STRAIT_LIB_GATEWAY_NUMBERING_H_
#define STRAIT_LIB_GATEWAY_NUMBERING_H_

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace strait::gateway {

class OpNumbering {
 public:
  // Worlds remembered per job: failures reported for a world this gateway has not reached yet
  // (it has not heard of a peer's restart) must still count once it gets there.
  static constexpr size_t kWorldsPerJob = 4;

  struct Number {
    uint64_t world = 0;
    uint64_t epoch = 0;
    uint64_t sequence = 0;
  };

  // The hash of the incarnations of every rank, in rank order (0 = unknown is not allowed).
  static uint64_t WorldIncarnation(const std::vector<uint64_t>& incarnations) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t v : incarnations) h = Mix(h ^ v);
    return h;
  }

  // The next number for (job, key) in `world`.
  Number Next(const std::string& job, const std::string& key, uint64_t world) {
    std::lock_guard<std::mutex> lock(mu_);
    Epoch& e = EpochOf(job, world);
    if (auto it = e.pending.find(key); it != e.pending.end() && it->second < e.sequences[key]) {
      // The held failure's number was given out and that operation is over (it failed and
      // Failed() moved on, or it was never reported back): move now, as the peer did.
      Move(e, e.epoch + 1);
    }
    return Number{world, e.epoch, e.sequences[key]++};
  }

  // The operation (world, epoch, sequence) of (job, key) failed here or on a peer: the job's
  // numbering in that world moves to epoch + 1 with fresh sequences, unless it is there or
  // beyond already, or this gateway has not numbered that operation yet (then the move waits
  // until Next() has given that number out; see the file comment). Returns whether it moved.
  bool Failed(const std::string& job, const std::string& key, const Number& failed) {
    std::lock_guard<std::mutex> lock(mu_);
    Epoch& e = EpochOf(job, failed.world);
    if (e.epoch > failed.epoch) return false;
    if (e.epoch == failed.epoch) {
      auto next = e.sequences.find(key);
      const uint64_t issued = next == e.sequences.end() ? 0 : next->second;
      if (issued <= failed.sequence) {
        auto [it, fresh] = e.pending.emplace(key, failed.sequence);
        if (!fresh) it->second = std::min(it->second, failed.sequence);
        return false;
      }
    }
    Move(e, failed.epoch + 1);
    return true;
  }

  // How many times a job's numbering moved to a new epoch.
  uint64_t restarts() const {
    std::lock_guard<std::mutex> lock(mu_);
    return restarts_;
  }

  // The value for OperationId's sequence argument.
  static uint64_t Word(const Number& n) {
    return Mix(Mix(Mix(n.world) ^ n.epoch) ^ n.sequence);
  }

  // What an abort carries so that peers can apply Failed():
  // "numbering/2 <world> <epoch> <sequence> <key length> <key><job>".
  static std::string Note(const std::string& job, const std::string& key, const Number& n) {
    return std::string(kNotePrefix) + std::to_string(n.world) + " " + std::to_string(n.epoch) +
           " " + std::to_string(n.sequence) + " " + std::to_string(key.size()) + " " + key + job;
  }
  // Parses Note(); false for anything else (an abort from a peer that numbers differently).
  static bool ParseNote(const std::string& note, std::string* job, std::string* key, Number* n) {
    const std::string prefix = kNotePrefix;
    if (note.compare(0, prefix.size(), prefix) != 0) return false;
    const char* p = note.data() + prefix.size();
    const char* end = note.data() + note.size();
    uint64_t key_size = 0;
    for (uint64_t* field : {&n->world, &n->epoch, &n->sequence, &key_size}) {
      auto r = std::from_chars(p, end, *field);
      if (r.ec != std::errc() || r.ptr == end || *r.ptr != ' ') return false;
      p = r.ptr + 1;
    }
    if (key_size > static_cast<uint64_t>(end - p)) return false;
    key->assign(p, p + key_size);
    job->assign(p + key_size, end);
    return true;
  }

 private:
  static constexpr const char* kNotePrefix = "numbering/2 ";

  struct Epoch {
    uint64_t epoch = 0;
    std::map<std::string, uint64_t> sequences;  // key -> the next sequence
    std::map<std::string, uint64_t> pending;    // key -> a peer's failed sequence not reached
  };

  void Move(Epoch& e, uint64_t epoch) {
    e.epoch = epoch;
    e.sequences.clear();
    e.pending.clear();
    ++restarts_;
  }
  struct Job {
    std::deque<std::pair<uint64_t, Epoch>> worlds;  // newest last
  };

  // splitmix64's finaliser: stable across builds and machines.
  static uint64_t Mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }

  Epoch& EpochOf(const std::string& job, uint64_t world) {
    auto& worlds = jobs_[job].worlds;
    for (auto& [w, e] : worlds) {
      if (w == world) return e;
    }
    worlds.emplace_back(world, Epoch{});
    if (worlds.size() > kWorldsPerJob) worlds.pop_front();
    return worlds.back().second;
  }

  mutable std::mutex mu_;
  std::map<std::string, Job> jobs_;
  uint64_t restarts_ = 0;
};

}  // namespace strait::gateway

#endif  // STRAIT_LIB_GATEWAY_NUMBERING_H_
