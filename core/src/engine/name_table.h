// A table of values by name for names that recur (a training loop submits the same tensors
// every step): a value that ends keeps its node, marked free, so that the steady state
// allocates no node and no key. Free nodes are swept once the table holds more than twice the
// most nodes live at once since the last sweep, plus kKeepFree: a step of 10,000 tensors that
// all end before the next step starts keeps its nodes, while names that never recur cost
// amortised O(1) each and memory stays bounded.
// Lookups take a string_view: no key is built to look one up (the map's keys are views of the
// names its entries hold).
//
// Thread-safety: not thread-safe; each table is guarded by its owner.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace hvd {

template <typename V>
class NameTable {
 public:
  struct Node {
    bool live = false;
    V value{};
    // The owner's note about the name, kept while the node lives and while it is free (not
    // reset with the value): e.g. where the name was found in another table last time.
    uint32_t hint = 0;
  };

  // The live node of `key`, or null.
  Node* Find(std::string_view key) const {
    auto it = map_.find(key);
    return it != map_.end() && it->second->node.live ? &it->second->node : nullptr;
  }
  // Makes `key` live with `value` and returns its node; null (value untouched) if it is live
  // already.
  Node* Insert(std::string_view key, V&& value) {
    auto it = map_.find(key);
    if (it == map_.end()) {
      // The map's key is a view of the name its entry holds, which never moves.
      auto entry = std::make_unique<Entry>();
      entry->name.assign(key.data(), key.size());
      const std::string_view own(entry->name);
      it = map_.emplace(own, std::move(entry)).first;
    } else if (it->second->node.live) {
      return nullptr;
    }
    Node& n = it->second->node;
    n.value = std::move(value);
    n.live = true;
    peak_ = std::max(peak_, ++live_);
    return &n;
  }
  // Ends a live node's value (reset to V()). Other nodes stay where they are.
  void Release(Node* n) {
    Free(n);
    MaybeSweep();
  }
  void Release(std::string_view key) { Release(Find(key)); }
  // f(value) for every live value; where it returns true the value is released.
  template <typename F>
  void ReleaseIf(F f) {
    for (auto& kv : map_) {
      Node& n = kv.second->node;
      if (n.live && f(n.value)) Free(&n);
    }
    MaybeSweep();
  }
  void Clear() {
    map_.clear();
    live_ = 0;
    peak_ = 0;
    ++erasures_;
  }
  size_t live() const { return live_; }
  // Counts the times nodes were erased (swept or cleared): a pointer to a node kept across a
  // change of this count may dangle. Live nodes are never erased.
  uint64_t erasures() const { return erasures_; }

 private:
  static constexpr size_t kKeepFree = 4096;
  struct Entry {
    std::string name;
    Node node;
  };
  void Free(Node* n) {
    if (n == nullptr || !n->live) return;
    n->live = false;
    n->value = V{};
    --live_;
  }
  void MaybeSweep() {
    if (map_.size() <= 2 * peak_ + kKeepFree) return;
    ++erasures_;
    peak_ = live_;
    for (auto it = map_.begin(); it != map_.end();) {
      it = it->second->node.live ? std::next(it) : map_.erase(it);
    }
  }

  std::unordered_map<std::string_view, std::unique_ptr<Entry>> map_;
  size_t live_ = 0;
  size_t peak_ = 0;  // the most live nodes since the last sweep
  uint64_t erasures_ = 0;
};

}  // namespace hvd
