#include "runtime/agree.h"

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


std::optional<Diag> on_rank_threads(const DeviceMesh& mesh, std::chrono::milliseconds timeout,
                                    const std::function<std::optional<Diag>(Comm&)>& fn) {
  auto rv = Rendezvous::in_process();
  std::mutex mu;
  std::optional<Diag> first;
  std::vector<std::unique_ptr<Comm>> comms(static_cast<size_t>(mesh.world()));
  std::vector<std::thread> threads;
  for (int r = 0; r < mesh.world(); ++r) {
    threads.emplace_back([&, r] {
      CommOptions co;
      co.timeout = timeout;
      Result<std::unique_ptr<Comm>> c = Comm::create(rv, r, mesh.world(), mesh.rank_groups(r), co);
      std::optional<Diag> d = c ? fn(**c) : std::optional<Diag>(c.error());
      if (d) {
        std::lock_guard<std::mutex> lock(mu);
        // The first root cause: a rank that only saw another's abort (from_peer)
        // may finish before the rank that failed, and must not hide its reason.
        if (!first || (first->from_peer && !d->from_peer)) first = *d;
      }
      if (d && c) (*c)->abort(d->message);
      if (c) comms[static_cast<size_t>(r)] = std::move(c).value();  // destroyed after every rank is done
    });
  }
  for (std::thread& t : threads) t.join();
  comms.clear();
  return first;
}

Result<std::unique_ptr<Comm>> connect_rank(const DeviceMesh& mesh, int rank, const std::string& rendezvous_dir,
                                           std::chrono::milliseconds timeout) {
  CommOptions co;
  co.timeout = timeout;
  return Comm::create(Rendezvous::file(rendezvous_dir), rank, mesh.world(), mesh.rank_groups(rank), co);
}

}  // namespace sf
