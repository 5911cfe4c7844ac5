// A table of values by name for names that recur (a training loop submits the same tensors
// every step): a value that ends keeps its node, marked free, so that the steady state
// allocates no node and no key. Free nodes are swept once the table holds more than twice the
// most nodes live at once since the last sweep, plus kKeepFree: a step of 10,000 tensors that
// all end before the next step starts keeps its nodes, while names that never recur cost
// amortised O(1) each and memory stays bounded.
// Lookups take a string_view: no key is built to look one up.
// The index is open addressing with linear probing over (hash, entry) slots, at most half full:
// a lookup reads one slot and, on a matching 64-bit hash, the entry's name. Entries are never
// erased one by one (a value that ends only frees its node), so the index has no tombstones: a
// sweep or a growth rebuilds it.
// Insert first tries the entry that followed the previous Insert's the last time: a step's
// tensors come in the same order every step, so in the steady state an Insert compares one
// name and neither hashes the key nor reads the index, whose slots lie at random (a cache miss
// each, with a step's tensors and data between two visits).
//
// Thread-safety: not thread-safe; each table is guarded by its owner.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hvd {

// What NameTable::Free does to a value that ends: by default it is reset to V(); a type whose
// reset can be cheaper overloads this (found by argument-dependent lookup).
template <typename V>
void NameTableReset(V& v) {
  v = V{};
}

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

  static uint64_t Hash(std::string_view key) { return std::hash<std::string_view>()(key); }

  // The live node of `key`, or null.
  Node* Find(std::string_view key) const {
    Entry* e = slots_.empty() ? nullptr : slots_[Probe(key, Hash(key))].entry;
    return e != nullptr && e->node.live ? &e->node : nullptr;
  }
  // Makes `key` live with `value` and returns its node; null (value untouched) if it is live
  // already.
  Node* Insert(std::string_view key, V&& value) {
    Node* n = Acquire(key);
    if (n != nullptr) n->value = std::move(value);
    return n;
  }
  // Makes `key` live with its node's value as the last release left it (NameTableReset), for
  // the caller to fill in; null if it is live already.
  Node* Acquire(std::string_view key) {
    Entry* e = last_ != nullptr ? last_->next : nullptr;
    if (e == nullptr || std::string_view(e->name) != key) {
      const uint64_t h = Hash(key);
      ++hashes_;
      if (2 * (entries_.size() + 1) > slots_.size()) Reindex(2 * (entries_.size() + 1));
      Slot& slot = slots_[Probe(key, h)];
      if (slot.entry == nullptr) {
        entries_.push_back(std::make_unique<Entry>());
        slot = Slot{h, entries_.back().get()};
        slot.entry->name.assign(key.data(), key.size());
      }
      e = slot.entry;
    }
    if (e->node.live) return nullptr;
    if (last_ != nullptr && last_ != e) last_->next = e;
    last_ = e;
    Node& n = e->node;
    n.live = true;
    peak_ = std::max(peak_, ++live_);
    return &n;
  }
  // Ends a live node's value (NameTableReset). Other nodes stay where they are; without
  // `sweep`, so do free ones (erasures() does not change).
  void Release(Node* n, bool sweep = true) {
    Free(n);
    if (sweep) MaybeSweep();
  }
  void Release(std::string_view key) { Release(Find(key)); }
  // As Release, for a node whose value its caller has reset already (NameTableReset), outside
  // the lock that guards this table.
  void ReleaseReset(Node* n) {
    Free(n, /*reset=*/false);
    MaybeSweep();
  }
  // f(value) for every live value; where it returns true the value is released.
  template <typename F>
  void ReleaseIf(F f) {
    for (auto& e : entries_) {
      Node& n = e->node;
      if (n.live && f(n.value)) Free(&n);
    }
    MaybeSweep();
  }
  // Sweeps free nodes if there are too many (what Release does after it frees).
  void Sweep() { MaybeSweep(); }
  // f(value) for every live value.
  template <typename F>
  void ForEachLive(F f) {
    for (auto& e : entries_) {
      if (e->node.live) f(e->node.value);
    }
  }
  void Clear() {
    entries_.clear();
    slots_.clear();
    last_ = nullptr;
    live_ = 0;
    peak_ = 0;
    ++erasures_;
  }
  size_t live() const { return live_; }
  // Counts the times nodes were erased (swept or cleared): a pointer to a node kept across a
  // change of this count may dangle. Live nodes are never erased.
  uint64_t erasures() const { return erasures_; }
  // Counts the Inserts and Acquires that hashed their key: one whose prediction held did not.
  uint64_t hashes() const { return hashes_; }

 private:
  static constexpr size_t kKeepFree = 4096;
  struct Entry {
    std::string name;
    Node node;
    Entry* next = nullptr;  // the entry inserted after this one the last time, a prediction
  };

  struct Slot {
    uint64_t hash = 0;
    Entry* entry = nullptr;  // null: empty
  };
  // The slot of `key`: its entry's, or the empty one where it would go.
  size_t Probe(std::string_view key, uint64_t h) const {
    const size_t mask = slots_.size() - 1;
    size_t i = static_cast<size_t>(h) & mask;
    while (slots_[i].entry != nullptr &&
           (slots_[i].hash != h || std::string_view(slots_[i].entry->name) != key)) {
      i = (i + 1) & mask;
    }
    return i;
  }
  // Rebuilds the index over entries_ with room for `want` entries at most half full.
  void Reindex(size_t want) {
    size_t cap = 16;
    while (cap < 2 * want) cap *= 2;
    slots_.assign(cap, Slot());
    for (auto& e : entries_) {
      const uint64_t h = Hash(e->name);
      slots_[Probe(e->name, h)] = Slot{h, e.get()};
    }
  }
  void Free(Node* n, bool reset = true) {
    if (n == nullptr || !n->live) return;
    n->live = false;
    if (reset) NameTableReset(n->value);
    --live_;
  }
  void MaybeSweep() {
    if (entries_.size() <= 2 * peak_ + kKeepFree) return;
    ++erasures_;
    peak_ = live_;
    entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                  [](const std::unique_ptr<Entry>& e) { return !e->node.live; }),
                   entries_.end());
    for (auto& e : entries_) e->next = nullptr;  // an erased entry may be one
    last_ = nullptr;
    Reindex(entries_.size());
  }

  std::vector<std::unique_ptr<Entry>> entries_;  // every node, live or free; never moved
  std::vector<Slot> slots_;                      // the index: a power of two, at most half full
  Entry* last_ = nullptr;                        // the last Insert's
  size_t live_ = 0;
  size_t peak_ = 0;  // the most live nodes since the last sweep
  uint64_t erasures_ = 0;
  uint64_t hashes_ = 0;
};

}  // namespace hvd
