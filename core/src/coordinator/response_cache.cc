#include "coordinator/response_cache.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <unordered_set>

#include "planner/fusion.h"

namespace hvd {

bool SameRequest(const Request& a, const Request& b) {
  return a.type == b.type && a.name == b.name && a.dtype == b.dtype && a.op == b.op &&
         a.root == b.root && (a.device == kCpuDevice) == (b.device == kCpuDevice) &&
         a.prescale == b.prescale &&
         a.postscale == b.postscale && a.shape == b.shape && a.splits == b.splits &&
         a.group == b.group && a.group_size == b.group_size;
}

// Every cache's contents() are numbered from one count, so that no number means two contents,
// of one cache or of two.
uint64_t ResponseCache::NewContents() {
  static std::atomic<uint64_t> count{0};
  return count.fetch_add(1, std::memory_order_relaxed) + 1;
}

ResponseCache::ResponseCache(int capacity, bool keep_history)
    : capacity_(capacity > 0 ? static_cast<uint32_t>(capacity) : 0),
      contents_(NewContents()),
      keep_history_(keep_history) {}

int ResponseCache::Lookup(const Request& r, uint32_t* hint) const {
  if (!r.error.empty()) return -1;  // a refusal goes to the coordinator, whatever is cached
  if (hint != nullptr) {
    // A name holds one bit at a time: a bit that holds exactly r is r's.
    const uint32_t b = *hint - 1;
    if (*hint != 0 && b < slots_.size() && slots_[b].live && SameRequest(slots_[b].request, r)) {
      return static_cast<int>(b);
    }
    const int found = Lookup(r);
    *hint = found >= 0 ? static_cast<uint32_t>(found) + 1 : 0;
    return found;
  }
  auto it = by_name_.find(r.name);
  if (it == by_name_.end()) return -1;
  return SameRequest(slots_[it->second].request, r) ? static_cast<int>(it->second) : -1;
}

int ResponseCache::SlotOf(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : static_cast<int>(it->second);
}

void ResponseCache::SetBitsOf(const std::vector<std::string>& names,
                              std::vector<uint64_t>* bits) const {
  for (const std::string& name : names) {
    const int bit = SlotOf(name);
    if (bit >= 0 && static_cast<size_t>(bit) / 64 < bits->size()) {
      (*bits)[bit / 64] |= uint64_t{1} << (bit % 64);
    }
  }
}

bool ResponseCache::RebuildAll(const std::vector<uint64_t>& bits, size_t fusion_threshold,
                               std::vector<Response>* out, std::vector<Response>* spare) {
  size_t n = 0;
  for (size_t w = 0; w < bits.size(); ++w) {
    for (uint64_t word = bits[w]; word; word &= word - 1, ++n) {
      const uint32_t bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(word));
      if (bit >= slots_.size() || !slots_[bit].live) return false;
    }
  }
  // Fused as they are built: no response per tensor. Each tensor is marked used here, in bit
  // order (Apply leaves these responses alone).
  ResponseFuser fuser(fusion_threshold);
  Response like;  // the fields fusion compares
  for (size_t w = 0; w < bits.size(); ++w) {
    for (uint64_t word = bits[w]; word; word &= word - 1) {
      const uint32_t bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(word));
      Slot& slot = slots_[bit];
      last_used_[bit] = ++clock_;
      const Request& q = slot.request;
      FillFields(q, &like);
      const size_t bytes = q.type == OpType::kAllreduce ? RequestBytes(q) : 0;
      Response* into = fuser.Join(like, bytes);
      if (into == nullptr) {
        Response r;
        r.names.reserve(n);  // usually one response takes them all
        r.shapes.reserve(n);
        r.bits.reserve(n);
        FillFields(q, &r);
        r.from_cache = true;
        into = &fuser.Start(std::move(r), bytes);
      }
      // Written over a spare name and shape (their storage kept), or new.
      while (spare != nullptr && !spare->empty() && spare->back().names.empty() &&
             spare->back().shapes.empty()) {
        spare->pop_back();
      }
      Response* stock = spare != nullptr && !spare->empty() ? &spare->back() : nullptr;
      if (stock != nullptr && !stock->names.empty()) {
        into->names.push_back(std::move(stock->names.back()));
        stock->names.pop_back();
        into->names.back().assign(q.name);
      } else {
        into->names.push_back(q.name);
      }
      if (stock != nullptr && !stock->shapes.empty()) {
        into->shapes.push_back(std::move(stock->shapes.back()));
        stock->shapes.pop_back();
        into->shapes.back().assign(q.shape.begin(), q.shape.end());
      } else {
        into->shapes.push_back(q.shape);
      }
      into->bits.push_back(bit);
      --n;
    }
  }
  *out = fuser.Take();
  return true;
}

int64_t ResponseCache::FirstEmpty(const std::vector<uint64_t>& bits) const {
  for (size_t w = 0; w < bits.size(); ++w) {
    const size_t first = w * 64, live = slots_.size();
    const uint64_t held = first >= live       ? 0
                          : live - first >= 64 ? ~uint64_t{0}
                                               : (uint64_t{1} << (live - first)) - 1;
    if (const uint64_t empty = bits[w] & ~held) {
      return static_cast<int64_t>(first + __builtin_ctzll(empty));
    }
  }
  return -1;
}

bool ResponseCache::MarkUsed(const std::vector<uint64_t>& bits) {
  if (FirstEmpty(bits) >= 0) return false;
  for (size_t w = 0; w < bits.size(); ++w) {
    for (uint64_t word = bits[w]; word; word &= word - 1) {
      last_used_[w * 64 + __builtin_ctzll(word)] = ++clock_;
    }
  }
  return true;
}

bool ResponseCache::Decode(uint32_t bit, uint64_t epoch, Request* out) const {
  if (bit >= slots_.size() || epoch < history_floor_) return false;
  for (const auto& ev : history_) {
    if (ev.bit == bit && ev.epoch > epoch) {
      *out = ev.request;
      return true;
    }
  }
  if (!slots_[bit].live) return false;
  *out = slots_[bit].request;
  return true;
}

Request ResponseCache::FromResponse(const Response& r, size_t i) {
  Request q;
  q.type = r.type;
  q.name = r.names[i];
  q.dtype = r.dtype;
  q.op = r.op;
  q.root = r.root;
  q.prescale = r.prescale;
  q.postscale = r.postscale;
  q.device = r.device;
  q.shape = r.shapes[i];
  if (!r.groups.empty() && r.group_sizes[i] > 1) {
    q.group = r.groups[i];
    q.group_size = r.group_sizes[i];
  }
  return q;
}

bool ResponseCache::Cacheable(const Response& r) {
  return (r.type == OpType::kAllreduce || r.type == OpType::kBroadcast ||
          r.type == OpType::kReducescatter) &&
         r.joined.empty() && r.error.empty();
}

bool ResponseCache::Encodable(const Response& r, std::vector<uint32_t>* bits) const {
  if (!enabled() || !Cacheable(r)) return false;
  bits->clear();
  for (size_t i = 0; i < r.names.size(); ++i) {
    int b = Lookup(FromResponse(r, i));
    if (b < 0) return false;
    bits->push_back(static_cast<uint32_t>(b));
  }
  return true;
}

void ResponseCache::FillFields(const Request& q, Response* out) {
  out->type = q.type;
  out->dtype = q.dtype;
  out->op = q.op;
  out->root = q.root;
  out->prescale = q.prescale;
  out->postscale = q.postscale;
  out->device = q.device;
}

void ResponseCache::Fill(const Request& q, Response* out) {
  FillFields(q, out);
  out->names.push_back(q.name);
  out->shapes.push_back(q.shape);
}

bool ResponseCache::Rebuild(const std::vector<uint32_t>& bits, Response* out) const {
  for (size_t i = 0; i < bits.size(); ++i) {
    if (bits[i] >= slots_.size() || !slots_[bits[i]].live) return false;
    const Request& q = slots_[bits[i]].request;
    if (i == 0) {
      *out = Response();
      Fill(q, out);
    } else {
      out->names.push_back(q.name);
      out->shapes.push_back(q.shape);
    }
    if (q.group_size > 1 || !out->groups.empty()) {  // parallel to the names (messages.h)
      out->groups.resize(i);
      out->group_sizes.resize(i, 0);
      out->groups.push_back(q.group);
      out->group_sizes.push_back(q.group_size);
    }
  }
  return !bits.empty();
}

void ResponseCache::MarkGrouped(uint32_t bit, bool grouped) {
  if (grouped_mask_.size() <= bit / 64) {
    if (!grouped) return;  // (a job without groups keeps no mask)
    grouped_mask_.resize(bit / 64 + 1, 0);
  }
  const uint64_t mask = uint64_t{1} << (bit % 64);
  grouped_mask_[bit / 64] = grouped ? grouped_mask_[bit / 64] | mask : grouped_mask_[bit / 64] & ~mask;
}

bool ResponseCache::AnyGrouped(const std::vector<uint64_t>& bits) const {
  for (size_t w = 0; w < bits.size() && w < grouped_mask_.size(); ++w) {
    if (bits[w] & grouped_mask_[w]) return true;
  }
  return false;
}

void ResponseCache::WidenToGroups(std::vector<uint64_t>* bits,
                                  const std::vector<std::string>& groups) const {
  if (groups.empty() && !AnyGrouped(*bits)) return;
  const size_t words = std::min(bits->size(), grouped_mask_.size());
  std::unordered_set<std::string_view> keys(groups.begin(), groups.end());
  for (size_t w = 0; w < words; ++w) {
    for (uint64_t word = (*bits)[w] & grouped_mask_[w]; word; word &= word - 1) {
      keys.insert(slots_[w * 64 + __builtin_ctzll(word)].request.group);
    }
  }
  if (keys.empty()) return;
  for (size_t w = 0; w < words; ++w) {
    for (uint64_t word = grouped_mask_[w]; word; word &= word - 1) {
      const int b = __builtin_ctzll(word);
      if (keys.count(slots_[w * 64 + b].request.group) > 0) (*bits)[w] |= uint64_t{1} << b;
    }
  }
}

void ResponseCache::CloseGroups(std::vector<uint64_t>* bits) const {
  if (!AnyGrouped(*bits)) return;
  std::unordered_map<std::string_view, int32_t> members;  // of each group, set in `bits`
  auto each = [this, bits](auto f) {
    for (size_t w = 0; w < bits->size() && w < grouped_mask_.size(); ++w) {
      for (uint64_t word = (*bits)[w] & grouped_mask_[w]; word; word &= word - 1) {
        const uint32_t bit = static_cast<uint32_t>(w * 64 + __builtin_ctzll(word));
        f(bit, slots_[bit].request);
      }
    }
  };
  // A group's members mostly hold bits one after another: a run of one group is one lookup.
  std::string_view last;
  int32_t* count = nullptr;
  auto of = [&](const Request& q) -> int32_t& {
    if (count == nullptr || q.group != last) {
      count = &members[q.group];
      last = q.group;
    }
    return *count;
  };
  each([&of](uint32_t, const Request& q) { ++of(q); });
  if (members.empty()) return;
  count = nullptr;
  each([&of, bits](uint32_t bit, const Request& q) {
    if (of(q) != q.group_size) (*bits)[bit / 64] &= ~(uint64_t{1} << (bit % 64));
  });
}

// Whether the cached request q is what FromResponse(r, i) would give, without building it.
bool ResponseCache::SameAsResponse(const Request& q, const Response& r, size_t i) {
  const bool grouped = !r.groups.empty() && r.group_sizes[i] > 1;
  return q.type == r.type && q.name == r.names[i] && q.dtype == r.dtype && q.op == r.op &&
         q.root == r.root && (q.device == kCpuDevice) == (r.device == kCpuDevice) &&
         q.prescale == r.prescale && q.postscale == r.postscale && q.shape == r.shapes[i] &&
         q.splits.empty() && q.group_size == (grouped ? r.group_sizes[i] : 0) &&
         (grouped ? q.group == r.groups[i] : q.group.empty());
}

void ResponseCache::Touch(const Request& req,
                          std::vector<std::pair<uint32_t, Request>>* changed) {
  ++clock_;
  auto it = by_name_.find(req.name);
  if (it != by_name_.end()) {
    Slot& s = slots_[it->second];
    if (!SameRequest(s.request, req)) {
      // The tensor changed: the bit takes the new request; older epochs keep the old meaning.
      if (keep_history_) history_.push_back(Eviction{epoch_ + 1, it->second, s.request});
      if (changed) changed->emplace_back(it->second, s.request);
      MarkGrouped(it->second, req.group_size > 1);
      s.request = req;
      s.since = epoch_ + 1;
      contents_ = NewContents();
    }
    last_used_[it->second] = clock_;
    return;
  }
  // Insert at the lowest free bit, else evict the least recently used entry. Slots fill in
  // order and are never freed (only replaced), so the lowest free bit is the count in use.
  uint32_t bit = 0;
  const bool found_free = slots_.size() < capacity_;
  if (found_free) {
    bit = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
    last_used_.push_back(0);
  } else {
    bit = LeastRecentlyUsed();
  }
  Slot& s = slots_[bit];
  if (!found_free) {
    if (keep_history_) history_.push_back(Eviction{epoch_ + 1, bit, s.request});
    if (changed) changed->emplace_back(bit, s.request);
    by_name_.erase(s.request.name);
  }
  MarkGrouped(bit, req.group_size > 1);
  s.live = true;
  s.request = req;
  s.since = epoch_ + 1;
  contents_ = NewContents();
  last_used_[bit] = clock_;
  lru_.emplace_back(clock_, bit);
  std::push_heap(lru_.begin(), lru_.end(), std::greater<>());
  by_name_[req.name] = bit;
}

// Pops the heap's top; the slot it names is the least recently used once its time is current
// (uses are unique ticks of clock_, so there are no ties).
uint32_t ResponseCache::LeastRecentlyUsed() {
  for (;;) {
    std::pop_heap(lru_.begin(), lru_.end(), std::greater<>());
    const uint32_t bit = lru_.back().second;
    if (lru_.back().first == last_used_[bit]) {
      lru_.pop_back();
      return bit;
    }
    lru_.back().first = last_used_[bit];
    std::push_heap(lru_.begin(), lru_.end(), std::greater<>());
  }
}

void ResponseCache::Apply(const std::vector<Response>& list,
                          std::vector<std::pair<uint32_t, Request>>* changed) {
  if (enabled()) {
    for (const auto& r : list) {
      if (!Cacheable(r) || r.from_cache) continue;
      for (size_t i = 0; i < r.names.size(); ++i) {
        // The steady state (a tensor seen before, unchanged) only marks its use.
        auto it = by_name_.find(r.names[i]);
        if (it != by_name_.end() && SameAsResponse(slots_[it->second].request, r, i)) {
          last_used_[it->second] = ++clock_;
          continue;
        }
        Touch(FromResponse(r, i), changed);
      }
    }
    BoundHistory();
  }
  ++epoch_;
}

void ResponseCache::BoundHistory() {
  const size_t limit = 1024 + 4 * static_cast<size_t>(capacity_);
  while (history_.size() > limit) {
    history_floor_ = std::max(history_floor_, history_.front().epoch);
    history_.pop_front();
  }
}

void ResponseCache::PruneHistory(uint64_t oldest_epoch_in_use) {
  while (!history_.empty() && history_.front().epoch <= oldest_epoch_in_use) history_.pop_front();
}

}  // namespace hvd
