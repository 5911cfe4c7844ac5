// Constants and small helpers shared by the algorithm files (not part of the collectives API).
//
// Thread-safety: constants and pure functions.
#pragma once

#include <cstddef>
#include <vector>

namespace hvd {

// Pipelining unit of the ring and chain algorithms: every ring step (and every hop of the
// broadcast chain) moves its chunk in segments of this many bytes, so that one segment is
// reduced or forwarded while the next is still on the wire. Large enough to amortise the
// per-message cost of TCP, small enough to keep several segments in flight and the receive
// scratch in L2. A multiple of every element size.
constexpr size_t kSegmentBytes = 256 * 1024;

// How many receives are posted ahead of the segment being reduced, and the receive slots (one
// segment each) of the ring allreduce, which frees a slot as soon as it is reduced, so it needs
// kLookahead + 1 of them. (ReduceScatter sends from its slots and sizes them itself.)
constexpr size_t kLookahead = 2;
constexpr size_t kRecvSlots = kLookahead + 1;

// Broadcasts up to this size use a binomial tree (log2(p) hops of the whole buffer); larger
// ones a pipelined chain (bandwidth-optimal: every link carries the buffer once).
constexpr size_t kSmallBroadcastBytes = 64 * 1024;

inline int PositiveMod(int a, int p) { return ((a % p) + p) % p; }

// `count` elements split into `parts` contiguous chunks; the first count % parts chunks hold
// one element more. Some chunks are empty when count < parts.
class EvenChunks {
 public:
  EvenChunks(size_t count, int parts)
      : base_(count / parts), extra_(count % parts) {}
  size_t Count(int c) const { return base_ + (static_cast<size_t>(c) < extra_ ? 1 : 0); }
  size_t Offset(int c) const {
    const size_t uc = static_cast<size_t>(c);
    return uc * base_ + (uc < extra_ ? uc : extra_);
  }

 private:
  size_t base_;
  size_t extra_;
};

// Exclusive prefix sums: offsets[i] = sum(v[0..i)).
inline std::vector<size_t> PrefixOffsets(const std::vector<size_t>& v) {
  std::vector<size_t> out(v.size(), 0);
  for (size_t i = 1; i < v.size(); ++i) out[i] = out[i - 1] + v[i - 1];
  return out;
}

// One pipelined piece of work: a segment of a chunk handled during ring step `step`.
// `offset` and `count` are in elements of the buffer being reduced (or bytes for byte
// algorithms).
struct Segment {
  int step;
  size_t offset;
  size_t count;
};

// Appends the segments of [offset, offset + count) for `step`, each at most seg_units long.
inline void AppendSegments(std::vector<Segment>* out, int step, size_t offset, size_t count,
                           size_t seg_units) {
  for (size_t done = 0; done < count; done += seg_units) {
    const size_t n = count - done < seg_units ? count - done : seg_units;
    out->push_back(Segment{step, offset + done, n});
  }
}

}  // namespace hvd
