// The C API (hvd_c.h) over the C++ API. The one per-process state is the engine the caller
// holds; nothing here is global.
#include "hvd_c.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "hvd/engine.h"

struct hvd_engine {
  std::unique_ptr<hvd::Engine> engine;
};
struct hvd_handle {
  hvd::HandlePtr handle;
};
struct hvd_error {
  int code;
  std::string message;
};

namespace {

void SetError(hvd_error** err, const hvd::Status& s) {
  if (err) *err = new hvd_error{static_cast<int>(s.code()), s.ToString()};
}

hvd::TensorView View(const void* data, hvd_dtype dtype, int ndim, const int64_t* shape) {
  std::vector<int64_t> dims;
  if (ndim > 0 && shape) dims.assign(shape, shape + ndim);
  return hvd::TensorView(const_cast<void*>(data), static_cast<hvd::DataType>(dtype), dims);
}

hvd_handle* Wrap(hvd::HandlePtr h) { return new hvd_handle{std::move(h)}; }

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

int hvd_rank(const hvd_engine* e) { return e->engine->rank(); }
int hvd_size(const hvd_engine* e) { return e->engine->size(); }
int hvd_local_rank(const hvd_engine* e) { return e->engine->local_rank(); }
int hvd_local_size(const hvd_engine* e) { return e->engine->local_size(); }

hvd_handle* hvd_allreduce(hvd_engine* e, const char* name, const void* input, void* output,
                          hvd_dtype dtype, int ndim, const int64_t* shape, hvd_reduce_op op,
                          double prescale, double postscale) {
  return Wrap(e->engine->Allreduce(name ? name : "", View(input, dtype, ndim, shape),
                                   View(output, dtype, ndim, shape),
                                   static_cast<hvd::ReduceOp>(op), prescale, postscale));
}

hvd_handle* hvd_broadcast(hvd_engine* e, const char* name, void* buffer, hvd_dtype dtype,
                          int ndim, const int64_t* shape, int root) {
  hvd::TensorView v = View(buffer, dtype, ndim, shape);
  return Wrap(e->engine->Broadcast(name ? name : "", v, v, root));
}

hvd_handle* hvd_allgather(hvd_engine* e, const char* name, const void* input, hvd_dtype dtype,
                          int ndim, const int64_t* shape) {
  return Wrap(e->engine->Allgather(name ? name : "", View(input, dtype, ndim, shape)));
}

hvd_handle* hvd_barrier(hvd_engine* e) { return Wrap(e->engine->Barrier()); }
hvd_handle* hvd_join(hvd_engine* e) { return Wrap(e->engine->Join()); }

int hvd_poll(const hvd_handle* h) { return h->handle->Poll() ? 1 : 0; }

int hvd_wait(const hvd_handle* h, int64_t timeout_ms, hvd_error** err) {
  hvd::Status s = timeout_ms < 0 ? h->handle->Wait()
                                 : h->handle->WaitFor(std::chrono::milliseconds(timeout_ms));
  if (!s.ok()) SetError(err, s);
  return static_cast<int>(s.code());
}

const void* hvd_handle_output(const hvd_handle* h, size_t* bytes) {
  if (bytes) *bytes = h->handle->output_bytes().size();
  return h->handle->output_data();
}

int hvd_handle_output_shape(const hvd_handle* h, int64_t* shape, int max_ndim) {
  const auto& s = h->handle->output_shape();
  for (int i = 0; i < max_ndim && i < static_cast<int>(s.size()); ++i) shape[i] = s[i];
  return static_cast<int>(s.size());
}

int hvd_handle_join_last_rank(const hvd_handle* h) { return h->handle->join_last_rank(); }
void hvd_handle_free(hvd_handle* h) { delete h; }

}  // extern "C"
