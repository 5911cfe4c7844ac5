// The benchmark hook (hvd/raw.h): a collective run straight on the transport.
#include "hvd/raw.h"

#include <numeric>

#include "engine/engine_impl.h"
#include "reduce/reduce.h"

namespace hvd {

namespace {

using RawFn = std::function<Status(Transport&, ScratchBuffer&)>;

RawFn MakeRaw(RawCollective coll, const void* in, void* out, size_t count, DataType dtype,
              ReduceOp op, int size, double timeout) {
  const size_t esize = DataTypeSize(dtype);
  return [=](Transport& t, ScratchBuffer& scratch) -> Status {
    Deadline d = DeadlineAfterSeconds(timeout);
    ReduceOp sum_op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
    double post = op == ReduceOp::kAverage ? 1.0 / size : 1.0;
    switch (coll) {
      case RawCollective::kAllreduce: {
        if (out != in && count) std::memcpy(out, in, count * esize);
        HVD_RETURN_IF_ERROR(Allreduce(t, out, count, dtype, sum_op, scratch, d));
        Scale(out, count, dtype, post);
        return Status::OK();
      }
      case RawCollective::kAllgather: {
        std::vector<size_t> bytes(size, count * esize);
        return Allgatherv(t, in, out, bytes, d);
      }
      case RawCollective::kBroadcast:
        if (out != in && t.rank() == 0 && count) std::memcpy(out, in, count * esize);
        return Broadcast(t, out, count * esize, 0, d);
      case RawCollective::kAlltoall: {
        if (count % size) return Status::InvalidArgument("alltoall count must be divisible by size");
        std::vector<size_t> bytes(size, count / size * esize);
        return Alltoallv(t, in, bytes, out, bytes, d);
      }
      case RawCollective::kReducescatter: {
        if (count % size) return Status::InvalidArgument("reducescatter count must be divisible by size");
        std::vector<size_t> counts(size, count / size);
        HVD_RETURN_IF_ERROR(ReduceScatter(t, in, out, counts, dtype, sum_op, scratch, d));
        Scale(out, count / size, dtype, post);
        return Status::OK();
      }
    }
    return Status::InvalidArgument("unknown raw collective");
  };
}

}  // namespace

Status RunRawCollective(Engine& engine, RawCollective coll, const void* in, void* out,
                        size_t count, DataType dtype, ReduceOp op, double* seconds) {
  TensorEntry e;
  e.request.name = "raw";  // one at a time: the call waits, and the name refuses overlap
  e.request.shape = {0};  // the raw function carries its own buffers
  e.handle = NewHandle();
  RawFn run = MakeRaw(coll, in, out, count, dtype, op, engine.size(),
                      engine.options().timeout_seconds);
  if (seconds) {
    const double timeout = engine.options().timeout_seconds;
    run = [run, seconds, timeout](Transport& t, ScratchBuffer& scratch) -> Status {
      HVD_RETURN_IF_ERROR(Barrier(t, DeadlineAfterSeconds(timeout)));
      const auto t0 = Clock::now();
      Status s = run(t, scratch);
      *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      return s;
    };
  }
  e.raw = std::make_unique<RawFn>(std::move(run));
  HandlePtr h = engine.impl()->Enqueue(std::move(e));
  return h->Wait();
}

NegotiationCounters ReadNegotiationCounters(Engine& engine) {
  NegotiationCounters c;
  c.nanoseconds = engine.impl()->negotiation_ns();
  c.messages = engine.impl()->negotiation_messages();
  c.cache_hits = engine.impl()->cache_hits();
  c.bookkeeping_nanoseconds = engine.impl()->bookkeeping_ns();
  c.fast_path_steps = engine.impl()->fast_path_steps();
  c.fast_path_steps_reused = engine.impl()->fast_path_steps_reused();
  return c;
}

bool NegotiatesInRounds(Engine& engine) { return engine.impl()->negotiates_in_rounds(); }

}  // namespace hvd
