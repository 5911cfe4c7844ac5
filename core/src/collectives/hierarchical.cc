// Hierarchical allreduce over two group views of one transport (transport/group_view.h):
//   1. Reduce-scatter over `local` (this host's ranks): local rank i ends with part i of the
//      host's sum, parts split as evenly as the count allows.
//   2. Allreduce of part i over `cross` (rank i of every host): each part crosses the network
//      once per host instead of the whole buffer crossing it 2(p-1)/p times on a flat ring.
//   3. Allgather over `local`: every rank gets every part.
// Every host must have local.size() ranks (the cross view of each part has one rank per host);
// the planner uses a flat algorithm otherwise.
//
// Hierarchical allgatherv, over the same views. A host's block is its ranks' parts in local
// order; piece i of a block is its i-th of local.size() near-equal byte ranges.
//   1. Alltoallv over `local`: local rank i receives piece i of its host's block, each rank
//      sending the slices of its part that fall in each piece.
//   2. Allgatherv of piece i over `cross`: local rank i now holds piece i of every block, so
//      each byte crosses the network once per host, the crossing split among local ranks.
//   3. Allgatherv over `local` of those collections: every rank holds every piece of every
//      block (in scratch, piece-major).
//   4. Each piece is copied to its parts' places in world-rank order.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "collectives/collectives.h"

namespace hvd {

namespace {

// Byte range [lo, hi) of piece i of a block of `total` bytes in n pieces.
void Piece(size_t total, int n, int i, size_t* lo, size_t* hi) {
  const size_t base = total / n, extra = total % n;
  *lo = i * base + std::min<size_t>(i, extra);
  *hi = *lo + base + (static_cast<size_t>(i) < extra ? 1 : 0);
}

size_t Overlap(size_t a_lo, size_t a_hi, size_t b_lo, size_t b_hi) {
  const size_t lo = std::max(a_lo, b_lo), hi = std::min(a_hi, b_hi);
  return hi > lo ? hi - lo : 0;
}

// The layout of one hierarchical allgather.
struct GatherLayout {
  std::vector<size_t> block;                 // [k] bytes of host k's block
  std::vector<std::vector<size_t>> starts;   // [k][j] where local rank j's part starts in it
  std::vector<size_t> collection;            // [i] bytes local rank i holds after step 2
  size_t total = 0;
};

GatherLayout Layout(const std::vector<std::vector<int>>& hosts, const std::vector<size_t>& bytes,
                    int n_local) {
  GatherLayout g;
  g.block.assign(hosts.size(), 0);
  g.starts.resize(hosts.size());
  g.collection.assign(n_local, 0);
  for (size_t k = 0; k < hosts.size(); ++k) {
    for (int r : hosts[k]) {
      g.starts[k].push_back(g.block[k]);
      g.block[k] += bytes[r];
    }
    g.total += g.block[k];
    for (int i = 0; i < n_local; ++i) {
      size_t lo, hi;
      Piece(g.block[k], n_local, i, &lo, &hi);
      g.collection[i] += hi - lo;
    }
  }
  return g;
}

// The largest collection (the same reservation on every rank) and the whole output.
size_t ScratchFor(const GatherLayout& g) {
  size_t collection = 0;
  for (size_t c : g.collection) collection = std::max(collection, c);
  return collection + g.total;
}

}  // namespace

std::vector<size_t> HierarchicalParts(size_t count, int n) {
  std::vector<size_t> parts(static_cast<size_t>(n), count / n);
  for (size_t i = 0; i < count % n; ++i) ++parts[i];
  return parts;
}

size_t HierarchicalAllgatherScratchBytes(const std::vector<std::vector<int>>& hosts,
                                         const std::vector<size_t>& bytes) {
  if (hosts.empty()) return 0;
  return ScratchFor(Layout(hosts, bytes, static_cast<int>(hosts[0].size())));
}

Status HierarchicalAllgatherv(Transport& local, Transport& cross,
                              const std::vector<std::vector<int>>& hosts, const void* in,
                              void* out, const std::vector<size_t>& bytes, ScratchBuffer& scratch,
                              Deadline deadline) {
  const int n_local = local.size(), n_hosts = cross.size();
  const int li = local.rank(), me_host = cross.rank();
  if (static_cast<int>(hosts.size()) != n_hosts) {
    return Status::InvalidArgument("hierarchical allgather: " + std::to_string(hosts.size()) +
                                   " hosts given for a cross view of " + std::to_string(n_hosts));
  }
  for (const auto& h : hosts) {
    if (static_cast<int>(h.size()) != n_local) {
      return Status::InvalidArgument("hierarchical allgather: every host needs " +
                                     std::to_string(n_local) + " ranks");
    }
  }
  const GatherLayout g = Layout(hosts, bytes, n_local);
  if (g.total == 0) return Status::OK();
  const size_t need = ScratchFor(g);
  auto* base = static_cast<uint8_t*>(scratch.Get(need));
  if (base == nullptr) {
    return Status::ResourceExhausted("hierarchical allgather: no memory for " +
                                     std::to_string(need) + " bytes of scratch");
  }
  // 1. Piece li of this host's block, from the slices of each local rank's part.
  const size_t my_start = g.starts[me_host][li];
  const size_t my_bytes = bytes[hosts[me_host][li]];
  std::vector<size_t> send(n_local), recv(n_local);
  size_t plo, phi;
  Piece(g.block[me_host], n_local, li, &plo, &phi);
  for (int j = 0; j < n_local; ++j) {
    size_t lo, hi;
    Piece(g.block[me_host], n_local, j, &lo, &hi);
    send[j] = Overlap(my_start, my_start + my_bytes, lo, hi);
    const size_t js = g.starts[me_host][j], je = js + bytes[hosts[me_host][j]];
    recv[j] = Overlap(js, je, plo, phi);
  }
  uint8_t* collection = base;
  // Piece li of host k sits at offset sum_{k' < k} |piece li of k'| of the collection.
  std::vector<size_t> cross_bytes(n_hosts);
  size_t at = 0;
  for (int k = 0; k < n_hosts; ++k) {
    size_t lo, hi;
    Piece(g.block[k], n_local, li, &lo, &hi);
    cross_bytes[k] = hi - lo;
    if (k < me_host) at += hi - lo;
  }
  uint8_t* my_piece = collection + at;
  HVD_RETURN_IF_ERROR(Alltoallv(local, in, send, my_piece, recv, deadline));
  // 2. Piece li of every host's block.
  HVD_RETURN_IF_ERROR(Allgatherv(cross, my_piece, collection, cross_bytes, deadline));
  // 3. Every local rank's collection, in local order.
  uint8_t* all = collection + g.collection[li];
  HVD_RETURN_IF_ERROR(Allgatherv(local, collection, all, g.collection, deadline));
  // 4. Piece i of host k covers bytes [lo, hi) of the block: copy each part's share of it.
  std::vector<size_t> world_at(bytes.size() + 1, 0);
  for (size_t r = 0; r < bytes.size(); ++r) world_at[r + 1] = world_at[r] + bytes[r];
  auto* dst = static_cast<uint8_t*>(out);
  const uint8_t* src = all;
  for (int i = 0; i < n_local; ++i) {
    for (int k = 0; k < n_hosts; ++k) {
      size_t lo, hi;
      Piece(g.block[k], n_local, i, &lo, &hi);
      for (int j = 0; j < n_local; ++j) {
        const size_t js = g.starts[k][j], je = js + bytes[hosts[k][j]];
        const size_t n = Overlap(js, je, lo, hi);
        if (n == 0) continue;
        const size_t from = std::max(js, lo);
        std::memcpy(dst + world_at[hosts[k][j]] + (from - js), src + (from - lo), n);
      }
      src += hi - lo;
    }
  }
  return Status::OK();
}

size_t HierarchicalAllreduceScratchBytes(size_t count, DataType dtype, int local_size,
                                         int cross_size) {
  if (count == 0 || local_size < 1) return 0;
  std::vector<size_t> parts = HierarchicalParts(count, local_size);
  size_t rs = local_size > 1 ? ReduceScatterScratchBytes(parts, dtype) : 0;
  // The largest part sets the most scratch either algorithm uses across hosts.
  size_t ar = 0;
  if (cross_size > 1) {
    ar = std::max(RingAllreduceScratchBytes(parts[0], dtype, cross_size),
                  parts[0] * DataTypeSize(dtype));
  }
  return rs > ar ? rs : ar;
}

Status HierarchicalAllreduce(Transport& local, Transport& cross, void* buf, size_t count,
                             DataType dtype, ReduceOp op, ScratchBuffer& scratch,
                             Deadline deadline, AllreduceAlgorithm cross_algo) {
  const size_t esize = DataTypeSize(dtype);
  if (esize == 0) return Status::InvalidArgument("hierarchical allreduce: unknown dtype");
  if (count == 0 || local.size() * cross.size() == 1) return Status::OK();
  if (buf == nullptr) return Status::InvalidArgument("hierarchical allreduce: null buffer");
  const int l = local.rank();
  const std::vector<size_t> parts = HierarchicalParts(count, local.size());
  size_t offset = 0;
  for (int i = 0; i < l; ++i) offset += parts[i];
  char* mine = static_cast<char*>(buf) + offset * esize;
  if (local.size() > 1) {
    HVD_RETURN_IF_ERROR(ReduceScatter(local, buf, mine, parts, dtype, op, scratch, deadline));
  }
  if (cross.size() > 1 && parts[l] > 0) {
    HVD_RETURN_IF_ERROR(Allreduce(cross, mine, parts[l], dtype, op, scratch, deadline, cross_algo));
  }
  if (local.size() > 1) {
    std::vector<size_t> bytes(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) bytes[i] = parts[i] * esize;
    HVD_RETURN_IF_ERROR(Allgatherv(local, mine, buf, bytes, deadline));
  }
  return Status::OK();
}

}  // namespace hvd
