// The C API (hvd_c.h) over the C++ API. The one per-process state is the engine the caller
// holds; nothing here is global.
#include "hvd_c.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hvd/engine.h"

struct hvd_engine {
  std::unique_ptr<hvd::Engine> engine;
};
struct hvd_handle {
  hvd::HandlePtr handle;  // null where the C layer refused the call (`refused` says why)
  hvd::Status refused;
};
struct hvd_error {
  int code;
  std::string message;
};

namespace {

void SetError(hvd_error** err, const hvd::Status& s) {
  if (err) *err = new hvd_error{static_cast<int>(s.code()), s.ToString()};
}

// An enum argument's value as the caller passed it: C may pass any int, which C++ must not
// read as the enum type until it is known to be one of its values.
template <typename E>
int Raw(const E& value) {
  static_assert(sizeof(E) == sizeof(int), "the C enums are int-sized");
  int v;
  std::memcpy(&v, &value, sizeof(v));
  return v;
}

// `dtype` already checked (BadTensor).
hvd::TensorView View(const void* data, int dtype, int ndim, const int64_t* shape) {
  std::vector<int64_t> dims;
  if (ndim > 0 && shape) dims.assign(shape, shape + ndim);
  return hvd::TensorView(const_cast<void*>(data), static_cast<hvd::DataType>(dtype), dims);
}

hvd_handle* Wrap(hvd::HandlePtr h) { return new hvd_handle{std::move(h), hvd::Status::OK()}; }

// A call the C layer refuses: a handle that has finished with InvalidArgument, as the header
// promises (argument errors surface at hvd_wait).
hvd_handle* Refused(const char* op, const char* name, const std::string& why) {
  return new hvd_handle{nullptr, hvd::Status::InvalidArgument(
                                     std::string(op) + " '" + (name ? name : "") + "': " + why)};
}

// The same, for a call with an engine: negotiated as the operation would have been
// (Engine::Refuse), so that it fails on every rank with this rank's reason instead of the other
// ranks waiting for this one.
hvd_handle* RefusedEverywhere(hvd_engine* e, const char* op, const char* name,
                              const std::string& why) {
  std::vector<hvd::HandlePtr> h = e->engine->Refuse(op, {name ? name : ""}, why);
  return Wrap(std::move(h.front()));
}

// What the C++ API cannot tell from its own types: values outside the C enums (an enum's bits
// would wrap into another value) and a shape that is not there.
std::string BadTensor(int dtype, int ndim, const int64_t* shape) {
  if (dtype < HVD_UINT8 || dtype > HVD_UINT16) {
    return "dtype " + std::to_string(dtype) + " is not an hvd_dtype (0 to " +
           std::to_string(HVD_UINT16) + ")";
  }
  if (ndim < 0) return "ndim " + std::to_string(ndim) + " is negative";
  if (ndim > 0 && shape == nullptr) {
    return "shape is NULL with ndim " + std::to_string(ndim) + " (NULL only with ndim 0, a scalar)";
  }
  return "";
}

}  // namespace

extern "C" {

const char* hvd_error_message(const hvd_error* err) { return err ? err->message.c_str() : "OK"; }
int hvd_error_code(const hvd_error* err) { return err ? err->code : HVD_OK; }
void hvd_error_free(hvd_error* err) { delete err; }

hvd_engine* hvd_init(hvd_error** err) {
  auto e = hvd::Engine::CreateFromEnvironment();
  if (!e.ok()) {
    SetError(err, e.status());
    return nullptr;
  }
  return new hvd_engine{std::move(e).value()};
}

void hvd_shutdown(hvd_engine* e) {
  if (!e) return;
  e->engine->Shutdown();
  delete e;
}

// Without an engine (NULL): -1.
int hvd_rank(const hvd_engine* e) { return e ? e->engine->rank() : -1; }
int hvd_size(const hvd_engine* e) { return e ? e->engine->size() : -1; }
int hvd_local_rank(const hvd_engine* e) { return e ? e->engine->local_rank() : -1; }
int hvd_local_size(const hvd_engine* e) { return e ? e->engine->local_size() : -1; }

hvd_handle* hvd_allreduce(hvd_engine* e, const char* name, const void* input, void* output,
                          hvd_dtype dtype, int ndim, const int64_t* shape, hvd_reduce_op op,
                          double prescale, double postscale) {
  if (!e) return Refused("allreduce", name, "the engine is NULL");
  const int dt = Raw(dtype), rop = Raw(op);
  std::string bad = BadTensor(dt, ndim, shape);
  if (bad.empty() && (rop < HVD_SUM || rop > HVD_PRODUCT)) {
    bad = "op " + std::to_string(rop) + " is not an hvd_reduce_op (0 to " +
          std::to_string(HVD_PRODUCT) + ")";
  }
  if (!bad.empty()) return RefusedEverywhere(e, "allreduce", name, bad);
  return Wrap(e->engine->Allreduce(name ? name : "", View(input, dt, ndim, shape),
                                   View(output, dt, ndim, shape),
                                   static_cast<hvd::ReduceOp>(rop), prescale, postscale));
}

hvd_handle* hvd_broadcast(hvd_engine* e, const char* name, void* buffer, hvd_dtype dtype,
                          int ndim, const int64_t* shape, int root) {
  if (!e) return Refused("broadcast", name, "the engine is NULL");
  const int dt = Raw(dtype);
  const std::string bad = BadTensor(dt, ndim, shape);
  if (!bad.empty()) return RefusedEverywhere(e, "broadcast", name, bad);
  hvd::TensorView v = View(buffer, dt, ndim, shape);
  // (The engine would call it the output; a negative dimension it names itself.)
  const bool elements =
      std::all_of(v.shape.begin(), v.shape.end(), [](int64_t d) { return d > 0; });
  if (buffer == nullptr && elements) {
    return RefusedEverywhere(e, "broadcast", name, "buffer is NULL");
  }
  return Wrap(e->engine->Broadcast(name ? name : "", v, v, root));
}

hvd_handle* hvd_allgather(hvd_engine* e, const char* name, const void* input, hvd_dtype dtype,
                          int ndim, const int64_t* shape) {
  if (!e) return Refused("allgather", name, "the engine is NULL");
  const int dt = Raw(dtype);
  const std::string bad = BadTensor(dt, ndim, shape);
  if (!bad.empty()) return RefusedEverywhere(e, "allgather", name, bad);
  return Wrap(e->engine->Allgather(name ? name : "", View(input, dt, ndim, shape)));
}

hvd_handle* hvd_barrier(hvd_engine* e) {
  return e ? Wrap(e->engine->Barrier()) : Refused("barrier", "", "the engine is NULL");
}
hvd_handle* hvd_join(hvd_engine* e) {
  return e ? Wrap(e->engine->Join()) : Refused("join", "", "the engine is NULL");
}

int hvd_poll(const hvd_handle* h) { return !h || !h->handle || h->handle->Poll() ? 1 : 0; }

int hvd_wait(const hvd_handle* h, int64_t timeout_ms, hvd_error** err) {
  hvd::Status s;
  if (!h) {
    s = hvd::Status::InvalidArgument("hvd_wait: the handle is NULL");
  } else if (!h->handle) {
    s = h->refused;
  } else {
    s = timeout_ms < 0 ? h->handle->Wait()
                       : h->handle->WaitFor(std::chrono::milliseconds(timeout_ms));
  }
  if (!s.ok()) SetError(err, s);
  return static_cast<int>(s.code());
}

const void* hvd_handle_output(const hvd_handle* h, size_t* bytes) {
  if (!h || !h->handle) {
    if (bytes) *bytes = 0;
    return nullptr;
  }
  if (bytes) *bytes = h->handle->output_bytes().size();
  return h->handle->output_data();
}

int hvd_handle_output_shape(const hvd_handle* h, int64_t* shape, int max_ndim) {
  if (!h || !h->handle) return 0;
  const auto& s = h->handle->output_shape();
  for (int i = 0; shape && i < max_ndim && i < static_cast<int>(s.size()); ++i) shape[i] = s[i];
  return static_cast<int>(s.size());
}

int hvd_handle_join_last_rank(const hvd_handle* h) {
  return h && h->handle ? h->handle->join_last_rank() : -1;
}
void hvd_handle_free(hvd_handle* h) { delete h; }

}  // extern "C"
