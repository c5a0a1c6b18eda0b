// PyTorch's memory history (torch.cuda.memory._record_memory_history): a
// ring of trace entries per device, the stack recorder PyTorch hands over,
// annotations, compile contexts and user metadata, and the trace trackers
// PyTorch attaches. The torch layer converts entries to PyTorch's
// TraceEntry when a snapshot is taken; the actions are numbered as
// TraceEntry::Action (checked there at compile time).
//
// What the entries say here: alloc and free_requested at the backend's
// alloc and free; free_completed when the library took the block back (at
// once, or when a free kept back during a capture was made); oom before an
// out-of-memory error; snapshot when one is taken. segment_alloc and
// segment_free follow the physical bytes the device's arenas hold: an
// allocation that made them grow records segment_alloc of the growth at
// the allocation's address (where the new memory serves), and a release
// (empty_cache, an out-of-memory retry) records segment_free of what went,
// at address 0: the library maps and unmaps chunks, not segments, and
// reports no address for them. Trackers get alloc, free and oom entries
// only, since a consumer of segment entries (NCCL's registration hook)
// would register ranges that are no mapping.
#ifndef SA_NATIVE_CORE_HISTORY_H
#define SA_NATIVE_CORE_HISTORY_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "plugins/torch/native/core/live_map.h"
#include "plugins/torch/native/core/pool.h"

namespace sa_native {

enum class Action : int {
  kAlloc = 0,
  kFreeRequested,
  kFreeCompleted,
  kSegmentAlloc,
  kSegmentFree,
  kSegmentMap,
  kSegmentUnmap,
  kSnapshot,
  kOom,
  kCount,
};

// PyTorch's RecordContext: which events keep a stack.
enum class When : int { kNever = 0, kState = 1, kAlloc = 2, kAll = 3 };

// An entry's compile context outside torch.compile's regions: PyTorch's
// word for none, which its tools (torch.cuda._memory_viz) skip.
inline constexpr const char *kNoCompileContext = "N/A";

struct TraceRecord {
  Action action = Action::kAlloc;
  int device = 0;
  uintptr_t addr = 0;  // for kOom: the device's free bytes, as PyTorch records
  size_t size = 0;
  uintptr_t stream = 0;
  PoolId pool = kDefaultPool;
  int64_t time = 0;  // Platform::now()
  Context context;
  std::string compile_context;
  std::string user_metadata;
};

struct Annotation {
  int device = 0;
  int64_t time = 0;
  std::vector<std::pair<std::string, std::string>> metadata;
};

class History {
 public:
  using Recorder = std::function<Context()>;
  using Tracker = std::function<void(const TraceRecord &)>;

  // PyTorch's recordHistory: enabled keeps entries (at most max_entries per
  // device, the oldest overwritten); when says which events gather a stack
  // through recorder; skip_mask has bit (1 << Action) for each action not
  // to record.
  void configure(bool enabled, Recorder recorder, size_t max_entries, When when,
                 bool clear, uint32_t skip_mask);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // A stack from the recorder where when reaches level, else null.
  Context gather(When level);
  When when() const { return static_cast<When>(when_.load(std::memory_order_relaxed)); }

  // Whether an entry of this action would be kept or tracked: a cheap test
  // before the caller works out what it would say.
  bool wants(Action a) const;
  // Keeps the entry (time, compile context and user metadata filled in
  // here; its stack dropped below When::kAlloc) and hands it to the
  // trackers.
  void record(TraceRecord r, int64_t now);
  std::vector<TraceRecord> entries(int device);

  void annotate(Annotation a);
  std::vector<Annotation> annotations();

  void attach_tracker(Tracker t);

  // A stack of compile contexts per thread (torch.compile's, when asked).
  void push_compile_context(const std::string &c);
  void pop_compile_context();

  void set_user_metadata(const std::string &m);
  std::string user_metadata();

 private:
  struct Ring {
    std::vector<TraceRecord> entries;
    size_t next = 0;  // where the next entry goes once full
  };
  std::atomic<bool> enabled_{false};
  std::atomic<int> when_{0};
  std::atomic<uint32_t> skip_{0};
  std::atomic<bool> tracking_{false};
  std::mutex lock_;
  std::shared_ptr<Recorder> recorder_;
  size_t max_entries_ = 1;
  std::map<int, Ring> rings_;
  std::vector<Annotation> annotations_;
  size_t annotations_next_ = 0;
  std::vector<Tracker> trackers_;
  std::string user_metadata_;
};

}  // namespace sa_native

#endif  // SA_NATIVE_CORE_HISTORY_H
