#include "coordinator/messages.h"

#include <cstring>

namespace hvd {

const char* OpTypeName(OpType t) {
  switch (t) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kAllgather: return "allgather";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAlltoall: return "alltoall";
    case OpType::kReducescatter: return "reducescatter";
    case OpType::kBarrier: return "barrier";
    case OpType::kJoin: return "join";
    case OpType::kProcessSet: return "process set";
    case OpType::kError: return "error";
  }
  return "unknown";
}

namespace {

constexpr uint32_t kMaxCount = 1u << 24;  // sanity bound on any vector/string length

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    size_t n = out_.size();
    out_.resize(n + sizeof(T));
    std::memcpy(out_.data() + n, &v, sizeof(T));
  }
  void Str(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  template <typename T>
  void Vec(const std::vector<T>& v) {
    Put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (const T& x : v) Put<T>(x);
  }
  std::vector<uint8_t> Take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  Reader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  template <typename T>
  bool Get(T* v) {
    if (n_ - pos_ < sizeof(T) || pos_ > n_) return false;
    std::memcpy(v, d_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Str(std::string* s) {
    uint32_t len;
    if (!Get(&len) || len > n_ - pos_) return false;
    s->assign(reinterpret_cast<const char*>(d_ + pos_), len);
    pos_ += len;
    return true;
  }
  template <typename T>
  bool Vec(std::vector<T>* v) {
    uint32_t len;
    if (!Get(&len) || len > kMaxCount || static_cast<size_t>(len) * sizeof(T) > n_ - pos_) {
      return false;
    }
    v->resize(len);
    for (auto& x : *v) Get(&x);
    return true;
  }
  bool Enum(uint8_t* v, uint8_t limit) { return Get(v) && *v < limit; }
  // A count of items each at least `min_bytes` long that the rest of the payload can hold.
  bool Count(uint32_t* n, size_t min_bytes) {
    return Get(n) && *n <= kMaxCount && static_cast<size_t>(*n) * min_bytes <= n_ - pos_;
  }
  bool done() const { return pos_ == n_; }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t pos_ = 0;
};

void Put(Writer& w, const Request& r) {
  w.Put<uint8_t>(static_cast<uint8_t>(r.type));
  w.Str(r.name);
  w.Put<uint8_t>(static_cast<uint8_t>(r.dtype));
  w.Put<uint8_t>(static_cast<uint8_t>(r.op));
  w.Put<int32_t>(r.root);
  w.Put<int32_t>(r.device);
  w.Put<double>(r.prescale);
  w.Put<double>(r.postscale);
  w.Vec(r.shape);
  w.Vec(r.splits);
  w.Str(r.group);
  w.Put<int32_t>(r.group_size);
  w.Str(r.error);
  w.Put<uint8_t>(static_cast<uint8_t>(r.error_code));
}

bool Get(Reader& rd, Request* r) {
  uint8_t type, dtype, op, code;
  bool ok = rd.Enum(&type, static_cast<uint8_t>(OpType::kError)) && rd.Str(&r->name) &&
            rd.Enum(&dtype, kNumDataTypes) && rd.Enum(&op, kNumReduceOps) && rd.Get(&r->root) &&
            rd.Get(&r->device) && rd.Get(&r->prescale) && rd.Get(&r->postscale) &&
            rd.Vec(&r->shape) && rd.Vec(&r->splits) && rd.Str(&r->group) &&
            rd.Get(&r->group_size) && rd.Str(&r->error) &&
            rd.Enum(&code, static_cast<uint8_t>(StatusCode::kResourceExhausted) + 1);
  if (!ok) return false;
  r->error_code = static_cast<StatusCode>(code);
  r->type = static_cast<OpType>(type);
  r->dtype = static_cast<DataType>(dtype);
  r->op = static_cast<ReduceOp>(op);
  return true;
}

void Put(Writer& w, const Response& r) {
  w.Put<uint8_t>(r.cache_bits.empty() ? 0 : 1);
  if (!r.cache_bits.empty()) {
    w.Vec(r.cache_bits);
    return;
  }
  w.Put<uint8_t>(static_cast<uint8_t>(r.type));
  w.Put<uint32_t>(static_cast<uint32_t>(r.names.size()));
  for (const auto& n : r.names) w.Str(n);
  w.Put<uint32_t>(static_cast<uint32_t>(r.shapes.size()));
  for (const auto& s : r.shapes) w.Vec(s);
  w.Put<uint8_t>(static_cast<uint8_t>(r.dtype));
  w.Put<uint8_t>(static_cast<uint8_t>(r.op));
  w.Put<int32_t>(r.root);
  w.Put<double>(r.prescale);
  w.Put<double>(r.postscale);
  w.Vec(r.sizes);
  w.Str(r.error);
  w.Put<uint8_t>(static_cast<uint8_t>(r.error_code));
  w.Put<int32_t>(r.last_joined);
  w.Vec(r.joined);
  w.Put<int32_t>(r.device);
  w.Put<uint32_t>(static_cast<uint32_t>(r.groups.size()));
  for (const auto& g : r.groups) w.Str(g);
  w.Vec(r.group_sizes);
}

bool Get(Reader& rd, Response* r) {
  uint8_t type, dtype, op, compact, code;
  uint32_t n;
  if (!rd.Enum(&compact, 2)) return false;
  if (compact) return rd.Vec(&r->cache_bits) && !r->cache_bits.empty();
  if (!rd.Enum(&type, static_cast<uint8_t>(OpType::kError) + 1) || !rd.Count(&n, 4)) {
    return false;
  }
  r->type = static_cast<OpType>(type);
  r->names.resize(n);
  for (auto& s : r->names) {
    if (!rd.Str(&s)) return false;
  }
  if (!rd.Count(&n, 4)) return false;
  r->shapes.resize(n);
  for (auto& s : r->shapes) {
    if (!rd.Vec(&s)) return false;
  }
  bool ok = rd.Enum(&dtype, kNumDataTypes) && rd.Enum(&op, kNumReduceOps) && rd.Get(&r->root) &&
            rd.Get(&r->prescale) && rd.Get(&r->postscale) && rd.Vec(&r->sizes) &&
            rd.Str(&r->error) && rd.Enum(&code, static_cast<uint8_t>(StatusCode::kResourceExhausted) + 1) &&
            rd.Get(&r->last_joined) && rd.Vec(&r->joined) && rd.Get(&r->device) &&
            rd.Count(&n, 4);
  if (!ok) return false;
  r->groups.resize(n);
  for (auto& g : r->groups) {
    if (!rd.Str(&g)) return false;
  }
  if (!rd.Vec(&r->group_sizes)) return false;
  r->error_code = static_cast<StatusCode>(code);
  r->dtype = static_cast<DataType>(dtype);
  r->op = static_cast<ReduceOp>(op);
  return true;
}

template <typename Item>
Status DecodeItems(Reader& rd, std::vector<Item>* items, const char* what) {
  uint32_t n;
  if (!rd.Count(&n, 1)) {
    return Status::InvalidArgument(std::string("malformed ") + what + ": bad count");
  }
  items->resize(n);
  for (auto& it : *items) {
    if (!Get(rd, &it)) return Status::InvalidArgument(std::string("malformed ") + what);
  }
  return Status::OK();
}

Status CheckDone(const Reader& rd, const char* what) {
  if (!rd.done()) return Status::InvalidArgument(std::string("trailing bytes after ") + what);
  return Status::OK();
}

// The plan knobs rank 0 sends with a response list or its part of a round.
void PutKnobs(Writer& w, const PlanKnobs& k) {
  w.Put<int32_t>(k.hierarchical_allreduce);
  w.Put<uint64_t>(k.small_allreduce_bytes);
  w.Put<uint64_t>(k.staging_piece_bytes);
}

bool GetKnobs(Reader& rd, PlanKnobs* k) {
  return rd.Get(&k->hierarchical_allreduce) && k->hierarchical_allreduce >= 0 &&
         k->hierarchical_allreduce <= 2 && rd.Get(&k->small_allreduce_bytes) &&
         rd.Get(&k->staging_piece_bytes);
}

}  // namespace

std::vector<uint8_t> Encode(const RequestList& l) {
  Writer w;
  w.Put<int32_t>(l.process_set);
  w.Put<uint32_t>(static_cast<uint32_t>(l.requests.size()));
  for (const auto& r : l.requests) Put(w, r);
  w.Put<uint64_t>(l.cache_epoch);
  w.Vec(l.cached_bits);
  return w.Take();
}

std::vector<uint8_t> Encode(const ResponseList& l) {
  Writer w;
  w.Put<int32_t>(l.process_set);
  w.Put<uint32_t>(static_cast<uint32_t>(l.responses.size()));
  for (const auto& r : l.responses) Put(w, r);
  w.Vec(l.ready_bits);
  w.Put<uint64_t>(l.fusion_threshold);
  PutKnobs(w, l.knobs);
  w.Put<uint64_t>(l.after_round);
  return w.Take();
}

std::vector<uint8_t> Encode(const RoundContribution& c) {
  Writer w;
  w.Put<uint64_t>(c.round);
  w.Put<int32_t>(c.rank);
  w.Put<uint64_t>(c.cache_epoch);
  w.Vec(c.ready);
  w.Vec(c.withdraw);
  w.Put<uint64_t>(c.fusion_threshold);
  PutKnobs(w, c.knobs);
  w.Put<uint8_t>(c.hold_uneven ? 1 : 0);
  return w.Take();
}

Status Decode(const uint8_t* data, size_t len, RequestList* out) {
  Reader rd(data, len);
  if (!rd.Get(&out->process_set) || out->process_set < 0) {
    return Status::InvalidArgument("malformed request list: bad process set");
  }
  HVD_RETURN_IF_ERROR(DecodeItems(rd, &out->requests, "request list"));
  for (auto& r : out->requests) r.process_set = out->process_set;
  if (!rd.Get(&out->cache_epoch) || !rd.Vec(&out->cached_bits)) {
    return Status::InvalidArgument("malformed request list: bad cache bits");
  }
  return CheckDone(rd, "request list");
}

Status CheckResponse(const Response& r, int size) {
  auto bad = [&r](const std::string& what) {
    return Status::InvalidArgument(std::string("malformed ") + OpTypeName(r.type) + " response" +
                                   (r.names.empty() ? "" : " '" + r.names[0] + "'") + ": " + what);
  };
  if (r.names.empty()) return bad("no tensor name");
  for (int32_t j : r.joined) {
    if (j < 0 || j >= size) return bad("joined rank " + std::to_string(j) + " out of range");
  }
  if (r.type == OpType::kError) return Status::OK();
  if (r.type == OpType::kJoin) {
    if (r.last_joined < -1 || r.last_joined >= size) return bad("last joined rank out of range");
    return Status::OK();
  }
  if (r.type == OpType::kProcessSet) {
    if (r.root <= 0) return bad("process set id " + std::to_string(r.root));
    for (int64_t q : r.sizes) {
      if (q < 0 || q >= size) return bad("rank " + std::to_string(q) + " out of range");
    }
    return Status::OK();
  }
  if (r.shapes.size() != r.names.size()) {
    return bad(std::to_string(r.shapes.size()) + " shapes for " + std::to_string(r.names.size()) +
               " names");
  }
  if ((!r.groups.empty() && r.groups.size() != r.names.size()) ||
      r.group_sizes.size() != r.groups.size()) {
    return bad(std::to_string(r.groups.size()) + " groups and " +
               std::to_string(r.group_sizes.size()) + " group sizes for " +
               std::to_string(r.names.size()) + " names");
  }
  for (size_t i = 0; i < r.groups.size(); ++i) {
    if (r.group_sizes[i] < 0 || (r.group_sizes[i] > 1) != !r.groups[i].empty()) {
      return bad("tensor '" + r.names[i] + "' has group size " +
                 std::to_string(r.group_sizes[i]) + " with group '" + r.groups[i] + "'");
    }
  }
  for (const auto& shape : r.shapes) {
    for (int64_t d : shape) {
      if (d < 0) return bad("negative dimension " + std::to_string(d));
    }
  }
  for (int64_t rows : r.sizes) {
    if (rows < 0) return bad("negative row count " + std::to_string(rows));
  }
  const bool rows_first = r.type == OpType::kAllgather || r.type == OpType::kAlltoall ||
                          r.type == OpType::kReducescatter;
  if (rows_first && r.shapes[0].empty()) return bad("a scalar where rows are needed");
  const size_t n = static_cast<size_t>(size);
  if (r.type == OpType::kAllgather && r.sizes.size() != n * r.names.size()) {
    return bad(std::to_string(r.sizes.size()) + " row counts for " + std::to_string(size) + " ranks");
  }
  if (r.type == OpType::kAlltoall && r.sizes.size() != n * n) {
    return bad(std::to_string(r.sizes.size()) + " splits for " + std::to_string(size) + " ranks");
  }
  if (r.type == OpType::kBroadcast && (r.root < 0 || r.root >= size)) {
    return bad("root " + std::to_string(r.root) + " out of range");
  }
  if (r.device < kCpuDevice) return bad("device " + std::to_string(r.device) + " out of range");
  return Status::OK();
}

Status Decode(const uint8_t* data, size_t len, ResponseList* out) {
  Reader rd(data, len);
  if (!rd.Get(&out->process_set) || out->process_set < 0) {
    return Status::InvalidArgument("malformed response list: bad process set");
  }
  HVD_RETURN_IF_ERROR(DecodeItems(rd, &out->responses, "response list"));
  for (auto& r : out->responses) r.process_set = out->process_set;
  if (!rd.Vec(&out->ready_bits) || !rd.Get(&out->fusion_threshold)) {
    return Status::InvalidArgument("malformed response list: bad ready bits");
  }
  if (!GetKnobs(rd, &out->knobs)) {
    return Status::InvalidArgument("malformed response list: bad plan knobs");
  }
  if (!rd.Get(&out->after_round)) {
    return Status::InvalidArgument("malformed response list: bad round number");
  }
  for (auto& r : out->responses) r.knobs = out->knobs;
  return CheckDone(rd, "response list");
}

Status Decode(const uint8_t* data, size_t len, RoundContribution* out) {
  Reader rd(data, len);
  if (!rd.Get(&out->round) || !rd.Get(&out->rank) || out->rank < 0 ||
      !rd.Get(&out->cache_epoch)) {
    return Status::InvalidArgument("malformed round: bad header");
  }
  if (!rd.Vec(&out->ready) || !rd.Vec(&out->withdraw)) {
    return Status::InvalidArgument("malformed round: bad bits");
  }
  if (!rd.Get(&out->fusion_threshold) || !GetKnobs(rd, &out->knobs)) {
    return Status::InvalidArgument("malformed round: bad plan knobs");
  }
  uint8_t hold = 0;
  if (!rd.Get(&hold) || hold > 1) return Status::InvalidArgument("malformed round: bad hold");
  out->hold_uneven = hold == 1;
  return CheckDone(rd, "round");
}

}  // namespace hvd
