// Uses the installed hvd: one allreduce (sum) of a small tensor, checked against the formula.
// Works as a world of size 1 without a launcher, or under `hvdrun -np N`.
#include <cstdio>
#include <vector>

#include "hvd/engine.h"

int main() {
  auto engine = hvd::Engine::CreateFromEnvironment();
  if (!engine.ok()) {
    std::fprintf(stderr, "hvd_consumer: init failed: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  const int rank = (*engine)->rank(), size = (*engine)->size();
  std::vector<float> v(7);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((rank + 1) * (i + 1));
  hvd::TensorView t(v.data(), hvd::DataType::kFloat32, {static_cast<int64_t>(v.size())});
  hvd::Status st = (*engine)->Allreduce("consumer.v", t, t, hvd::ReduceOp::kSum)->Wait();
  if (!st.ok()) {
    std::fprintf(stderr, "hvd_consumer: allreduce failed: %s\n", st.ToString().c_str());
    return 1;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != static_cast<float>(size * (size + 1) / 2 * (i + 1))) {
      std::fprintf(stderr, "hvd_consumer: element %zu is %g\n", i, v[i]);
      return 1;
    }
  }
  if (rank == 0) std::printf("hvd_consumer: ok, ranks=%d\n", size);
  return (*engine)->Shutdown().ok() ? 0 : 1;
}
