// Collective bandwidth with nccl-tests' methodology, for our two backends: Gloo
// (runtime/comm/comm.h, CPU, always) and NCCL (runtime/comm/nccl.h, one GPU per rank,
// registered only when NCCL loads and there are as many GPUs as ranks).
// docs/collectives.md explains the numbers; in short, for each backend, world size
// (ranks are threads of this process), collective and size:
//
//   1. every rank prepares its inputs (f32, small integers, so every summation
//      order is exact) and, for Gloo, one copy per iteration (a Gloo collective
//      consumes its input);
//   2. `-w` warm-up iterations issued back to back, then waited for;
//   3. a barrier of the rank threads, then each rank's host timer around `-n`
//      iterations issued back to back and one final synchronisation (Gloo: wait()
//      on every Work in issue order; NCCL: the stream, through wait_with_timeout);
//   4. time = the mean over ranks of (rank's elapsed / iterations): the benchmark's
//      real_time, reported through manual timing;
//   5. outside the timed loop, every rank's result of the last iteration is
//      compared bit for bit with the host definitions (codegen/dist/
//      host_collectives.h), and a mismatch fails the benchmark.
//
// Counters: bytes = nccl-tests' size of what ran (nccl::collective_size: the
// buffer for all_reduce, the gathered output for all_gather, the input for
// reduce_scatter, the send buffer for all_to_all); algbw = bytes / time in GB/s
// (1e9); busbw = algbw x nccl::bus_factor (all_reduce 2(n-1)/n, the others (n-1)/n);
// iters and warmup as run.
//
// Flags (ours; everything else is Google Benchmark's), named as nccl-tests names them:
//   -b, --minbytes N     smallest size (default 8; K, M, G suffixes are 2^10, 2^20, 2^30)
//   -e, --maxbytes N     largest size (default 64M)
//   -f, --stepfactor F   size multiplier (default 8: 8 B, 64 B, ..., 16 MiB, as
//                        nccl-tests' `-b 8 -e 64M -f 8`, which stops at the last
//                        size not above -e)
//   -n, --iters N        timed iterations (default 20), but at most what keeps
//                        iters x size within --budget per rank, and at least 2
//   -w, --warmup_iters N warm-up iterations (default 5), capped like -n
//   --budget N           bytes of one rank's timed iterations (default 64M): Gloo
//                        holds every iteration's input until it runs, and on a
//                        2-core machine this keeps a whole run near a minute
//   --ranks 2,4          world sizes
//   --backends gloo,nccl which backends to run (those present)
//   -c, --check 0|1      compare with the host definitions (default 1)
//
// Exit status 1 when a benchmark failed or a result was wrong.
//
// The JSON context gets nccl (the library's version or why it is absent), gpus,
// sizes and iters from here; device, commit, date and command come from
// --benchmark_context (scripts/bench) and are filled in here when not given.
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/host_collectives.h"
#include "runtime/comm/comm.h"
#include "runtime/gpu/cuda.h"
#include "runtime/comm/nccl.h"

namespace sf {
namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int64_t min_bytes = 8;
  int64_t max_bytes = int64_t{64} << 20;
  int64_t factor = 8;
  int iters = 20;
  int warmup = 5;
  int64_t budget = int64_t{64} << 20;
  std::vector<int> ranks = {2, 4};
  std::set<std::string> backends = {"gloo", "nccl"};
  bool check = true;
  int failures = 0;  // benchmarks that failed or gave a wrong result: the exit status
};

Config& config() {
  static Config c;
  return c;
}

// Iterations for one size: -n, within the budget, at least 2.
int iterations_for(int64_t bytes, int wanted) {
  const int64_t fit = config().budget / std::max<int64_t>(bytes, 1);
  return static_cast<int>(std::max<int64_t>(std::min<int64_t>(wanted, fit), std::min(wanted, 2)));
}

// The per-member block of the n-way cut (the extent each member sends, keeps or
// receives); the whole buffer for all_reduce.
int64_t block_of(CollectiveKind c, const nccl::CollectiveSize& sz, int n) {
  switch (c) {
    case CollectiveKind::AllReduce: return sz.send_count;
    case CollectiveKind::AllGather: return sz.send_count;
    case CollectiveKind::ReduceScatter: return sz.recv_count;
    case CollectiveKind::AllToAll: return sz.send_count / n;
  }
  return 0;
}

// Rank r's input of `count` elements: small integers, so sums are exact in f32 in
// any order and every backend must give the host definitions' bits.
Tensor input(int rank, int64_t count) {
  Tensor t(DType::F32, {count});
  auto* p = reinterpret_cast<float*>(t.data());
  for (int64_t i = 0; i < count; ++i) p[i] = static_cast<float>((i * 7 + rank * 13) % 31 - 15);
  return t;
}

// The host definitions' result on every member.
std::vector<Tensor> expected(CollectiveKind c, const std::vector<Tensor>& locals, int64_t block) {
  const size_t n = locals.size();
  const std::vector<int64_t> sizes(n, block);
  switch (c) {
    case CollectiveKind::AllReduce: return host_all_reduce(locals, ReduceOp::Sum);
    case CollectiveKind::AllGather: return host_all_gather(locals, 0);
    case CollectiveKind::ReduceScatter: return host_reduce_scatter(locals, 0, sizes, ReduceOp::Sum);
    case CollectiveKind::AllToAll: return host_all_to_all(locals, 0, std::vector<std::vector<int64_t>>(n, sizes), 0);
  }
  return {};
}

// "" when `got` has `want`'s shape and bits, else where they first differ.
std::string compare(const Tensor& got, const Tensor& want) {
  if (got.type() != want.type()) return "result is " + got.type().str() + ", expected " + want.type().str();
  if (std::memcmp(got.data(), want.data(), got.nbytes()) == 0) return "";
  for (int64_t i = 0; i < got.numel(); ++i)
    if (got.get(i) != want.get(i))
      return "element " + std::to_string(i) + " is " + std::to_string(got.get(i)) + ", expected " +
             std::to_string(want.get(i));
  return "the bits differ";
}

// What every rank thread of one measurement reports.
struct RankRun {
  double seconds = 0;   // elapsed for the timed iterations
  Tensor result;        // the last iteration's (Gloo), or the downloaded buffer (NCCL)
  std::string error;
};

// Runs fn(rank) on one thread per rank and joins them.
void run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : ts) t.join();
}

// Turns the ranks' reports into the benchmark's time, counters and check.
void report(benchmark::State& state, CollectiveKind c, int n, const nccl::CollectiveSize& sz, int iters, int warmup,
            const std::vector<Tensor>& locals, const std::vector<RankRun>& runs) {
  for (int r = 0; r < n; ++r)
    if (!runs[static_cast<size_t>(r)].error.empty()) {
      ++config().failures;
      state.SkipWithError(runs[static_cast<size_t>(r)].error.c_str());
      return;
    }
  double sum = 0;
  for (const RankRun& r : runs) sum += r.seconds / iters;
  const double t = sum / n;
  state.SetIterationTime(t);
  if (config().check) {
    const std::vector<Tensor> want = expected(c, locals, block_of(c, sz, n));
    for (int r = 0; r < n; ++r) {
      const std::string why = compare(runs[static_cast<size_t>(r)].result, want[static_cast<size_t>(r)]);
      if (!why.empty()) {
        const std::string msg = "rank " + std::to_string(r) + ": wrong result: " + why;
        ++config().failures;
        state.SkipWithError(msg.c_str());
        return;
      }
    }
  }
  state.counters["bytes"] = static_cast<double>(sz.bytes);
  state.counters["algbw"] = nccl::algbw_GBps(sz.bytes, t);
  state.counters["busbw"] = nccl::busbw_GBps(c, n, sz.bytes, t);
  state.counters["iters"] = iters;
  state.counters["warmup"] = warmup;
}

// ---- Gloo --------------------------------------------------------------------------------

// One Comm per rank over the whole world, connected once per world size.
struct GlooWorld {
  std::shared_ptr<Rendezvous> rv;
  std::vector<std::unique_ptr<Comm>> comms;
};

std::map<int, std::unique_ptr<GlooWorld>>& gloo_worlds() {
  static std::map<int, std::unique_ptr<GlooWorld>> w;
  return w;
}

Result<GlooWorld*> gloo_world(int n) {
  auto& worlds = gloo_worlds();
  if (auto it = worlds.find(n); it != worlds.end()) return it->second.get();
  auto w = std::make_unique<GlooWorld>();
  w->rv = Rendezvous::in_process();
  w->comms.resize(static_cast<size_t>(n));
  std::vector<int> all(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) all[static_cast<size_t>(r)] = r;
  std::vector<std::string> errors(static_cast<size_t>(n));
  run_ranks(n, [&](int r) {
    Result<std::unique_ptr<Comm>> c = Comm::create(w->rv, r, n, {all});
    if (c) w->comms[static_cast<size_t>(r)] = std::move(c).value();
    else errors[static_cast<size_t>(r)] = c.error().message;
  });
  for (const std::string& e : errors)
    if (!e.empty()) return Diag{"", {}, e};
  GlooWorld* raw = w.get();
  worlds.emplace(n, std::move(w));
  return raw;
}

Work issue(Comm& comm, CollectiveKind c, Tensor t, int n, int64_t block) {
  const std::vector<int64_t> sizes(static_cast<size_t>(n), block);
  switch (c) {
    case CollectiveKind::AllReduce: return comm.all_reduce(0, std::move(t), ReduceOp::Sum);
    case CollectiveKind::AllGather: return comm.all_gather(0, std::move(t), 0, sizes);
    case CollectiveKind::ReduceScatter: return comm.reduce_scatter(0, std::move(t), 0, sizes, ReduceOp::Sum);
    case CollectiveKind::AllToAll: return comm.all_to_all(0, std::move(t), 0, sizes, 0, sizes);
  }
  return {};
}

void BM_Gloo(benchmark::State& state, CollectiveKind c, int n, int64_t requested) {
  Result<GlooWorld*> world = gloo_world(n);
  if (!world) {
    ++config().failures;
    state.SkipWithError(world.error().message.c_str());
    return;
  }
  const nccl::CollectiveSize sz = nccl::collective_size(c, requested, 4, n);
  const int64_t block = block_of(c, sz, n);
  const int iters = iterations_for(sz.bytes, config().iters);
  const int warmup = std::min(config().warmup, iters);
  std::vector<Tensor> locals;
  for (int r = 0; r < n; ++r) locals.push_back(input(r, sz.send_count));
  for (auto _ : state) {
    std::vector<RankRun> runs(static_cast<size_t>(n));
    std::barrier sync(n);
    run_ranks(n, [&](int r) {
      Comm& comm = *(*world)->comms[static_cast<size_t>(r)];
      RankRun& out = runs[static_cast<size_t>(r)];
      const Tensor& mine = locals[static_cast<size_t>(r)];
      // Each collective consumes its input: the copies are made before the clock.
      std::vector<Tensor> copies(static_cast<size_t>(warmup + iters), mine);
      std::vector<Work> works;
      works.reserve(static_cast<size_t>(iters));
      for (int i = 0; i < warmup; ++i) works.push_back(issue(comm, c, std::move(copies[static_cast<size_t>(i)]), n, block));
      for (Work& w : works)
        if (Result<Tensor> t = w.wait(); !t && out.error.empty()) out.error = t.error().message;
      works.clear();
      sync.arrive_and_wait();
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i)
        works.push_back(issue(comm, c, std::move(copies[static_cast<size_t>(warmup + i)]), n, block));
      for (Work& w : works) {
        Result<Tensor> t = w.wait();
        if (!t) {
          if (out.error.empty()) out.error = t.error().message;
        } else {
          out.result = std::move(t).value();
        }
      }
      out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    });
    report(state, c, n, sz, iters, warmup, locals, runs);
  }
}

// ---- NCCL --------------------------------------------------------------------------------

struct NcclRank {
  std::shared_ptr<cuda::Context> ctx;
  cuda::Stream stream;
  std::unique_ptr<nccl::NcclComm> comm;
};

struct NcclWorld {
  std::vector<NcclRank> ranks;
};

std::map<int, std::unique_ptr<NcclWorld>>& nccl_worlds() {
  static std::map<int, std::unique_ptr<NcclWorld>> w;
  return w;
}

// Rank r on GPU r, its communicator's unique id exchanged through the Gloo world.
Result<NcclWorld*> nccl_world(int n) {
  auto& worlds = nccl_worlds();
  if (auto it = worlds.find(n); it != worlds.end()) return it->second.get();
  Result<GlooWorld*> gloo = gloo_world(n);
  if (!gloo) return gloo.error();
  auto w = std::make_unique<NcclWorld>();
  w->ranks.resize(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  run_ranks(n, [&](int r) {
    NcclRank& me = w->ranks[static_cast<size_t>(r)];
    std::string& err = errors[static_cast<size_t>(r)];
    Result<std::shared_ptr<cuda::Context>> ctx = cuda::Context::primary(r);
    Result<cuda::Stream> s = ctx ? cuda::Stream::create(**ctx) : Result<cuda::Stream>(ctx.error());
    // Every rank takes part in the exchange, whatever happened above, so that
    // none waits for another: create() checks the device itself.
    Result<std::unique_ptr<nccl::NcclComm>> c = nccl::NcclComm::create(*(*gloo)->comms[static_cast<size_t>(r)], 0, r);
    if (!ctx) err = ctx.error().message;
    else if (!s) err = s.error().message;
    else if (!c) err = c.error().message;
    if (!err.empty()) return;
    me.ctx = *ctx;
    me.stream = std::move(s).value();
    me.comm = std::move(c).value();
  });
  for (const std::string& e : errors)
    if (!e.empty()) return Diag{"", {}, e};
  NcclWorld* raw = w.get();
  worlds.emplace(n, std::move(w));
  return raw;
}

Result<void> enqueue(nccl::NcclComm& comm, CollectiveKind c, CUdeviceptr send, CUdeviceptr recv,
                     const nccl::CollectiveSize& sz, int n, CUstream s) {
  switch (c) {
    case CollectiveKind::AllReduce:
      return comm.all_reduce(send, recv, static_cast<size_t>(sz.send_count), DType::F32, ReduceOp::Sum, s);
    case CollectiveKind::AllGather: return comm.all_gather(send, recv, static_cast<size_t>(sz.send_count), DType::F32, s);
    case CollectiveKind::ReduceScatter:
      return comm.reduce_scatter(send, recv, static_cast<size_t>(sz.recv_count), DType::F32, ReduceOp::Sum, s);
    case CollectiveKind::AllToAll:
      return comm.all_to_all(send, recv, static_cast<size_t>(block_of(c, sz, n)), DType::F32, s);
  }
  return {};
}

void BM_Nccl(benchmark::State& state, CollectiveKind c, int n, int64_t requested) {
  Result<NcclWorld*> world = nccl_world(n);
  if (!world) {
    ++config().failures;
    state.SkipWithError(world.error().message.c_str());
    return;
  }
  const nccl::CollectiveSize sz = nccl::collective_size(c, requested, 4, n);
  // The device buffers are reused by every iteration, as nccl-tests does: no budget.
  const int iters = std::max(config().iters, 1);
  const int warmup = config().warmup;
  std::vector<Tensor> locals;
  for (int r = 0; r < n; ++r) locals.push_back(input(r, sz.send_count));
  for (auto _ : state) {
    std::vector<RankRun> runs(static_cast<size_t>(n));
    std::barrier sync(n);
    run_ranks(n, [&](int r) {
      NcclRank& me = (*world)->ranks[static_cast<size_t>(r)];
      RankRun& out = runs[static_cast<size_t>(r)];
      auto fail = [&](const Result<void>& e) {
        if (!e.ok() && out.error.empty()) out.error = e.error().message;
        return !e.ok();
      };
      const Tensor& mine = locals[static_cast<size_t>(r)];
      // A fresh thread per iteration: bind the rank's GPU first.
      bool bad = fail(me.ctx->make_current());
      Result<cuda::Buffer> send = cuda::Buffer::allocate(*me.ctx, mine.nbytes());
      Result<cuda::Buffer> recv = cuda::Buffer::allocate(*me.ctx, static_cast<size_t>(sz.recv_count) * 4);
      bad = bad || !send || !recv;
      if (!send) out.error = send.error().message;
      else if (!recv) out.error = recv.error().message;
      if (!bad) bad = fail(cuda::check(me.ctx->drv().MemcpyHtoD(send->ptr(), mine.data(), mine.nbytes()), "cuMemcpyHtoD"));
      for (int i = 0; i < warmup && !bad; ++i)
        bad = fail(enqueue(*me.comm, c, send->ptr(), recv->ptr(), sz, n, me.stream.get()));
      if (!bad) bad = fail(me.comm->wait_with_timeout(me.stream.get()));
      // Every rank reaches the barrier, failed or not, so none waits forever.
      sync.arrive_and_wait();
      if (bad) return;
      const auto t0 = Clock::now();
      for (int i = 0; i < iters && !bad; ++i)
        bad = fail(enqueue(*me.comm, c, send->ptr(), recv->ptr(), sz, n, me.stream.get()));
      if (!bad) bad = fail(me.comm->wait_with_timeout(me.stream.get()));
      out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      if (bad) return;
      out.result = Tensor(DType::F32, {sz.recv_count});
      fail(cuda::check(me.ctx->drv().MemcpyDtoH(out.result.data(), recv->ptr(), out.result.nbytes()), "cuMemcpyDtoH"));
    });
    report(state, c, n, sz, iters, warmup, locals, runs);
  }
}

// GPUs the driver sees, or why there are none.
Result<int> gpu_count() {
  Result<const cuda::Driver*> d = cuda::driver();
  if (!d) return d.error();
  int n = 0;
  SF_TRY(cuda::check((*d)->DeviceGetCount(&n), "cuDeviceGetCount"));
  return n;
}

// ---- command line ------------------------------------------------------------------------

// "64M" -> 67108864; nullopt if it is not a count >= 1.
std::optional<int64_t> parse_size(const std::string& s) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || v < 1) return std::nullopt;
  int64_t m = 1;
  std::string suffix(end);
  if (suffix == "K" || suffix == "k") m = int64_t{1} << 10;
  else if (suffix == "M" || suffix == "m") m = int64_t{1} << 20;
  else if (suffix == "G" || suffix == "g") m = int64_t{1} << 30;
  else if (!suffix.empty()) return std::nullopt;
  return v * m;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) v.push_back(item);
  return v;
}

// Takes our flags out of argv; an error message, or "".
std::string parse_flags(int argc, char** argv, std::vector<char*>* rest) {
  Config& c = config();
  struct Flag {
    const char* short_name;
    const char* long_name;
    std::function<bool(const std::string&)> set;
  };
  auto count = [](int64_t* out) {
    return [out](const std::string& v) {
      std::optional<int64_t> x = parse_size(v);
      if (x) *out = *x;
      return x.has_value();
    };
  };
  auto integer = [](int* out, int min) {
    return [out, min](const std::string& v) {
      char* end = nullptr;
      const long x = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end || x < min) return false;
      *out = static_cast<int>(x);
      return true;
    };
  };
  int check = 1;
  const std::vector<Flag> flags = {
      {"-b", "--minbytes", count(&c.min_bytes)},
      {"-e", "--maxbytes", count(&c.max_bytes)},
      {"-f", "--stepfactor", [&c](const std::string& v) { return parse_size(v) && (c.factor = *parse_size(v)) >= 2; }},
      {"-n", "--iters", integer(&c.iters, 1)},
      {"-w", "--warmup_iters", integer(&c.warmup, 0)},
      {"", "--budget", count(&c.budget)},
      {"-c", "--check", integer(&check, 0)},
      {"", "--ranks",
       [&c](const std::string& v) {
         c.ranks.clear();
         for (const std::string& s : split_list(v)) {
           const int n = std::atoi(s.c_str());
           if (n < 1) return false;
           c.ranks.push_back(n);
         }
         return !c.ranks.empty();
       }},
      {"", "--backends",
       [&c](const std::string& v) {
         c.backends.clear();
         for (const std::string& s : split_list(v)) {
           if (s != "gloo" && s != "nccl") return false;
           c.backends.insert(s);
         }
         return !c.backends.empty();
       }},
  };
  rest->push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const Flag* hit = nullptr;
    std::optional<std::string> value;
    for (const Flag& f : flags) {
      for (const std::string& name : {std::string(f.short_name), std::string(f.long_name)}) {
        if (name.empty()) continue;
        if (a == name) {
          if (i + 1 >= argc) return a + " needs a value";
          hit = &f;
          value = argv[++i];
        } else if (a.rfind(name + "=", 0) == 0) {
          hit = &f;
          value = a.substr(name.size() + 1);
        }
        if (hit) break;
      }
      if (hit) break;
    }
    if (!hit) {
      rest->push_back(argv[i]);
      continue;
    }
    if (!hit->set(*value)) return std::string(hit->long_name) + " " + *value + ": not a valid value";
  }
  c.check = check != 0;
  if (c.max_bytes < c.min_bytes) return "--maxbytes is below --minbytes";
  return "";
}

// The keys given with --benchmark_context=KEY=VALUE[,KEY=VALUE].
std::set<std::string> context_keys(const std::vector<char*>& args) {
  std::set<std::string> keys;
  const std::string flag = "--benchmark_context=";
  for (char* a : args) {
    if (!a) continue;
    const std::string s = a;
    if (s.rfind(flag, 0) != 0) continue;
    for (const std::string& kv : split_list(s.substr(flag.size()))) keys.insert(kv.substr(0, kv.find('=')));
  }
  return keys;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) {
      std::string m = line.substr(line.find(':') + 1);
      m.erase(0, m.find_first_not_of(' '));
      std::replace(m.begin(), m.end(), ' ', '_');
      return m;
    }
  return "unknown";
}

std::string git_commit() {
  const std::string cmd = std::string("git -C '") + SF_SOURCE_DIR + "' rev-parse --short HEAD 2>/dev/null";
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[64];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    ::pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace
}  // namespace sf

int main(int argc, char** argv) {
  using namespace sf;
  std::vector<char*> args;
  if (std::string e = parse_flags(argc, argv, &args); !e.empty()) {
    std::cerr << "bench_collectives: error: " << e << "\n";
    return 1;
  }
  const std::set<std::string> given = context_keys(args);
  int n = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  const Config& cfg = config();

  // Which NCCL worlds can run, and why not.
  Result<const nccl::Library*> lib = nccl::library();
  Result<int> gpus = gpu_count();
  std::string nccl_context = lib ? "NCCL " + (*lib)->version_str() + " (" + (*lib)->file + ")" : lib.error().message;
  auto nccl_skip = [&](int world) -> std::string {
    if (!cfg.backends.count("nccl")) return "not asked for (--backends)";
    if (!lib) return lib.error().message;
    if (!gpus) return gpus.error().message;
    if (*gpus < world)
      return "needs " + std::to_string(world) + " GPUs, one per rank (NCCL cannot put two ranks of one communicator "
             "on one device), and the driver sees " + std::to_string(*gpus);
    return "";
  };

  std::vector<int64_t> sizes;
  for (int64_t s = cfg.min_bytes; s <= cfg.max_bytes; s *= cfg.factor) sizes.push_back(s);
  for (int world : cfg.ranks) {
    const std::string skip = nccl_skip(world);
    if (!skip.empty() && cfg.backends.count("nccl"))
      std::cerr << "bench_collectives: NCCL with " << world << " ranks skipped: " << skip << "\n";
    for (CollectiveKind c : kAllCollectives)
      for (int64_t s : sizes) {
        const int64_t bytes = nccl::collective_size(c, s, 4, world).bytes;
        const std::string tail = std::string(collective_name(c)) + "/ranks:" + std::to_string(world) +
                                 "/bytes:" + std::to_string(bytes);
        if (cfg.backends.count("gloo"))
          benchmark::RegisterBenchmark(("gloo/" + tail).c_str(), BM_Gloo, c, world, s)
              ->UseManualTime()
              ->Iterations(1)
              ->Unit(benchmark::kMicrosecond);
        if (skip.empty())
          benchmark::RegisterBenchmark(("nccl/" + tail).c_str(), BM_Nccl, c, world, s)
              ->UseManualTime()
              ->Iterations(1)
              ->Unit(benchmark::kMicrosecond);
      }
  }

  std::string gpu_names;
  if (gpus)
    for (int g = 0; g < *gpus; ++g)
      if (Result<cuda::DeviceInfo> info = cuda::device_info(g))
        gpu_names += (gpu_names.empty() ? "" : ", ") + info->name;
  benchmark::AddCustomContext("nccl", nccl_context);
  benchmark::AddCustomContext("gpus", gpus ? std::to_string(*gpus) + (gpu_names.empty() ? "" : " (" + gpu_names + ")")
                                           : gpus.error().message);
  benchmark::AddCustomContext("sizes", "-b " + std::to_string(cfg.min_bytes) + " -e " + std::to_string(cfg.max_bytes) +
                                           " -f " + std::to_string(cfg.factor) + " (f32)");
  benchmark::AddCustomContext("iters", "-n " + std::to_string(cfg.iters) + " -w " + std::to_string(cfg.warmup) +
                                           " --budget " + std::to_string(cfg.budget) + " per rank (Gloo)");
  benchmark::AddCustomContext("ranks", "threads of one process; Gloo over TCP loopback");
  if (!given.count("device")) benchmark::AddCustomContext("device", "cpu:" + cpu_model());
  if (!given.count("commit")) benchmark::AddCustomContext("commit", git_commit());
  if (!given.count("date")) benchmark::AddCustomContext("date", utc_now());
  if (!given.count("command")) {
    std::string cmd;
    for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
    benchmark::AddCustomContext("command", cmd);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  // Communicators before the contexts and the Gloo worlds they were made through.
  nccl_worlds().clear();
  gloo_worlds().clear();
  if (cfg.failures > 0) {
    std::cerr << "bench_collectives: " << cfg.failures << " benchmark(s) failed or gave a wrong result (ERROR OCCURRED above)\n";
    return 1;
  }
  return 0;
}
