/* The C API of hvd: opaque handles and an error out-parameter.
 *
 *   hvd_error* err = NULL;
 *   hvd_engine* e = hvd_init(&err);                 // from the environment contract
 *   if (!e) { fprintf(stderr, "%s\n", hvd_error_message(err)); hvd_error_free(err); }
 *   hvd_handle* h = hvd_allreduce(e, "grad", buf, buf, HVD_FLOAT32, 1, &n, HVD_AVERAGE, 1.0, 1.0);
 *   if (hvd_wait(h, -1, &err) != HVD_OK) { ... }
 *   hvd_handle_free(h);
 *   hvd_shutdown(e);
 *
 * Thread-safety: every function taking an hvd_engine may be called from any thread; a
 * hvd_handle may be polled and waited on from any thread and is freed once, by its owner.
 */
#ifndef HVD_C_H_
#define HVD_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(HVD_BUILDING_LIBRARY)
#define HVD_C_EXPORT __attribute__((visibility("default")))
#else
#define HVD_C_EXPORT
#endif

typedef struct hvd_engine hvd_engine;
typedef struct hvd_handle hvd_handle;
typedef struct hvd_error hvd_error;

/* Same values as hvd::DataType and hvd::ReduceOp. */
typedef enum {
  HVD_UINT8 = 0, HVD_INT8, HVD_INT32, HVD_INT64, HVD_FLOAT16, HVD_BFLOAT16, HVD_FLOAT32,
  HVD_FLOAT64, HVD_BOOL, HVD_INT16, HVD_UINT16
} hvd_dtype;
typedef enum { HVD_SUM = 0, HVD_AVERAGE, HVD_MIN, HVD_MAX, HVD_PRODUCT } hvd_reduce_op;

/* Status codes, as hvd::StatusCode. */
enum {
  HVD_OK = 0, HVD_INVALID_ARGUMENT, HVD_FAILED_PRECONDITION, HVD_TIMEOUT, HVD_PEER_LOST,
  HVD_ABORTED, HVD_INTERNAL, HVD_RESOURCE_EXHAUSTED
};

HVD_C_EXPORT const char* hvd_error_message(const hvd_error* err);
HVD_C_EXPORT int hvd_error_code(const hvd_error* err);
HVD_C_EXPORT void hvd_error_free(hvd_error* err);

/* Returns NULL and sets *err (if err is not NULL) on failure. */
HVD_C_EXPORT hvd_engine* hvd_init(hvd_error** err);
/* Shuts down and frees the engine: `e` may not be used after, by any thread (NULL: nothing). */
HVD_C_EXPORT void hvd_shutdown(hvd_engine* e);
/* -1 for a NULL engine. */
HVD_C_EXPORT int hvd_rank(const hvd_engine* e);
HVD_C_EXPORT int hvd_size(const hvd_engine* e);
HVD_C_EXPORT int hvd_local_rank(const hvd_engine* e);
HVD_C_EXPORT int hvd_local_size(const hvd_engine* e);

/* Asynchronous operations: never NULL; argument errors surface at hvd_wait (a NULL engine, a
 * dtype or op outside its enum, a negative ndim, a NULL shape with ndim > 0, a NULL buffer
 * with elements included). With an engine, such an error fails the operation on every rank
 * together, with this rank's reason, once every rank has called it (the others' calls do not
 * wait for this one). `shape` has `ndim` entries; buffers stay valid until the handle has
 * finished. */
HVD_C_EXPORT hvd_handle* hvd_allreduce(hvd_engine* e, const char* name, const void* input,
                                       void* output, hvd_dtype dtype, int ndim,
                                       const int64_t* shape, hvd_reduce_op op, double prescale,
                                       double postscale);
HVD_C_EXPORT hvd_handle* hvd_broadcast(hvd_engine* e, const char* name, void* buffer,
                                       hvd_dtype dtype, int ndim, const int64_t* shape, int root);
/* The result is owned by the handle: hvd_handle_output / hvd_handle_output_shape. */
HVD_C_EXPORT hvd_handle* hvd_allgather(hvd_engine* e, const char* name, const void* input,
                                       hvd_dtype dtype, int ndim, const int64_t* shape);
HVD_C_EXPORT hvd_handle* hvd_barrier(hvd_engine* e);
HVD_C_EXPORT hvd_handle* hvd_join(hvd_engine* e);

/* 1 when finished, 0 while pending. A NULL handle is finished, and hvd_wait on it gives
 * HVD_INVALID_ARGUMENT. */
HVD_C_EXPORT int hvd_poll(const hvd_handle* h);
/* Blocks until finished; returns the status code and sets *err on failure. timeout_ms < 0
 * waits without limit. HVD_TIMEOUT: still pending when timeout_ms passed, or finished, failed
 * because a peer was silent for HVD_TIMEOUT_SECONDS or a stall shutdown. To tell the two apart,
 * wait again: hvd_wait(h, 0, ...) once hvd_poll gives 1 returns the final code (the operation
 * may have finished, OK included, since the wait that timed out). */
HVD_C_EXPORT int hvd_wait(const hvd_handle* h, int64_t timeout_ms, hvd_error** err);
/* After a successful allgather: the result and its shape (ndim entries written to shape, at
 * most max_ndim); returns the number of dimensions. */
HVD_C_EXPORT const void* hvd_handle_output(const hvd_handle* h, size_t* bytes);
HVD_C_EXPORT int hvd_handle_output_shape(const hvd_handle* h, int64_t* shape, int max_ndim);
/* After join: the last rank that joined. */
HVD_C_EXPORT int hvd_handle_join_last_rank(const hvd_handle* h);
HVD_C_EXPORT void hvd_handle_free(hvd_handle* h);

#ifdef __cplusplus
}
#endif

#endif /* HVD_C_H_ */
