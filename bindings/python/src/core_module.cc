// hvd._core: the pybind11 module under the Python package `hvd`.
//
// It binds the public C++ API (hvd/engine.h) for both frameworks at once by taking tensors as
// raw addresses plus a dtype code and a shape that the Python layer reads from the tensor or the
// array. It includes no libtorch or NumPy headers, so it builds in seconds and does not depend on
// torch's C++ ABI; the core stays free of Python types.
//
// Ownership and threads:
//   - The module holds the one per-process Engine (g_engine). It is created by init() and
//     destroyed by shutdown() (also run at interpreter exit from hvd/__init__.py). Every
//     function that touches g_engine runs with the GIL held, which serialises them; the
//     destruction itself runs with the GIL released after g_engine has been emptied.
//   - Each enqueue returns a PyHandle that owns the engine's HandlePtr and `keep`, the Python
//     objects (input and output tensors) whose memory the engine reads or writes. `keep` is
//     dropped only once the operation has finished; a PyHandle collected earlier parks its
//     `keep` in Orphans(), which the next enqueue sweeps. Memory handed to the engine therefore
//     stays valid however the caller drops the handle.
//   - Allgather, alltoall and reducescatter results are owned by the engine's Handle (no
//     OutputAllocator, so no Python object is touched on the background thread); output()
//     exposes those bytes as a writable uint8 NumPy array that keeps the Handle alive, from
//     which the Python layer builds the result tensor without a copy.
//   - wait() releases the GIL; poll() and the accessors do not block (a pending poll yields
//     the core once).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "hvd/config.h"
#include "hvd/engine.h"

namespace py = pybind11;

namespace {

std::unique_ptr<hvd::Engine> g_engine;  // guarded by the GIL
// One init at a time: init releases the GIL while the engine starts, and a second thread's
// init meanwhile would start a second engine for the same rank (the job then saw two processes
// claim it). Taken with the GIL released, so that the thread starting the engine can take the
// GIL back.
std::mutex g_init_mu;
int64_t g_elastic_generation = 0;  // the world this process last ran (elastic jobs); GIL

// Runs fn() with the GIL released, and takes the GIL back by hand rather than in
// py::gil_scoped_release's destructor: at interpreter exit Python ends a daemon thread that
// takes the GIL back with pthread_exit, whose unwinding must not pass a noexcept frame, and a
// destructor is one (std::terminate: a rank whose daemon thread waited in an allreduce as its
// script ended died with SIGABRT, about one job in four). pybind11 lets that unwinding through.
template <typename F>
void WithoutGil(F&& fn) {
  PyThreadState* state = PyEval_SaveThread();
  try {
    fn();
  } catch (...) {
    PyEval_RestoreThread(state);
    throw;
  }
  PyEval_RestoreThread(state);
}

// A failed Status on its way to Python; translated into the exception class of its code.
struct StatusError : std::exception {
  explicit StatusError(hvd::Status s) : status(std::move(s)), text(status.ToString()) {}
  const char* what() const noexcept override { return text.c_str(); }
  hvd::Status status;
  std::string text;
};

// The Python exception classes, one per StatusCode (index = code). Owned by the module.
constexpr int kErrorClasses = 8;  // HvdError, then one per hvd::StatusCode after kOk
PyObject* g_errors[kErrorClasses] = {nullptr};

struct Orphan {
  hvd::HandlePtr handle;
  py::object keep;
};
// Guarded by the GIL. Never destroyed: it must not outlive the interpreter's objects at exit
// (shutdown() at exit empties it, as every pending operation then finishes).
std::vector<Orphan>& Orphans() {
  static auto* orphans = new std::vector<Orphan>();
  return *orphans;
}

void SweepOrphans() {
  auto& orphans = Orphans();
  if (orphans.empty()) return;
  std::vector<Orphan> still;
  for (auto& o : orphans) {
    if (!o.handle->Finished()) still.push_back(std::move(o));
  }
  orphans.swap(still);
}

// Device memory a handle owns (a device tensor's allgather, alltoall or reducescatter result),
// seen through __cuda_array_interface__ as uint8 bytes; keeps the handle alive.
struct DeviceBytes {
  hvd::HandlePtr h;
  size_t bytes;
  py::dict Interface() const {
    py::dict d;
    d["shape"] = py::make_tuple(static_cast<py::ssize_t>(bytes));
    d["typestr"] = "|u1";
    d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(h->output_data()), false);
    d["version"] = 3;
    d["strides"] = py::none();
    return d;
  }
};

// How long a wait blocks before it lets Python handle signals (PyHandle::Wait).
constexpr std::chrono::milliseconds kSignalSlice{100};

// The Python face of one operation. Thread-safety: methods are called with the GIL held;
// wait() releases it while blocking.
class PyHandle {
 public:
  PyHandle(hvd::HandlePtr h, py::object keep) : h_(std::move(h)), keep_(std::move(keep)) {}
  ~PyHandle() {
    if (keep_ && !keep_.is_none() && !h_->Finished()) Orphans().push_back({h_, std::move(keep_)});
  }

  // A pending poll yields the core (Handle::Poll) with the GIL held: the engine's threads need
  // no GIL, while taking it back from a busy Python thread could take milliseconds.
  bool Poll() const { return h_->Poll(); }

  // Waits in slices of kSignalSlice, and between slices lets Python run its signal handlers
  // (on the main thread): Ctrl-C raises KeyboardInterrupt within a slice, as in Python's own
  // blocking calls, even while the operation waits for a rank that never submits it. The
  // operation stays in flight; a later wait() takes it up again.
  void Wait() {
    hvd::Status s;
    for (;;) {
      WithoutGil([&] { s = h_->WaitFor(kSignalSlice); });
      // Finished since (while this thread took the GIL back, say): the final status, not the
      // slice's Timeout.
      if (h_->Finished()) {
        s = h_->status();
        break;
      }
      // Any other answer is final for this process (a child forked while it was pending).
      if (s.code() != hvd::StatusCode::kTimeout) break;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    // With stream-ordered completion (a handle with an event) the device work may still run:
    // the tensors it reads and writes (temporaries among them: contiguous copies, compressed
    // gradients) stay referenced until StreamWait has ordered the caller's stream after it, so
    // that the caching allocator cannot hand their memory to the caller's next kernels before.
    if (!s.ok() || h_->cuda_event() == nullptr) keep_ = py::none();
    if (!s.ok()) throw StatusError(s);
  }

  // The result bytes of allgather, alltoall and reducescatter as a uint8 array viewing the
  // handle's memory; the array keeps the handle alive.
  py::array Output() const {
    auto* owner = new hvd::HandlePtr(h_);
    py::capsule base(owner, [](void* p) { delete static_cast<hvd::HandlePtr*>(p); });
    auto* data = const_cast<uint8_t*>(h_->output_bytes().data());
    return py::array(py::dtype("uint8"), {static_cast<py::ssize_t>(h_->output_bytes().size())},
                     {1}, data, base);
  }

  // The same for a device tensor's result: `bytes` bytes of device memory.
  DeviceBytes DeviceOutput(size_t bytes) const { return DeviceBytes{h_, bytes}; }

  // Stream-ordered completion (HVD_ENABLE_ASYNC_COMPLETION): makes the CUDA stream at address
  // `stream` wait for the operation's device work; nothing without an event. The tensors kept
  // for the work (Wait) go once the stream is ordered after it.
  void StreamWait(uintptr_t stream) {
    hvd::Status s = h_->StreamWait(reinterpret_cast<void*>(stream));
    if (s.ok()) keep_ = py::none();
    if (!s.ok()) throw StatusError(s);
  }

  std::vector<int64_t> OutputShape() const { return h_->output_shape(); }
  std::vector<int64_t> ReceivedSplits() const { return h_->received_splits(); }
  int JoinLastRank() const { return h_->join_last_rank(); }
  int Code() const { return static_cast<int>(h_->status().code()); }
  std::string Message() const { return h_->status().message(); }

 private:
  hvd::HandlePtr h_;
  py::object keep_;
};

hvd::Engine& Eng() {
  if (!g_engine) {
    throw StatusError(hvd::Status::FailedPrecondition(
        "hvd has not been initialized; call hvd.init() first"));
  }
  return *g_engine;
}

hvd::DataType ToDataType(int code) {
  if (code < 0 || code >= hvd::kNumDataTypes) {
    throw StatusError(hvd::Status::InvalidArgument("unknown dtype code " + std::to_string(code)));
  }
  return static_cast<hvd::DataType>(code);
}

hvd::ReduceOp ToReduceOp(int code) {
  if (code < 0 || code >= hvd::kNumReduceOps) {
    throw StatusError(hvd::Status::InvalidArgument(
        "unknown reduce op " + std::to_string(code) +
        "; use hvd.Sum, hvd.Average, hvd.Adasum, hvd.Min, hvd.Max or hvd.Product"));
  }
  return static_cast<hvd::ReduceOp>(code);
}

// Where a tensor's memory is: an address (host memory), or a tuple (address, CUDA device
// ordinal, address of the cudaStream_t its data is ready on; 0 = the legacy default stream).
hvd::TensorView View(py::handle where, int dtype, std::vector<int64_t> shape) {
  hvd::TensorView v(nullptr, ToDataType(dtype), std::move(shape));
  if (py::isinstance<py::tuple>(where)) {
    auto t = where.cast<py::tuple>();
    if (t.size() != 3) {
      throw StatusError(hvd::Status::InvalidArgument("a device tensor is (address, device, stream)"));
    }
    v.data = reinterpret_cast<void*>(t[0].cast<uintptr_t>());
    v.device = t[1].cast<int>();
    v.stream = reinterpret_cast<void*>(t[2].cast<uintptr_t>());
  } else {
    v.data = reinterpret_cast<void*>(where.cast<uintptr_t>());
  }
  return v;
}


// An operation the engine refused as it was submitted (a name already in flight, a process set
// this rank is not in) raises at the call, as Horovod's do. Wrong arguments are negotiated, so
// that every rank fails together (Handle::refused): an async call raises at its wait.
PyHandle* Wrap(hvd::HandlePtr h, py::object keep) {
  if (h->refused()) throw StatusError(h->status());
  return new PyHandle(std::move(h), std::move(keep));
}

// `process_sets`: lists of ranks every rank adds as the engine starts (ids 1, 2, ...);
// `dynamic`: allow adding and removing sets later (as HVD_DYNAMIC_PROCESS_SETS=1);
// `mpi_comm`, `mpi_world_ranks`: the job's world as an MPI communicator (Options::mpi_comm).
void Init(std::vector<std::vector<int>> process_sets, bool dynamic,
          std::optional<int64_t> mpi_comm, std::vector<int> mpi_world_ranks) {
  if (g_engine) return;
  WithoutGil([&] { g_init_mu.lock(); });
  std::lock_guard<std::mutex> one(g_init_mu, std::adopt_lock);
  if (g_engine) return;  // another thread's init started it meanwhile: as Horovod, one engine
  hvd::StatusOr<std::unique_ptr<hvd::Engine>> e = hvd::Status::Internal("not started");
  WithoutGil([&] {
    auto o = hvd::Options::FromEnvironment();
    if (o.ok()) {
      o->process_sets = std::move(process_sets);
      o->dynamic_process_sets = o->dynamic_process_sets || dynamic;
      o->mpi_comm = mpi_comm;
      o->mpi_world_ranks = std::move(mpi_world_ranks);
      // An elastic worker's init after a shutdown joins the next world (hvd.elastic.run).
      o->elastic_after_generation = g_elastic_generation;
      e = hvd::Engine::Create(*o);
    } else {
      e = o.status();
    }
  });
  if (!e.ok()) throw StatusError(e.status());
  g_engine = std::move(*e);
  g_elastic_generation = g_engine->elastic_generation();
}

void Shutdown() {
  std::unique_ptr<hvd::Engine> e = std::move(g_engine);
  if (!e) return;
  WithoutGil([&] {
    e->Shutdown();
    e.reset();
  });
  SweepOrphans();
}

void RegisterErrors(py::module_& m) {
  static const char* kNames[kErrorClasses] = {
      nullptr,       "InvalidArgumentError", "FailedPreconditionError", "HvdTimeoutError",
      "PeerLostError", "AbortedError",       "InternalError",           "ResourceExhaustedError"};
  PyObject* base = PyErr_NewExceptionWithDoc(
      "hvd.HvdError",
      "An error reported by the hvd engine (a RuntimeError); the message is the core's.",
      PyExc_RuntimeError, nullptr);
  m.add_object("HvdError", py::handle(base));
  g_errors[0] = base;
  for (int i = 1; i < kErrorClasses; ++i) {
    std::string qual = std::string("hvd.") + kNames[i];
    // InvalidArgumentError and FailedPreconditionError are also ValueErrors, as Horovod
    // raises for bad arguments and for a call before hvd.init(), so that `except ValueError`
    // catches them.
    const bool value_error = i == static_cast<int>(hvd::StatusCode::kInvalidArgument) ||
                             i == static_cast<int>(hvd::StatusCode::kFailedPrecondition);
    PyObject* bases = value_error ? PyTuple_Pack(2, base, PyExc_ValueError) : nullptr;
    g_errors[i] = PyErr_NewException(qual.c_str(), bases ? bases : base, nullptr);
    Py_XDECREF(bases);
    m.add_object(kNames[i], py::handle(g_errors[i]));
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      int code = static_cast<int>(e.status.code());
      // The whole text, a NUL in a tensor's name included (PyErr_SetString would stop there);
      // bytes that are not UTF-8 are kept as escapes.
      PyObject* text = PyUnicode_DecodeUTF8(e.text.data(), static_cast<Py_ssize_t>(e.text.size()),
                                            "backslashreplace");
      PyObject* cls = g_errors[code > 0 && code < kErrorClasses ? code : 6];
      if (text == nullptr) {
        PyErr_Clear();
        PyErr_SetString(cls, e.what());
        return;
      }
      PyErr_SetObject(cls, text);
      Py_DECREF(text);
    }
  });
}

void BindConstants(py::module_& m) {
  m.attr("UINT8") = static_cast<int>(hvd::DataType::kUInt8);
  m.attr("INT8") = static_cast<int>(hvd::DataType::kInt8);
  m.attr("INT32") = static_cast<int>(hvd::DataType::kInt32);
  m.attr("INT64") = static_cast<int>(hvd::DataType::kInt64);
  m.attr("FLOAT16") = static_cast<int>(hvd::DataType::kFloat16);
  m.attr("BFLOAT16") = static_cast<int>(hvd::DataType::kBFloat16);
  m.attr("FLOAT32") = static_cast<int>(hvd::DataType::kFloat32);
  m.attr("FLOAT64") = static_cast<int>(hvd::DataType::kFloat64);
  m.attr("BOOL") = static_cast<int>(hvd::DataType::kBool);
  m.attr("INT16") = static_cast<int>(hvd::DataType::kInt16);
  m.attr("UINT16") = static_cast<int>(hvd::DataType::kUInt16);
  m.attr("SUM") = static_cast<int>(hvd::ReduceOp::kSum);
  m.attr("AVERAGE") = static_cast<int>(hvd::ReduceOp::kAverage);
  m.attr("MIN") = static_cast<int>(hvd::ReduceOp::kMin);
  m.attr("MAX") = static_cast<int>(hvd::ReduceOp::kMax);
  m.attr("PRODUCT") = static_cast<int>(hvd::ReduceOp::kProduct);
  m.attr("ADASUM") = static_cast<int>(hvd::ReduceOp::kAdasum);
  m.attr("HAVE_CUDA") = bool(HVD_HAVE_CUDA);
  m.attr("HAVE_NCCL") = bool(HVD_HAVE_NCCL);
  m.attr("NCCL_VERSION_CODE") = int(HVD_NCCL_VERSION_CODE);
  m.attr("HAVE_MPI") = bool(HVD_HAVE_MPI);
  m.attr("VERSION") = HVD_VERSION_STRING;
}

void BindEngine(py::module_& m) {
  m.def("init", &Init, "Creates the engine from the environment (idempotent).",
        py::arg("process_sets") = std::vector<std::vector<int>>(), py::arg("dynamic") = false,
        py::arg("mpi_comm") = std::optional<int64_t>(),
        py::arg("mpi_world_ranks") = std::vector<int>());
  m.def("dynamic_process_sets", [] { return Eng().options().dynamic_process_sets; });
  m.def("add_process_set", [](std::vector<int> ranks) {
    hvd::StatusOr<int32_t> id = hvd::Status::Internal("not run");
    hvd::Engine& e = Eng();
    WithoutGil([&] { id = e.AddProcessSet(std::move(ranks)); });
    if (!id.ok()) throw StatusError(id.status());
    return *id;
  });
  m.def("remove_process_set", [](int32_t id) {
    hvd::Status s;
    hvd::Engine& e = Eng();
    WithoutGil([&] { s = e.RemoveProcessSet(id); });
    if (!s.ok()) throw StatusError(s);
  });
  m.def("process_set_ranks", [](int32_t id) { return Eng().ProcessSetRanks(id); });
  m.def("process_set_ids", [] { return Eng().ProcessSetIds(); });
  m.def("elastic", [] { return Eng().options().elastic; },
        "Whether this rank is a worker of an elastic job (HVD_ELASTIC=1).");
  m.def("mpi_enabled", [] {
    const hvd::Options& o = Eng().options();
    return o.bootstrap == hvd::Options::Bootstrap::kMpi ||
           o.cpu_operations == hvd::Options::CpuOperations::kMpi;
  }, "Whether this job uses MPI: started by mpirun, or HVD_CPU_OPERATIONS=mpi.");
  m.def("mpi_threads_supported", [] { return Eng().mpi_threads_supported(); },
        "Whether MPI gives this process MPI_THREAD_MULTIPLE (False without MPI in use).");
  m.def("start_timeline", [](const std::string& path, bool mark_cycles) {
    hvd::Status s = Eng().StartTimeline(path, mark_cycles);
    if (!s.ok()) throw StatusError(s);
  });
  m.def("stop_timeline", [] {
    hvd::Status s = Eng().StopTimeline();
    if (!s.ok()) throw StatusError(s);
  });
  m.def("shutdown", &Shutdown, "Stops the engine; pending operations fail with AbortedError.");
  m.def("is_initialized", [] { return static_cast<bool>(g_engine); });
  m.def("hosts_updated", [] {
    hvd::StatusOr<bool> updated = false;
    hvd::Engine& e = Eng();
    WithoutGil([&] { updated = e.HostsUpdated(); });
    if (!updated.ok()) throw StatusError(updated.status());
    return *updated;
  }, "Collective: whether hvdrun has published a newer world than this engine's (elastic).");
  m.def("elastic_state_synced", [] {
    hvd::Status s;
    hvd::Engine& e = Eng();
    WithoutGil([&] { s = e.StateSynced(); });
    if (!s.ok()) throw StatusError(s);
  }, "Elastic: this worker holds the job's state now (after state.sync()).");
  m.def("elastic_generation", [] { return Eng().elastic_generation(); });
  m.def("rank", [] { return Eng().rank(); });
  m.def("size", [] { return Eng().size(); });
  m.def("local_rank", [] { return Eng().local_rank(); });
  m.def("local_size", [] { return Eng().local_size(); });
  m.def("cross_rank", [] { return Eng().cross_rank(); });
  m.def("cross_size", [] { return Eng().cross_size(); });
  m.def("dtype_name", [](int code) { return std::string(hvd::DataTypeName(ToDataType(code))); });
}

void BindReductions(py::module_& m) {
  auto ref = py::return_value_policy::take_ownership;
  m.def("allreduce",
        [](const std::string& name, py::handle in, py::handle out, int dtype,
           std::vector<int64_t> shape, int op, double pre, double post, py::object keep,
           int32_t ps) {
          SweepOrphans();
          auto v_in = View(in, dtype, shape);
          auto v_out = View(out, dtype, shape);
          return Wrap(Eng().Allreduce(name, v_in, v_out, ToReduceOp(op), pre, post, ps),
                      std::move(keep));
        },
        ref);
  m.def("grouped_allreduce",
        [](const std::vector<std::string>& names, const std::vector<py::object>& ins,
           const std::vector<py::object>& outs, const std::vector<int>& dtypes,
           const std::vector<std::vector<int64_t>>& shapes, int op, double pre, double post,
           py::object keep, int32_t ps) {
          SweepOrphans();
          std::vector<hvd::TensorView> vin, vout;
          for (size_t i = 0; i < ins.size() && i < outs.size() && i < dtypes.size() &&
                             i < shapes.size(); ++i) {
            vin.push_back(View(ins[i], dtypes[i], shapes[i]));
            vout.push_back(View(outs[i], dtypes[i], shapes[i]));
          }
          auto hs = Eng().GroupedAllreduce(names, vin, vout, ToReduceOp(op), pre, post, ps);
          py::list result;
          for (auto& h : hs) result.append(py::cast(Wrap(h, keep), py::return_value_policy::take_ownership));
          return result;
        });
  m.def("reducescatter",
        [](const std::string& name, py::handle in, int dtype, std::vector<int64_t> shape, int op,
           double pre, double post, py::object keep, int32_t ps) {
          SweepOrphans();
          return Wrap(Eng().Reducescatter(name, View(in, dtype, std::move(shape)), ToReduceOp(op),
                                          pre, post, nullptr, ps),
                      std::move(keep));
        },
        ref);
  m.def("grouped_reducescatter",
        [](const std::vector<std::string>& names, const std::vector<py::object>& ins,
           const std::vector<int>& dtypes, const std::vector<std::vector<int64_t>>& shapes, int op,
           double pre, double post, py::object keep, int32_t ps) {
          SweepOrphans();
          std::vector<hvd::TensorView> vin;
          for (size_t i = 0; i < ins.size() && i < dtypes.size() && i < shapes.size(); ++i) {
            vin.push_back(View(ins[i], dtypes[i], shapes[i]));
          }
          auto hs = Eng().GroupedReducescatter(names, vin, ToReduceOp(op), pre, post, ps);
          py::list result;
          for (auto& h : hs) result.append(py::cast(Wrap(h, keep), py::return_value_policy::take_ownership));
          return result;
        });
}

void BindGathers(py::module_& m) {
  auto ref = py::return_value_policy::take_ownership;
  m.def("allgather",
        [](const std::string& name, py::handle in, int dtype, std::vector<int64_t> shape,
           py::object keep, int32_t ps) {
          SweepOrphans();
          return Wrap(Eng().Allgather(name, View(in, dtype, std::move(shape)), nullptr, ps),
                      std::move(keep));
        },
        ref);
  m.def("grouped_allgather",
        [](const std::vector<std::string>& names, const std::vector<py::object>& ins,
           const std::vector<int>& dtypes, const std::vector<std::vector<int64_t>>& shapes,
           py::object keep, int32_t ps) {
          SweepOrphans();
          std::vector<hvd::TensorView> vin;
          for (size_t i = 0; i < ins.size() && i < dtypes.size() && i < shapes.size(); ++i) {
            vin.push_back(View(ins[i], dtypes[i], shapes[i]));
          }
          auto hs = Eng().GroupedAllgather(names, vin, ps);
          py::list result;
          for (auto& h : hs) result.append(py::cast(Wrap(h, keep), py::return_value_policy::take_ownership));
          return result;
        });
  m.def("broadcast",
        [](const std::string& name, py::handle in, py::handle out, int dtype,
           std::vector<int64_t> shape, int root, py::object keep, int32_t ps) {
          SweepOrphans();
          auto v_in = View(in, dtype, shape);
          auto v_out = View(out, dtype, shape);
          return Wrap(Eng().Broadcast(name, v_in, v_out, root, ps), std::move(keep));
        },
        ref);
  m.def("alltoall",
        [](const std::string& name, py::handle in, int dtype, std::vector<int64_t> shape,
           std::vector<int64_t> splits, py::object keep, int32_t ps) {
          SweepOrphans();
          return Wrap(Eng().Alltoall(name, View(in, dtype, std::move(shape)), splits, nullptr, ps),
                      std::move(keep));
        },
        ref);
  m.def("barrier", [](int32_t ps) { return Wrap(Eng().Barrier(ps), py::none()); }, ref);
  // The bindings' own refusals of an operation's arguments, sent so that every rank fails it.
  m.def("refuse",
        [](const std::string& op, const std::vector<std::string>& names, const std::string& why,
           int32_t ps) {
          py::list result;
          for (auto& h : Eng().Refuse(op, names, why, ps)) {
            result.append(py::cast(Wrap(h, py::none()), py::return_value_policy::take_ownership));
          }
          return result;
        });
  m.def("join", [](int device) { return Wrap(Eng().Join(device), py::none()); },
        py::arg("device") = -1, ref);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "hvd's C++ engine, bound for the hvd, hvd.numpy and hvd.torch packages";
  RegisterErrors(m);
  BindConstants(m);
  BindEngine(m);
  BindReductions(m);
  BindGathers(m);

  py::class_<DeviceBytes>(m, "DeviceBytes")
      .def_property_readonly("__cuda_array_interface__", &DeviceBytes::Interface);
  py::class_<PyHandle>(m, "Handle")
      .def("poll", &PyHandle::Poll, "True once the operation has finished.")
      .def("wait", &PyHandle::Wait,
           "Blocks (without the GIL) until the operation has finished; raises HvdError on failure.")
      .def("output", &PyHandle::Output)
      .def("device_output", &PyHandle::DeviceOutput)
      .def("stream_wait", &PyHandle::StreamWait)
      .def_property_readonly("output_shape", &PyHandle::OutputShape)
      .def_property_readonly("received_splits", &PyHandle::ReceivedSplits)
      .def_property_readonly("join_last_rank", &PyHandle::JoinLastRank)
      .def_property_readonly("code", &PyHandle::Code)
      .def_property_readonly("message", &PyHandle::Message);
}
