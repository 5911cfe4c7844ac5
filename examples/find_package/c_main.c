/* Uses the installed hvd's C API: one allreduce (sum), checked against the formula. Runs as a
 * world of size 1 without a launcher, or under `hvdrun -np N`. */
#include <stdio.h>

#include "hvd_c.h"

int main(void) {
  hvd_error* err = NULL;
  hvd_engine* e = hvd_init(&err);
  if (!e) {
    fprintf(stderr, "hvd_c_consumer: init failed: %s\n", hvd_error_message(err));
    hvd_error_free(err);
    return 1;
  }
  const int rank = hvd_rank(e), size = hvd_size(e);
  float v[5];
  for (int i = 0; i < 5; ++i) v[i] = (float)((rank + 1) * (i + 1));
  const int64_t n = 5;
  hvd_handle* h = hvd_allreduce(e, "c_consumer.v", v, v, HVD_FLOAT32, 1, &n, HVD_SUM, 1.0, 1.0);
  int rc = hvd_wait(h, -1, &err);
  hvd_handle_free(h);
  if (rc != HVD_OK) {
    fprintf(stderr, "hvd_c_consumer: allreduce failed: %s\n", hvd_error_message(err));
    hvd_error_free(err);
    return 1;
  }
  for (int i = 0; i < 5; ++i) {
    if (v[i] != (float)(size * (size + 1) / 2 * (i + 1))) {
      fprintf(stderr, "hvd_c_consumer: element %d is %g\n", i, (double)v[i]);
      return 1;
    }
  }
  if (rank == 0) printf("hvd_c_consumer: ok, ranks=%d\n", size);
  hvd_shutdown(e);
  return 0;
}
