/* The C API under hvdrun: allreduce (sum, average), broadcast, allgather with differing first
 * dimensions, a mismatch error, barrier and join; expected values by formula. Exits non-zero
 * naming the failed check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd_c.h"

static int failures = 0;
#define CHECK(cond, ...)                        \
  do {                                          \
    if (!(cond)) {                              \
      fprintf(stderr, "FAIL: " __VA_ARGS__);    \
      fprintf(stderr, "\n");                    \
      ++failures;                               \
    }                                           \
  } while (0)

static int wait_ok(hvd_handle* h, const char* what) {
  hvd_error* err = NULL;
  int code = hvd_wait(h, 30000, &err);
  if (code != HVD_OK) {
    fprintf(stderr, "FAIL: %s: %s\n", what, hvd_error_message(err));
    ++failures;
  }
  hvd_error_free(err);
  return code;
}

int main(void) {
  hvd_error* err = NULL;
  hvd_engine* e = hvd_init(&err);
  if (!e) {
    fprintf(stderr, "hvd_init: %s\n", hvd_error_message(err));
    hvd_error_free(err);
    return 1;
  }
  const int rank = hvd_rank(e), size = hvd_size(e);

  /* Allreduce sum and average, count 0, 1, odd, large. */
  const int64_t counts[] = {0, 1, 1001, 1 << 18};
  for (int c = 0; c < 4; ++c) {
    int64_t n = counts[c];
    double* in = malloc(sizeof(double) * (n ? n : 1));
    double* out = malloc(sizeof(double) * (n ? n : 1));
    for (int64_t i = 0; i < n; ++i) in[i] = (rank + 1) * (double)(i % 7 + 1);
    char name[64];
    snprintf(name, sizeof name, "c.sum.%d", c);
    hvd_handle* h = hvd_allreduce(e, name, in, out, HVD_FLOAT64, 1, &n, HVD_SUM, 1.0, 1.0);
    if (wait_ok(h, name) == HVD_OK) {
      for (int64_t i = 0; i < n; ++i) {
        double expect = size * (size + 1) / 2.0 * (double)(i % 7 + 1);
        if (out[i] != expect) {
          CHECK(0, "%s[%ld] = %g, expected %g", name, (long)i, out[i], expect);
          break;
        }
      }
    }
    hvd_handle_free(h);
    snprintf(name, sizeof name, "c.avg.%d", c);
    h = hvd_allreduce(e, name, in, in, HVD_FLOAT64, 1, &n, HVD_AVERAGE, 1.0, 1.0);
    if (wait_ok(h, name) == HVD_OK) {
      for (int64_t i = 0; i < n; ++i) {
        double expect = (size + 1) / 2.0 * (double)(i % 7 + 1);
        if (in[i] != expect) {
          CHECK(0, "%s[%ld] = %g, expected %g", name, (long)i, in[i], expect);
          break;
        }
      }
    }
    hvd_handle_free(h);
    free(in);
    free(out);
  }

  /* Broadcast from the last rank. */
  int32_t b[5];
  for (int i = 0; i < 5; ++i) b[i] = rank * 100 + i;
  int64_t bshape = 5;
  hvd_handle* h = hvd_broadcast(e, "c.bcast", b, HVD_INT32, 1, &bshape, size - 1);
  if (wait_ok(h, "broadcast") == HVD_OK) {
    for (int i = 0; i < 5; ++i) CHECK(b[i] == (size - 1) * 100 + i, "broadcast[%d] = %d", i, b[i]);
  }
  hvd_handle_free(h);

  /* Allgather: rank r contributes r+1 rows of 2 floats, value r. */
  float g[64];
  int64_t gshape[2] = {rank + 1, 2};
  for (int i = 0; i < (rank + 1) * 2; ++i) g[i] = (float)rank;
  h = hvd_allgather(e, "c.gather", g, HVD_FLOAT32, 2, gshape);
  if (wait_ok(h, "allgather") == HVD_OK) {
    int64_t shape[4];
    int nd = hvd_handle_output_shape(h, shape, 4);
    size_t bytes = 0;
    const float* out = hvd_handle_output(h, &bytes);
    int64_t rows = (int64_t)size * (size + 1) / 2;
    CHECK(nd == 2 && shape[0] == rows && shape[1] == 2, "allgather shape");
    CHECK(bytes == (size_t)rows * 2 * sizeof(float), "allgather bytes %zu", bytes);
    int64_t row = 0;
    for (int r = 0; r < size && bytes; ++r) {
      for (int k = 0; k <= r; ++k, ++row) CHECK(out[row * 2] == (float)r, "allgather row %ld", (long)row);
    }
  }
  hvd_handle_free(h);

  /* A shape mismatch fails on every rank with a message naming the tensor; the next op works. */
  if (size > 1) {
    float m[4] = {0};
    int64_t mshape = rank == 0 ? 3 : 4;
    h = hvd_allreduce(e, "c.mismatch", m, m, HVD_FLOAT32, 1, &mshape, HVD_SUM, 1.0, 1.0);
    err = NULL;
    int code = hvd_wait(h, 30000, &err);
    CHECK(code == HVD_INVALID_ARGUMENT, "mismatch gave code %d", code);
    CHECK(strstr(hvd_error_message(err), "c.mismatch") != NULL, "mismatch message: %s",
          hvd_error_message(err));
    hvd_error_free(err);
    hvd_handle_free(h);
  }
  /* Misuse on one rank (the last) fails the operation on every rank together, naming it. What
   * the C layer cannot turn into a tensor (a dtype, op or shape that is not one) was refused on
   * that rank alone, and the others waited for it with no limit. The next operation works. */
  if (size > 1) {
    float x[4] = {1, 2, 3, 4};
    int64_t four = 4;
    const int me = rank == size - 1;
    hvd_handle* one[] = {
        hvd_allreduce(e, "c.one.dtype", x, x, me ? (hvd_dtype)77 : HVD_FLOAT32, 1, &four,
                      HVD_SUM, 1.0, 1.0),
        hvd_allreduce(e, "c.one.op", x, x, HVD_FLOAT32, 1, &four,
                      me ? (hvd_reduce_op)99 : HVD_SUM, 1.0, 1.0),
        hvd_broadcast(e, "c.one.shape", x, HVD_FLOAT32, 1, me ? NULL : &four, 0),
        hvd_allgather(e, "c.one.ndim", x, HVD_FLOAT32, me ? -1 : 1, &four),
    };
    const char* says[] = {"dtype 77 is not an hvd_dtype", "op 99 is not an hvd_reduce_op",
                          "shape is NULL", "ndim -1 is negative"};
    char on_rank[32];
    snprintf(on_rank, sizeof(on_rank), "rank %d", size - 1);
    for (size_t i = 0; i < sizeof(one) / sizeof(one[0]); ++i) {
      err = NULL;
      int code = hvd_wait(one[i], 30000, &err);
      CHECK(code == HVD_INVALID_ARGUMENT, "one rank's refusal %zu gave code %d", i, code);
      CHECK(strstr(hvd_error_message(err), says[i]) != NULL &&
                strstr(hvd_error_message(err), on_rank) != NULL,
            "one rank's refusal %zu says '%s'", i, hvd_error_message(err));
      hvd_error_free(err);
      hvd_handle_free(one[i]);
    }
    float v = 1, total = 0;
    int64_t n1 = 1;
    h = hvd_allreduce(e, "c.one.after", &v, &total, HVD_FLOAT32, 1, &n1, HVD_SUM, 1.0, 1.0);
    if (wait_ok(h, "allreduce after one rank's refusals") == HVD_OK) {
      CHECK(total == (float)size, "sum after one rank's refusals %f", total);
    }
    hvd_handle_free(h);
  }
  /* Misuse is refused at hvd_wait, saying what was wrong, and crashes nothing (every rank makes
   * the same calls). */
  {
    float x[4] = {1, 2, 3, 4};
    int64_t four = 4;
    struct {
      hvd_handle* h;
      const char* says;
    } bad[] = {
        {hvd_allreduce(e, "c.bad.out", x, NULL, HVD_FLOAT32, 1, &four, HVD_SUM, 1.0, 1.0),
         "output data is null"},
        {hvd_allreduce(e, "c.bad.dtype", x, x, (hvd_dtype)262, 1, &four, HVD_SUM, 1.0, 1.0),
         "dtype 262 is not an hvd_dtype"},
        {hvd_allreduce(e, "c.bad.op", x, x, HVD_FLOAT32, 1, &four, (hvd_reduce_op)261, 1.0, 1.0),
         "op 261 is not an hvd_reduce_op"},
        {hvd_allreduce(e, "c.bad.ndim", x, x, HVD_FLOAT32, -1, &four, HVD_SUM, 1.0, 1.0),
         "ndim -1 is negative"},
        {hvd_allreduce(e, "c.bad.shape", x, x, HVD_FLOAT32, 1, NULL, HVD_SUM, 1.0, 1.0),
         "shape is NULL"},
        {hvd_allreduce(NULL, "c.bad.engine", x, x, HVD_FLOAT32, 1, &four, HVD_SUM, 1.0, 1.0),
         "the engine is NULL"},
        {hvd_broadcast(e, "c.bad.bcast", NULL, HVD_FLOAT32, 1, &four, 0),
         "broadcast 'c.bad.bcast' on rank"},
        {hvd_broadcast(e, "c.bad.bcast2", NULL, HVD_FLOAT32, 1, &four, 0), "buffer is NULL"},
        {hvd_allreduce(e, "__hvd.mine", x, x, HVD_FLOAT32, 1, &four, HVD_SUM, 1.0, 1.0),
         "names that start with '__hvd.' are hvd's own"},
        {hvd_allgather(e, "c.bad.gather", x, (hvd_dtype)-1, 1, &four), "not an hvd_dtype"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
      err = NULL;
      int code = hvd_wait(bad[i].h, 30000, &err);
      CHECK(hvd_poll(bad[i].h) == 1, "refused call %zu is finished", i);
      CHECK(code == HVD_INVALID_ARGUMENT, "refused call %zu gave code %d", i, code);
      CHECK(strstr(hvd_error_message(err), bad[i].says) != NULL, "refused call %zu says '%s'", i,
            hvd_error_message(err));
      hvd_error_free(err);
      hvd_handle_free(bad[i].h);
    }
    CHECK(hvd_rank(NULL) == -1 && hvd_size(NULL) == -1, "rank and size of a NULL engine");
    err = NULL;
    CHECK(hvd_wait(NULL, 0, &err) == HVD_INVALID_ARGUMENT, "hvd_wait(NULL)");
    hvd_error_free(err);
    CHECK(hvd_poll(NULL) == 1, "hvd_poll(NULL)");
  }
  /* The caller's names never meet hvd's own: allreduces named "barrier.0" and "join" in flight
   * through the first barrier and the join (when hvd's own were "barrier.<n>" and "join",
   * the barrier and the join failed: a name already in flight). */
  float ones[3] = {1, 1, 1}, sum_b[3] = {0}, sum_j[3] = {0};
  int64_t three = 3;
  hvd_handle* named_b =
      hvd_allreduce(e, "barrier.0", ones, sum_b, HVD_FLOAT32, 1, &three, HVD_SUM, 1.0, 1.0);
  h = hvd_barrier(e);
  wait_ok(h, "barrier");
  hvd_handle_free(h);
  if (wait_ok(named_b, "an allreduce named barrier.0") == HVD_OK) {
    CHECK(sum_b[0] == (float)size && sum_b[2] == (float)size, "barrier.0's sum %f", sum_b[0]);
  }
  hvd_handle_free(named_b);
  hvd_handle* named_j =
      hvd_allreduce(e, "join", ones, sum_j, HVD_FLOAT32, 1, &three, HVD_SUM, 1.0, 1.0);
  h = hvd_join(e);
  if (wait_ok(h, "join") == HVD_OK) {
    int last = hvd_handle_join_last_rank(h);
    CHECK(last >= 0 && last < size, "join last rank %d", last);
  }
  hvd_handle_free(h);
  if (wait_ok(named_j, "an allreduce named join") == HVD_OK) {
    CHECK(sum_j[0] == (float)size && sum_j[2] == (float)size, "join's sum %f", sum_j[0]);
  }
  hvd_handle_free(named_j);
  hvd_shutdown(e);

  /* A second engine in the same job: the rendezvous addresses of the first are stale now. */
  for (int round = 0; round < 3; ++round) {
    err = NULL;
    e = hvd_init(&err);
    if (!e) {
      CHECK(0, "re-init %d: %s", round, hvd_error_message(err));
      hvd_error_free(err);
      break;
    }
    int32_t v = rank + round, total = 0;
    int64_t one = 1;
    h = hvd_allreduce(e, "c.again", &v, &total, HVD_INT32, 1, &one, HVD_SUM, 1.0, 1.0);
    if (wait_ok(h, "allreduce after re-init") == HVD_OK) {
      CHECK(total == size * (size - 1) / 2 + size * round, "re-init %d sum %d", round, total);
    }
    hvd_handle_free(h);
    hvd_shutdown(e);
  }
  if (rank == 0) printf("c_api_test: %s (size %d)\n", failures ? "FAILED" : "ok", size);
  return failures ? 1 : 0;
}
