#include "runtime/comm/agree.h"

#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

namespace sf {

namespace {

Tensor bytes_tensor(const std::string& s) {
  Tensor t(DType::Bool, Shape{static_cast<int64_t>(s.size())});
  if (!s.empty()) std::memcpy(t.data(), s.data(), s.size());
  return t;
}

// Every member's text along group `g`, in group order: sizes first, then the bytes.
Result<std::vector<std::string>> gather_group(Comm& comm, int g, const std::string& text) {
  const std::vector<int>& members = comm.group(g);
  const size_t n = members.size();
  Tensor len(DType::I64, Shape{1});
  len.set_int(0, static_cast<int64_t>(text.size()));
  Result<Tensor> lens = comm.all_gather(g, len, 0, std::vector<int64_t>(n, 1)).wait();
  if (!lens) return lens.error();
  std::vector<int64_t> sizes(n);
  for (size_t i = 0; i < n; ++i) sizes[i] = lens->get_int(static_cast<int64_t>(i));
  Result<Tensor> all = comm.all_gather(g, bytes_tensor(text), 0, sizes).wait();
  if (!all) return all.error();
  std::vector<std::string> out;
  const char* p = reinterpret_cast<const char*>(all->data());
  for (size_t i = 0; i < n; ++i) {
    out.emplace_back(p, static_cast<size_t>(sizes[i]));
    p += sizes[i];
  }
  return out;
}

}  // namespace

Result<std::string> broadcast_text(Comm& comm, const std::string& text) {
  std::string cur = text;
  for (int g = 0; g < comm.num_groups(); ++g) {
    if (comm.group(g).size() < 2) continue;
    Result<std::vector<std::string>> all = gather_group(comm, g, cur);
    if (!all) return all.error();
    cur = (*all)[0];  // the member at coordinate 0 along this dim
  }
  return cur;
}

Result<std::vector<std::string>> all_gather_text(Comm& comm, const std::string& text) {
  // Along each dim in turn, with the texts gathered so far packed as one
  // length-prefixed string, so that after the last dim every rank has all of them.
  std::vector<std::pair<int, std::string>> mine = {{comm.rank(), text}};
  for (int g = 0; g < comm.num_groups(); ++g) {
    if (comm.group(g).size() < 2) continue;
    std::string packed;
    for (auto& [r, s] : mine) packed += std::to_string(r) + " " + std::to_string(s.size()) + " " + s;
    Result<std::vector<std::string>> all = gather_group(comm, g, packed);
    if (!all) return all.error();
    mine.clear();
    for (const std::string& p : *all) {
      size_t i = 0;
      while (i < p.size()) {
        size_t a = p.find(' ', i), b = p.find(' ', a + 1);
        int r = std::stoi(p.substr(i, a - i));
        size_t len = std::stoul(p.substr(a + 1, b - a - 1));
        mine.emplace_back(r, p.substr(b + 1, len));
        i = b + 1 + len;
      }
    }
  }
  std::vector<std::string> out(static_cast<size_t>(comm.world()));
  for (auto& [r, s] : mine) out[static_cast<size_t>(r)] = s;
  return out;
}

namespace {

// "name value" lines back into pairs (the value may hold spaces, not newlines).
std::vector<std::pair<std::string, std::string>> parse_parts(const std::string& s) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t nl = s.find('\n', i);
    if (nl == std::string::npos) nl = s.size();
    std::string line = s.substr(i, nl - i);
    size_t sp = line.find(' ');
    out.emplace_back(line.substr(0, sp), sp == std::string::npos ? "" : line.substr(sp + 1));
    i = nl + 1;
  }
  return out;
}

}  // namespace

Digest& Digest::update(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    a_ = (a_ ^ p[i]) * 1099511628211ull;  // the FNV-1a 64 prime
    b_ = (b_ ^ p[i]) * 1099511628211ull;
  }
  n_ += n;
  return *this;
}

std::string Digest::hex() const {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(a_),
                static_cast<unsigned long long>(b_));
  return std::string(buf) + " (" + std::to_string(n_) + " bytes)";
}

void RunDigest::add(const std::string& name, const std::string& text) {
  // Short one-line texts (options) stay readable in the message; the rest is hashed.
  const bool whole = text.size() <= 200 && text.find('\n') == std::string::npos;
  if (whole) parts_.emplace_back(name, "'" + text + "'");
  else add(name, Digest().update(text));
}

void RunDigest::add(const std::string& name, const Digest& d) { parts_.emplace_back(name, "digest " + d.hex()); }

std::string RunDigest::str() const {
  std::string s;
  for (const auto& [name, value] : parts_) s += name + " " + value + "\n";
  return s;
}

Result<void> agree_on_run(Comm& comm, const RunDigest& digest) {
  Result<std::vector<std::string>> all = all_gather_text(comm, digest.str());
  if (!all) return with_context("comparing what the ranks run: ", all.error());
  const std::vector<std::string>& texts = *all;
  for (size_t r = 1; r < texts.size(); ++r) {
    if (texts[r] == texts[0]) continue;
    auto mine = parse_parts(texts[0]), theirs = parse_parts(texts[r]);
    std::string what;
    for (size_t i = 0; i < std::max(mine.size(), theirs.size()); ++i) {
      if (i < mine.size() && i < theirs.size() && mine[i] == theirs[i]) continue;
      std::string name = i < theirs.size() ? theirs[i].first : mine[i].first;
      what += (what.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + "'s " + name + " " +
              (i < theirs.size() ? theirs[i].second : "(missing)") + " differs from rank 0's " +
              (i < mine.size() ? mine[i].second : "(missing)");
    }
    return Diag{"", {},
                "rank " + std::to_string(comm.rank()) + ": the ranks disagree on what to run (every rank must be " +
                    "started with the same graph, options, Plan and configs): " + what};
  }
  return {};
}

Result<void> on_rank_threads(const DeviceMesh& mesh, std::chrono::milliseconds timeout,
                             const std::function<Result<void>(Comm&)>& fn) {
  if (std::optional<std::string> why = reserve_rank_descriptors(mesh.mesh(), mesh.world())) return Diag{"", {}, *why};
  auto rv = Rendezvous::in_process();
  std::mutex mu;
  Result<void> first;
  std::vector<std::unique_ptr<Comm>> comms(static_cast<size_t>(mesh.world()));
  std::vector<std::thread> threads;
  for (int r = 0; r < mesh.world(); ++r) {
    threads.emplace_back([&, r] {
      CommOptions co;
      co.timeout = timeout;
      Result<std::unique_ptr<Comm>> c = Comm::create(rv, r, mesh.world(), mesh.rank_groups(r), co);
      Result<void> d;
      // An exception escaping a std::thread would terminate the process: a bug that
      // throws ends as this rank's Diag instead (and aborts the others).
      const std::string who = "rank " + std::to_string(r) + ": internal error: ";
      try {
        d = c ? fn(**c) : Result<void>(c.error());
      } catch (const DiagError& e) {
        d = Diag{"", {}, who + e.diag.str()};
      } catch (const std::exception& e) {
        d = Diag{"", {}, who + e.what()};
      } catch (...) {
        d = Diag{"", {}, who + "an unknown exception"};
      }
      if (!d.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        // The first root cause: a rank that only saw another's abort (from_peer)
        // may finish before the rank that failed, and must not hide its reason.
        if (first.ok() || (first.error().from_peer && !d.error().from_peer)) first = d;
      }
      if (!d.ok() && c) (*c)->abort(d.error().message);
      if (c) comms[static_cast<size_t>(r)] = std::move(c).value();  // destroyed after every rank is done
    });
  }
  for (std::thread& t : threads) t.join();
  destroy_comms(comms);
  return first;
}

Result<std::unique_ptr<Comm>> connect_rank(const DeviceMesh& mesh, int rank, const std::string& rendezvous_dir,
                                           std::chrono::milliseconds timeout,
                                           std::optional<std::chrono::steady_clock::time_point> deadline) {
  CommOptions co;
  co.timeout = timeout;
  co.connect_deadline = deadline;
  return Comm::create(Rendezvous::file(rendezvous_dir), rank, mesh.world(), mesh.rank_groups(rank), co);
}

}  // namespace sf
