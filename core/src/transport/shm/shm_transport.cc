#include "transport/shm/shm_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <deque>
#include <map>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/auth.h"
#include "collectives/collectives.h"
#include "common/cpu_relax.h"
#include "common/descriptors.h"
#include "common/logging.h"
#include "reduce/reduce.h"
#include "transport/collective_offload.h"
#include "transport/group_view.h"
#include "transport/tcp/control_channel.h"
#include "transport/transport_factory.h"

namespace hvd {

namespace {

// Each pair's data ring (one per direction, in the receiver's segment) holds up to 1 MiB, less on
// hosts of more than 33 ranks: a rank's rings in all hold at most 32 MiB (at least 64 KiB each).
// A ring's pages are touched as bytes go through it, so a host's rings could otherwise take
// ranks^2 MiB (16 GiB for an alltoall at 128 ranks).
constexpr size_t kMaxRingBytes = size_t{1} << 20;
constexpr size_t kRingBudgetBytes = size_t{32} << 20;
constexpr size_t kMinRingBytes = size_t{64} << 10;
constexpr uint64_t kShmBit = uint64_t{1} << 63;

// The head of a segment. `sleeping` is the owner's doorbell flag: set while its rank sleeps in
// the io_context; a peer that moves bytes or advances a counter the rank may be waiting for
// rings the rank's eventfd then. The counters are the owner's progress through the chunks of
// shared-memory allreduces (ShmCollectives): the last chunk it published its input of, reduced
// its share of, and finished.
struct alignas(64) Doorbell {
  std::atomic<uint32_t> sleeping;
  // Set while the owner's background thread polls its control rings (ShmControl): senders then
  // do not ring its eventfd.
  std::atomic<uint32_t> polling;
  alignas(64) std::atomic<uint64_t> published;
  alignas(64) std::atomic<uint64_t> reduced;
  alignas(64) std::atomic<uint64_t> finished;
};

// Shared-memory allreduce: chunks of up to kChunkBytes, two in flight (double buffers).
constexpr size_t kChunkBytes = size_t{1} << 20;
// Chunks up to this size are reduced whole by every rank (one step); larger ones are split
// into one share per rank, reduced by that rank, and gathered.
constexpr size_t kOneStepBytes = 32 << 10;
constexpr size_t kCollectiveBytes = 4 * kChunkBytes;  // in[2], out[2]

// One direction between two ranks, in the receiver's segment.
struct alignas(64) RingHeader {
  std::atomic<uint64_t> head;  // bytes the sender has written, in all
  char pad0[64 - sizeof(std::atomic<uint64_t>)];
  std::atomic<uint64_t> tail;  // bytes the receiver has taken, in all
  char pad1[64 - sizeof(std::atomic<uint64_t>)];
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "rings need lock-free 64-bit atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "doorbells need lock-free atomics");

// One direction of a control link (ShmControl), in the receiver's segment: framed messages as
// over TCP, and `closed`, raised by the sender after its last bytes when it closes the link.
// Up to 256 KiB, and 8 MiB per rank in all (at least 16 KiB each), as the data rings.
constexpr size_t kMaxControlRingBytes = size_t{256} << 10;
constexpr size_t kControlBudgetBytes = size_t{8} << 20;
constexpr size_t kMinControlRingBytes = size_t{16} << 10;
struct alignas(64) ControlHeader {
  RingHeader ring;
  std::atomic<uint32_t> closed;
  char pad[64 - sizeof(std::atomic<uint32_t>)];
};

// The largest power of two up to budget / (slots - 1), within [least, most].
size_t RingCapacity(int slots, size_t budget, size_t least, size_t most) {
  const size_t share = budget / static_cast<size_t>(std::max(slots - 1, 1));
  size_t cap = most;
  while (cap > least && cap > share) cap /= 2;
  return cap;
}
size_t DataRingBytes(int slots) {
  return RingCapacity(slots, kRingBudgetBytes, kMinRingBytes, kMaxRingBytes);
}
size_t ControlRingBytes(int slots) {
  return RingCapacity(slots, kControlBudgetBytes, kMinControlRingBytes, kMaxControlRingBytes);
}

size_t SegmentBytes(int slots) {
  return sizeof(Doorbell) + kCollectiveBytes +
         static_cast<size_t>(slots) * (sizeof(RingHeader) + DataRingBytes(slots) +
                                       sizeof(ControlHeader) + ControlRingBytes(slots));
}

// One rank's segment as mapped here, and its bell.
struct Segment {
  uint8_t* base = nullptr;
  size_t bytes = 0;
  int bell_fd = -1;
  int pid_fd = -1;  // the owner's process (pidfd), readable once it has exited; -1 for this rank
  size_t ring_cap = kMaxRingBytes;             // DataRingBytes of the host's ranks
  size_t control_cap = kMaxControlRingBytes;   // ControlRingBytes of them

  Doorbell* bell() const { return reinterpret_cast<Doorbell*>(base); }
  // The owner's input of a chunk (buffer b of 2), and its reduced share of it.
  uint8_t* in(int b) const { return base + sizeof(Doorbell) + b * kChunkBytes; }
  uint8_t* out(int b) const { return base + sizeof(Doorbell) + (2 + b) * kChunkBytes; }
  size_t slot_bytes() const { return sizeof(RingHeader) + ring_cap; }
  RingHeader* ring(int slot) const {
    return reinterpret_cast<RingHeader*>(base + sizeof(Doorbell) + kCollectiveBytes +
                                         slot * slot_bytes());
  }
  uint8_t* data(int slot) const { return reinterpret_cast<uint8_t*>(ring(slot) + 1); }
  // The control ring from the rank of `slot` to the owner.
  ControlHeader* control(int slot, int slots) const {
    return reinterpret_cast<ControlHeader*>(base + sizeof(Doorbell) + kCollectiveBytes +
                                            slots * slot_bytes() +
                                            slot * (sizeof(ControlHeader) + control_cap));
  }
  uint8_t* control_data(int slot, int slots) const {
    return reinterpret_cast<uint8_t*>(control(slot, slots) + 1);
  }
};

// Copies between a ring's data (`cap` bytes) and a caller's buffer at stream position `pos`
// (wrapping).
void CopyIntoRing(uint8_t* ring, uint64_t pos, const uint8_t* src, size_t n, size_t cap) {
  const size_t at = pos % cap, first = std::min(n, cap - at);
  std::memcpy(ring + at, src, first);
  std::memcpy(ring, src + first, n - first);
}

void CopyOutOfRing(const uint8_t* ring, uint64_t pos, uint8_t* dst, size_t n, size_t cap) {
  const size_t at = pos % cap, first = std::min(n, cap - at);
  std::memcpy(dst, ring + at, first);
  std::memcpy(dst + first, ring, n - first);
}

// Maps [p, p + n) of a segment into this process up front (MADV_POPULATE_WRITE or _READ, which
// change no byte); where the kernel lacks them (before 5.14) the pages fault in as used.
void Prefault(uint8_t* p, size_t n, bool write) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n + page - 1) & ~(page - 1);
  ::madvise(reinterpret_cast<void*>(lo), hi - lo, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
}

// How often a spinning wait also polls the io_context (a syscall) and yields the core.
constexpr auto kPollEvery = std::chrono::microseconds(20);

void Unmap(std::vector<Segment>& segments) {
  for (Segment& s : segments) {
    if (s.base) ::munmap(s.base, s.bytes);
    if (s.bell_fd >= 0) ::close(s.bell_fd);
    if (s.pid_fd >= 0) ::close(s.pid_fd);
    s = Segment{};
  }
}

// Called after publishing head or tail. The fence orders that store before the load of the
// flag (a store may otherwise still sit in this core's store buffer when the load runs): with
// the sleeper's seq_cst store of the flag before its last look at the rings, either it sees the
// bytes or this sees the flag.
void WriteBell(const Segment& s) {
  uint64_t one = 1;
  ssize_t n = ::write(s.bell_fd, &one, sizeof(one));
  (void)n;  // a full counter already wakes the reader
}

void Ring(const Segment& s) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (s.bell()->sleeping.load(std::memory_order_relaxed)) WriteBell(s);
}

// ---------------------------------------------------------------- the control plane

// Control links to the ranks of this host through their segments' control rings: the same
// frames as over TCP (transport/tcp/control_channel.h), without a syscall while both ends poll.
//
//   - Send appends the frame to the link's outgoing bytes and copies what fits into the ring
//     in the peer's segment; the rest goes as the peer frees space. It rings the peer's eventfd
//     unless the peer's `polling` flag is up; a receiver that frees space in a ring its sender
//     had filled rings the sender, whose outgoing bytes may be waiting for it.
//   - Poll moves bytes both ways on every link and hands each complete frame to the link's
//     message callback. The engine calls it while it spins (with `polling` up) and once after
//     lowering the flag before it sleeps, so a sender either sees the flag down and rings, or
//     its bytes are seen by that last look; the io_context calls it whenever the eventfd rings.
//   - Close raises `closed` after the last bytes; the peer reports the link closed once it has
//     read them all. A peer whose process exited (pidfd) is reported once what it wrote is read,
//     so a message it sent before exiting (shutdown, abort) comes first, as over TCP.
class ShmControl : public ShmControlPlane, public std::enable_shared_from_this<ShmControl> {
 public:
  ShmControl(int rank, std::vector<int> slot_of, int my_slot, const std::vector<Segment>* segments)
      : rank_(rank), slot_of_(std::move(slot_of)), my_slot_(my_slot), segments_(segments),
        links_(slot_of_.size()) {}

  bool Has(int peer) const override {
    return peer >= 0 && peer < static_cast<int>(slot_of_.size()) && peer != rank_ &&
           slot_of_[peer] >= 0;
  }

  std::shared_ptr<ControlLink> Link(int peer, ControlLink::MessageFn on_message,
                                    ControlLink::ErrorFn on_error) override;

  bool Poll() override {
    if (!segments_ || polling_now_) return false;
    polling_now_ = true;
    bool moved = false;
    for (int p = 0; p < static_cast<int>(links_.size()); ++p) {
      if (links_[p].used && links_[p].open) moved = Move(p) || moved;
    }
    polling_now_ = false;
    return moved;
  }

  void SetPolling(bool on) override {
    if (!segments_) return;
    own().bell()->polling.store(on ? 1 : 0, std::memory_order_seq_cst);
  }
  bool polling() const {
    return segments_ && own().bell()->polling.load(std::memory_order_relaxed) != 0;
  }

  // The link's state, for ShmControlLink.
  bool open(int peer) const { return links_[peer].open; }
  bool idle(int peer) const { return links_[peer].out_at == links_[peer].out.size(); }

  void Send(int peer, uint8_t type, const std::vector<uint8_t>& payload) {
    State& l = links_[peer];
    if (!l.open || !segments_) return;
    uint8_t header[kControlHeaderBytes];
    const uint32_t len = static_cast<uint32_t>(payload.size() + 1);
    std::memcpy(header, &len, 4);
    header[4] = type;
    if (l.out_at == l.out.size()) {
      l.out.clear();
      l.out_at = 0;
    }
    l.out.insert(l.out.end(), header, header + sizeof(header));
    l.out.insert(l.out.end(), payload.begin(), payload.end());
    Flush(peer);
  }

  void Close(int peer) {
    State& l = links_[peer];
    if (!l.open) return;
    l.open = false;
    if (!segments_) return;
    Flush(peer);  // what fits; the rest is dropped, as a TCP close drops its queue
    ControlHeader* h = theirs(peer).control(my_slot_, slots());
    h->closed.store(1, std::memory_order_release);
    Ring(theirs(peer), /*always=*/true);
  }

  // From the router's pidfd watch: reports the link once what the peer wrote has been read.
  void PeerExited(int peer) {
    if (!Has(peer)) return;
    links_[peer].exited = true;
    if (links_[peer].used && links_[peer].open) Move(peer);
  }

  // The router is going away with the segments.
  void Detach() { segments_ = nullptr; }

 private:
  struct State {
    bool used = false;  // a link was made
    bool open = false;
    bool exited = false;
    ControlLink::MessageFn on_message;
    ControlLink::ErrorFn on_error;
    std::vector<uint8_t> out;  // frames not yet in the ring: out[out_at..]
    size_t out_at = 0;
    std::vector<uint8_t> in;  // bytes of frames not complete yet
  };

  int slots() const { return static_cast<int>(segments_->size()); }
  const Segment& own() const { return (*segments_)[my_slot_]; }
  const Segment& theirs(int peer) const { return (*segments_)[slot_of_[peer]]; }

  // As the data plane's Ring, with the receiver's `polling` flag instead of `sleeping`.
  void Ring(const Segment& s, bool always = false) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (always || !s.bell()->polling.load(std::memory_order_relaxed)) WriteBell(s);
  }

  // Copies what fits of the outgoing bytes into the peer's ring. True if any moved.
  bool Flush(int peer) {
    State& l = links_[peer];
    if (l.out_at == l.out.size()) return false;
    ControlHeader* h = theirs(peer).control(my_slot_, slots());
    uint8_t* data = theirs(peer).control_data(my_slot_, slots());
    const uint64_t head = h->ring.head.load(std::memory_order_relaxed);
    const uint64_t tail = h->ring.tail.load(std::memory_order_acquire);
    const size_t cap = theirs(peer).control_cap;
    const size_t n = std::min<size_t>(l.out.size() - l.out_at, cap - (head - tail));
    if (n == 0) return false;
    CopyIntoRing(data, head, l.out.data() + l.out_at, n, cap);
    l.out_at += n;
    h->ring.head.store(head + n, std::memory_order_release);
    Ring(theirs(peer));
    return true;
  }

  // Flushes to the peer, reads from it and dispatches complete frames. True if bytes moved.
  bool Move(int peer) {
    State& l = links_[peer];
    bool moved = Flush(peer);
    ControlHeader* h = own().control(slot_of_[peer], slots());
    const uint8_t* data = own().control_data(slot_of_[peer], slots());
    const uint32_t closed = h->closed.load(std::memory_order_acquire);
    const uint64_t tail = h->ring.tail.load(std::memory_order_relaxed);
    const uint64_t head = h->ring.head.load(std::memory_order_acquire);
    if (head != tail) {
      const size_t n = static_cast<size_t>(head - tail);
      const size_t at = l.in.size();
      l.in.resize(at + n);
      CopyOutOfRing(data, tail, l.in.data() + at, n, own().control_cap);
      h->ring.tail.store(head, std::memory_order_release);
      if (n == own().control_cap) Ring(theirs(peer));  // it may have bytes waiting for space
      moved = true;
    }
    size_t used = 0;
    while (l.open && l.in.size() - used >= kControlHeaderBytes) {
      uint32_t len;
      uint8_t type;
      std::string why;
      if (!ParseControlHeader(l.in.data() + used, &len, &type, &why)) {
        Fail(peer, why);
        return true;
      }
      if (l.in.size() - used - kControlHeaderBytes < len) break;
      const uint8_t* body = l.in.data() + used + kControlHeaderBytes;
      std::vector<uint8_t> payload(body, body + len);
      used += kControlHeaderBytes + len;
      l.on_message(peer, type, std::move(payload));  // may send, close or abort
    }
    if (used) l.in.erase(l.in.begin(), l.in.begin() + static_cast<std::ptrdiff_t>(used));
    // Everything the peer wrote has been read: a closed link or an exited process is reported.
    if (l.open && (closed || l.exited) &&
        h->ring.head.load(std::memory_order_acquire) == h->ring.tail.load(std::memory_order_relaxed)) {
      Fail(peer, closed ? "connection closed by the peer" : "its process exited");
    }
    return moved;
  }

  void Fail(int peer, const std::string& what) {
    State& l = links_[peer];
    if (!l.open) return;
    Close(peer);
    l.on_error(peer, what);
  }

  const int rank_;
  const std::vector<int> slot_of_;
  const int my_slot_;
  const std::vector<Segment>* segments_;  // the router's; null once it is gone
  std::vector<State> links_;               // [peer]
  bool polling_now_ = false;               // Poll is running (a callback must not re-enter it)
};

class ShmControlLink : public ControlLink {
 public:
  ShmControlLink(std::shared_ptr<ShmControl> plane, int peer)
      : plane_(std::move(plane)), peer_(peer) {}
  int peer() const override { return peer_; }
  bool open() const override { return plane_->open(peer_); }
  bool idle() const override { return plane_->idle(peer_); }
  void Send(uint8_t type, std::shared_ptr<const std::vector<uint8_t>> payload) override {
    plane_->Send(peer_, type, *payload);
  }
  void Close() override { plane_->Close(peer_); }

 private:
  std::shared_ptr<ShmControl> plane_;
  const int peer_;
};

std::shared_ptr<ControlLink> ShmControl::Link(int peer, ControlLink::MessageFn on_message,
                                              ControlLink::ErrorFn on_error) {
  if (!Has(peer) || links_[peer].used) return nullptr;
  State& l = links_[peer];
  l.used = true;
  l.open = true;
  l.on_message = std::move(on_message);
  l.on_error = std::move(on_error);
  // What the peer already sent is read by the next Poll, once the engine runs: the callbacks
  // must not run while the factory is still setting the job up.
  return std::make_shared<ShmControlLink>(shared_from_this(), peer);
}

// ---------------------------------------------------------------- the router

// The pieces of a fused allreduce (AllreducePiece) as one logical buffer, found by element
// offset.
class PieceLayout {
 public:
  explicit PieceLayout(const std::vector<AllreducePiece>& pieces) : pieces_(pieces) {
    starts_.reserve(pieces.size());
    for (const auto& q : pieces) {
      starts_.push_back(total_);
      total_ += q.count;
    }
  }
  size_t total() const { return total_; }
  // Calls f(piece, offset in the piece, offset in the range, elements) for each part of
  // [lo, lo + len) in order (len <= total() - lo).
  template <typename F>
  void ForEach(size_t lo, size_t len, F f) const {
    if (len == 0) return;
    size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), lo) -
                                   starts_.begin()) - 1;
    for (size_t done = 0; done < len; ++i) {
      const size_t off = lo + done - starts_[i];
      const size_t take = std::min(pieces_[i].count - off, len - done);
      if (take > 0) f(pieces_[i], off, done, take);
      done += take;
    }
  }

 private:
  const std::vector<AllreducePiece>& pieces_;
  std::vector<size_t> starts_;
  size_t total_ = 0;
};

class ShmRouter;

// Whole collectives over the segments when every rank of the job shares this host: allreduce
// reads the peers' inputs straight from their segments (ShmRouter::ShmAllreduce). The rest is
// left to hvd's algorithms over the rings.
class ShmCollectives : public CollectiveOffload {
 public:
  explicit ShmCollectives(ShmRouter* router) : router_(router) {}
  // Its waits run the io_context, and with it the control plane, themselves (ShmRouter::Wait).
  void SetWaitPoll(std::function<Status()>) override {}
  std::optional<Status> Allreduce(void* buf, size_t count, DataType dtype, ReduceOp op,
                                  Deadline deadline) override;
  bool OffersAllreducePieces() const override { return true; }
  Status AllreducePieces(const std::vector<AllreducePiece>& pieces, DataType dtype, ReduceOp op,
                         double prescale, Deadline deadline) override;
  std::optional<Status> Allgatherv(const void*, void*, const std::vector<size_t>&,
                                   Deadline) override {
    return std::nullopt;
  }
  std::optional<Status> Broadcast(void*, size_t, int, Deadline) override { return std::nullopt; }
  std::optional<Status> Alltoallv(const void*, const std::vector<size_t>&, void*,
                                  const std::vector<size_t>&, Deadline) override {
    return std::nullopt;
  }
  std::optional<Status> ReduceScatter(const void*, void*, const std::vector<size_t>&, DataType,
                                      ReduceOp, Deadline) override {
    return std::nullopt;
  }
  std::optional<Status> Barrier(Deadline) override { return std::nullopt; }

 private:
  ShmRouter* router_;
};

class ShmRouter : public Transport {
 public:
  ShmRouter(std::unique_ptr<TcpTransport> tcp, std::vector<int> slot_of, int my_slot,
            std::vector<Segment> segments, std::chrono::microseconds spin,
            Clock::duration progress_window)
      : tcp_(std::move(tcp)),
        io_(tcp_->io()),
        slot_of_(std::move(slot_of)),
        my_slot_(my_slot),
        segments_(std::move(segments)),
        peers_(slot_of_.size()),
        spin_(spin),
        progress_window_(progress_window),
        bell_(std::make_shared<BellReader>(io_)),
        collectives_(this),
        control_(std::make_shared<ShmControl>(tcp_->rank(), slot_of_, my_slot_, &segments_)) {
    // MPI's collectives when asked for (HVD_CPU_OPERATIONS=mpi); else, when every rank shares
    // this host, allreduce straight through the segments.
    const bool all_local =
        std::all_of(slot_of_.begin(), slot_of_.end(), [](int slot) { return slot >= 0; });
    set_offload(tcp_->offload() ? tcp_->offload() : all_local ? &collectives_ : nullptr);
    // The io_context reads this rank's eventfd, so that a ring wakes a sleeping wait.
    bell_->fd.assign(::fcntl(segments_[my_slot_].bell_fd, F_DUPFD_CLOEXEC, 0));
    bell_->control = control_;
    ArmBell(bell_);
    // Each peer's process: its exit fails what cannot complete any more.
    for (int p = 0; p < size(); ++p) {
      if (!IsShm(p)) continue;
      auto w = std::make_shared<PidWatch>(io_);
      w->fd.assign(::fcntl(segments_[slot_of_[p]].pid_fd, F_DUPFD_CLOEXEC, 0));
      std::weak_ptr<ShmControl> control = control_;
      w->fd.async_wait(asio::posix::stream_descriptor::wait_read,
                       [w, p, control](const asio::error_code& ec) {
                         if (ec) return;
                         w->exited = true;
                         if (auto c = control.lock()) c->PeerExited(p);
                       });
      peers_[p].watch = w;
    }
  }

  ~ShmRouter() override {
    control_->Detach();
    bell_->stopped = true;
    asio::error_code ec;
    bell_->fd.cancel(ec);
    bell_->fd.close(ec);
    for (auto& p : peers_) {
      if (p.watch) {
        p.watch->fd.cancel(ec);
        p.watch->fd.close(ec);
      }
    }
    tcp_.reset();  // runs the io_context until the cancelled handlers are done
    Unmap(segments_);
  }

  int rank() const override { return tcp_->rank(); }
  int size() const override { return tcp_->size(); }

  TransportRequest Isend(int peer, const void* buf, size_t len) override {
    return Post(peer, static_cast<uint8_t*>(const_cast<void*>(buf)), len, true);
  }
  TransportRequest Irecv(int peer, void* buf, size_t len) override {
    return Post(peer, static_cast<uint8_t*>(buf), len, false);
  }

  Status Wait(TransportRequest r, Deadline deadline) override {
    auto busy = Clock::now(), polled = busy;
    for (;;) {
      bool moved = Progress();
      if (Finished(r)) break;
      auto now = Clock::now();
      // The io_context (TCP peers, heartbeats, control) is polled every kPollEvery (a syscall:
      // a round of the rings is a few loads) for a request over shared memory, and on every
      // round for one over TCP, whose bytes only the io_context moves.
      size_t ran = 0;
      if (now - polled >= kPollEvery || !(r.id & kShmBit)) {
        ran = PollIo();
        polled = now;
        AdoptTcpFailure();
        if (Finished(r)) break;
        if (!CheckDeadline(r, deadline).ok()) break;
      }
      if (moved || ran > 0) {
        busy = now;
        continue;
      }
      if (now - busy < spin_) {
        CpuRelax();
        if (oversubscribed_ || now - polled >= kPollEvery) sched_yield();
        continue;
      }
      if (SleepUnless([this] { return Progress(); }, deadline)) AdoptTcpFailure();
      busy = Clock::now();
    }
    return Take(r);
  }

  // Allreduce of the pieces' concatenation (AllreducePiece: in place for one piece whose in
  // and out are the same), every rank of the job on this host. Per chunk s of up to
  // kChunkBytes of it (buffers s % 2 of each segment):
  //   1. wait until every rank finished chunk s - 2 (it no longer reads this rank's buffers);
  //   2. copy the chunk's inputs, from wherever the pieces lie, into in[b] (times the
  //      prescale), and publish s;
  //   3. once every rank published s: a small chunk is reduced whole by every rank, in rank
  //      order, straight from the peers' in[b] into the pieces' outputs (one step). A larger
  //      one is split into one share per rank: this rank reduces its share from every in[b]
  //      into its out[b] and publishes `reduced`; once every rank has, it copies each out[b]
  //      share into the outputs;
  //   4. publish `finished`.
  // In a split chunk only this rank reads its own share of in[b]: step 2 leaves that share
  // out, and step 3 reads this rank's term of it straight from the pieces (unless a prescale
  // or a joined rank's zeros must be applied first), so 1/size of the chunk is not copied.
  // Every input is read once from where its owner put it and every output written once, with
  // no fusion buffer between the tensors and the segments; the reduction order is the same on
  // every rank, so results agree bitwise.
  Status ShmAllreduce(const std::vector<AllreducePiece>& pieces, DataType dtype, ReduceOp op,
                      double prescale, Deadline deadline) {
    const size_t es = DataTypeSize(dtype);
    if (op == ReduceOp::kAverage) op = ReduceOp::kSum;
    const int p = size(), me = rank();
    const Segment& mine = segments_[my_slot_];
    const PieceLayout layout(pieces);
    const size_t count = layout.total();
    const size_t chunk_elems = kChunkBytes / es;
    for (size_t first = 0; first < count; first += chunk_elems) {
      const size_t n = std::min(chunk_elems, count - first);
      const uint64_t s = ++chunks_;
      const int b = static_cast<int>(s % 2);
      if (s > 2) HVD_RETURN_IF_ERROR(WaitCounters(&Doorbell::finished, s - 2, deadline));
      uint8_t* staged = mine.in(b);
      auto share = [n, p](int q, size_t* lo) {
        const size_t base = n / p, extra = n % p;
        *lo = q * base + std::min<size_t>(q, extra);
        return base + (static_cast<size_t>(q) < extra ? 1 : 0);
      };
      const bool split = p > 1 && n * es > kOneStepBytes;
      size_t own_lo = 0;
      const size_t own_len = split ? share(me, &own_lo) : 0;
      // This rank's term of its own share, read where the pieces lie: only with inputs as they
      // are (no prescale, no joined rank's zeros).
      bool direct = split && prescale == 1.0;
      layout.ForEach(first + own_lo, own_len, [&](const AllreducePiece& q, size_t, size_t,
                                                  size_t) { direct &= q.in != nullptr; });
      auto stage = [&](size_t from, size_t len) {
        layout.ForEach(first + from, len,
                       [&](const AllreducePiece& q, size_t off, size_t at, size_t part) {
                         uint8_t* dst = staged + (from + at) * es;
                         if (q.in) {
                           std::memcpy(dst, static_cast<const uint8_t*>(q.in) + off * es,
                                       part * es);
                         } else {
                           std::memset(dst, 0, part * es);
                         }
                       });
        if (prescale != 1.0) Scale(staged + from * es, len, dtype, prescale);
      };
      if (direct) {
        stage(0, own_lo);
        stage(own_lo + own_len, n - own_lo - own_len);
      } else {
        stage(0, n);
      }
      Publish(&Doorbell::published, s);
      HVD_RETURN_IF_ERROR(WaitCounters(&Doorbell::published, s, deadline));
      if (!split) {
        layout.ForEach(first, n, [&](const AllreducePiece& q, size_t off, size_t at, size_t len) {
          if (q.out == nullptr) return;
          uint8_t* dst = static_cast<uint8_t*>(q.out) + off * es;
          const uint8_t* term0 = segments_[0].in(b) + at * es;
          if (p == 1) {
            std::memcpy(dst, term0, len * es);
            return;
          }
          ReduceTo(dst, term0, segments_[1].in(b) + at * es, len, dtype, op);
          for (int r = 2; r < p; ++r) ReduceInto(dst, segments_[r].in(b) + at * es, len, dtype, op);
        });
      } else {
        const size_t lo = own_lo, len = own_len;
        uint8_t* out = mine.out(b);
        // out = term 0 op term 1 (one pass), then op each later term, in rank order; this
        // rank's term from the pieces when direct (a split chunk has p >= 2).
        auto term = [&](int q) { return segments_[q].in(b) + lo * es; };
        if (!direct || me > 1) {
          ReduceTo(out, term(0), term(1), len, dtype, op);
        } else {
          layout.ForEach(first + lo, len,
                         [&](const AllreducePiece& t, size_t off, size_t at, size_t part) {
                           const uint8_t* own = static_cast<const uint8_t*>(t.in) + off * es;
                           const uint8_t* other = term(1 - me) + at * es;
                           ReduceTo(out + at * es, me == 0 ? own : other, me == 0 ? other : own,
                                    part, dtype, op);
                         });
        }
        for (int q = 2; q < p; ++q) {
          if (q != me || !direct) {
            ReduceInto(out, term(q), len, dtype, op);
            continue;
          }
          layout.ForEach(first + lo, len,
                         [&](const AllreducePiece& t, size_t off, size_t at, size_t part) {
                           ReduceInto(out + at * es, static_cast<const uint8_t*>(t.in) + off * es,
                                      part, dtype, op);
                         });
        }
        Publish(&Doorbell::reduced, s);
        HVD_RETURN_IF_ERROR(WaitCounters(&Doorbell::reduced, s, deadline));
        for (int q = 0; q < p; ++q) {
          size_t qlo;
          const size_t qlen = share(q, &qlo);
          const uint8_t* reduced = segments_[q].out(b);
          layout.ForEach(first + qlo, qlen,
                         [&](const AllreducePiece& t, size_t off, size_t at, size_t part) {
                           if (t.out == nullptr) return;
                           std::memcpy(static_cast<uint8_t*>(t.out) + off * es,
                                       reduced + at * es, part * es);
                         });
        }
      }
      Publish(&Doorbell::finished, s);
    }
    return Status::OK();
  }

  std::shared_ptr<ShmControl> control() const { return control_; }

  void Abort(const Status& why) override {
    if (!broken_.ok()) return;
    broken_ = why;
    for (auto& p : peers_) {
      for (auto* q : {&p.sends, &p.recvs}) {
        for (const Op& op : *q) Finish(op.id, why);
        q->clear();
      }
    }
    tcp_->Abort(why);
  }

 private:
  struct Op {
    uint64_t id;
    uint8_t* buf;
    size_t len;
    size_t done;
  };
  struct PidWatch {
    explicit PidWatch(asio::io_context& io) : fd(io) {}
    asio::posix::stream_descriptor fd;
    bool exited = false;
  };
  struct Peer {
    std::deque<Op> sends, recvs;
    Clock::time_point moved;
    std::shared_ptr<PidWatch> watch;
    bool send_mapped = false, recv_mapped = false;  // the pair's rings prefaulted here
  };
  struct State {
    bool done = false;
    Status status;
    int peer = -1;
    bool is_send = false;
    size_t len = 0;
  };
  struct BellReader {
    explicit BellReader(asio::io_context& io) : fd(io) {}
    asio::posix::stream_descriptor fd;
    uint64_t value = 0;
    bool stopped = false;
    std::weak_ptr<ShmControl> control;  // polled on every ring
  };

  static void ArmBell(const std::shared_ptr<BellReader>& b) {
    b->fd.async_read_some(asio::buffer(&b->value, sizeof(b->value)),
                          [b](const asio::error_code& ec, size_t) {
                            if (ec || b->stopped) return;
                            if (auto c = b->control.lock()) c->Poll();
                            ArmBell(b);
                          });
  }

  bool IsShm(int peer) const {
    return peer >= 0 && peer < size() && peer != rank() && slot_of_[peer] >= 0;
  }

  TransportRequest Post(int peer, uint8_t* buf, size_t len, bool is_send) {
    if (!IsShm(peer)) {
      return is_send ? tcp_->Isend(peer, buf, len) : tcp_->Irecv(peer, buf, len);
    }
    uint64_t id = kShmBit | next_id_++;
    State& st = ops_[id];
    st.peer = peer;
    st.is_send = is_send;
    st.len = len;
    if (!broken_.ok()) {
      st.done = true;
      st.status = broken_;
    } else if (len == 0) {
      st.done = true;
    } else {
      Peer& p = peers_[peer];
      // The ring's pages, mapped here at the pair's first use: a stream that starts at the
      // ring's front otherwise faults its pages in one by one as it first passes them (a host
      // of 8 ranks took twice as long over its first alltoalls of 256 KiB).
      bool& mapped = is_send ? p.send_mapped : p.recv_mapped;
      if (!mapped) {
        mapped = true;
        const Segment& owner = is_send ? segments_[slot_of_[peer]] : segments_[my_slot_];
        const int slot = is_send ? my_slot_ : slot_of_[peer];
        Prefault(owner.data(slot), owner.ring_cap, is_send);
      }
      // (A peer that has exited fails this in the next Progress, after its ring is drained.)
      (is_send ? p.sends : p.recvs).push_back(Op{id, buf, len, 0});
      MovePeer(peer);
    }
    return {id};
  }

  void Finish(uint64_t id, Status s) {
    auto it = ops_.find(id);
    if (it == ops_.end()) return;
    it->second.done = true;
    it->second.status = std::move(s);
  }

  // Copies what fits into the peer's ring and out of this rank's ring from the peer.
  bool MovePeer(int peer) {
    if (!broken_.ok()) return false;
    Peer& p = peers_[peer];
    const Segment& theirs = segments_[slot_of_[peer]];
    const Segment& mine = segments_[my_slot_];
    bool moved = false;
    if (!p.sends.empty()) {
      RingHeader* ring = theirs.ring(my_slot_);
      uint8_t* data = theirs.data(my_slot_);
      uint64_t head = ring->head.load(std::memory_order_relaxed);
      uint64_t tail = ring->tail.load(std::memory_order_acquire);
      uint64_t start = head;
      const size_t cap = theirs.ring_cap;
      while (!p.sends.empty() && head - tail < cap) {
        Op& op = p.sends.front();
        size_t n = std::min<size_t>(op.len - op.done, cap - (head - tail));
        CopyIntoRing(data, head, op.buf + op.done, n, cap);
        op.done += n;
        head += n;
        if (op.done == op.len) {
          Finish(op.id, Status::OK());
          p.sends.pop_front();
        }
      }
      if (head != start) {
        ring->head.store(head, std::memory_order_release);
        moved = true;
      }
    }
    if (!p.recvs.empty()) {
      RingHeader* ring = mine.ring(slot_of_[peer]);
      uint8_t* data = mine.data(slot_of_[peer]);
      uint64_t tail = ring->tail.load(std::memory_order_relaxed);
      uint64_t head = ring->head.load(std::memory_order_acquire);
      uint64_t start = tail;
      while (!p.recvs.empty() && head != tail) {
        Op& op = p.recvs.front();
        size_t n = std::min<size_t>(op.len - op.done, head - tail);
        CopyOutOfRing(data, tail, op.buf + op.done, n, mine.ring_cap);
        op.done += n;
        tail += n;
        if (op.done == op.len) {
          Finish(op.id, Status::OK());
          p.recvs.pop_front();
        }
      }
      if (tail != start) {
        ring->tail.store(tail, std::memory_order_release);
        moved = true;
      }
    }
    if (moved) {
      p.moved = Clock::now();
      Ring(theirs);
    }
    return moved;
  }

  bool Progress() {
    bool moved = false;
    for (int q = 0; q < size(); ++q) {
      Peer& p = peers_[q];
      if (!IsShm(q) || (p.sends.empty() && p.recvs.empty())) continue;
      moved = MovePeer(q) || moved;
      // A peer that has exited wrote all it ever will: what its ring holds has been taken
      // above, so requests still pending with it cannot complete.
      if (p.watch->exited && (!p.sends.empty() || !p.recvs.empty())) {
        MovePeer(q);
        if (!p.sends.empty() || !p.recvs.empty()) {
          std::ostringstream os;
          os << "rank " << q << " lost: its process exited while rank " << rank() << " was "
             << (p.recvs.empty() ? "sending to" : "receiving from") << " it over shared memory";
          Abort(Status::PeerLost(os.str()));
          return true;
        }
      }
    }
    return moved;
  }

  void Publish(std::atomic<uint64_t> Doorbell::*counter, uint64_t s) {
    (segments_[my_slot_].bell()->*counter).store(s, std::memory_order_release);
    for (int q = 0; q < size(); ++q) {
      if (q != rank()) Ring(segments_[slot_of_[q]]);
    }
  }

  // The lowest rank whose `counter` is below `s`, or -1.
  int Behind(std::atomic<uint64_t> Doorbell::*counter, uint64_t s) const {
    for (int q = 0; q < size(); ++q) {
      if ((segments_[slot_of_[q]].bell()->*counter).load(std::memory_order_acquire) < s) return q;
    }
    return -1;
  }

  // Waits until every rank's `counter` reached `s`, running the io_context as Wait does. Fails
  // when the rank it waits for has exited, the transport broke, or nothing advanced for the
  // progress window past the deadline.
  Status WaitCounters(std::atomic<uint64_t> Doorbell::*counter, uint64_t s, Deadline deadline) {
    auto busy = Clock::now(), polled = busy;
    int last_behind = -1;
    for (;;) {
      if (!broken_.ok()) return broken_;
      const int q = Behind(counter, s);
      if (q < 0) return Status::OK();
      auto now = Clock::now();
      if (q != last_behind) {
        last_behind = q;
        progressed_ = now;
      }
      if (peers_[q].watch && peers_[q].watch->exited && Behind(counter, s) == q) {
        Abort(Status::PeerLost("rank " + std::to_string(q) + " lost: its process exited during "
                               "an allreduce over shared memory (rank " +
                               std::to_string(rank()) + ")"));
        return broken_;
      }
      Deadline limit = deadline;
      if (progress_window_.count() > 0) limit = std::max(limit, progressed_ + progress_window_);
      if (now >= limit) {
        std::ostringstream os;
        os << "timed out waiting for rank " << q << " in an allreduce over shared memory";
        if (progress_window_.count() > 0) {
          os << ": it made no progress for "
             << std::chrono::duration<double>(progress_window_).count() << " s";
        }
        os << " (the peer stopped making progress; see HVD_TIMEOUT_SECONDS)";
        Abort(Status::Timeout(os.str()));
        return broken_;
      }
      if (now - polled >= kPollEvery) {
        size_t ran = PollIo();
        polled = now;
        AdoptTcpFailure();
        if (ran > 0) {
          busy = now;
          continue;
        }
      }
      if (now - busy < spin_) {
        CpuRelax();
        if (oversubscribed_ || now - polled >= kPollEvery / 2) sched_yield();
        continue;
      }
      polled = Clock::time_point();  // poll once more before sleeping
      if (now - busy < spin_ + kPollEvery) continue;
      if (SleepUnless([&] { return Behind(counter, s) != q; }, limit)) busy = Clock::now();
    }
  }

  // The io_context (TCP, timers: heartbeats out) and this host's control rings. Their senders
  // do not ring this rank's eventfd while its `polling` flag is up, as it is through the
  // engine's collectives: without this look, heartbeats and aborts from the ranks of this host
  // went unread through a long wait, and the heartbeat timer counted them silent.
  size_t PollIo() {
    if (io_.stopped()) io_.restart();
    size_t ran = io_.poll();
    if (control_ && control_->Poll()) ++ran;
    return ran;
  }

  // Sleeps in the io_context until a peer rings, a TCP or control event, a timer, or `limit`
  // (at most a second), unless `ready()` is true once this rank's doorbell flag is up: the flag
  // goes up before that last look, so a peer either sees it and rings, or made its change
  // before the look. Returns whether it slept.
  template <typename Ready>
  bool SleepUnless(Ready ready, Deadline limit) {
    Doorbell* bell = segments_[my_slot_].bell();
    bell->sleeping.store(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    // The engine's collectives run with the control rings' `polling` flag up (their senders
    // then write without ringing): down while this sleeps, after which the rings get one more
    // look, so that a control message sent meanwhile rings the eventfd.
    const bool control_polling = control_ && control_->polling();
    if (control_polling) control_->SetPolling(false);
    const bool skip = (control_polling && control_->Poll()) || ready();
    if (!skip) {
      auto left = std::max<Clock::duration>(limit - Clock::now(), std::chrono::milliseconds(1));
      io_.run_one_for(std::min<Clock::duration>(left, std::chrono::seconds(1)));
    }
    bell->sleeping.store(0, std::memory_order_relaxed);
    if (control_polling) control_->SetPolling(true);
    return !skip;
  }

  // A TCP failure (a shared-memory peer's connection closed: it died) fails the shared-memory
  // requests too.
  void AdoptTcpFailure() {
    if (broken_.ok() && !tcp_->broken().ok()) Abort(tcp_->broken());
  }

  bool Finished(TransportRequest r) const {
    if (!(r.id & kShmBit)) return tcp_->Finished(r);
    auto it = ops_.find(r.id);
    return it == ops_.end() || it->second.done;
  }

  Status Take(TransportRequest r) {
    if (!(r.id & kShmBit)) return tcp_->Take(r);
    auto it = ops_.find(r.id);
    if (it == ops_.end()) return Status::Internal("transport: unknown request");
    Status s = it->second.done ? it->second.status : broken_;
    ops_.erase(it);
    return s;
  }

  Status CheckDeadline(TransportRequest r, Deadline deadline) {
    if (!(r.id & kShmBit)) return tcp_->CheckDeadline(r, deadline);
    auto it = ops_.find(r.id);
    if (it == ops_.end() || it->second.done) return Status::OK();
    const State& st = it->second;
    if (Clock::now() < Stretched(deadline, peers_[st.peer].moved, progress_window_)) {
      return Status::OK();
    }
    Status timeout = Status::Timeout(
        StallMessage(st.is_send, st.len, st.peer, " over shared memory", progress_window_));
    Abort(timeout);
    return timeout;
  }

  std::unique_ptr<TcpTransport> tcp_;
  asio::io_context& io_;
  const std::vector<int> slot_of_;  // [rank]: its slot among this host's ranks, or -1
  const int my_slot_;
  std::vector<Segment> segments_;  // [slot]
  std::vector<Peer> peers_;
  std::unordered_map<uint64_t, State> ops_;
  uint64_t next_id_ = 1;
  const std::chrono::microseconds spin_;
  const Clock::duration progress_window_;
  // More ranks on this host than cores: a spinning wait yields every round, since the rank it
  // waits for may need this core.
  const bool oversubscribed_ = segments_.size() > std::max(1u, std::thread::hardware_concurrency());
  std::shared_ptr<BellReader> bell_;
  ShmCollectives collectives_;
  std::shared_ptr<ShmControl> control_;
  uint64_t chunks_ = 0;             // shared-memory allreduce chunks this rank has started
  Clock::time_point progressed_;    // when the rank waited for last changed
  Status broken_;
};

Status ShmCollectives::AllreducePieces(const std::vector<AllreducePiece>& pieces,
                                       DataType dtype, ReduceOp op, double prescale,
                                       Deadline deadline) {
  return router_->ShmAllreduce(pieces, dtype, op, prescale, deadline);
}

std::optional<Status> ShmCollectives::Allreduce(void* buf, size_t count, DataType dtype,
                                                ReduceOp op, Deadline deadline) {
  if (DataTypeSize(dtype) == 0) return std::nullopt;
  AllreducePiece whole;
  whole.in = buf;
  whole.out = buf;
  whole.count = count;
  return router_->ShmAllreduce({whole}, dtype, op, 1.0, deadline);
}

// ---------------------------------------------------------------- set-up

struct RankInfo {
  uint64_t key;
  int32_t pid;
  int32_t wants;  // 0: HVD_SHM=off
};

Status Errno(const std::string& what) {
  const int err = errno;
  return Status::FailedPrecondition("shared memory: " + what + ": " + std::strerror(err) +
                                    DescriptorLimitNote(err));
}

// The abstract socket name of `rank` in this job.
std::string SocketName(const std::string& tag, int rank) {
  return std::string(1, '\0') + "hvd-shm-" + tag + "-" + std::to_string(rank);
}

sockaddr_un Address(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  return a;
}

class FdCloser {
 public:
  explicit FdCloser(int fd = -1) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

bool SendFds(int sock, int a, int b) {
  char byte = 'S';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  int fds[2] = {a, b};
  std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
  return ::sendmsg(sock, &m, MSG_NOSIGNAL) == 1;
}

// False when the peer closed first or sent something else; *truncated when the descriptors came
// but did not fit (this process is out of descriptors: the kernel drops them, MSG_CTRUNC).
bool ReceiveFds(int sock, int* a, int* b, bool* truncated) {
  *truncated = false;
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  if (::recvmsg(sock, &m, MSG_CMSG_CLOEXEC) != 1) return false;
  if (m.msg_flags & MSG_CTRUNC) {
    *truncated = true;
    return false;
  }
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(2 * sizeof(int))) return false;
  int fds[2];
  std::memcpy(fds, CMSG_DATA(c), sizeof(fds));
  *a = fds[0];
  *b = fds[1];
  return true;
}

// Creates this rank's segment and exchanges segments with the other ranks of its host
// (`local`, in slot order). On success segments[slot] is every local rank's, mapped.
Status ExchangeSegments(const std::vector<int>& local, int me, const std::vector<RankInfo>& info,
                        const std::string& tag, Deadline deadline,
                        std::vector<Segment>* segments) {
  const int slots = static_cast<int>(local.size());
  auto slot_of = [&local](int r) {
    return static_cast<int>(std::find(local.begin(), local.end(), r) - local.begin());
  };
  const int my_slot = slot_of(me);
  segments->assign(slots, Segment{});
  FdCloser memfd(::memfd_create("hvd-shm", MFD_CLOEXEC));
  if (memfd.get() < 0) return Errno("memfd_create");
  const size_t bytes = SegmentBytes(slots);
  if (::ftruncate(memfd.get(), static_cast<off_t>(bytes)) != 0) return Errno("ftruncate");
  Segment& own = (*segments)[my_slot];
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
  if (base == MAP_FAILED) return Errno("mmap of " + std::to_string(bytes) + " bytes");
  own.base = static_cast<uint8_t*>(base);
  own.bytes = bytes;
  own.ring_cap = DataRingBytes(slots);
  own.control_cap = ControlRingBytes(slots);
  own.bell_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (own.bell_fd < 0) return Errno("eventfd");

  FdCloser listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (listener.get() < 0) return Errno("socket");
  socklen_t len;
  sockaddr_un addr = Address(SocketName(tag, me), &len);
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) return Errno("bind");
  // Every other rank of the host may dial at once: a backlog of them all (a full backlog would
  // only hold a dialer back; its connect does not block).
  if (::listen(listener.get(), std::max(slots, SOMAXCONN)) != 0) return Errno("listen");

  std::map<int, int> out;  // local rank -> connected socket awaiting its segment
  std::vector<int> to_dial;
  for (int r : local) {
    if (r != me) to_dial.push_back(r);
  }
  std::vector<int> served;
  // A stranger may connect any number of times.
  LimitedWarning refused("shared memory: refused a connection that is not a rank of this job on "
                         "this host");
  auto finish = [&](Status s) {
    for (auto& kv : out) ::close(kv.second);
    return s;
  };
  // Each peer's process: one that exits during the exchange fails it at once, naming it.
  for (int r : local) {
    if (r == me) continue;
    Segment& theirs = (*segments)[slot_of(r)];
    theirs.pid_fd = static_cast<int>(::syscall(SYS_pidfd_open, info[r].pid, 0));
    if (theirs.pid_fd < 0 && errno == ESRCH) {
      return finish(Status::PeerLost("rank " + std::to_string(r) + " lost: its process exited "
                                     "while this host's ranks were setting up shared memory"));
    }
    if (theirs.pid_fd < 0) return finish(Errno("pidfd_open of rank " + std::to_string(r)));
  }
  auto exited = [&]() -> int {
    for (int r : local) {
      if (r == me) continue;
      pollfd pfd{(*segments)[slot_of(r)].pid_fd,
                 POLLIN, 0};
      if (::poll(&pfd, 1, 0) == 1) return r;
    }
    return -1;
  };
  while (!to_dial.empty() || !out.empty() || static_cast<int>(served.size()) < slots - 1) {
    if (int gone = exited(); gone >= 0) {
      return finish(Status::PeerLost("rank " + std::to_string(gone) + " lost: its process exited "
                                     "while this host's ranks were setting up shared memory"));
    }
    if (Clock::now() >= deadline) {
      std::string missing;
      for (int r : to_dial) missing += " " + std::to_string(r);
      for (auto& kv : out) missing += " " + std::to_string(kv.first);
      return finish(Status::Timeout("shared memory: no segment from rank(s)" +
                                    (missing.empty() ? std::string(" -") : missing) + " and " +
                                    std::to_string(slots - 1 - served.size()) +
                                    " rank(s) did not ask for this rank's in time"));
    }
    // Dial the ranks whose listener is up. The connect must not block: a peer whose backlog
    // is full is itself dialing, and ranks that each wait for the next to accept would wait in
    // a circle (hosts of more than 64 ranks did, until the exchange's time ran out).
    for (auto it = to_dial.begin(); it != to_dial.end();) {
      int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (s < 0) return finish(Errno("socket"));
      socklen_t plen;
      sockaddr_un peer = Address(SocketName(tag, *it), &plen);
      if (::connect(s, reinterpret_cast<sockaddr*>(&peer), plen) != 0) {
        ::close(s);  // not listening yet, or its backlog is full: later
        ++it;
        continue;
      }
      int32_t who = me;
      if (::send(s, &who, sizeof(who), MSG_NOSIGNAL) != sizeof(who)) {
        ::close(s);
        ++it;
        continue;
      }
      out[*it] = s;
      it = to_dial.erase(it);
    }
    std::vector<pollfd> fds;
    fds.push_back(pollfd{listener.get(), POLLIN, 0});
    for (auto& kv : out) fds.push_back(pollfd{kv.second, POLLIN, 0});
    ::poll(fds.data(), fds.size(), to_dial.empty() ? 100 : 10);
    // A rank asking for this rank's segment: it must be the local rank it says, by pid. The
    // pid (the kernel's word) is checked before anything is read: any process of this network
    // namespace can connect to the socket, and one that sends nothing would hold this loop for
    // the read's time limit.
    // Every connection waiting is taken (a bounded number a round, whatever strangers do).
    for (int taken = 0; (fds[0].revents & POLLIN) && taken < slots + 64; ++taken) {
      int s = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (s < 0 && (errno == EMFILE || errno == ENFILE)) {
        // The local rank asking would see only its connection closed: say why here.
        return finish(Errno("accepting a local rank's connection"));
      }
      if (s < 0) break;  // none left (the listener does not block)
      FdCloser conn(s);
      ucred cred{};
      socklen_t clen = sizeof(cred);
      const bool known =
          ::getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0 &&
          std::any_of(local.begin(), local.end(),
                      [&](int r) { return r != me && info[r].pid == cred.pid; });
      int32_t who = -1;
      bool ok = known;
      if (known) {  // a rank of this host, which sent its rank as it connected
        timeval tv{2, 0};
        ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        ok = ::recv(s, &who, sizeof(who), MSG_WAITALL) == sizeof(who) &&
             std::find(local.begin(), local.end(), who) != local.end() && who != me &&
             cred.pid == info[who].pid;
      }
      if (!ok) {
        refused.Note(known ? "pid " + std::to_string(cred.pid) + " claimed rank " +
                                 std::to_string(who)
                           : "pid " + std::to_string(cred.pid) + " is no rank's of this host");
      } else if (!SendFds(s, memfd.get(), own.bell_fd)) {
        return finish(Errno("passing the segment to rank " + std::to_string(who)));
      } else if (std::find(served.begin(), served.end(), who) == served.end()) {
        served.push_back(who);
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      int r = -1;
      for (auto& kv : out) {
        if (kv.second == fds[i].fd) r = kv.first;
      }
      int seg_fd = -1, bell_fd = -1;
      bool truncated = false;
      bool got = ReceiveFds(fds[i].fd, &seg_fd, &bell_fd, &truncated);
      ::close(fds[i].fd);
      out.erase(r);
      if (truncated) {
        errno = EMFILE;
        return finish(Errno("receiving rank " + std::to_string(r) + "'s segment"));
      }
      if (!got) {
        return finish(Status::FailedPrecondition("shared memory: rank " + std::to_string(r) +
                                                 " closed without passing its segment"));
      }
      FdCloser seg(seg_fd);
      Segment& theirs = (*segments)[slot_of(r)];
      theirs.bell_fd = bell_fd;
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, seg.get(), 0);
      if (p == MAP_FAILED) return finish(Errno("mmap of rank " + std::to_string(r) + "'s segment"));
      theirs.base = static_cast<uint8_t*>(p);
      theirs.bytes = bytes;
      theirs.ring_cap = own.ring_cap;
      theirs.control_cap = own.control_cap;
    }
  }
  return finish(Status::OK());
}

}  // namespace

std::shared_ptr<ShmControlPlane> SharedMemoryControl(Transport& transport) {
  auto* router = dynamic_cast<ShmRouter*>(&transport);
  return router ? router->control() : nullptr;
}

StatusOr<std::unique_ptr<Transport>> ConnectSharedMemory(std::unique_ptr<TcpTransport>& tcp,
                                                         const Options& options,
                                                         Deadline deadline, int* lost_peer) {
  const int n = tcp->size(), me = tcp->rank();
  auto lost = [&](Status s) {
    if (lost_peer) *lost_peer = tcp->lost_peer();
    return s;
  };
  const bool wanted = options.shm != Options::Toggle::kOff;
  // 1. Every rank's host and pid.
  // Ranks that can share memory: the same host key (the abstract sockets the segments are
  // passed over live in the network namespace).
  RankInfo mine{ThisHostKey(), static_cast<int32_t>(::getpid()), wanted ? 1 : 0};
  std::vector<RankInfo> info(n);
  Status s = Allgatherv(*tcp, &mine, info.data(), std::vector<size_t>(n, sizeof(RankInfo)),
                        deadline);
  if (!s.ok()) return lost(s.WithContext("shared memory: exchanging hosts"));
  std::vector<int> local;
  for (int r = 0; r < n; ++r) {
    if (info[r].wants && info[r].key == mine.key) local.push_back(r);
  }
  // 2. The segments, among the ranks of this host.
  std::vector<Segment> segments;
  Status mine_ok = Status::OK();
  Deadline setup = std::min(deadline, DeadlineAfterSeconds(30));
  if (wanted && local.size() > 1) {
    auth::Nonce a{}, b{};
    std::memcpy(a.data(), &info[local[0]].pid, sizeof(int32_t));
    std::memcpy(b.data(), &mine.key, sizeof(uint64_t));
    auth::Mac mac = auth::Proof(options.secret, "hvd shm", a, b, "shm");
    const std::string tag = auth::Hex(mac.data(), 8);
    mine_ok = ExchangeSegments(local, me, info, tag, setup, &segments);
    if (!mine_ok.ok()) Unmap(segments);
  }
  // 3. Which pairs use it: both ranks must have their segments.
  int32_t ok = (wanted && local.size() > 1) ? (mine_ok.ok() ? 1 : 0) : 2;
  std::vector<int32_t> oks(n);
  // A rank whose exchange failed at once (out of descriptors) waits here for those still in
  // theirs, until their setup deadline (about its own): not only the progress window, which
  // may be shorter, or it would give up and fail the job that TCP alone could run.
  const Deadline agree = std::max(deadline, setup + std::chrono::seconds(10));
  s = Allgatherv(*tcp, &ok, oks.data(), std::vector<size_t>(n, sizeof(int32_t)), agree);
  if (!s.ok()) {
    Unmap(segments);
    return lost(s.WithContext("shared memory: agreeing on it"));
  }
  std::vector<int> failed;  // (2: a rank alone on its host, or not wanting it: nothing failed)
  for (int r : local) {
    if (oks[r] == 0) failed.push_back(r);
  }
  if (!failed.empty()) {
    Unmap(segments);
    std::string why = "rank(s) " + RankList(failed) +
                      " of this host could not set up shared memory" +
                      (mine_ok.ok() ? "" : " (this rank: " + mine_ok.message() + ")");
    if (options.shm == Options::Toggle::kOn) {
      return Status::FailedPrecondition("HVD_SHM=on: " + why);
    }
    HVD_LOG(kWarning) << why << "; this host's ranks talk over TCP (HVD_SHM=auto)";
    return std::unique_ptr<Transport>(std::move(tcp));
  }
  // Not wanted here (ranks that differ are refused before: CheckKnobsAgree), or alone.
  if (!wanted || local.size() < 2) return std::unique_ptr<Transport>(std::move(tcp));
  std::vector<int> slot_of(n, -1);
  for (size_t i = 0; i < local.size(); ++i) slot_of[local[i]] = static_cast<int>(i);
  const int my_slot = slot_of[me];
  HVD_LOG(kDebug) << "shared memory with " << local.size() - 1 << " rank(s) of this host";
  auto window = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options.timeout_seconds));
  return std::unique_ptr<Transport>(new ShmRouter(std::move(tcp), std::move(slot_of), my_slot,
                                                  std::move(segments), SpinWindow(options),
                                                  window));
}

}  // namespace hvd
