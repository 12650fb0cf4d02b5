#include "runtime/executor.h"

#include <map>
#include <mutex>
#include <thread>

#include "codegen/dist/shard.h"
#include "codegen/dist/explain.h"
#include "runtime/local_step.h"

namespace sf {

namespace {

Diag at_step(const LocalProgram& p, size_t i, const DeviceMesh& mesh, const std::string& what, bool from_peer = false,
             SourceLoc loc = {}) {
  Diag d{"", loc, "rank " + std::to_string(p.rank) + ", step " + std::to_string(i) + " (" +
                     step_line(p, p.steps[i], mesh) + "): " + what};
  d.from_peer = from_peer;
  return d;
}

Result<std::vector<Tensor>> execute_on(const LocalProgram& p, Comm& comm, const DeviceMesh& mesh,
                                       const std::vector<Tensor>& inputs, const ExecOptions& opts,
                                       const std::atomic<bool>* aborted) {
  static const std::atomic<bool> never{false};
  const std::atomic<bool>& stop = aborted ? *aborted : never;
  std::vector<Tensor> v(p.types.size());
  if (inputs.size() != p.param_values.size())
    return Diag{"", {}, "rank " + std::to_string(p.rank) + ": " + std::to_string(inputs.size()) + " inputs for " +
                            std::to_string(p.param_values.size()) + " params"};
  for (size_t i = 0; i < inputs.size(); ++i) v[static_cast<size_t>(p.param_values[i])] = inputs[i];
  std::map<int, Work> pending;
  struct Issued {
    double at_us;
    std::string name;
    int64_t bytes;
    size_t step;
  };
  std::map<int, Issued> issued;  // by handle, for the trace
  auto now_us = [&] {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - opts.trace_origin).count();
  };
  if (opts.trace) opts.trace->add_rank(p.rank);
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const LocalStep& s = p.steps[i];
    if (stop.load()) return at_step(p, i, mesh, "aborted because another rank failed", true);
    try {
      if (opts.before_step) opts.before_step(p.rank, i, stop);
    } catch (const std::exception& e) {
      return at_step(p, i, mesh, e.what());
    }
    if (is_local_step(s)) {
      const KernelRunner& runner = opts.kernels ? *opts.kernels : reference_kernel_runner();
      const double t0 = opts.trace ? now_us() : 0;
      if (auto err = run_local_step(p, s, v, runner)) return at_step(p, i, mesh, err->message, false, err->loc);
      if (opts.trace) {
        nlohmann::json args{{"step", i}};
        std::string name;
        if (s.kind == LocalStep::Kind::Kernel) {
          const LocalKernel& k = p.kernels[static_cast<size_t>(s.kernel)];
          name = k.name;
          args["bytes"] = k.bytes_read + k.bytes_written;
          args["flops"] = k.flops;
          args["kind"] = k.kind;
        } else {
          name = step_line(p, s, mesh);
          name = name.substr(0, name.find(' '));
        }
        opts.trace->add(p.rank, Stream::Compute, name, t0, now_us() - t0, std::move(args),
                        s.kind == LocalStep::Kind::Kernel ? "kernel" : "local");
      }
      continue;
    }
    switch (s.kind) {
      case LocalStep::Kind::Start: {
        Tensor x = v[static_cast<size_t>(s.in[0])];
        if (opts.trace)
          issued[s.handle] = {now_us(),
                              std::string(s.ring_steps ? "ring_shift" : redist_kind_name(s.comm)) + " " +
                                  p.names[static_cast<size_t>(s.in[0])],
                              static_cast<int64_t>(x.nbytes()), i};
        switch (s.comm) {
          case RedistKind::AllGather: pending.emplace(s.handle, comm.all_gather(s.mesh_dim, std::move(x), s.dim, s.sizes)); break;
          case RedistKind::ReduceScatter:
            pending.emplace(s.handle, comm.reduce_scatter(s.mesh_dim, std::move(x), s.dim, s.sizes, s.op));
            break;
          case RedistKind::AllReduce: pending.emplace(s.handle, comm.all_reduce(s.mesh_dim, std::move(x), s.op)); break;
          case RedistKind::AllToAll:
            pending.emplace(s.handle, comm.all_to_all(s.mesh_dim, std::move(x), s.dim, s.sizes, s.dim2, s.sizes2));
            break;
          case RedistKind::Slice:
          case RedistKind::Partialize: return at_step(p, i, mesh, "internal: not a collective");
        }
        break;
      }
      case LocalStep::Kind::Compute:
      case LocalStep::Kind::Kernel:
      case LocalStep::Kind::Slice:
      case LocalStep::Kind::Partialize:
      case LocalStep::Kind::Concat: break;  // run above
      case LocalStep::Kind::Wait: {
        auto it = pending.find(s.handle);
        if (it == pending.end()) return at_step(p, i, mesh, "internal: wait without a start");
        const double t0 = opts.trace ? now_us() : 0;
        Result<Tensor> t = it->second.wait();
        pending.erase(it);
        if (!t.ok()) return at_step(p, i, mesh, t.error().message, t.error().from_peer);
        if (opts.trace) {
          const double t1 = now_us();
          const Issued& is = issued[s.handle];
          opts.trace->add(p.rank, Stream::Comm, is.name, is.at_us, t1 - is.at_us,
                          {{"bytes", is.bytes}, {"step", is.step}}, "collective");
          opts.trace->add(p.rank, Stream::Compute, "wait " + p.names[static_cast<size_t>(s.out)], t0, t1 - t0,
                          {{"step", i}}, "wait");
        }
        v[static_cast<size_t>(s.out)] = std::move(t).value();
        break;
      }
    }
  }
  std::vector<Tensor> out;
  for (int o : p.output_values) out.push_back(v[static_cast<size_t>(o)]);
  return out;
}

// Runs fn on a rank's thread: an exception escaping a std::thread would terminate
// the process, so a bug that throws ends as that rank's Diag (and aborts the others).
template <class F>
auto guarded(int rank, F&& fn) -> decltype(fn()) {
  const std::string who = "rank " + std::to_string(rank) + ": internal error: ";
  try {
    return fn();
  } catch (const DiagError& e) {
    return Diag{"", {}, who + e.diag.str()};
  } catch (const std::exception& e) {
    return Diag{"", {}, who + e.what()};
  } catch (...) {
    return Diag{"", {}, who + "an unknown exception"};
  }
}

}  // namespace

Result<std::vector<Tensor>> execute(const LocalProgram& p, Comm& comm, const std::vector<Tensor>& inputs,
                                    const ExecOptions& opts, const std::atomic<bool>* aborted) {
  // The mesh only names steps in messages; a 1-D stand-in of the right size does.
  DeviceMesh mesh(Mesh{});
  return execute_on(p, comm, mesh, inputs, opts, aborted);
}

Result<std::vector<std::vector<Tensor>>> run_ranks_in_threads(const std::vector<LocalProgram>& programs,
                                                              const DeviceMesh& mesh,
                                                              const std::vector<std::vector<Tensor>>& inputs,
                                                              const ExecOptions& opts) {
  int world = mesh.world();
  // Refused before a thread starts: past the limit, or out of descriptors, the
  // ranks would wait on each other rather than fail.
  if (std::optional<std::string> why = reserve_rank_descriptors(mesh.mesh(), world)) return Diag{"", {}, *why};
  auto rv = Rendezvous::in_process();
  std::atomic<bool> aborted{false};
  std::mutex mu;
  std::optional<Diag> first_error;
  std::vector<std::vector<Tensor>> outputs(static_cast<size_t>(world));
  std::vector<std::unique_ptr<Comm>> comms(static_cast<size_t>(world));
  auto fail = [&](const Diag& d, Comm* comm) {
    {
      std::lock_guard<std::mutex> lock(mu);
      // The first root cause: an echo of another rank's abort only stands in
      // until one arrives (see Diag::from_peer).
      if (!first_error || (first_error->from_peer && !d.from_peer)) first_error = d;
    }
    if (!aborted.exchange(true) && comm) comm->abort(d.message);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      CommOptions co;
      co.timeout = opts.timeout;
      co.connect_deadline = opts.connect_deadline;
      Result<std::unique_ptr<Comm>> c = Comm::create(rv, r, world, mesh.rank_groups(r), co);
      if (!c.ok()) {
        fail(c.error(), nullptr);
        return;
      }
      Comm& comm = **c;
      Result<std::vector<Tensor>> out = guarded(r, [&] {
        return execute_on(programs[static_cast<size_t>(r)], comm, mesh, inputs[static_cast<size_t>(r)], opts, &aborted);
      });
      if (!out.ok()) fail(out.error(), &comm);
      else outputs[static_cast<size_t>(r)] = std::move(out).value();
      comms[static_cast<size_t>(r)] = std::move(c).value();  // destroyed after every rank is done
    });
  }
  for (std::thread& t : threads) t.join();
  destroy_comms(comms);
  if (first_error) return *first_error;
  return outputs;
}

Result<std::vector<Tensor>> run_rank_in_process(const LocalProgram& program, const DeviceMesh& mesh,
                                                const std::vector<Tensor>& inputs, const std::string& rendezvous_dir,
                                                const ExecOptions& opts) {
  CommOptions co;
  co.timeout = opts.timeout;
  co.connect_deadline = opts.connect_deadline;
  Result<std::unique_ptr<Comm>> c =
      Comm::create(Rendezvous::file(rendezvous_dir), program.rank, mesh.world(), mesh.rank_groups(program.rank), co);
  if (!c.ok()) return c.error();
  if (opts.on_connect)
    if (std::optional<Diag> d = opts.on_connect(**c)) return *d;  // every rank fails alike: no abort needed
  Result<std::vector<Tensor>> out = execute_on(program, **c, mesh, inputs, opts, nullptr);
  if (!out.ok()) (*c)->abort(out.error().message);
  return out;
}

}  // namespace sf
