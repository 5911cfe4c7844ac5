// Adasum, the adaptive summation of Maleki et al. ("Scaling Distributed Training with Adaptive
// Summation"), as Horovod runs it on CPUs: recursive vector halving with distance doubling.
//
// Two vectors combine as
//   adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
// (a coefficient is 1 where the squared norm is below sqrt(DBL_MIN), ~1.5e-154, as in Horovod:
// a vector of zeros, as a joined rank gives), tensor by tensor for a fused buffer, and
// the ranks combine as a binary tree: ranks r and r ^ 1 first, then those pairs' results at
// distance 2, and so on. The world size must be a power of two.
//
// Level d (1, 2, 4, ...): partners r and r ^ d hold the same segment of their subtrees'
// combined vectors. Each keeps half of it (the lower rank the first half), sending the other
// half to its partner and receiving the partner's copy of its own half. The dot product and
// the two squared norms of every tensor are then sums over the 2d ranks of the block r / 2d,
// whose halves cover the whole vectors: each rank computes its partial sums and the block adds
// them up by recursive doubling (every rank adds the same pairs, so all agree bitwise), and
// both partners scale their half with the same coefficients. After the last level each rank
// holds a 1/size segment of the result; the levels are then undone in reverse, each rank
// swapping its segment for its partner's, until every rank has all of it.
//
// Arithmetic: products and sums in float64, the result rounded once to the dtype (float32 or
// float64); float16 elements are read exactly and each result rounded to float32, then to
// float16, so every level of the tree holds its vectors in float16.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "collectives/collectives.h"
#include "reduce/half_convert.h"

namespace hvd {
namespace {

struct Segment {
  size_t begin = 0, end = 0;  // elements
  size_t size() const { return end - begin; }
};

// A float16 element, stored as its bits.
struct Half {
  uint16_t bits;
};

template <typename T>
double Get(const void* p, size_t i) {
  return static_cast<double>(static_cast<const T*>(p)[i]);
}

template <>
double Get<Half>(const void* p, size_t i) {
  return static_cast<double>(detail::DecodeHalf(static_cast<const Half*>(p)[i].bits));
}

template <typename T>
T FromDouble(double v) {
  return static_cast<T>(v);
}

template <>
Half FromDouble<Half>(double v) {
  return Half{detail::EncodeHalf(static_cast<float>(v))};
}

// Per tensor k: [3k] dot(A, B), [3k+1] |A|^2, [3k+2] |B|^2 over the elements of `seg`, where
// A is the lower subtree's vector (at a[]) and B the upper's (at b[]); both cover `seg`.
template <typename T>
void PartialSums(const void* a, const void* b, Segment seg, const std::vector<size_t>& starts,
                 std::vector<double>* sums) {
  std::fill(sums->begin(), sums->end(), 0.0);
  const size_t tensors = starts.size() - 1;
  for (size_t k = 0; k < tensors; ++k) {
    const size_t lo = std::max(starts[k], seg.begin), hi = std::min(starts[k + 1], seg.end);
    double dot = 0, aa = 0, bb = 0;
    for (size_t i = lo; i < hi; ++i) {
      const double x = Get<T>(a, i - seg.begin), y = Get<T>(b, i - seg.begin);
      dot += x * y;
      aa += x * x;
      bb += y * y;
    }
    (*sums)[3 * k] = dot;
    (*sums)[3 * k + 1] = aa;
    (*sums)[3 * k + 2] = bb;
  }
}

// Below this squared norm a vector keeps coefficient 1 (Horovod's threshold).
const double kSqrtDoubleMin = std::sqrt(std::numeric_limits<double>::min());

// out[i] = ca * A[i] + cb * B[i] over `seg`, with each tensor's coefficients from `sums`.
template <typename T>
void Combine(const void* a, const void* b, void* out, Segment seg,
             const std::vector<size_t>& starts, const std::vector<double>& sums) {
  const size_t tensors = starts.size() - 1;
  for (size_t k = 0; k < tensors; ++k) {
    const double dot = sums[3 * k], aa = sums[3 * k + 1], bb = sums[3 * k + 2];
    const double ca = aa >= kSqrtDoubleMin ? 1.0 - dot / aa * 0.5 : 1.0;
    const double cb = bb >= kSqrtDoubleMin ? 1.0 - dot / bb * 0.5 : 1.0;
    const size_t lo = std::max(starts[k], seg.begin), hi = std::min(starts[k + 1], seg.end);
    for (size_t i = lo; i < hi; ++i) {
      const size_t j = i - seg.begin;
      static_cast<T*>(out)[j] = FromDouble<T>(ca * Get<T>(a, j) + cb * Get<T>(b, j));
    }
  }
}

template <typename T>
Status Run(Transport& t, void* buf, const std::vector<size_t>& counts, ScratchBuffer& scratch,
           Deadline deadline) {
  const int n = t.size(), r = t.rank();
  std::vector<size_t> starts = {0};
  for (size_t c : counts) starts.push_back(starts.back() + c);
  const size_t total = starts.back();
  if (total == 0 || n == 1) return Status::OK();
  T* data = static_cast<T*>(buf);
  void* tmp = scratch.Get((total / 2 + 1) * sizeof(T));
  if (tmp == nullptr) {
    return Status::ResourceExhausted("adasum: no memory for " +
                                     std::to_string((total / 2 + 1) * sizeof(T)) +
                                     " bytes of scratch");
  }
  std::vector<double> sums(3 * counts.size()), other(sums.size());
  std::vector<Segment> parents;  // the segment each level halved, to undo the levels
  Segment seg{0, total};
  for (int d = 1; d < n; d <<= 1) {
    const int partner = r ^ d;
    const bool lower = (r & d) == 0;
    const size_t mid = seg.begin + seg.size() / 2;
    const Segment keep = lower ? Segment{seg.begin, mid} : Segment{mid, seg.end};
    const Segment give = lower ? Segment{mid, seg.end} : Segment{seg.begin, mid};
    HVD_RETURN_IF_ERROR(t.SendRecv(partner, data + give.begin, give.size() * sizeof(T), partner,
                                   tmp, keep.size() * sizeof(T), deadline));
    const void* mine = data + keep.begin;
    const void* a = lower ? mine : tmp;  // the lower subtree's vector
    const void* b = lower ? tmp : mine;
    PartialSums<T>(a, b, keep, starts, &sums);
    for (int m = 1; m <= d; m <<= 1) {
      HVD_RETURN_IF_ERROR(t.SendRecv(r ^ m, sums.data(), sums.size() * sizeof(double), r ^ m,
                                     other.data(), other.size() * sizeof(double), deadline));
      for (size_t i = 0; i < sums.size(); ++i) sums[i] += other[i];
    }
    Combine<T>(a, b, data + keep.begin, keep, starts, sums);
    parents.push_back(seg);
    seg = keep;
  }
  // Undo the levels: swap halves with the same partners, last level first.
  for (int level = static_cast<int>(parents.size()) - 1; level >= 0; --level) {
    const int partner = r ^ (1 << level);
    const Segment parent = parents[level];
    const Segment other_half = seg.begin == parent.begin ? Segment{seg.end, parent.end}
                                                         : Segment{parent.begin, seg.begin};
    HVD_RETURN_IF_ERROR(t.SendRecv(partner, data + seg.begin, seg.size() * sizeof(T), partner,
                                   data + other_half.begin, other_half.size() * sizeof(T),
                                   deadline));
    seg = parent;
  }
  return Status::OK();
}

}  // namespace

Status AdasumAllreduce(Transport& t, void* buf, const std::vector<size_t>& counts, DataType dtype,
                       ScratchBuffer& scratch, Deadline deadline) {
  const int n = t.size();
  if (n & (n - 1)) {
    return Status::InvalidArgument("adasum needs a number of ranks that is a power of two, got " +
                                   std::to_string(n));
  }
  switch (dtype) {
    case DataType::kFloat16: return Run<Half>(t, buf, counts, scratch, deadline);
    case DataType::kFloat32: return Run<float>(t, buf, counts, scratch, deadline);
    case DataType::kFloat64: return Run<double>(t, buf, counts, scratch, deadline);
    default:
      return Status::InvalidArgument(
          std::string("adasum reduces float16, float32 and float64, not ") + DataTypeName(dtype));
  }
}

size_t AdasumScratchBytes(size_t count, DataType dtype) {
  return (count / 2 + 1) * DataTypeSize(dtype);
}

}  // namespace hvd
