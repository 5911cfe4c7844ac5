// What ranks tell the coordinator (Request) and what it answers (Response), and their wire
// encoding. Every rank executes the same Response list in the same order.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hvd/status.h"
#include "hvd/types.h"

namespace hvd {

enum class OpType : uint8_t {
  kAllreduce = 0,
  kAllgather,
  kBroadcast,
  kAlltoall,
  kReducescatter,
  kBarrier,
  kJoin,
  // Adds (Request::splits = the set's ranks) or removes (Request::root = its id) a process set;
  // negotiated in the global set like a barrier (names "__hvd.process_set.<n>").
  kProcessSet,
  kError,  // Response only: the named tensors failed negotiation
};
const char* OpTypeName(OpType t);

// One rank's announcement that a named tensor is ready.
struct Request {
  OpType type = OpType::kAllreduce;
  std::string name;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = -1;
  int32_t device = -1;
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int64_t> shape;
  std::vector<int64_t> splits;   // alltoall: rows sent to each rank
  std::string group;             // grouped ops: the group's key ("" = not grouped)
  int32_t group_size = 0;
  // Not empty: the rank refused the operation's arguments (a root outside the set, splits of
  // the wrong number, an output that does not fit), and says why. The request is negotiated
  // all the same so that every rank fails it together (the coordinator answers kError with
  // this), instead of the others waiting for a rank that gave up alone.
  std::string error;
  StatusCode error_code = StatusCode::kInvalidArgument;
  // The process set (0: every rank). Not on the wire: a RequestList is for one set.
  int32_t process_set = 0;
};

// The coordinator's decision about one or more (fused) tensors.
// How the members plan a list's allreduces (planner/plan.h): rank 0's choice, sent with each
// response list so that every member plans alike; autotune (HVD_AUTOTUNE=1) changes it.
struct PlanKnobs {
  int32_t hierarchical_allreduce = 0;          // an Options::Toggle: 0 auto, 1 on, 2 off
  uint64_t small_allreduce_bytes = 64u << 10;  // recursive doubling up to this, the ring above
  uint64_t staging_piece_bytes = 4u << 20;     // a staged allreduce's pieces (0: one)
  bool operator==(const PlanKnobs& o) const {
    return hierarchical_allreduce == o.hierarchical_allreduce &&
           small_allreduce_bytes == o.small_allreduce_bytes &&
           staging_piece_bytes == o.staging_piece_bytes;
  }
};

struct Response {
  OpType type = OpType::kAllreduce;
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;  // per tensor: the agreed shape (rank 0's for
                                             // allgather/alltoall, whose first dim may differ)
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int32_t root = -1;
  double prescale = 1.0;
  double postscale = 1.0;
  // allgather: rows of every rank, tensor-major ([t * size + r]);
  // alltoall: the splits matrix, [src * size + dst] rows sent from src to dst.
  // kProcessSet: the ranks of the set to add (empty: remove the set `root`).
  // kError: when not empty, the ranks it is for (an operation refused while a rank has joined,
  // or a group's member failed, before the other ranks submitted it); the others' entries of
  // the name stay in flight and are answered on their own.
  std::vector<int64_t> sizes;
  std::string error;           // kError: what differed and where
  StatusCode error_code = StatusCode::kInvalidArgument;  // kError: the status the ranks get
  int32_t last_joined = -1;    // kJoin: the last rank to join
  // Ranks that had joined when this response was made: they take part without a tensor.
  std::vector<int32_t> joined;
  // kCpuDevice for host tensors; for device tensors the CUDA device of the lowest rank that
  // announced them (ranks may use different GPUs; each rank runs on its one device). Responses
  // fuse only when this is equal, so a fused buffer never mixes host and device memory.
  int32_t device = kCpuDevice;
  // Grouped tensors (Request::group): where any tensor of the response is in a group, each
  // tensor's group key and size, parallel to `names` ("" and 0: not grouped); empty where none
  // is. The response cache keeps them with the tensor, so that a group's members are cached
  // hits of its own requests and take the fast path all or none (ResponseCache::CloseGroups).
  std::vector<std::string> groups;
  std::vector<int32_t> group_sizes;
  // On the wire only: when not empty, the response travels as these response-cache bits and
  // the fields above are rebuilt from the receiver's cache.
  std::vector<uint32_t> cache_bits;
  // The process set (0: every rank); ranks, roots, sizes and joins are counted in it. Not on
  // the wire: a ResponseList is for one set.
  int32_t process_set = 0;
  // Not on the wire: built by this rank from agreed cache bits (ResponseCache::RebuildAll),
  // which has marked its tensors used already.
  bool from_cache = false;
  // Not on the wire: with from_cache, each tensor's cache bit (names[i] is bit bits[i]).
  std::vector<uint32_t> bits;
  // Not on the wire: the knobs of the list it came in.
  PlanKnobs knobs;
};

// Control-channel message kinds.
enum class MessageType : uint8_t {
  kRequests = 1,   // worker -> coordinator: RequestList
  kResponses = 2,  // coordinator -> workers: ResponseList
  kShutdown = 3,   // either way: payload = the rank that asked
  kAbort = 4,      // either way: payload = the cause's StatusCode (u8), then its message (a
                   // printable first byte: all message); the communicator is gone
  kHeartbeat = 5,  // either way, every second: the sender's background thread is alive
  kRound = 6,      // every rank to every other: RoundContribution (the symmetric fast path)
};

// hvd's own requests (join, barrier, process set changes, an elastic job's check for new hosts)
// travel as requests too, under names that start with kOwnNamePrefix: "__hvd.join",
// "__hvd.barrier.<n>", "__hvd.process_set.<n>", "__hvd.elastic.hosts_updated".
// A caller's tensor name may not start with it (RefusalLocked), so the two never meet in a
// rank's table of names in flight.
inline constexpr char kOwnNamePrefix[] = "__hvd.";
inline constexpr char kJoinName[] = "__hvd.join";
struct RequestList {
  int32_t process_set = 0;  // every request and bit is of this set
  std::vector<Request> requests;
  uint64_t cache_epoch = 0;          // the sender's response-cache epoch
  std::vector<uint64_t> cached_bits;  // bit vector: the cached tensors announced
};

struct ResponseList {
  int32_t process_set = 0;  // every response and bit is of this set
  std::vector<Response> responses;
  // The cached tensors every rank has announced (the fast path, engine/background.cc): every
  // rank builds their responses from its own cache, in bit order, fused with rank 0's
  // threshold, and runs them after `responses`.
  std::vector<uint64_t> ready_bits;
  uint64_t fusion_threshold = 0;
  PlanKnobs knobs;  // for every response of the list, cached ones included
  // With the symmetric fast path (engine/rounds.cc): the rounds of the global set rank 0 had
  // completed when it sent the list. A rank runs the list after its own round of that number.
  uint64_t after_round = 0;
};

// One rank's part of a round of the global set's symmetric fast path (engine/rounds.cc): the
// cached tensors it has ready, as bits at its cache epoch, and the bits whose tensors it moves
// to the coordinator. Rank 0's part also carries what every rank builds the agreed responses
// with.
struct RoundContribution {
  uint64_t round = 0;
  int32_t rank = 0;
  uint64_t cache_epoch = 0;
  std::vector<uint64_t> ready;
  std::vector<uint64_t> withdraw;
  // Rank 0 only.
  uint64_t fusion_threshold = 0;
  PlanKnobs knobs;
  // Whether the round holds the bits every rank announced while some rank announced a bit
  // another has not (its step still arriving): rank 0's clock says whether the hold is over.
  bool hold_uneven = false;
};

std::vector<uint8_t> Encode(const RequestList& l);
std::vector<uint8_t> Encode(const ResponseList& l);
std::vector<uint8_t> Encode(const RoundContribution& c);
// Decoders check every length against the payload and fail with InvalidArgument on garbage.
Status Decode(const uint8_t* data, size_t len, RequestList* out);
Status Decode(const uint8_t* data, size_t len, ResponseList* out);
Status Decode(const uint8_t* data, size_t len, RoundContribution* out);
// What a worker checks of a response from the coordinator (rebuilt from cache bits if need be)
// before executing it in a (process set of) `size` ranks: the fields its type uses are all there and in
// range (a name per shape, a row count per rank, a root among the ranks, no negative extent).
Status CheckResponse(const Response& r, int size);

}  // namespace hvd
