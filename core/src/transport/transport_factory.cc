#include "transport/transport_factory.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "bootstrap/auth.h"
#include "bootstrap/elastic.h"
#include "bootstrap/store.h"
#include "common/logging.h"
#include "hvd/config.h"
#include "collectives/collectives.h"
#include "transport/device_collectives.h"
#include "transport/group_view.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/control_channel.h"
#include "transport/tcp/mesh_hello.h"
#include "transport/tcp/tcp_mesh.h"
#include "transport/tcp/tcp_transport.h"

#if HVD_HAVE_NCCL
#include "transport/nccl/nccl_collectives.h"
#endif
#if HVD_HAVE_MPI
#include "transport/mpi/mpi_bootstrap.h"
#include "transport/mpi/mpi_collectives.h"
#include "transport/mpi/mpi_context.h"
#endif

namespace hvd {

namespace {

using asio::ip::tcp;

class JobBackendsImpl : public JobBackends {
 public:
  CollectiveOffload* offload() override { return offload_; }
  void FinishEarly() override {
#if HVD_HAVE_MPI
    if (mpi && mpi->CanFinishEarly()) {
      if (collectives) collectives->ReleaseOps();
      mpi->FinishEarly();
    }
#endif
  }
  bool FinishesEarly() const override {
#if HVD_HAVE_MPI
    return mpi && mpi->CanFinishEarly();
#else
    return false;
#endif
  }

  void JobFailed(const Status& why) override {
#if HVD_HAVE_MPI
    if (mpi) mpi->Abandon(why);
#else
    (void)why;
#endif
  }

  // Members are destroyed in reverse order: the collectives before MPI.
  std::unique_ptr<StoreServer> store_server;
#if HVD_HAVE_MPI
  std::unique_ptr<MpiContext> mpi;
  std::unique_ptr<MpiCollectives> collectives;
#endif
  CollectiveOffload* offload_ = nullptr;
};

// Step 1: MPI, when the options need it.
Status StartMpi(const Options& o, JobBackendsImpl* b) {
  const bool mpi_ops = o.cpu_operations == Options::CpuOperations::kMpi;
  if (o.bootstrap != Options::Bootstrap::kMpi && !mpi_ops) return Status::OK();
#if HVD_HAVE_MPI
  auto ctx = MpiContext::Create(o, /*need_threads=*/mpi_ops);
  if (!ctx.ok()) return ctx.status();
  b->mpi = std::move(*ctx);
  if (mpi_ops) {
    b->collectives = std::make_unique<MpiCollectives>(*b->mpi);
    b->offload_ = b->collectives.get();
  }
  return Status::OK();
#else
  return Status::FailedPrecondition(
      std::string(mpi_ops ? "HVD_CPU_OPERATIONS=mpi" : "starting under mpirun without hvdrun") +
      " needs MPI, but this build of hvd has none (rebuild with -DHVD_WITH_MPI=ON, or start the "
      "job with hvdrun, which hosts a rendezvous store)");
#endif
}

// Step 2: the store to meet at; may change o.secret (kMpi without one).
StatusOr<std::unique_ptr<StoreClient>> MeetingPlace(Options* o, JobBackendsImpl* b,
                                                   Deadline deadline) {
  if (o->bootstrap == Options::Bootstrap::kMpi) {
#if HVD_HAVE_MPI
    if (o->secret.empty()) {
      auto s = MpiShareNewSecret(*b->mpi, deadline);
      if (!s.ok()) return s.status();
      o->secret = *s;
    }
    return std::unique_ptr<StoreClient>(new MpiAddressStore(*b->mpi));
#endif  // without MPI, StartMpi has failed already

  }
  if (o->bootstrap == Options::Bootstrap::kSlurm && o->rank == 0 && o->secret.empty()) {
    // srun has no launcher to draw one: anyone who reaches rank 0's store port could join.
    HVD_LOG(kWarning) << "HVD_SECRET is not set: this Slurm job's connections are not "
                         "authenticated (export HVD_SECRET=$(openssl rand -hex 32) before srun)";
  }
  std::string store_addr = o->rendezvous_addr;
  if (o->bootstrap == Options::Bootstrap::kSlurm) {
    // The steps of a batch script share its HVD_SECRET, and two steps may meet on one port (the
    // port is a hash of job and step, or HVD_RENDEZVOUS_PORT): each step's connections prove a
    // key of its own, so that a task never joins another step's job.
    const auth::Mac key = auth::Proof(o->secret, "hvd slurm step", auth::Nonce{}, auth::Nonce{},
                                      o->slurm_step);
    o->secret = auth::Hex(key.data(), key.size());
    // Rank 0 reaches the store it hosts through loopback: the node's name need not resolve on
    // the node itself.
    if (o->rank == 0) store_addr = "127.0.0.1";
  }
  if (o->bootstrap == Options::Bootstrap::kSlurm && o->rank == 0) {
    auto server = StoreServer::Start("0.0.0.0", o->rendezvous_port, o->secret,
                                     o->start_timeout_seconds);
    if (!server.ok()) {
      return server.status().WithContext(
          "under Slurm rank 0 hosts the rendezvous store on port " +
          std::to_string(o->rendezvous_port) + " (set HVD_RENDEZVOUS_PORT to a free port)");
    }
    b->store_server = std::move(*server);
  }
  auto store = StoreClient::Connect(store_addr, o->rendezvous_port, deadline, o->secret);
  if (!store.ok()) {
    // (The client's errors name the store and its address.)
    if (o->bootstrap != Options::Bootstrap::kSlurm) return store.status();
    return store.status().WithContext(
        "under Slurm rank 0 hosts the store on the step's first node, at a port derived from the "
        "job and step ids (a store that refuses this task is another step's on that port: set "
        "HVD_RENDEZVOUS_PORT; a node name that does not resolve here: set HVD_RENDEZVOUS_ADDR)");
  }
  if (!o->store_prefix.empty()) {  // one generation of an elastic job (bootstrap/elastic.h)
    return std::unique_ptr<StoreClient>(new PrefixStore(std::move(*store), o->store_prefix));
  }
  return std::move(*store);
}

// The first IPv4 address of an interface that is up and not loopback; empty if there is none.
std::string NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN] = {0};
    if (::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                    sizeof(text)) != nullptr) {
      found = text;
    }
  }
  ::freeifaddrs(list);
  return found;
}

// The address this host would reach rank 0's node from (Slurm), or its name's first address
// that is not loopback (MPI); empty if neither is known.
std::string MultiNodeRouteAddress(asio::io_context& io, const Options& o) {
  asio::error_code ec;
  if (o.bootstrap == Options::Bootstrap::kSlurm) {
    // The local address of a (never used) UDP socket connected towards rank 0's host.
    tcp::resolver resolver(io);
    auto eps = resolver.resolve(tcp::v4(), o.rendezvous_addr, std::to_string(o.rendezvous_port), ec);
    if (ec || eps.empty()) return "";
    asio::ip::udp::socket probe(io);
    asio::ip::udp::endpoint target(eps.begin()->endpoint().address(), eps.begin()->endpoint().port());
    probe.open(target.protocol(), ec);
    if (!ec) probe.connect(target, ec);
    if (ec) return "";
    return probe.local_endpoint(ec).address().to_string();
  }
  if (o.bootstrap == Options::Bootstrap::kMpi) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    tcp::resolver resolver(io);
    auto eps = resolver.resolve(tcp::v4(), host, "0", ec);
    if (ec) return "";
    for (const auto& e : eps) {
      if (!e.endpoint().address().is_loopback()) return e.endpoint().address().to_string();
    }
  }
  return "";
}

// Step 3's bind address on a multi-node job left at the loopback default; empty: keep it.
std::string MultiNodeBindAddress(asio::io_context& io, const Options& o) {
  if (o.cross_size <= 1 || o.bind_addr != "127.0.0.1") return "";
  std::string chosen = MultiNodeRouteAddress(io, o);
  // A loopback address cannot be reached from the other nodes: rank 0's node name may resolve
  // to one on that node itself (Debian's /etc/hosts maps the host's name to 127.0.1.1).
  asio::error_code ec;
  const auto parsed = asio::ip::make_address(chosen, ec);
  if (chosen.empty() || ec || parsed.is_loopback()) chosen = NonLoopbackAddress();
  return chosen;
}

}  // namespace

// Waking a sleeping (often idle, virtualised) core costs tens of microseconds per hop, so a
// rank polls first. The poll yields the core on every empty round, so ranks that outnumber the
// cores hand it to each other instead of spinning against each other.
std::chrono::microseconds SpinWindow(const Options& options) {
  if (options.spin_microseconds >= 0) return std::chrono::microseconds(options.spin_microseconds);
  return std::chrono::microseconds(100);
}

bool MpiThreadMultiple() {
#if HVD_HAVE_MPI
  int initialized = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return false;
  MPI_Query_thread(&provided);
  return provided == MPI_THREAD_MULTIPLE;
#else
  return false;
#endif
}

Status TakeIdentityFromMpi(Options* options) {
  if (!options->MpiWorldGiven()) return Status::OK();
  if (!options->launched_by_mpi && !options->mpi_comm.has_value()) {
    // A list of ranks in a job no MPI launcher started (hvdrun's, or none): every launched
    // rank in order is the world as launched, without MPI, which is what Horovod's Gloo
    // controller makes of any list; a part of it would leave the ranks not listed waiting.
    bool everyone = static_cast<int>(options->mpi_world_ranks.size()) == options->size;
    for (size_t i = 0; everyone && i < options->mpi_world_ranks.size(); ++i) {
      everyone = options->mpi_world_ranks[i] == static_cast<int>(i);
    }
    if (everyone) {
      options->mpi_world_ranks.clear();
      return Status::OK();
    }
    return Status::FailedPrecondition(
        "hvd.init(comm=[...]) names some of the ranks as the job's world, which needs the job "
        "started by mpirun (or hvdrun --mpi); this job's launcher started " +
        std::to_string(options->size) + " rank(s), and a list of all of them in order is the "
        "only one it takes");
  }
#if HVD_HAVE_MPI
  return MpiContext::TakeIdentity(options);
#else
  return Status::FailedPrecondition("hvd.init(comm=...) names the job's world through MPI, but "
                                    "this build of hvd has none (rebuild with -DHVD_WITH_MPI=ON)");
#endif
}

namespace {

std::string RanksText(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return "rank " + std::to_string(ranks[0]);
  return "ranks [" + RankList(ranks, 8) + "]";
}

std::string ToggleText(int64_t v) {
  switch (static_cast<Options::Toggle>(v)) {
    case Options::Toggle::kOn: return "on";
    case Options::Toggle::kOff: return "off";
    default: return "auto";
  }
}

// Knobs that every rank must set alike: a difference makes the ranks disagree on the response
// cache's bits or on how bytes move, and the job would fail later (or crash, or hang) with a
// message that names neither. Every rank finds the same difference and says so.
Status CheckKnobsAgree(Transport& t, const Options& o, Deadline deadline) {
  struct Knob {
    const char* name;
    int64_t value;
    std::string (*text)(int64_t);
  };
  const Knob knobs[] = {
      {"HVD_CACHE_CAPACITY", o.cache_capacity, [](int64_t v) { return std::to_string(v); }},
      {"HVD_SHM", static_cast<int64_t>(o.shm), ToggleText},
      {"HVD_CPU_OPERATIONS", static_cast<int64_t>(o.cpu_operations),
       [](int64_t v) {
         return std::string(static_cast<Options::CpuOperations>(v) ==
                                    Options::CpuOperations::kMpi ? "mpi" : "tcp");
       }},
      // Where it decides which links form (worker to worker over TCP), the connections find
      // a difference first; elsewhere the ranks would agree on the lowest without a word.
      {"HVD_SYMMETRIC_NEGOTIATION", static_cast<int64_t>(o.symmetric_negotiation), ToggleText},
      // A rank without it refuses to add a set that the others wait for it to add.
      {"HVD_DYNAMIC_PROCESS_SETS", o.dynamic_process_sets ? 1 : 0,
       [](int64_t v) { return std::string(v ? "1" : "0"); }},
  };
  constexpr size_t k = sizeof(knobs) / sizeof(knobs[0]);
  const int n = t.size();
  int64_t mine[k];
  for (size_t i = 0; i < k; ++i) mine[i] = knobs[i].value;
  std::vector<int64_t> all(static_cast<size_t>(n) * k);
  HVD_RETURN_IF_ERROR(Allgatherv(t, mine, all.data(), std::vector<size_t>(n, sizeof(mine)),
                                 deadline));
  for (size_t i = 0; i < k; ++i) {
    std::map<int64_t, std::vector<int>> ranks_of;  // value -> the ranks that have it
    for (int r = 0; r < n; ++r) ranks_of[all[static_cast<size_t>(r) * k + i]].push_back(r);
    if (ranks_of.size() == 1) continue;
    std::string what;
    for (const auto& [value, ranks] : ranks_of) {
      what += (what.empty() ? "" : ", ") + RanksText(ranks) + (ranks.size() == 1 ? " has " : " have ") +
              knobs[i].text(value);
    }
    return Status::FailedPrecondition(
        std::string(knobs[i].name) + " differs between ranks: " + what +
        "; it must be the same on every rank");
  }
  return Status::OK();
}

// The process sets every rank will add at start (InitialProcessSets), compared in two
// allgathers (their lengths, then the lists): ranks that give different ones (another number
// of sets, other ranks) all fail here saying so, where each would otherwise wait to add a set
// that some other rank never adds. A rank's list: the number of sets, then each one's size and
// ranks.
Status CheckProcessSetsAgree(Transport& t, const Options& o, Deadline deadline) {
  std::vector<int64_t> mine;
  const auto sets = InitialProcessSets(o);
  mine.push_back(static_cast<int64_t>(sets.size()));
  for (const auto& s : sets) {
    mine.push_back(static_cast<int64_t>(s.size()));
    mine.insert(mine.end(), s.begin(), s.end());
  }
  const int n = t.size();
  int64_t len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(static_cast<size_t>(n));
  HVD_RETURN_IF_ERROR(Allgatherv(t, &len, lens.data(), std::vector<size_t>(n, sizeof(len)),
                                 deadline));
  std::vector<size_t> bytes(static_cast<size_t>(n));
  size_t total = 0;
  for (int r = 0; r < n; ++r) {
    if (lens[r] < 1 || lens[r] > (int64_t{1} << 24)) {
      return Status::Internal("comparing the process sets given at start: rank " +
                              std::to_string(r) + " sent a list of " + std::to_string(lens[r]) +
                              " numbers");
    }
    bytes[r] = static_cast<size_t>(lens[r]) * sizeof(int64_t);
    total += static_cast<size_t>(lens[r]);
  }
  std::vector<int64_t> all(total);
  HVD_RETURN_IF_ERROR(Allgatherv(t, mine.data(), all.data(), bytes, deadline));
  // Each rank's list again (a block that does not parse reads as far as it goes), compared with
  // rank 0's.
  std::vector<std::vector<std::vector<int64_t>>> gave(static_cast<size_t>(n));
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    const size_t end = at + static_cast<size_t>(lens[r]);
    for (size_t i = at + 1; static_cast<int64_t>(gave[r].size()) < all[at] && i < end;) {
      const size_t m = std::min(static_cast<size_t>(std::max<int64_t>(all[i], 0)), end - i - 1);
      gave[r].emplace_back(all.begin() + i + 1, all.begin() + i + 1 + m);
      i += 1 + m;
    }
    at = end;
  }
  std::string differ;
  bool same = true;
  for (int r = 0; r < n; ++r) {
    same = same && gave[r] == gave[0];
    std::string sets;
    for (const auto& set : gave[r]) sets += (sets.empty() ? "" : ", ") + ShapeToString(set);
    differ += (r ? ", rank " : "rank ") + std::to_string(r) + " [" + sets + "]";
  }
  if (same) return Status::OK();
  return Status::InvalidArgument(
      "the process sets given at start (hvd.init(process_sets=...), Options::process_sets) "
      "differ across ranks; every rank must give the same sets in the same order (sets equal "
      "to the world or to an earlier one left out): " + differ);
}

}  // namespace

std::vector<std::vector<int>> InitialProcessSets(const Options& o) {
  std::vector<std::vector<int>> added(1, std::vector<int>(o.size));
  for (int r = 0; r < o.size; ++r) added[0][r] = r;
  for (const auto& given : o.process_sets) {
    std::vector<int> ranks = given;
    std::sort(ranks.begin(), ranks.end());
    if (std::find(added.begin(), added.end(), ranks) != added.end()) continue;
    added.push_back(ranks);
  }
  added.erase(added.begin());
  return added;
}

StatusOr<JobConnections> ConnectJob(asio::io_context& io, const Options& options,
                                    Deadline deadline, ControlLink::MessageFn on_message,
                                    ControlLink::ErrorFn on_error) {
  auto backends = std::make_unique<JobBackendsImpl>();
  if (options.size == 1) {
    // A world of one that mpirun started, or named through MPI (hvd.init(comm=...)): MPI is
    // started (and finalized at shutdown where hvd started it), as for a larger one, so that
    // the program may use it alongside hvd.
    if (options.MpiWorldGiven() || options.bootstrap == Options::Bootstrap::kMpi) {
      HVD_RETURN_IF_ERROR(StartMpi(options, backends.get()));
    }
    JobConnections job;
    job.transport = std::make_unique<TcpTransport>(
        io, 0, std::vector<std::unique_ptr<asio::ip::tcp::socket>>(1));
    job.topology.host_of = {0};
    job.all_linked = true;
    job.backends = std::move(backends);
    return job;
  }
  Options o = options;
  HVD_RETURN_IF_ERROR(StartMpi(o, backends.get()));
  auto store = MeetingPlace(&o, backends.get(), deadline);
  if (!store.ok()) return store.status();
  std::string bind = MultiNodeBindAddress(io, o);
  if (!bind.empty()) {
    HVD_LOG(kInfo) << "multi-node job: listening on " << bind << " (set HVD_BIND_ADDR to choose)";
    o.bind_addr = bind;
  }
  auto mesh = TcpMesh::Create(io, o, **store, deadline);
  if (!mesh.ok()) return mesh.status();
  JobConnections job;
  // Step 4. A collective fails when a peer's bytes stop moving for HVD_TIMEOUT_SECONDS, however
  // long a large buffer takes on a slow link.
  auto tcp = std::make_unique<TcpTransport>(
      io, o.rank, std::move((*mesh)->data), SpinWindow(o),
      std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(o.timeout_seconds)));
  // A rank that fails from here on leaves its reason in the store, and a rank whose peer
  // closed its connection passes on the reason that peer left, as the mesh does. The note is
  // written at once (a failed transport has closed its connections, and peers look for it
  // within half a second), provisional while the peer's own reason is still being read. A
  // timeout is relayed too: in a ring step every rank behind a stopped one times out at about
  // the same moment, each on its own neighbour, and only the stopped rank's neighbour (whose
  // peer leaves no note) names the rank that stopped; the others pass that on.
  auto give_up = [&](Status s, int lost) {
    const bool relay = s.code() == StatusCode::kPeerLost || s.code() == StatusCode::kTimeout;
    LeaveGaveUpNote(**store, o.rank, s, /*provisional=*/relay);
    if (!relay) return s;
    Status explained = ExplainLostPeer(**store, lost, s);
    LeaveGaveUpNote(**store, o.rank, explained);
    return explained;
  };
  // The job's layout, for the local and cross views (hierarchical collectives).
  auto topology = GatherTopology(*tcp, o.local_rank, o.local_size, o.cross_rank, o.cross_size,
                                 ThisHostKey(), deadline, &job.layout_note);
  if (!topology.ok()) {
    return give_up(topology.status().WithContext("exchanging the job's layout"),
                   tcp->lost_peer());
  }
  job.topology = std::move(*topology);
  Status agree = CheckKnobsAgree(*tcp, o, deadline);
  if (agree.ok()) agree = CheckProcessSetsAgree(*tcp, o, deadline);
  if (!agree.ok()) return give_up(agree, tcp->lost_peer());
  // MPI's collectives from here on (HVD_CPU_OPERATIONS=mpi): the exchanges above go over TCP on
  // every rank, so that ranks that differ on it learn so instead of waiting for each other.
  tcp->set_offload(backends->offload());
  // Shared memory among the ranks of each host (transport/shm/shm_transport.h): the router
  // over it and TCP, or TCP alone.
  int lost = -1;
  auto transport = ConnectSharedMemory(tcp, o, deadline, &lost);
  if (!transport.ok()) return give_up(transport.status(), lost);
  job.transport = std::move(*transport);
  // Step 5. A peer on this host gets its link through shared memory (both ends decide alike:
  // the ranks of a host agree on who shares its segments), and its TCP connection is closed.
  auto shm_control = SharedMemoryControl(*job.transport);
  job.poller = shm_control;
  // Whether every rank links to every other: with every rank on this host sharing memory (the
  // ranks of a host agree on who shares its segments), in a job of two, or over the mesh's
  // control connections between workers (WorkerLinks: with HVD_SYMMETRIC_NEGOTIATION=on every
  // rank of such a job has them, since the mesh formed). Every rank finds the same. Then a
  // worker's links to the other workers (the symmetric fast path, engine/rounds.cc) go in
  // `peers`: through shared memory to a worker of this host (both ends make them), else over
  // their control connection.
  job.links_in_memory = shm_control != nullptr;
  for (int peer = 0; peer < o.size; ++peer) {
    if (peer != o.rank) job.links_in_memory = job.links_in_memory && shm_control->Has(peer);
  }
  job.all_linked = o.size <= 2 || job.links_in_memory ||
                   WorkerLinks(o.size, o.symmetric_negotiation == Options::Toggle::kOn);
  auto& control = (*mesh)->control;
  const bool worker = o.rank != 0;
  job.control.resize(worker ? 1 : o.size);
  if (worker && job.all_linked) job.peers.resize(o.size);
  for (int peer = 0; peer < o.size; ++peer) {
    if (peer == o.rank) continue;
    const bool to_peer = !worker || peer == 0 || job.all_linked;
    std::unique_ptr<asio::ip::tcp::socket> tcp;  // closed as it goes, unless a link takes it
    if (static_cast<size_t>(peer) < control.size()) tcp = std::move(control[peer]);
    std::shared_ptr<ControlLink> link;
    if (shm_control && shm_control->Has(peer)) {
      if (to_peer) link = shm_control->Link(peer, on_message, on_error);
    } else if (tcp && to_peer) {
      auto channel = std::make_shared<ControlChannel>(peer, std::move(tcp), on_message, on_error);
      channel->Start();
      job.control_over_tcp = true;
      link = std::move(channel);
    }
    if (!worker || peer == 0) {
      job.control[worker ? 0 : peer] = std::move(link);
    } else if (job.all_linked) {
      job.peers[peer] = std::move(link);
    }
  }
  job.backends = std::move(backends);
  if (o.bootstrap == Options::Bootstrap::kStore && !(*store)->collective()) {
    job.store = std::move(*store);
  }
  return job;
}

// Device collectives: NCCL where the build has it; a build without stages device tensors
// through host memory (engine/execute_device.cc). Tests may install a stand-in.
namespace {
std::mutex g_device_collectives_mu;
DeviceCollectivesFactory g_device_collectives_for_testing;

DeviceCollectivesFactory DeviceCollectivesForTesting() {
  std::lock_guard<std::mutex> l(g_device_collectives_mu);
  return g_device_collectives_for_testing;
}
}  // namespace

void SetDeviceCollectivesForTesting(DeviceCollectivesFactory factory) {
  std::lock_guard<std::mutex> l(g_device_collectives_mu);
  g_device_collectives_for_testing = std::move(factory);
}

bool DeviceCollectivesBuilt() { return HVD_HAVE_NCCL || DeviceCollectivesForTesting() != nullptr; }

StatusOr<std::unique_ptr<DeviceCollectives>> CreateDeviceCollectives(Transport& world,
                                                                     Device& device,
                                                                     Deadline deadline,
                                                                     PollFn poll) {
  if (DeviceCollectivesFactory f = DeviceCollectivesForTesting()) {
    return f(world, device, deadline, std::move(poll));
  }
#if HVD_HAVE_NCCL
  return CreateNcclCollectives(world, device, deadline, std::move(poll));
#else
  return Status::FailedPrecondition("this build has no NCCL");
#endif
}

}  // namespace hvd
