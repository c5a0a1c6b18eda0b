// The memory history (history.h).
#include "plugins/torch/native/core/history.h"

#include <algorithm>

namespace sa_native {
namespace {

thread_local std::vector<std::string> compile_contexts;

bool tracked(Action a) {
  return a == Action::kAlloc || a == Action::kFreeRequested || a == Action::kFreeCompleted ||
         a == Action::kOom;
}

}  // namespace

void History::configure(bool enabled, Recorder recorder, size_t max_entries, When when,
                        bool clear, uint32_t skip_mask) {
  std::lock_guard<std::mutex> g(lock_);
  recorder_ = enabled && recorder ? std::make_shared<Recorder>(std::move(recorder)) : nullptr;
  max_entries_ = std::max<size_t>(1, max_entries);
  when_.store(static_cast<int>(enabled && recorder_ ? when : When::kNever));
  skip_.store(skip_mask);
  if (!enabled || clear) {
    rings_.clear();
    annotations_.clear();
    annotations_next_ = 0;
  }
  enabled_.store(enabled);
}

Context History::gather(When level) {
  if (static_cast<int>(level) > when_.load(std::memory_order_relaxed)) return nullptr;
  std::shared_ptr<Recorder> r;
  {
    std::lock_guard<std::mutex> g(lock_);
    r = recorder_;
  }
  // Outside the lock: the recorder walks the Python and C++ stacks.
  return r ? (*r)() : nullptr;
}

bool History::wants(Action a) const {
  if ((skip_.load(std::memory_order_relaxed) >> static_cast<int>(a)) & 1u) return false;
  return enabled_.load(std::memory_order_relaxed) ||
         (tracked(a) && tracking_.load(std::memory_order_relaxed));
}

void History::record(TraceRecord r, int64_t now) {
  if (!wants(r.action)) return;
  r.time = now;
  // A trace keeps stacks from context "alloc" on; "state" keeps them on the
  // live blocks only (a free's entry would otherwise carry its block's).
  if (when() < When::kAlloc) r.context = nullptr;
  r.compile_context = compile_contexts.empty() ? kNoCompileContext : compile_contexts.back();
  std::vector<Tracker> trackers;
  {
    std::lock_guard<std::mutex> g(lock_);
    r.user_metadata = user_metadata_;
    if (tracked(r.action)) trackers = trackers_;
    if (enabled_.load(std::memory_order_relaxed)) {
      Ring &ring = rings_[r.device];
      if (ring.entries.size() < max_entries_) {
        ring.entries.push_back(r);
      } else {
        ring.entries[ring.next] = r;
        ring.next = (ring.next + 1) % ring.entries.size();
      }
    }
  }
  for (const Tracker &t : trackers) t(r);
}

std::vector<TraceRecord> History::entries(int device) {
  std::lock_guard<std::mutex> g(lock_);
  auto it = rings_.find(device);
  if (it == rings_.end()) return {};
  const Ring &ring = it->second;
  std::vector<TraceRecord> out;
  out.reserve(ring.entries.size());
  // Oldest first: from the slot the next entry would overwrite.
  for (size_t i = 0; i < ring.entries.size(); i++)
    out.push_back(ring.entries[(ring.next + i) % ring.entries.size()]);
  return out;
}

void History::annotate(Annotation a) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> g(lock_);
  if (annotations_.size() < max_entries_) {
    annotations_.push_back(std::move(a));
  } else {
    annotations_[annotations_next_] = std::move(a);
    annotations_next_ = (annotations_next_ + 1) % annotations_.size();
  }
}

std::vector<Annotation> History::annotations() {
  std::lock_guard<std::mutex> g(lock_);
  std::vector<Annotation> out;
  for (size_t i = 0; i < annotations_.size(); i++)
    out.push_back(annotations_[(annotations_next_ + i) % annotations_.size()]);
  return out;
}

void History::attach_tracker(Tracker t) {
  std::lock_guard<std::mutex> g(lock_);
  trackers_.push_back(std::move(t));
  tracking_.store(true);
}

void History::push_compile_context(const std::string &c) { compile_contexts.push_back(c); }

void History::pop_compile_context() {
  if (!compile_contexts.empty()) compile_contexts.pop_back();
}

void History::set_user_metadata(const std::string &m) {
  std::lock_guard<std::mutex> g(lock_);
  user_metadata_ = m;
}

std::string History::user_metadata() {
  std::lock_guard<std::mutex> g(lock_);
  return user_metadata_;
}

}  // namespace sa_native
