// The arena layout (layout.h): mapped ranges from the snapshot's chunks,
// then the superblocks' blocks and the spans placed in them by address.
#include "plugins/torch/native/core/layout.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "plugins/torch/native/core/failure.h"
#include "plugins/torch/native/core/json.h"

namespace sa_native {
namespace {

// Something the snapshot lists at an address: a superblock's blocks or a
// span, with the stream that owns it.
struct Item {
  uintptr_t address;
  uintptr_t end;  // one past its last block
  uintptr_t stream;
  bool large;
  std::vector<LayoutBlock> blocks;  // in address order, contiguous
};

BlockState letter_state(char c) {
  switch (c) {
    case 'L':  // live
    case 'R':  // live, recorded on other streams
      return BlockState::kLive;
    case 'D':  // freed, waiting for its event
      return BlockState::kPendingFree;
    default:  // 'F' free, 'C' cached in a thread
      return BlockState::kFree;
  }
}

Item superblock_item(const Json &sb) {
  size_t size = sb["size"].u64();
  Item it{sb["base"].u64(), sb["base"].u64() + size, sb["stream"].u64(), false, {}};
  size_t block = sb["block_size"].u64();
  const std::string &letters = sb["blocks"].str();
  size_t at = 0;
  if (block != 0) {
    for (char c : letters) {
      if (at + block > size) break;
      it.blocks.push_back({it.address + at, block, letter_state(c), 0});
      at += block;
    }
  }
  if (at < size) {
    // Past the last whole block, or a superblock no stream owns.
    BlockState rest = sb["state"].str() == "awaiting_event" && at == 0 ? BlockState::kPendingFree
                                                                       : BlockState::kFree;
    it.blocks.push_back({it.address + at, size - at, rest, 0});
  }
  return it;
}

Item span_item(const Json &sp) {
  const std::string &state = sp["state"].str();
  BlockState st = state == "live"             ? BlockState::kLive
                  : state == "awaiting_event" ? BlockState::kPendingFree
                                              : BlockState::kFree;
  LayoutBlock b{sp["base"].u64(), sp["size"].u64(), st, sp["request"].u64()};
  return Item{b.address, b.address + b.size, sp["stream"].u64(), true, {b}};
}

// The blocks of items that fall in [seg.address, seg.address + seg.size),
// gaps filled with free blocks, parts outside the range cut off.
void fill_segment(LayoutSegment &seg, const std::vector<const Item *> &items) {
  uintptr_t at = seg.address, end = seg.address + seg.size;
  bool owned = false;
  for (const Item *it : items) {
    for (const LayoutBlock &b : it->blocks) {
      uintptr_t lo = std::max<uintptr_t>(b.address, at), hi = std::min(b.address + b.size, end);
      if (hi <= lo) continue;
      if (lo > at) seg.blocks.push_back({at, lo - at, BlockState::kFree, 0});
      LayoutBlock part = b;
      part.address = lo;
      part.size = hi - lo;
      seg.blocks.push_back(part);
      at = hi;
    }
    if (it->large) seg.large = true;
    if (!owned && it->stream != 0) {
      seg.stream = it->stream;
      owned = true;
    }
  }
  if (at < end) seg.blocks.push_back({at, end - at, BlockState::kFree, 0});
}

}  // namespace

ArenaLayout parse_layout(std::string_view text) {
  Json doc = Json::parse(text);
  ArenaLayout out;
  out.granularity = doc["granularity"].u64();
  out.superblock_size = doc["superblock_size"].u64();
  out.large_threshold = doc["large_threshold"].u64();
  out.reserved = doc["stats"]["reserved_bytes"].u64();
  out.largest_request = doc["summary"]["largest_free_span"].u64();

  // Mapped ranges: chunks by address, merged where contiguous.
  std::vector<std::pair<uintptr_t, size_t>> mapped;
  for (const Json &c : doc["chunks"].items()) {
    uintptr_t at = c["mapped_at"].u64();
    if (c["mapped_at"].is_null() || at == 0)
      out.unmapped_cached += c["size"].u64();
    else
      mapped.emplace_back(at, c["size"].u64());
  }
  std::sort(mapped.begin(), mapped.end());
  for (const auto &m : mapped) {
    if (!out.segments.empty() &&
        out.segments.back().address + out.segments.back().size == m.first) {
      out.segments.back().size += m.second;
      continue;
    }
    LayoutSegment seg;
    seg.address = m.first;
    seg.size = m.second;
    out.segments.push_back(seg);
  }

  std::vector<Item> items;
  for (const Json &sb : doc["superblocks"].items()) items.push_back(superblock_item(sb));
  for (const Json &sp : doc["spans"].items()) {
    items.push_back(span_item(sp));
    // Waiting for its event or not: the stream that freed it reuses it at once.
    if (items.back().blocks[0].state != BlockState::kLive)
      out.largest_free_span = std::max(out.largest_free_span, items.back().blocks[0].size);
  }
  std::sort(items.begin(), items.end(),
            [](const Item &a, const Item &b) { return a.address < b.address; });

  // Items in each segment: both lists are sorted, so one pass.
  size_t next = 0;
  for (LayoutSegment &seg : out.segments) {
    uintptr_t end = seg.address + seg.size;
    while (next < items.size() && items[next].end <= seg.address) next++;
    std::vector<const Item *> in;
    for (size_t i = next; i < items.size() && items[i].address < end; i++) in.push_back(&items[i]);
    fill_segment(seg, in);
  }
  return out;
}

ArenaLayout read_layout(sa_arena *arena) {
  char *buf = nullptr;
  size_t len = 0;
  FILE *mem = open_memstream(&buf, &len);
  if (mem == nullptr) throw Failure(Failure::Kind::kLibrary, "streamarena: open_memstream failed");
  sa_status st = sa_snapshot_write(arena, mem);
  fclose(mem);
  std::unique_ptr<char, void (*)(void *)> owned(buf, std::free);
  if (st != SA_OK)
    throw Failure(Failure::Kind::kLibrary,
                  std::string("streamarena: sa_snapshot_write: ") + sa_status_string(st));
  try {
    return parse_layout(std::string_view(buf, len));
  } catch (const std::runtime_error &e) {
    throw Failure(Failure::Kind::kLibrary,
                  std::string("streamarena: the arena's snapshot did not parse: ") + e.what());
  }
}

}  // namespace sa_native
