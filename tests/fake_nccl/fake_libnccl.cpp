// A stand-in for libnccl.so.2 over the fake CUDA driver's host memory
// (tests/fake_nccl/README.md).
//
// runtime/comm/nccl.cpp dlopen()s $SHARDFUSE_LIBNCCL and dlsym()s every name in
// SF_NCCL_ENTRY_POINTS; this library defines them with <nccl.h> included, so a
// definition whose type differs from the header's declaration does not compile
// (C linkage allows no overloads), and kEntries (fake_nccl_api.cpp) names every entry point, so
// one the runtime adds without a definition here leaves an undefined symbol that
// the link (-Wl,--no-undefined) or the runtime's dlopen(RTLD_NOW) rejects.
//
// Ranks are threads of one process, and tests/fake_cuda's device memory is host
// memory, so a collective is a memcpy and a reduction loop: the thread that posts
// an operation last moves the data of every member, under the one mutex. What
// this fake adds over a real NCCL on one GPU is checking: members that disagree
// (counts, dtypes, ops, kinds, p2p pairs) fail with a message that says how, where
// NCCL would hang or corrupt memory.
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "tests/fake_cuda/fake_float.h"
#include "tests/fake_cuda/fake_log.h"
#include "runtime/comm/nccl.h"


#include "tests/fake_nccl/fake_nccl_state.h"

namespace fake {



// --- state ------------------------------------------------------------------------------



const char* kind_name(Kind k) {
  switch (k) {
    case Kind::AllReduce: return "all_reduce";
    case Kind::AllGather: return "all_gather";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::Split: return "split";
  }
  return "?";
}







// Never destroyed: at exit the runtime's static destructors may still call in, and
// LeakSanitizer sees everything as reachable from here.
State& state() {
  static State* s = new State;
  return *s;
}

thread_local std::string tls_error;  // ncclGetLastError's answer on this thread

thread_local int tls_depth = 0;
thread_local std::vector<Pending> tls_group;
thread_local ncclResult_t tls_group_error = ncclSuccess;
thread_local std::string tls_group_why;

const char* result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    case ncclNumResults: break;
  }
  return "ncclResult_t?";
}

// Every failure goes through here: the calling thread's ncclGetLastError, and an
// `error` line in the log, so a runtime that drops a return code still shows it.
ncclResult_t fail(ncclResult_t r, const char* call, const std::string& why) {
  tls_error = why;
  log_line(std::string("nccl error ") + call + " " + result_name(r) + " (" + why + ")");
  return r;
}

int timeout_ms() {
  const char* env = std::getenv("FAKE_NCCL_TIMEOUT_MS");
  const long v = env && *env ? std::strtol(env, nullptr, 10) : 0;
  return v > 0 && v < INT_MAX ? static_cast<int>(v) : kDefaultTimeoutMs;
}

// --- data types and reductions ----------------------------------------------------------


TypeInfo type_info(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return {"i8", 1, true};
    case ncclUint8: return {"u8", 1, true};
    case ncclInt32: return {"i32", 4, true};
    case ncclUint32: return {"u32", 4, true};
    case ncclInt64: return {"i64", 8, true};
    case ncclUint64: return {"u64", 8, true};
    case ncclFloat16: return {"f16", 2, true};
    case ncclFloat32: return {"f32", 4, true};
    case ncclFloat64: return {"f64", 8, true};
    case ncclBfloat16: return {"bf16", 2, true};
    // Carried (all_gather, send/recv) but not reduced: the fake has no fp8 arithmetic.
    case ncclFloat8e4m3: return {"f8e4m3", 1, false};
    case ncclFloat8e5m2: return {"f8e5m2", 1, false};
    case ncclNumTypes: break;
  }
  return {};
}

const char* op_name(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclProd: return "prod";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclAvg: return "avg";
    default: return nullptr;  // ncclRedOpCreatePreMulSum's ops, which the fake lacks
  }
}

double load_float(const std::byte* p, ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case ncclFloat64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    default: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return t == ncclFloat16 ? decode(h, 5, 10) : decode(h, 8, 7);
    }
  }
}

void store_float(std::byte* p, ncclDataType_t t, double v) {
  switch (t) {
    case ncclFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case ncclFloat64: std::memcpy(p, &v, 8); return;
    default: {
      const uint16_t h = static_cast<uint16_t>(t == ncclFloat16 ? encode(v, 5, 10) : encode(v, 8, 7));
      std::memcpy(p, &h, 2);
      return;
    }
  }
}

// out[i] = ins[0][i] op ins[1][i] op ... in member order; floats in double rounded
// once (NaN-propagating max/min, as runtime/core/host_collectives.cpp), integers in
// their own type (sum and prod wrap; avg = sum / n, truncated).
void reduce_float(const std::vector<const std::byte*>& ins, std::byte* out, size_t count, ncclDataType_t t,
                  ncclRedOp_t op) {
  const size_t es = type_info(t).bytes;
  for (size_t i = 0; i < count; ++i) {
    double acc = load_float(ins[0] + i * es, t);
    for (size_t k = 1; k < ins.size(); ++k) {
      const double v = load_float(ins[k] + i * es, t);
      switch (op) {
        case ncclSum:
        case ncclAvg: acc += v; break;
        case ncclProd: acc *= v; break;
        case ncclMax: acc = std::isnan(acc) || acc >= v ? acc : v; break;
        case ncclMin: acc = std::isnan(acc) || acc <= v ? acc : v; break;
        default: break;
      }
    }
    if (op == ncclAvg) acc /= static_cast<double>(ins.size());
    store_float(out + i * es, t, acc);
  }
}

template <class T>
void reduce_int(const std::vector<const std::byte*>& ins, std::byte* out, size_t count, ncclRedOp_t op) {
  using U = std::make_unsigned_t<T>;
  for (size_t i = 0; i < count; ++i) {
    T acc;
    std::memcpy(&acc, ins[0] + i * sizeof(T), sizeof(T));
    for (size_t k = 1; k < ins.size(); ++k) {
      T v;
      std::memcpy(&v, ins[k] + i * sizeof(T), sizeof(T));
      switch (op) {
        case ncclSum:
        case ncclAvg: acc = static_cast<T>(static_cast<U>(static_cast<U>(acc) + static_cast<U>(v))); break;
        case ncclProd: acc = static_cast<T>(static_cast<U>(static_cast<U>(acc) * static_cast<U>(v))); break;
        case ncclMax: acc = std::max(acc, v); break;
        case ncclMin: acc = std::min(acc, v); break;
        default: break;
      }
    }
    if (op == ncclAvg) acc = static_cast<T>(acc / static_cast<T>(ins.size()));
    std::memcpy(out + i * sizeof(T), &acc, sizeof(T));
  }
}

void reduce(const std::vector<const std::byte*>& ins, std::byte* out, size_t count, ncclDataType_t t, ncclRedOp_t op) {
  switch (t) {
    case ncclInt8: return reduce_int<int8_t>(ins, out, count, op);
    case ncclUint8: return reduce_int<uint8_t>(ins, out, count, op);
    case ncclInt32: return reduce_int<int32_t>(ins, out, count, op);
    case ncclUint32: return reduce_int<uint32_t>(ins, out, count, op);
    case ncclInt64: return reduce_int<int64_t>(ins, out, count, op);
    case ncclUint64: return reduce_int<uint64_t>(ins, out, count, op);
    default: return reduce_float(ins, out, count, t, op);
  }
}

// --- communicators ------------------------------------------------------------------------

std::string members_str(const std::vector<int>& ms) {
  std::string s;
  for (int m : ms) s += (s.empty() ? "" : " ") + std::to_string(m);
  return s;
}

std::string who(const Member& m) {
  return "member=" + std::to_string(m.index) + "/" + std::to_string(m.group ? m.group->n : 0) +
         (m.group ? " comm=" + hex(m.group->id) : std::string());
}

// The member behind a handle; nullptr (and the call fails) for a null or dead one.
std::shared_ptr<Member> find(State& s, ncclComm_t comm, const char* call, ncclResult_t* r) {
  if (!comm) {
    *r = fail(ncclInvalidArgument, call, std::string(call) + ": comm is NULL");
    return nullptr;
  }
  auto it = s.comms.find(id_of(comm));
  if (it == s.comms.end()) {
    *r = fail(ncclInvalidArgument, call,
              std::string(call) + ": " + hex(id_of(comm)) + " is not a live communicator (destroyed or aborted)");
    return nullptr;
  }
  return it->second;
}

// Takes the op out of the p2p queues and fails it for every member that waits on it.
void fail_op(State& s, Group& g, const std::shared_ptr<Op>& op, ncclResult_t r, const std::string& why) {
  if (op->settled()) return;
  op->result = r;
  op->why = why;
  for (auto* qs : {&g.sends, &g.recvs})
    for (std::deque<Xfer>& q : *qs) std::erase_if(q, [&](const Xfer& x) { return x.op == op; });
  s.cv.notify_all();
}

void abort_group(State& s, Group& g, const std::string& why) {
  if (g.aborted) return;
  g.aborted = true;
  g.abort_why = why;
  std::vector<std::shared_ptr<Op>> ops;
  for (auto& [seq, c] : g.colls) ops.push_back(c.op);
  for (auto* qs : {&g.sends, &g.recvs})
    for (std::deque<Xfer>& q : *qs) {
      for (const Xfer& x : q) ops.push_back(x.op);
      q.clear();
    }
  for (const std::shared_ptr<Op>& op : ops) fail_op(s, g, op, ncclRemoteError, why);
  s.cv.notify_all();
}

// Whether `m` can take an operation now; an error result otherwise.
ncclResult_t ready(const Member& m, const char* call) {
  if (m.sticky != ncclSuccess)
    return fail(m.sticky, call, std::string(call) + ": the communicator is in error after a failed operation: " + m.sticky_why);
  if (m.group && m.group->aborted)
    return fail(ncclRemoteError, call, std::string(call) + ": the communicator was aborted: " + m.group->abort_why);
  if (!m.group || !m.group->complete)
    return fail(ncclInvalidUsage, call,
                std::string(call) + ": the communicator is not initialized yet (poll ncclCommGetAsyncError until ncclSuccess)");
  if (m.finalized) return fail(ncclInvalidUsage, call, std::string(call) + ": the communicator was finalized");
  if (tls_depth > 0 && std::strcmp(call, "ncclSend") != 0 && std::strcmp(call, "ncclRecv") != 0)
    return fail(ncclInvalidUsage, call,
                std::string(call) + ": the fake runs only ncclSend/ncclRecv inside ncclGroupStart/ncclGroupEnd");
  return ncclSuccess;
}

// Waits for `op` (blocking mode) or hands it to ncclCommGetAsyncError (nonblocking),
// and answers as NCCL would. `missing` says who never came, for the fake's deadline.
ncclResult_t finish(State& s, std::unique_lock<std::mutex>& lock, Member& m, Group& g, const std::shared_ptr<Op>& op,
                    const char* call, const std::function<std::string()>& missing) {
  if (!op->settled() && m.nonblocking) {
    m.outstanding.push_back(op);
    return ncclInProgress;
  }
  if (!op->settled()) {
    const int ms = timeout_ms();
    const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
    while (!op->settled())
      if (s.cv.wait_until(lock, deadline) == std::cv_status::timeout && !op->settled())
        fail_op(s, g, op, ncclSystemError,
                std::string(call) + " on comm " + hex(g.id) + " timed out after " + std::to_string(ms) +
                    " ms ($FAKE_NCCL_TIMEOUT_MS): " + missing());
  }
  if (op->done) return ncclSuccess;
  if (m.sticky == ncclSuccess) m.sticky = op->result, m.sticky_why = op->why;
  return fail(op->result, call, op->why);
}

// --- collectives ------------------------------------------------------------------------

std::string disagreement(const Group& g, int64_t seq, const Coll& c, int me) {
  for (size_t k = 0; k < c.parts.size(); ++k) {
    if (!c.parts[k].posted || static_cast<int>(k) == me) continue;
    // Said in member order, whoever came first.
    const int lo = std::min(static_cast<int>(k), me), hi = std::max(static_cast<int>(k), me);
    const Part& a = c.parts[static_cast<size_t>(lo)];
    const Part& b = c.parts[static_cast<size_t>(hi)];
    const std::string at = "operation #" + std::to_string(seq) + " of comm " + hex(g.id) + ": ";
    const std::string on_a = " on member " + std::to_string(lo), on_b = " on member " + std::to_string(hi);
    if (a.kind != b.kind) return at + kind_name(a.kind) + on_a + ", " + kind_name(b.kind) + on_b;
    if (a.kind == Kind::Split) return "";
    const char* what = kind_name(a.kind);
    if (a.count != b.count)
      return at + what + " count " + std::to_string(a.count) + on_a + ", " + std::to_string(b.count) + on_b;
    if (a.type != b.type) return at + what + " type " + type_info(a.type).name + on_a + ", " + type_info(b.type).name + on_b;
    if (a.kind != Kind::AllGather && a.op != b.op)
      return at + what + " op " + op_name(a.op) + on_a + ", " + op_name(b.op) + on_b;
    return "";  // one posted member suffices: the others agreed with it
  }
  return "";
}

void form_children(State& s, const Coll& c) {
  std::map<int, std::vector<int>> by_color;
  for (size_t k = 0; k < c.parts.size(); ++k)
    if (c.parts[k].child) by_color[c.parts[k].color].push_back(static_cast<int>(k));
  for (auto& [color, ms] : by_color) {
    // By (key, parent member). Not std::stable_sort: libstdc++ 12's warns under clang 19.
    std::sort(ms.begin(), ms.end(), [&](int a, int b) {
      const int ka = c.parts[static_cast<size_t>(a)].key, kb = c.parts[static_cast<size_t>(b)].key;
      return ka != kb ? ka < kb : a < b;
    });
    auto g = std::make_shared<Group>();
    g->id = s.next_group++;
    g->n = static_cast<int>(ms.size());
    g->handles.assign(ms.size(), 0);
    g->sends.resize(ms.size() * ms.size());
    g->recvs.resize(ms.size() * ms.size());
    g->joined = g->n;
    g->complete = true;
    for (size_t i = 0; i < ms.size(); ++i) {
      const uint64_t h = c.parts[static_cast<size_t>(ms[i])].child;
      auto it = s.comms.find(h);
      if (it == s.comms.end()) {
        abort_group(s, *g, "member " + std::to_string(i) + "'s handle was destroyed before ncclCommSplit finished");
        continue;
      }
      g->handles[i] = h;
      it->second->group = g;
      it->second->index = static_cast<int>(i);
      it->second->forming.reset();
    }
  }
}

// Runs a collective every member posted and agreed on: reads every input first, so
// in-place and overlapping buffers get what NCCL gives them.
void execute(State& s, Coll& c) {
  const Part& p0 = c.parts[0];
  const int n = static_cast<int>(c.parts.size());
  const size_t es = type_info(p0.type).bytes;
  const size_t bytes = p0.count * es;
  auto snapshot = [&](size_t len) {
    std::vector<std::vector<std::byte>> in(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k) {
      in[static_cast<size_t>(k)].resize(len);
      if (len) std::memcpy(in[static_cast<size_t>(k)].data(), c.parts[static_cast<size_t>(k)].send, len);
    }
    return in;
  };
  switch (p0.kind) {
    case Kind::AllReduce: {
      const auto in = snapshot(bytes);
      std::vector<const std::byte*> ins;
      for (const auto& v : in) ins.push_back(v.data());
      std::vector<std::byte> out(bytes);
      reduce(ins, out.data(), p0.count, p0.type, p0.op);
      for (const Part& p : c.parts)
        if (bytes) std::memcpy(p.recv, out.data(), bytes);
      break;
    }
    case Kind::AllGather: {
      const auto in = snapshot(bytes);
      for (const Part& p : c.parts)
        for (int k = 0; k < n && bytes; ++k)
          std::memcpy(static_cast<std::byte*>(p.recv) + static_cast<size_t>(k) * bytes, in[static_cast<size_t>(k)].data(), bytes);
      break;
    }
    case Kind::ReduceScatter: {
      const auto in = snapshot(bytes * static_cast<size_t>(n));
      for (int b = 0; b < n && bytes; ++b) {
        std::vector<const std::byte*> ins;
        for (const auto& v : in) ins.push_back(v.data() + static_cast<size_t>(b) * bytes);
        reduce(ins, static_cast<std::byte*>(c.parts[static_cast<size_t>(b)].recv), p0.count, p0.type, p0.op);
      }
      break;
    }
    case Kind::Split: form_children(s, c); break;
  }
  c.op->done = true;
  ++s.ops;
  s.cv.notify_all();
}


// Posts this member's part of its next collective; the last member to post runs it.
ncclResult_t collective(const char* call, ncclComm_t comm, Part part, uint64_t stream, const SplitArgs* split) {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  ncclResult_t r = ncclSuccess;
  std::shared_ptr<Member> m = find(s, comm, call, &r);
  if (!m) return r;
  if ((r = ready(*m, call)) != ncclSuccess) return r;
  const TypeInfo ti = type_info(part.type);
  if (part.kind != Kind::Split) {
    if (!ti.name) return fail(ncclInvalidArgument, call, std::string(call) + ": unknown datatype " + std::to_string(part.type));
    if (part.kind != Kind::AllGather && !op_name(part.op))
      return fail(ncclInvalidArgument, call, std::string(call) + ": reduction op " + std::to_string(part.op) + " is not supported by the fake");
    if (part.kind != Kind::AllGather && !ti.reducible)
      return fail(ncclInvalidArgument, call, std::string(call) + ": the fake cannot reduce " + ti.name);
    if (part.count && (!part.send || !part.recv))
      return fail(ncclInvalidArgument, call, std::string(call) + ": NULL buffer with count " + std::to_string(part.count));
  }
  std::shared_ptr<Group> g = m->group;
  const std::string line = "nccl " + std::string(kind_name(part.kind)) +
                           (part.kind == Kind::Split
                                ? " color=" + std::to_string(part.color) + " key=" + std::to_string(part.key) + " " + who(*m)
                                : " count=" + std::to_string(part.count) + " type=" + ti.name + " member=" +
                                      std::to_string(m->index) + "/" + std::to_string(g->n) + " stream=" + hex(stream) +
                                      " comm=" + hex(g->id) +
                                      (part.kind == Kind::AllGather ? "" : std::string(" op=") + op_name(part.op)));
  log_line(line);

  std::shared_ptr<Member> child;
  part.child = 0;
  if (split && part.color != NCCL_SPLIT_NOCOLOR) {
    child = std::make_shared<Member>();
    // Without a config the child inherits the parent's, as in NCCL.
    child->nonblocking = split->config ? split->config->blocking == 0 : m->nonblocking;
    if (split->config) {
      s.max_ctas = split->config->maxCTAs == NCCL_CONFIG_UNDEF_INT ? -1 : split->config->maxCTAs;
      s.min_ctas = split->config->minCTAs == NCCL_CONFIG_UNDEF_INT ? -1 : split->config->minCTAs;
    }
    part.child = s.next_handle;
    s.next_handle += kGroupStep;
    s.comms[part.child] = child;
  }
  const int64_t seq = m->next_seq++;
  auto [it, fresh] = g->colls.try_emplace(seq);
  Coll& c = it->second;
  if (fresh) c.parts.resize(static_cast<size_t>(g->n));
  std::shared_ptr<Op> op = c.op;
  part.posted = true;
  c.parts[static_cast<size_t>(m->index)] = part;
  ++c.posted;
  if (child) {
    child->forming = op;
    // A call that may return ncclInProgress hands out the handle at once.
    if (m->nonblocking) *split->newcomm = handle<ncclComm_t>(part.child);
  }
  if (!op->settled())
    if (std::string why = disagreement(*g, seq, c, m->index); !why.empty()) fail_op(s, *g, op, ncclInvalidUsage, why);
  if (c.posted == g->n) {
    if (!op->settled()) execute(s, c);
    g->colls.erase(seq);  // everyone has the op; the slot is no longer needed
  }
  auto missing = [g, seq] {
    std::vector<int> ms;
    if (auto c = g->colls.find(seq); c != g->colls.end())
      for (size_t k = 0; k < c->second.parts.size(); ++k)
        if (!c->second.parts[k].posted) ms.push_back(static_cast<int>(k));
    return "members " + members_str(ms) + " never arrived";
  };
  r = finish(s, lock, *m, *g, op, call, missing);
  if (child && !m->nonblocking) {
    if (r == ncclSuccess) {
      *split->newcomm = handle<ncclComm_t>(part.child);
    } else {
      s.comms.erase(part.child);  // a blocking split that failed made no communicator
    }
  }
  return r;
}

// --- point-to-point -----------------------------------------------------------------------

// A send meets its receive: the data moves now, from the thread that came second.
void match(State& s, Group& g, const Xfer& snd, const Xfer& rcv) {
  if (snd.count != rcv.count || snd.type != rcv.type) {
    const std::string why = "send/recv mismatch on comm " + hex(g.id) + ": member " + std::to_string(snd.src) +
                            " sends " + std::to_string(snd.count) + " " + type_info(snd.type).name + " to member " +
                            std::to_string(snd.dst) + ", which receives " + std::to_string(rcv.count) + " " +
                            type_info(rcv.type).name + " from it";
    fail_op(s, g, snd.op, ncclInvalidUsage, why);
    fail_op(s, g, rcv.op, ncclInvalidUsage, why);
    return;
  }
  std::memmove(rcv.buf, snd.buf, snd.count * type_info(snd.type).bytes);
  for (const auto* op : {&snd.op, &rcv.op})
    if (--(*op)->remaining == 0) {
      (*op)->done = true;
      ++s.ops;
    }
  s.cv.notify_all();
}

void post(State& s, Group& g, Xfer x, bool send) {
  const size_t pair = static_cast<size_t>(x.src * g.n + x.dst);
  std::deque<Xfer>& mine = send ? g.sends[pair] : g.recvs[pair];
  std::deque<Xfer>& theirs = send ? g.recvs[pair] : g.sends[pair];
  if (theirs.empty()) {
    mine.push_back(std::move(x));
    return;
  }
  Xfer other = theirs.front();
  theirs.pop_front();
  if (send) {
    match(s, g, x, other);
  } else {
    match(s, g, other, x);
  }
}

std::string pending_str(const Group& g, const std::shared_ptr<Op>& op) {
  std::string s;
  for (size_t pair = 0; pair < g.sends.size(); ++pair) {
    for (const Xfer& x : g.sends[pair])
      if (x.op == op)
        s += (s.empty() ? "" : "; ") + std::string("the send of ") + std::to_string(x.count) + " " + type_info(x.type).name +
             " from member " + std::to_string(x.src) + " to member " + std::to_string(x.dst) + " was never received";
    for (const Xfer& x : g.recvs[pair])
      if (x.op == op)
        s += (s.empty() ? "" : "; ") + std::string("member ") + std::to_string(x.dst) + "'s receive of " +
             std::to_string(x.count) + " " + type_info(x.type).name + " from member " + std::to_string(x.src) +
             " was never sent";
  }
  return s;
}

// The outermost ncclGroupEnd: each communicator's sends and receives become one
// operation of that member, done when every transfer met its counterpart.
ncclResult_t end_group(std::vector<Pending> calls) {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  std::vector<uint64_t> comms;  // in order of first use
  for (const Pending& p : calls)
    if (std::find(comms.begin(), comms.end(), p.comm) == comms.end()) comms.push_back(p.comm);
  struct Posted {
    std::shared_ptr<Member> m;
    std::shared_ptr<Op> op;
  };
  std::vector<Posted> posted;
  ncclResult_t r = ncclSuccess;
  // Every communicator is checked before anything is posted: a group fails whole.
  std::vector<std::shared_ptr<Member>> members;
  for (uint64_t id : comms) {
    std::shared_ptr<Member> m = find(s, handle<ncclComm_t>(id), "ncclGroupEnd", &r);
    if (!m) return r;
    if ((r = ready(*m, "ncclGroupEnd")) != ncclSuccess) return r;
    members.push_back(std::move(m));
  }
  for (size_t i = 0; i < comms.size(); ++i) {
    const uint64_t id = comms[i];
    const std::shared_ptr<Member>& m = members[i];
    Group& g = *m->group;
    auto op = std::make_shared<Op>();
    int sends = 0, recvs = 0;
    uint64_t stream = 0;
    for (const Pending& p : calls)
      if (p.comm == id) {
        if (!stream) stream = p.stream;
        (p.send ? sends : recvs) += 1;
        if (p.count) ++op->remaining;
      }
    log_line("nccl group_end member=" + std::to_string(m->index) + "/" + std::to_string(g.n) + " stream=" + hex(stream) +
             " comm=" + hex(g.id) + " sends=" + std::to_string(sends) + " recvs=" + std::to_string(recvs));
    if (op->remaining == 0) {
      op->done = true;  // nothing to move; NCCL skips zero-count transfers too
    } else {
      for (const Pending& p : calls) {
        if (p.comm != id || !p.count || op->settled()) continue;
        Xfer x{op, p.buf, p.count, p.type, p.send ? m->index : p.peer, p.send ? p.peer : m->index};
        post(s, g, std::move(x), p.send);
      }
    }
    posted.push_back({m, op});
  }
  ncclResult_t out = ncclSuccess;
  for (const Posted& p : posted) {
    std::shared_ptr<Group> g = p.m->group;
    auto missing = [g, op = p.op] { return pending_str(*g, op); };
    const ncclResult_t one = finish(s, lock, *p.m, *g, p.op, "ncclGroupEnd", missing);
    if (out == ncclSuccess || (out == ncclInProgress && one != ncclSuccess)) out = one;
  }
  return out;
}

ncclResult_t p2p(bool send, const char* call, void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                 cudaStream_t stream) {
  ncclResult_t r = ncclSuccess;
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    std::shared_ptr<Member> m = find(s, comm, call, &r);
    if (m) r = ready(*m, call);
    if (r == ncclSuccess) {
      const TypeInfo ti = type_info(type);
      if (!ti.name) {
        r = fail(ncclInvalidArgument, call, std::string(call) + ": unknown datatype " + std::to_string(type));
      } else if (peer < 0 || peer >= m->group->n) {
        r = fail(ncclInvalidArgument, call,
                 std::string(call) + ": peer " + std::to_string(peer) + " is not a member of comm " +
                     hex(m->group->id) + " (" + std::to_string(m->group->n) + " members)");
      } else if (count && !buf) {
        r = fail(ncclInvalidArgument, call, std::string(call) + ": NULL buffer with count " + std::to_string(count));
      } else {
        log_line(std::string("nccl ") + (send ? "send" : "recv") + " count=" + std::to_string(count) + " peer=" +
                 std::to_string(peer) + " member=" + std::to_string(m->index) + "/" + std::to_string(m->group->n) +
                 " stream=" + hex(id_of(stream)) + " comm=" + hex(m->group->id) + " type=" + ti.name);
      }
    }
  }
  if (r != ncclSuccess) {
    if (tls_depth > 0 && tls_group_error == ncclSuccess) tls_group_error = r, tls_group_why = tls_error;
    return r;
  }
  Pending p{send, id_of(comm), buf, count, type, peer, id_of(stream)};
  if (tls_depth > 0) {
    tls_group.push_back(p);
    return ncclSuccess;
  }
  return end_group({p});  // outside a group: a group of one
}

// --- init -----------------------------------------------------------------------------------

ncclResult_t init(const char* call, ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank,
                  const ncclConfig_t* config) {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  if (!comm) return fail(ncclInvalidArgument, call, std::string(call) + ": comm is NULL");
  if (tls_depth > 0)
    return fail(ncclInvalidUsage, call, std::string(call) + ": the fake does not create communicators inside a group");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, call,
                std::string(call) + ": rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " ranks");
  if (config && config->magic != kConfigMagic)
    return fail(ncclInvalidArgument, call, std::string(call) + ": the config was not set from NCCL_CONFIG_INITIALIZER");
  if (config && config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
    return fail(ncclInvalidArgument, call, std::string(call) + ": config blocking " + std::to_string(config->blocking));
  int pid = 0;
  std::memcpy(&pid, id.internal + 24, sizeof pid);
  if (std::memcmp(id.internal, kIdMagic, sizeof kIdMagic) != 0 || pid != ::getpid())
    return fail(ncclInvalidArgument, call,
                std::string(call) + ": the unique id was not made by ncclGetUniqueId in this process (the fake NCCL "
                                    "is in-process only)");
  if (config) {
    s.max_ctas = config->maxCTAs == NCCL_CONFIG_UNDEF_INT ? -1 : config->maxCTAs;
    s.min_ctas = config->minCTAs == NCCL_CONFIG_UNDEF_INT ? -1 : config->minCTAs;
  }
  std::shared_ptr<Group>& g = s.by_id[std::string(id.internal, NCCL_UNIQUE_ID_BYTES)];
  if (!g) {
    g = std::make_shared<Group>();
    g->id = s.next_group++;
    g->n = nranks;
    g->handles.assign(static_cast<size_t>(nranks), 0);
    g->sends.resize(static_cast<size_t>(nranks * nranks));
    g->recvs.resize(static_cast<size_t>(nranks * nranks));
  }
  const std::string at = std::string(call) + " (rank " + std::to_string(rank) + ", comm " + hex(g->id) + "): ";
  if (g->aborted) return fail(ncclRemoteError, call, at + "the communicator was aborted: " + g->abort_why);
  if (g->complete) return fail(ncclInvalidUsage, call, at + "the unique id was used up by a communicator that is complete");
  if (g->n != nranks || g->handles[static_cast<size_t>(rank)]) {
    const std::string why =
        g->n != nranks ? "rank " + std::to_string(rank) + " says " + std::to_string(nranks) + " ranks, an earlier one " +
                             std::to_string(g->n)
                       : "rank " + std::to_string(rank) + " joined twice";
    abort_group(s, *g, why);
    return fail(ncclInvalidUsage, call, at + why);
  }
  auto m = std::make_shared<Member>();
  m->group = g;
  m->index = rank;
  m->nonblocking = config && config->blocking == 0;
  const uint64_t h = s.next_handle;
  s.next_handle += kGroupStep;
  s.comms[h] = m;
  g->handles[static_cast<size_t>(rank)] = h;
  *comm = handle<ncclComm_t>(h);
  const int max_ctas = config && config->maxCTAs != NCCL_CONFIG_UNDEF_INT ? config->maxCTAs : -1;
  log_line("nccl init " + who(*m) + (m->nonblocking ? " nonblocking" : " blocking") +
           " max_ctas=" + std::to_string(max_ctas));
  if (++g->joined == g->n) {
    g->complete = true;
    s.cv.notify_all();
    return ncclSuccess;
  }
  if (m->nonblocking) return ncclInProgress;
  const int ms = timeout_ms();
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (!g->complete && !g->aborted)
    if (s.cv.wait_until(lock, deadline) == std::cv_status::timeout && !g->complete && !g->aborted) {
      std::vector<int> absent;
      for (int k = 0; k < g->n; ++k)
        if (!g->handles[static_cast<size_t>(k)]) absent.push_back(k);
      abort_group(s, *g, "ranks " + members_str(absent) + " never joined within " + std::to_string(ms) +
                             " ms ($FAKE_NCCL_TIMEOUT_MS)");
      return fail(ncclSystemError, call, at + g->abort_why);
    }
  if (g->aborted) return fail(ncclRemoteError, call, at + "the communicator was aborted: " + g->abort_why);
  return ncclSuccess;
}

// A member that goes away with work outstanding aborts the others rather than
// leave them waiting for it.
bool busy(const Member& m) {
  if (!m.group) return m.forming && !m.forming->settled();
  if (!m.group->complete) return true;
  return std::any_of(m.outstanding.begin(), m.outstanding.end(), [](const auto& op) { return !op->settled(); });
}

}  // namespace fake
