// ErrorFeedbackStore: the per-(job, tensor) quantization residuals kept between steps.
//
// A two-level map (job, then tensor) so that DropJob is one erase, with transparent comparators
// so that a lookup of an existing key builds no std::string.
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "strait/codec.h"

namespace strait {

struct ErrorFeedbackStore::Impl {
  using TensorMap = std::map<std::string, std::vector<float>, std::less<>>;
  mutable std::mutex mu;
  std::map<std::string, TensorMap, std::less<>> jobs;
  size_t bytes = 0;
  size_t keys = 0;
};

ErrorFeedbackStore::ErrorFeedbackStore() : impl_(std::make_unique<Impl>()) {}
ErrorFeedbackStore::~ErrorFeedbackStore() = default;

std::span<float> ErrorFeedbackStore::Residual(std::string_view job, std::string_view tensor,
                                              size_t count) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto job_it = impl_->jobs.find(job);
  if (job_it == impl_->jobs.end()) {
    job_it = impl_->jobs.emplace(std::string(job), Impl::TensorMap()).first;
  }
  Impl::TensorMap& tensors = job_it->second;
  auto it = tensors.find(tensor);
  if (it == tensors.end()) {
    it = tensors.emplace(std::string(tensor), std::vector<float>(count, 0.0f)).first;
    impl_->bytes += count * sizeof(float);
    ++impl_->keys;
  } else if (it->second.size() != count) {
    // A new shape means the old residual belongs to a different tensor: start again from zero,
    // and give back the old memory rather than keep the larger capacity.
    impl_->bytes -= it->second.size() * sizeof(float);
    std::vector<float>(count, 0.0f).swap(it->second);
    impl_->bytes += count * sizeof(float);
  }
  return std::span<float>(it->second.data(), it->second.size());
}

size_t ErrorFeedbackStore::DropJob(std::string_view job) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->jobs.find(job);
  if (it == impl_->jobs.end()) return 0;
  const size_t dropped = it->second.size();
  for (const auto& [name, residual] : it->second) impl_->bytes -= residual.size() * sizeof(float);
  impl_->keys -= dropped;
  impl_->jobs.erase(it);
  return dropped;
}

void ErrorFeedbackStore::Clear() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->jobs.clear();
  impl_->bytes = 0;
  impl_->keys = 0;
}

size_t ErrorFeedbackStore::BytesHeld() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->bytes;
}

size_t ErrorFeedbackStore::KeyCount() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->keys;
}

}  // namespace strait
