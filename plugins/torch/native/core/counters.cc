// A device's statistics (counters.h).
#include "plugins/torch/native/core/counters.h"

#include <algorithm>

namespace sa_native {

void Stat::increase(uint64_t n) {
  current += static_cast<int64_t>(n);
  allocated += static_cast<int64_t>(n);
  peak = std::max(peak, current);
}

void Stat::decrease(uint64_t n) {
  current -= static_cast<int64_t>(n);
  freed += static_cast<int64_t>(n);
}

void Stat::set(uint64_t now) {
  int64_t v = static_cast<int64_t>(now);
  if (v > current)
    increase(static_cast<uint64_t>(v - current));
  else if (v < current)
    decrease(static_cast<uint64_t>(current - v));
}

namespace {

void add(StatArray &a, bool large, uint64_t n) {
  a[kAggregate].increase(n);
  a[large ? kLargePool : kSmallPool].increase(n);
}

void sub(StatArray &a, bool large, uint64_t n) {
  a[kAggregate].decrease(n);
  a[large ? kLargePool : kSmallPool].decrease(n);
}

template <typename F>
void each_array(Counters &c, F f) {
  for (StatArray *a : {&c.allocation, &c.segment, &c.active, &c.inactive_split,
                       &c.allocated_bytes, &c.reserved_bytes, &c.active_bytes,
                       &c.inactive_split_bytes, &c.requested_bytes})
    for (Stat &s : *a) f(s);
  f(c.oversize_allocations);
  f(c.oversize_segments);
}

}  // namespace

void DeviceCounters::allocated(bool large, size_t block, size_t requested) {
  std::lock_guard<std::mutex> g(lock_);
  add(c_.allocation, large, 1);
  add(c_.active, large, 1);
  add(c_.allocated_bytes, large, block);
  add(c_.active_bytes, large, block);
  add(c_.requested_bytes, large, requested);
}

void DeviceCounters::freed(bool large, size_t block, size_t requested) {
  std::lock_guard<std::mutex> g(lock_);
  sub(c_.allocation, large, 1);
  sub(c_.active, large, 1);
  sub(c_.allocated_bytes, large, block);
  sub(c_.active_bytes, large, block);
  sub(c_.requested_bytes, large, requested);
}

void DeviceCounters::retried() {
  std::lock_guard<std::mutex> g(lock_);
  c_.num_alloc_retries++;
}

void DeviceCounters::out_of_memory() {
  std::lock_guard<std::mutex> g(lock_);
  c_.num_ooms++;
}

void DeviceCounters::synchronized() {
  std::lock_guard<std::mutex> g(lock_);
  c_.num_sync_all_streams++;
}

void DeviceCounters::observe(size_t reserved, size_t chunks) {
  std::lock_guard<std::mutex> g(lock_);
  c_.reserved_bytes[kAggregate].set(reserved);
  c_.segment[kAggregate].set(chunks);
}

void DeviceCounters::raise_reserved_peak(size_t peak) {
  std::lock_guard<std::mutex> g(lock_);
  Stat &r = c_.reserved_bytes[kAggregate];
  r.peak = std::max(r.peak, static_cast<int64_t>(peak));
}

Counters DeviceCounters::read() {
  std::lock_guard<std::mutex> g(lock_);
  return c_;
}

void DeviceCounters::reset_peak() {
  std::lock_guard<std::mutex> g(lock_);
  each_array(c_, [](Stat &s) { s.reset_peak(); });
}

void DeviceCounters::reset_accumulated() {
  std::lock_guard<std::mutex> g(lock_);
  each_array(c_, [](Stat &s) { s.reset_accumulated(); });
  c_.num_alloc_retries = c_.num_ooms = c_.num_sync_all_streams = 0;
  c_.num_device_alloc = c_.num_device_free = 0;
}

}  // namespace sa_native
