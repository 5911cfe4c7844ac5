#include "transport/mpi/mpi_collectives.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "reduce/reduce.h"
#include "transport/transport.h"

namespace hvd {

namespace {

// The most bytes one MPI call moves (an allreduce's or broadcast's buffer; every rank's share
// of an allgatherv's, alltoallv's or reducescatter's round together). Open MPI's calls hold this
// thread while they run (a start call took seconds a GiB on a 2-core VM), and the control plane
// (heartbeats) is polled only between them: 64 MiB keeps each well under a second.
constexpr size_t kMaxChunkBytes = size_t{64} << 20;

// The deadline of one chunk of a chunked collective: the collective's, stretched to the same
// window after the chunk starts (Stretched), so that it bounds a stall (a chunk that does not
// finish), not how long a large collective may take.
Deadline ChunkDeadline(Deadline deadline, Clock::time_point started) {
  if (deadline == Deadline::max()) return deadline;  // (no window to add)
  return Stretched(deadline, Clock::now(), deadline - started);
}

template <DataType D, ReduceOp O>
void HalfReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceInto(inout, in, static_cast<size_t>(*len), D, O);
}

template <DataType D>
void CreateHalfOps(MPI_Op* ops) {
  MPI_Op_create(&HalfReduce<D, ReduceOp::kSum>, 1, &ops[static_cast<int>(ReduceOp::kSum)]);
  MPI_Op_create(&HalfReduce<D, ReduceOp::kSum>, 1, &ops[static_cast<int>(ReduceOp::kAverage)]);
  MPI_Op_create(&HalfReduce<D, ReduceOp::kMin>, 1, &ops[static_cast<int>(ReduceOp::kMin)]);
  MPI_Op_create(&HalfReduce<D, ReduceOp::kMax>, 1, &ops[static_cast<int>(ReduceOp::kMax)]);
  MPI_Op_create(&HalfReduce<D, ReduceOp::kProduct>, 1, &ops[static_cast<int>(ReduceOp::kProduct)]);
  ops[static_cast<int>(ReduceOp::kAdasum)] = MPI_OP_NULL;
}

MPI_Datatype TypeFor(DataType d) {
  switch (d) {
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kUInt16: return MPI_UINT16_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16:
    case DataType::kBFloat16: return MPI_UINT16_T;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kBool: return MPI_C_BOOL;
  }
  return MPI_DATATYPE_NULL;
}

bool FitsInt(size_t x) { return x <= static_cast<size_t>(INT_MAX); }

// Counts and displacements as MPI wants them; false if some does not fit an int.
bool ToInts(const std::vector<size_t>& sizes, std::vector<int>* counts, std::vector<int>* displs) {
  size_t off = 0;
  counts->resize(sizes.size());
  displs->resize(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (!FitsInt(sizes[i]) || !FitsInt(off)) return false;
    (*counts)[i] = static_cast<int>(sizes[i]);
    (*displs)[i] = static_cast<int>(off);
    off += sizes[i];
  }
  return FitsInt(off);
}

// The rounds of a v-collective in chunks (allgatherv, alltoallv, reducescatter): round k moves
// units [k * per, (k + 1) * per) of every block, fewer or none of a block that is shorter, so
// that a round moves at most `per` units of each block.
size_t RoundsFor(const std::vector<size_t>& sizes, size_t per) {
  const size_t longest = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  return (longest + per - 1) / per;
}

// Round k's counts and displacements, for blocks of `sizes` units that start at `starts` (the
// whole collective's displacements, which ToInts has found to fit an int, as does their end).
void RoundOf(const std::vector<size_t>& sizes, const std::vector<int>& starts, size_t per,
             size_t k, std::vector<int>* counts, std::vector<int>* displs) {
  counts->resize(sizes.size());
  displs->resize(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t first = std::min(sizes[i], k * per);
    (*counts)[i] = static_cast<int>(std::min(per, sizes[i] - first));
    (*displs)[i] = starts[i] + static_cast<int>(first);
  }
}

}  // namespace

MpiCollectives::MpiCollectives(MpiContext& mpi) : mpi_(mpi) {
  CreateHalfOps<DataType::kFloat16>(half_ops_[0]);
  CreateHalfOps<DataType::kBFloat16>(half_ops_[1]);
}

MpiCollectives::~MpiCollectives() { ReleaseOps(); }

void MpiCollectives::ReleaseOps() {
  if (!mpi_.broken().ok()) return;  // leave MPI alone after a failure (see MpiContext)
  for (auto& row : half_ops_) {
    for (MPI_Op& op : row) {
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
      op = MPI_OP_NULL;
    }
  }
}

MPI_Op MpiCollectives::OpFor(DataType dtype, ReduceOp op) const {
  if (dtype == DataType::kFloat16) return half_ops_[0][static_cast<int>(op)];
  if (dtype == DataType::kBFloat16) return half_ops_[1][static_cast<int>(op)];
  if (dtype == DataType::kBool) {
    return op == ReduceOp::kMin || op == ReduceOp::kProduct ? MPI_LAND : MPI_LOR;
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    case ReduceOp::kAdasum: return MPI_OP_NULL;
  }
  return MPI_OP_NULL;
}

template <typename Start>
Status MpiCollectives::Run(const char* what, Deadline deadline, Start start) {
  HVD_RETURN_IF_ERROR(mpi_.broken());
  MPI_Request req = MPI_REQUEST_NULL;
  HVD_RETURN_IF_ERROR(mpi_.Check(start(&req), what));
  return mpi_.Wait(&req, deadline, what);
}

const void* MpiCollectives::Unaliased(const void* in, size_t bytes, const void* out,
                                      size_t out_bytes) {
  auto* a = static_cast<const uint8_t*>(in);
  auto* b = static_cast<const uint8_t*>(out);
  if (bytes == 0 || out_bytes == 0 || a >= b + out_bytes || b >= a + bytes) return in;
  copy_.resize(bytes);
  std::memcpy(copy_.data(), in, bytes);
  return copy_.data();
}

std::optional<Status> MpiCollectives::Allreduce(void* buf, size_t count, DataType dtype,
                                                ReduceOp op, Deadline deadline) {
  if (op == ReduceOp::kAdasum) return std::nullopt;  // not MPI's: hvd's algorithm runs it
  const size_t esize = DataTypeSize(dtype);
  const MPI_Datatype type = TypeFor(dtype);
  const MPI_Op mop = OpFor(dtype, op);
  const size_t chunk = kMaxChunkBytes / esize;
  const Clock::time_point started = Clock::now();
  for (size_t done = 0; done < count; done += chunk) {
    const int n = static_cast<int>(std::min(count - done, chunk));
    void* p = static_cast<uint8_t*>(buf) + done * esize;
    const Deadline d = ChunkDeadline(deadline, started);
    HVD_RETURN_IF_ERROR(Run("MPI_Iallreduce", d, [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, p, n, type, mop, mpi_.comm(), r);
    }));
  }
  return Status::OK();
}

std::optional<Status> MpiCollectives::Allgatherv(const void* in, void* out,
                                                 const std::vector<size_t>& bytes,
                                                 Deadline deadline) {
  std::vector<int> counts, displs;
  if (!ToInts(bytes, &counts, &displs)) return std::nullopt;
  // The entry point has put this rank's block in place already (`in` points at it). Every rank
  // has the same sizes, so every rank makes the same rounds.
  const size_t per = std::max<size_t>(1, kMaxChunkBytes / bytes.size());
  const size_t rounds = RoundsFor(bytes, per);
  const Clock::time_point started = Clock::now();
  std::vector<int> rc, rd;
  for (size_t k = 0; k < rounds; ++k) {
    RoundOf(bytes, displs, per, k, &rc, &rd);
    const Deadline d = ChunkDeadline(deadline, started);
    HVD_RETURN_IF_ERROR(Run("MPI_Iallgatherv", d, [&](MPI_Request* r) {
      return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, rc.data(), rd.data(),
                             MPI_BYTE, mpi_.comm(), r);
    }));
  }
  return Status::OK();
}

std::optional<Status> MpiCollectives::Broadcast(void* buf, size_t bytes, int root,
                                                Deadline deadline) {
  const Clock::time_point started = Clock::now();
  for (size_t done = 0; done < bytes; done += kMaxChunkBytes) {
    const int n = static_cast<int>(std::min(bytes - done, kMaxChunkBytes));
    void* p = static_cast<uint8_t*>(buf) + done;
    const Deadline d = ChunkDeadline(deadline, started);
    HVD_RETURN_IF_ERROR(Run("MPI_Ibcast", d, [&](MPI_Request* r) {
      return MPI_Ibcast(p, n, MPI_BYTE, root, mpi_.comm(), r);
    }));
  }
  return Status::OK();
}

std::optional<Status> MpiCollectives::Alltoallv(const void* in, const std::vector<size_t>& send_bytes,
                                                void* out, const std::vector<size_t>& recv_bytes,
                                                Deadline deadline) {
  std::vector<int> sc, sd, rc, rd;
  const size_t per = std::max<size_t>(1, kMaxChunkBytes / send_bytes.size());
  // Sizes differ per rank: one MPI_MAX agrees on whether some rank's do not fit an int, and on
  // the number of rounds (those of the longest block any rank sends or receives).
  int64_t agreed[2] = {ToInts(send_bytes, &sc, &sd) && ToInts(recv_bytes, &rc, &rd) ? 0 : 1,
                       static_cast<int64_t>(std::max(RoundsFor(send_bytes, per),
                                                     RoundsFor(recv_bytes, per)))};
  HVD_RETURN_IF_ERROR(Run("MPI_Iallreduce (alltoallv sizes)", deadline, [&](MPI_Request* r) {
    return MPI_Iallreduce(MPI_IN_PLACE, agreed, 2, MPI_INT64_T, MPI_MAX, mpi_.comm(), r);
  }));
  if (agreed[0]) return std::nullopt;
  size_t in_bytes = 0, out_bytes = 0;
  for (size_t b : send_bytes) in_bytes += b;
  for (size_t b : recv_bytes) out_bytes += b;
  const void* src = Unaliased(in, in_bytes, out, out_bytes);
  const Clock::time_point started = Clock::now();
  std::vector<int> sck, sdk, rck, rdk;
  for (size_t k = 0; k < static_cast<size_t>(agreed[1]); ++k) {
    RoundOf(send_bytes, sd, per, k, &sck, &sdk);
    RoundOf(recv_bytes, rd, per, k, &rck, &rdk);
    const Deadline d = ChunkDeadline(deadline, started);
    HVD_RETURN_IF_ERROR(Run("MPI_Ialltoallv", d, [&](MPI_Request* r) {
      return MPI_Ialltoallv(src, sck.data(), sdk.data(), MPI_BYTE, out, rck.data(), rdk.data(),
                            MPI_BYTE, mpi_.comm(), r);
    }));
  }
  return Status::OK();
}

std::optional<Status> MpiCollectives::ReduceScatter(const void* in, void* out,
                                                    const std::vector<size_t>& counts,
                                                    DataType dtype, ReduceOp op,
                                                    Deadline deadline) {
  std::vector<int> ic, displs;
  if (!ToInts(counts, &ic, &displs)) return std::nullopt;
  const size_t esize = DataTypeSize(dtype);
  size_t total = 0;
  for (size_t c : counts) total += c;
  const int me = mpi_.rank();
  const void* src = Unaliased(in, total * esize, out, counts[me] * esize);
  const MPI_Datatype type = TypeFor(dtype);
  const MPI_Op mop = OpFor(dtype, op);
  const size_t per = std::max<size_t>(1, kMaxChunkBytes / esize / counts.size());
  const size_t rounds = RoundsFor(counts, per);
  if (rounds <= 1) {
    return Run("MPI_Ireduce_scatter", deadline, [&](MPI_Request* r) {
      return MPI_Ireduce_scatter(src, out, ic.data(), type, mop, mpi_.comm(), r);
    });
  }
  // In rounds: MPI takes a round's input as one run of blocks, so each round's share of every
  // block is packed into stage_ first (a copy far faster than the reduction), and its result
  // lands in place in `out`.
  stage_.resize(std::min(total, per * counts.size()) * esize);
  const auto* from = static_cast<const uint8_t*>(src);
  const Clock::time_point started = Clock::now();
  std::vector<int> rc, rd;
  for (size_t k = 0; k < rounds; ++k) {
    RoundOf(counts, displs, per, k, &rc, &rd);
    size_t packed = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      const size_t n = static_cast<size_t>(rc[i]) * esize;
      if (n) std::memcpy(stage_.data() + packed, from + static_cast<size_t>(rd[i]) * esize, n);
      packed += n;
    }
    void* mine = static_cast<uint8_t*>(out) + (static_cast<size_t>(rd[me]) - displs[me]) * esize;
    const Deadline d = ChunkDeadline(deadline, started);
    HVD_RETURN_IF_ERROR(Run("MPI_Ireduce_scatter", d, [&](MPI_Request* r) {
      return MPI_Ireduce_scatter(stage_.data(), mine, rc.data(), type, mop, mpi_.comm(), r);
    }));
  }
  return Status::OK();
}

std::optional<Status> MpiCollectives::Barrier(Deadline deadline) {
  return Run("MPI_Ibarrier", deadline, [&](MPI_Request* r) { return MPI_Ibarrier(mpi_.comm(), r); });
}

}  // namespace hvd
