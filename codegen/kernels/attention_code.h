// The fused attention kernel's code builder (internal to codegen/kernels): the block's
// tiles, how the kernel is built (Mode), and AttentionCode, which emits one block's
// work. attention.cpp holds the host, SIMT and shared-memory tensor-core forms and
// the emitter; attention_registers.cpp the register-resident tensor-core form
// (docs/fusion.md, "Attention"), attention_wgmma.cpp its sm_90a wgmma form.
#pragma once

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <llvm/IR/Constants.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include "codegen/kernels/attention.h"
#include "codegen/kernels/element.h"
#include "codegen/kernels/matmul.h"
#include "codegen/kernels/mma_layout.h"

namespace sf::attention_detail {

using kernels::Elem;
using kernels::ElementCodegen;
using kernels::GroupValues;
using kernels::emit_loop;

inline Diag fail(std::string msg) { return Diag{"", {}, "attention emitter: " + std::move(msg)}; }

// How the kernel is built: plain loops on the host; threads of a block on NVPTX, the
// two products in FMA (Simt) or on the tensor cores (Mma: mma.sync m16n8k16); or the
// Mma kernel built for the host with each thread a call and the warp instructions and
// barriers calls to MmaSimHooks (MmaSim: the tests' simulation).
enum class Mode { Host, Simt, Mma, MmaSim };

// One coordinate of an mma fragment element as an affine function of the lane's group
// (lane / 4) and thread-in-group (lane % 4): base + g * by_g + tig * by_tig, read off
// mma_layout.h's maps (tested against the PTX ISA's figures) at lanes 0, 4 and 1.
struct Affine {
  int base = 0, by_g = 0, by_tig = 0;
};
template <class F>
std::pair<Affine, Affine> fragment_map(F elem, int i) {
  const kernels::RowCol l0 = elem(0, i), l4 = elem(4, i), l1 = elem(1, i);
  return {Affine{l0.row, l4.row - l0.row, l1.row - l0.row}, Affine{l0.col, l4.col - l0.col, l1.col - l0.col}};
}

// The f32 tiles of one block, as offsets (in floats) into the block's buffer.
// `regs`: the register-resident tensor-core form keeps the scores, accumulators and
// row statistics in registers, and shared memory holds q, k and v only.
struct Tiles {
  int64_t bm = 0, bn = 0, e = 0, ev = 0;
  int64_t q = 0, k = 0, v = 0, s = 0, acc = 0, m = 0, l = 0, alpha = 0, floats = 0;
  // The register-resident form's tiles hold the operands as the tensor cores take
  // them, 16-bit, rows along the head dim: q [bm][e], k [bn][e] and v [bn][ev] at these
  // byte offsets, each row padded (qs, ks, vs: the strides) to an odd number of 16-byte
  // chunks, so that the 8 rows an ldmatrix phase reads fall in 8 distinct 16-byte
  // slots of a 128-byte line: one wavefront (rows of a multiple of 64 elements would
  // all start in one bank, an 8-way conflict).
  bool regs = false;
  int64_t q16 = 0, k16 = 0, v16 = 0, qs = 0, ks = 0, vs = 0;
  // `wgmma` (the register-resident form on sm_90a): q, k and v are what wgmma reads
  // through its matrix descriptors, the matmul's 128-byte-swizzled layout: panels of
  // 64 head-dim columns, each of the tile's rows (bm or bn) 128 bytes (chunk c of row
  // j at chunk c ^ j % 8), q's E / 64 panels, then per buffer k's E / 64 and v's
  // Ev / 64, each on a 1024-byte boundary (AttentionCode::tile_index).
  bool wgmma = false;
  // k/v buffers: 2 (key tile t in buffer t % 2), 3 for the pipelined wgmma form (tile
  // t - 1's v is still read while tile t + 1 is copied).
  int64_t kv_buffers = 2;
  // TMA brings k and v (the wgmma form, KernelSpec::tma): per buffer a "full"
  // mbarrier (the copies complete on it) and an "empty" one (every warp arrives once
  // its products no longer read the buffer), after the buffers from byte mbar_off.
  bool tma = false;
  int64_t mbar_off = 0;
  Tiles(int64_t bm_, int64_t bn_, int64_t e_, int64_t ev_, bool regs_ = false, bool wgmma_ = false, int64_t kv_buffers_ = 2,
        bool tma_ = false)
      : bm(bm_), bn(bn_), e(e_), ev(ev_), regs(regs_), wgmma(regs_ && wgmma_), kv_buffers(kv_buffers_), tma(wgmma && tma_) {
    k = q + bm * e;
    v = k + bn * e;
    s = v + bn * ev;
    acc = s + bm * bn;
    m = acc + bm * ev;
    l = m + bm;
    alpha = l + bm;
    floats = alpha + bm;
    qs = padded(e);
    ks = padded(e);
    vs = padded(ev);
    k16 = q16 + 2 * bm * qs;
    v16 = k16 + 2 * bn * ks;
    if (wgmma) {
      k16 = panels(e) * bm * 128;  // bm is whole warpgroups of 64 rows: a multiple of 1024 bytes
      v16 = k16 + panels(e) * bn * 128;
    }
    mbar_off = k16 + kv_buffers * kv_bytes();
  }
  static int64_t panels(int64_t n) { return (n + 63) / 64; }
  // n (a multiple of 8) plus 8 or 16 elements: an odd number of 16-byte chunks.
  static int64_t padded(int64_t n) { return n + ((n / 8) % 2 == 0 ? 8 : 16); }
  // The register-resident form double-buffers k and v: key tile t is read from
  // buffer t % 2 while tile t + 1 is copied into the other (cp.async), buffer 1 this
  // many bytes after buffer 0.
  int64_t kv_bytes() const { return wgmma ? (panels(e) + panels(ev)) * bn * 128 : 2 * bn * ks + 2 * bn * vs; }
  int64_t bytes() const { return regs ? mbar_off + (tma ? 16 * kv_buffers : 0) : floats * 4; }
};

class AttentionCode {
 public:
  AttentionCode(const KernelSpec& spec, const AttentionKernelInfo& info, const Tiles& t, Mode mode,
                llvm::IRBuilderBase& b, ElementCodegen& cg)
      : spec_(spec), info_(info), m_(info.match), t_(t), mode_(mode), b_(b), cg_(cg) {}

  // MmaSim: the hooks table (MmaSimHooks: ctx, barrier, ldmatrix_x4, mma, ...) and
  // the thread's index as the hooks take it.
  // Index 4 here is MmaSimHooks' shfl_bfly (its 17th pointer); 5, 6 and 7 its
  // cp_async, cp_commit and cp_wait (its 6th to 8th); 8 its wgmma_ra (19th), 9 and
  // 10 its wgmma_commit and wgmma_wait (9th and 10th), 11 its wgmma (5th), 12 to 15
  // its tma_load, mbar_init, mbar_expect_tx and mbar_try_wait (11th to 14th), 16
  // its mbar_arrive (15th), 17 its named_barrier (16th), 18 its setmaxnreg (18th).
  void sim_hooks(llvm::Value* hooks, llvm::Value* tid32);
  // The register-resident form (tensor cores, block_m = 16 or 32 x warps): each warp
  // keeps its rows' scores, probabilities, output accumulators and row statistics in
  // mma fragments, FlashAttention-2's layout, in `mtiles` 16-row tiles (1 or 2).
  void set_registers(bool on, int mtiles = 1) {
    regs_ = on;
    mtiles_ = on ? mtiles : 0;
  }
  // The register-resident form's products by wgmma.mma_async (sm_90a; Tiles::wgmma):
  // each warpgroup's 64 rows (its warps' 16 each, mtiles 1) at once, q and p from the
  // same registers mma.sync takes them in, k and v from shared memory through matrix
  // descriptors; the scores and output accumulators land in the same fragments.
  void set_wgmma(bool on, bool pipelined = false) {
    wg_ = on;
    wg_pipe_ = on && pipelined;
  }
  // FlashAttention-3's ping-pong between warpgroups (KernelConfig::pingpong; the
  // pipelined wgmma form, warpgroups in pairs): the two warpgroups of a pair issue
  // their products in turns, so that one's softmax runs while the other's products
  // have the tensor cores. Turn-taking by named barriers 1 + 2 p + r (pair p, role r).
  void set_pingpong(bool on) { pp_ = on && wg_pipe_; }
  // The register-resident form folds the attention's scale into the softmax's exp2
  // (FlashAttention's softmax_scale_log2): where the logits are the scores times a
  // positive constant c under masks alone (where(mask, x, -inf) whose masks do not
  // read the scores), and the kernel keeps f32 between its ops (Precision::Fused),
  // the chain is evaluated with that product read as the raw scores, the row maxima
  // are kept over them (c > 0 keeps the order), and exp(c (s - m)) is one
  // 2^fma(s, c log2 e, -m c log2 e): one multiplication an element fewer. Returns c
  // and the product's node, or nullopt.
  std::optional<std::pair<double, int>> scale_fold() const;
  void set_scale_fold(std::optional<std::pair<double, int>> f) {
    fold_ = f ? f->first : 0.0;
    fold_node_ = f ? f->second : -1;
  }
  // FlashAttention-3's producer warpgroup (KernelConfig::warp_specialize; the wgmma
  // form with TMA, two consumer warpgroups): a third warpgroup after the
  // `consumer_threads` consumers, whose first thread brings every key tile by TMA
  // while the consumers only wait for them and multiply; the producer gives up
  // registers (setmaxnreg.dec to kProducerRegs) and the consumers take them
  // (setmaxnreg.inc to kConsumerRegs). The launch has consumer_threads + 128 threads.
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  void set_producer(int64_t consumer_threads) {
    ws_ = true;
    consumer_threads_ = consumer_threads;
  }

  // ---- TMA for k and v (the wgmma form with KernelSpec::tma) ----
  // Where a k or v tile comes from by TMA: the param, and the tensor map's layout over
  // it (kv_tma_layout of the operand's views, copy_source): dims (cols, rows, head
  // dims), and each head dim's coordinate of the block's head b.
  struct TmaSource {
    int param = -1;
    KvTmaLayout layout;
  };
  // nullopt with `why` set where the operand does not come by TMA.
  std::optional<TmaSource> tma_source(int node, int64_t rows, int64_t cols, std::string* why = nullptr);
  // Both k's (its rows node's) and v's, or nullopt with `why` naming the one that
  // does not come by TMA; the kernel's group values built for the question alone (no
  // code emitted).
  std::optional<std::pair<TmaSource, TmaSource>> tma_sources(size_t num_params, std::string* why);
  // The kernel takes them by these tensor maps (k's, v's: generic pointers).
  void set_tma(std::pair<TmaSource, TmaSource> src, llvm::Value* kmap, llvm::Value* vmap, int warps) {
    tma_src_ = std::move(src);
    kmap_ = kmap;
    vmap_ = vmap;
    warps_n_ = warps;
  }
  // Thread 0 initialises each k/v buffer's full and empty mbarriers, then a barrier.
  void tma_init();
  // Thread 0: key tile kv0's k and v panels into the buffer at byte `buf_off` (buffer
  // `buf`), completing on its mbarrier.
  void tma_kv(llvm::Value* b, llvm::Value* kv0, llvm::Value* buf, llvm::Value* buf_off);
  // Every thread: until buffer `buf`'s full mbarrier completed the phase of `parity`.
  void tma_wait(llvm::Value* buf, llvm::Value* parity);
  // Thread 0, before bringing use n >= 1 of buffer `buf`: until every warp released
  // use n - 1 (the empty mbarrier's phase n - 1).
  void tma_wait_empty(llvm::Value* buf, llvm::Value* use);
  // Lane 0 of every warp: the warp's products no longer read buffer `buf`.
  void tma_release(llvm::Value* buf);
  // Buffer buf's full or empty mbarrier, as the instructions take it.
  llvm::Value* mbar_at(llvm::Value* buf, bool empty = false);
  void mbar_wait(llvm::Value* bar, llvm::Value* parity);
  // Thread 0 brings key tile kv0 (use kv0 / bn / n of buffer tile % n) when kv0 <
  // kv_end, after that buffer's previous use was released.
  void tma_fetch(llvm::Value* b, llvm::Value* kv0, llvm::Value* kv_end, int64_t n);
  // The calling thread brings key tile kv0 into buffer tile % n once its previous use
  // was released (tma_fetch's work; the producer warpgroup's loop).
  void tma_bring(llvm::Value* b, llvm::Value* kv0, int64_t n);


  // The whole kernel body for block `bid` (an i64 below blocks()).
  Result<void> block(llvm::Value* bid, llvm::Value* buf, llvm::Value* tid, llvm::Value* nthreads,
                     const std::vector<llvm::Value*>& in, llvm::Value* out);

  int64_t query_tiles() const { return std::max<int64_t>((m_.l + rph_ - 1) / rph_, 1); }
  int64_t blocks() const { return info_.batches / group_ * (m_.l > 0 ? (m_.l + rph_ - 1) / rph_ : 0); }
  // G query heads of one kv head per block, rph rows of each (G * rph = the tile's rows).
  void set_groups(int64_t group, int64_t rows_per_head) {
    group_ = group;
    rph_ = rows_per_head;
  }
  // The blocks take the query tiles longest first, `width` kv-head groups (of
  // group_ query heads) at a time (attention_block_order); 0: the grid's plain order,
  // block bid on group bid / query_tiles(), tile bid % query_tiles().
  void set_order(int64_t width) { lpt_width_ = width; }

 private:
  static Result<void> ok() { return {}; }
  // Whether the block's work is spread over threads (every mode but the host's loops).
  bool threaded() const { return mode_ != Mode::Host; }
  // Block row r's query row and batch index (its head): q0 + r % rph, b + r / rph.
  llvm::Value* row_of(llvm::Value* r) {
    return b_.CreateAdd(q0_, group_ == 1 ? r : b_.CreateURem(r, c(rph_)));
  }
  llvm::Value* head_of(llvm::Value* r) { return group_ == 1 ? b0_ : b_.CreateAdd(b0_, b_.CreateUDiv(r, c(rph_))); }
  llvm::Value* c(int64_t v) { return b_.getInt64(static_cast<uint64_t>(v)); }
  DType out_dtype() const { return spec_.group.node(m_.out).type.dtype; }

  // The block's buffer, float `base + i`.
  llvm::Value* at(int64_t base, llvm::Value* i) {
    return b_.CreateInBoundsGEP(b_.getFloatTy(), buf_, b_.CreateAdd(c(base), i));
  }
  // A float variable in the entry block (promoted to a register by mem2reg; an alloca
  // inside a loop would take stack on every iteration).
  llvm::Value* slot(llvm::Type* t = nullptr) {
    llvm::BasicBlock& entry = b_.GetInsertBlock()->getParent()->getEntryBlock();
    llvm::IRBuilder<> e(&entry, entry.getFirstInsertionPt());
    return e.CreateAlloca(t ? t : b_.getFloatTy());
  }
  llvm::Value* get(int64_t base, llvm::Value* i) { return b_.CreateLoad(b_.getFloatTy(), at(base, i)); }
  // The register-resident form's 16-bit tiles: element i of the tile at byte `base`
  // stored rounded to the operand dtype.
  void put16(int64_t base, llvm::Value* i, llvm::Value* x) { store16(base, i, to16(x)); }
  // 16-bit bits `bits` (an i16) at element i of the tile at byte `base`.
  void store16(int64_t base, llvm::Value* i, llvm::Value* bits);
  // Eight of them at elements i .. i + 7 (i a multiple of 8, the tile 16-byte aligned):
  // one 16-byte store.
  void store16x8(int64_t base, llvm::Value* i, const std::vector<llvm::Value*>& bits);
  // ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 from `lane_row` (this lane's row
  // address, mma_layout.h's ldmatrix_x4_*_addr) plus `off` bytes: four registers.
  std::vector<llvm::Value*> ldsm_x4(llvm::Value* lane_row, int64_t off, bool trans = false);
  void put(int64_t base, llvm::Value* i, llvm::Value* v) { b_.CreateStore(v, at(base, i)); }

  // for (i = 0; i < n; ++i) body(i), spread over the block's threads (a block apart)
  // with a barrier after it on NVPTX; a plain loop on the host.
  Result<void> par(int64_t n, const std::string& name, const std::function<Result<void>(llvm::Value*)>& body) {
    Result<void> r = threaded() ? emit_loop(b_, tid_, c(n), nthreads_, name, body) : emit_loop(b_, c(0), c(n), c(1), name, body);
    if (!r) return r;
    if (threaded()) barrier();
    return r;
  }
  void barrier() {
    // With a producer warpgroup, past its branch: the consumers' named barrier 5 (1
    // to 4 are ping-pong's turns).
    if (consumers_only_) return named_barrier(c(5), static_cast<int>(consumer_threads_), /*sync=*/true);
    if (mode_ == Mode::MmaSim) {
      b_.CreateCall(llvm::FunctionType::get(b_.getVoidTy(), {b_.getPtrTy()}, false), hook_[1], {hook_[0]});
      return;
    }
    b_.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier0, {}, {});
  }

  // ---- the tensor-core products (Mode::Mma, MmaSim) ------------------------------

  bool f16() const { return score_in_dtype() == DType::F16; }
  DType score_in_dtype() const { return spec_.group.node(m_.q).type.dtype == DType::F16 ? DType::F16 : DType::BF16; }
  // f32 x, y rounded to the operand dtype and packed in one .b32, x in the low half.
  llvm::Value* pack(llvm::Value* x, llvm::Value* y);
  llvm::Value* coord(const Affine& a, llvm::Value* g, llvm::Value* tig) {
    return b_.CreateAdd(c(a.base), b_.CreateAdd(b_.CreateMul(g, c(a.by_g)), b_.CreateMul(tig, c(a.by_tig))));
  }
  // The A fragment (16 x 16) at (m0, k0) of the f32 tile at `base` with rows of `stride`.
  std::vector<llvm::Value*> frag_a(int64_t base, int64_t stride, llvm::Value* m0, llvm::Value* k0);
  // The B fragment (16 x 8) at (k0, n0): element (k, n) from the f32 tile at `base`,
  // at (k0 + k) * k_stride + (n0 + n) * n_stride.
  std::vector<llvm::Value*> frag_b(int64_t base, int64_t k_stride, int64_t n_stride, llvm::Value* k0, llvm::Value* n0);
  // Where C/D element i (16 x 8 at (m0, n0)) lies in a tile with rows of `stride`.
  llvm::Value* c_index(int i, llvm::Value* m0, llvm::Value* n0, int64_t stride, llvm::Value** row_out = nullptr);
  // D = A B + C, mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32.
  std::vector<llvm::Value*> mma(const std::vector<llvm::Value*>& a, const std::vector<llvm::Value*>& bf,
                                const std::vector<llvm::Value*>& cf);
  // for (tile = warp; tile < tiles; tile += warps): warp-uniform, as mma.sync needs.
  Result<void> per_warp_tile(int64_t tiles, const std::string& name, const std::function<Result<void>(llvm::Value*)>& body);
  // `k_steps` products accumulated on `acc` (4 f32 slots), one per k0 = 0, 16, ...
  Result<void> accumulate(llvm::Value* acc, int64_t k, const std::string& name,
                          const std::function<void(llvm::Value* k0, std::vector<llvm::Value*>&, std::vector<llvm::Value*>&)>& frags);

  // `body` where `cond` holds.
  Result<void> when(llvm::Value* cond, const std::function<Result<void>()>& body);
  // body() where `cond` holds, else `other` (0 by default): an f32.
  Result<llvm::Value*> guarded(llvm::Value* cond, const std::function<Result<llvm::Value*>()>& body,
                               llvm::Value* other = nullptr);

  // Value `v` (q, kt or v: a float tensor of the group) at flat index `flat` of its
  // own shape, through its prologue, as f32.
  // `coords`: v's coordinates at `flat`, when known (generators such as a causal
  // mask's tril then read them instead of dividing the flat index).
  Result<llvm::Value*> operand(int v, llvm::Value* flat, GroupValues::Hook hook = {},
                               std::vector<llvm::Value*> coords = {});

  // The chain's logit at block row r and key `col` from the raw dot product `raw()`
  // (called only inside the rows and keys); -inf outside them.
  Result<llvm::Value*> logit(llvm::Value* r, llvm::Value* col, const std::function<Result<llvm::Value*>()>& raw);
  // Chain value `node` (the logits, or an operand of theirs of the scores' shape) at
  // block row r and key `col`, the scores being the raw dot product `raw`.
  Result<llvm::Value*> chain_value(int node, llvm::Value* r, llvm::Value* col, llvm::Value* raw);
  // The same where the caller knows (r, col) is inside the rows and keys and, for a
  // causal chain, on or below the diagonal: no bounds test, and the chain read up to
  // the causal where's kept operand (unmasked_node), the mask not evaluated.
  Result<llvm::Value*> logit_inside(llvm::Value* r, llvm::Value* col, llvm::Value* raw);
  // The node logit_inside evaluates: the logits, or with a causal diagonal the causal
  // where's kept operand; -1 where that operand is not of the logits' shape.
  int unmasked_node() const;

  Result<void> key_tile(llvm::Value* b, llvm::Value* kv0);

  // k [bn, E] from kt [.., E, S]; v [bn, Ev] from v [.., S, Ev], through their
  // prologues, zero past the keys.
  Result<void> load_kv(llvm::Value* b, llvm::Value* kv0);
  // kt's tile element by element: store(i, key j, e, value) for i = j E + e.
  Result<void> load_k_elements(llvm::Value* b, llvm::Value* kv0,
                               const std::function<void(llvm::Value*, llvm::Value*, llvm::Value*, llvm::Value*)>& store);

  // The shared-memory forms' products and softmax over the loaded k and v tiles.
  Result<void> products(llvm::Value* kv0);

  // ---- the register-resident form's loads -----------------------------------------
  // The 16-bit tiles are filled 8 elements along the head dim at a time. Where a
  // param reaches the operand through views only, in runs of 8 dense elements (the
  // projections' heads, GQA's repeat, a transpose's input), its 8 elements are one
  // 16-byte load when every such param is 16-byte aligned (checked once per block,
  // else element by element); arithmetic in the prologue (RoPE) runs per element
  // on the loaded lanes. k's rows are read from its transpose's input, [.., S, E],
  // whose head dim is contiguous.

  // The node k's rows are read from: kt's input where kt = transpose(k, -2, -1).
  int k_rows_node() const;

  // Which params q, k's rows and v read in dense runs of 8, and whether all of them
  // are 16-byte aligned here (aligned_).
  void plan_vector_loads();

  // Elements index .. index + 7 of `ptr` (dtype t, 16-byte aligned there), widened. On
  // NVPTX each 16 bytes is one ld.global.nc.v4 (llvm.nvvm.ldg): a plain vector load
  // whose lanes are only extracted is split into scalar loads by LLVM's vector
  // combining, which the lanes' per-element arithmetic invites here.
  std::vector<Elem> load8(DType t, llvm::Value* ptr, llvm::Value* index);
  // v rounded to the tiles' 16-bit dtype, as stored: a lane load8 read and nothing
  // changed is its loaded bits (no rounding code for a plain copy).
  llvm::Value* to16(llvm::Value* v);

  // Elements c0 .. c0 + 7 of `node` from flat index `flat` (c0 a multiple of 8 along
  // its contiguous last dim), through its prologue, as the tiles store them (to16).
  // `vector`: the dense params come in 16-byte loads.
  Result<std::vector<llvm::Value*>> lanes8(int node, llvm::Value* flat, bool vector);

  // For each of `rows` tile rows and chunk of 8 of its `cols`: `row_base(r)` gives the
  // node's flat index of (r, 0) and whether the row exists (else zeros), `store` puts
  // the 8 values; spread over the block's threads, a barrier after.
  Result<void> load16(int node, int64_t rows, int64_t cols, const std::string& name,
                      const std::function<std::pair<llvm::Value*, llvm::Value*>(llvm::Value*)>& row_base,
                      const std::function<void(llvm::Value*, llvm::Value*, const std::vector<llvm::Value*>&)>& store);

  // k [bn][E] and v [bn][Ev] (rows: keys kv0 + j) into the buffer `bufe` elements
  // after buffer 0 (0 or Tiles::kv_bytes() / 2). An operand that is a 16-bit param
  // seen through views alone (copy_source) is copied by cp.async, 16 bytes a thread at
  // a time, when its pointer is 16-byte aligned (aligned_), committed as one group by
  // the caller; otherwise it is loaded and stored by the threads, a barrier after.
  Result<void> load_kv16(llvm::Value* b, llvm::Value* kv0, llvm::Value* bufe);

  // The param slot and offset map that `node` (k's rows or v) copies unchanged: a
  // chain of transposes, permutes, reshapes, expands and slices from a param of the
  // tiles' 16-bit dtype, read in dense runs of 8 (`runs`: TMA's kv_tma_layout checks
  // the layout itself, through any number of view steps). nullopt where anything computes.
  std::optional<std::pair<int, kernels::IndexMap>> copy_source(int node, bool runs = true) const;
  // cp.async of `rows` tile rows of `cols` elements (8 at a time) of `node`'s param
  // `src` into the tile at byte `base` plus `bufe` elements, rows `stride` apart;
  // `row_base` as load16's. Spread over the block's threads, no barrier.
  // `stride` 0: the tile in the wgmma layout (tile_index over `rows`).
  Result<void> copy16(const std::pair<int, kernels::IndexMap>& src, int64_t rows, int64_t cols, const std::string& name,
                      int64_t base, int64_t stride, llvm::Value* bufe,
                      const std::function<std::pair<llvm::Value*, llvm::Value*>(llvm::Value*)>& row_base);
  // Element (row j, column col) of a q, k or v tile of `rows` rows, counted from its
  // start: rows of `stride` elements, or (stride 0) the wgmma layout (Tiles::wgmma).
  llvm::Value* tile_index(llvm::Value* j, llvm::Value* col, int64_t stride, int64_t rows);
  // The wgmma form's instructions: wgmma.fence, commit_group, wait_group 0, the
  // product with A from registers (MmaSimHooks::wgmma_ra in MmaSim), and the proxy
  // fence that makes the threads' shared-memory writes (cp.async, st.shared) visible
  // to wgmma's reads.
  void wgmma_fence();
  // Ping-pong (set_pingpong): the turns of a warpgroup's product groups. turn_first
  // before its first turn (the pair's second warpgroup gives the first its first
  // turn); turn_begin waits for the warpgroup's turn (bar.sync on its barrier, 256
  // threads: its 128 and the other's arrivals), turn_end gives the turn to the other
  // warpgroup (bar.arrive on the other's barrier), but at the `last` turn the second
  // warpgroup does not (nothing would wait for it). Each barrier then completes as
  // often as it is waited on, and no arrival is left at the block's exit.
  // The producer warpgroup's branch (set_producer), at the top of the block: thread 0
  // initialises the k/v buffers' mbarriers and every thread of the launch meets at a
  // barrier; the producer warpgroup then gives up its registers and its first thread
  // brings key tiles 0 .. kv_end in turn, each once every consumer warp released its
  // buffer's previous use, and leaves; the consumers take the registers and go on,
  // their barriers from here on named barrier 5 of theirs alone.
  void producer_branch(llvm::Value* b, llvm::Value* kv_end);
  void set_max_regs(int count, bool inc);
  // The keys any row of the block (its first row q0) can see: all, or (causal) up to
  // the last row's diagonal, q0 + rph - 1 + d, clamped to [0, S].
  llvm::Value* key_end(llvm::Value* q0);
  void turn_first();
  void turn_begin();
  void turn_end(bool last);
  void named_barrier(llvm::Value* id, int threads, bool sync);
  void wgmma_commit();
  void wgmma_wait(int pending);
  void proxy_fence();
  // The values (f32 or i32) passed through an empty volatile asm, which LLVM keeps in
  // order with the other inline PTX: a wgmma's results so that no instruction reads
  // them ahead of the wgmma.wait_group emitted before, and a wgmma's inputs so that
  // they are defined ahead of the wgmma.fence after (NVPTX only).
  void fence_operands(std::vector<llvm::Value*>& v);
  // D += A B, B at shared byte `b_off` (a leading byte offset `lbo`, MN-major where
  // `trans_b`), A from four registers `a`, or (a empty) K-major at shared byte `a_off`.
  std::vector<llvm::Value*> wgmma(const std::vector<llvm::Value*>& a, llvm::Value* a_off, llvm::Value* b_off, int64_t lbo,
                                  std::vector<llvm::Value*> d, bool trans_b);
  // copy() where `src` exists and aligned_ holds (a block-uniform branch), else load().
  Result<void> copy_or_load(const std::optional<std::pair<int, kernels::IndexMap>>& src,
                            const std::function<Result<void>()>& copy, const std::function<Result<void>()>& load);
  // cp.async.commit_group; cp.async.wait_group `pending` (hooks 6 and 7 in MmaSim).
  void cp_commit();
  void cp_wait(int pending);

  // ---- the register-resident tensor-core form (regs_) -------------------------------
  // Warp w owns block rows 16 T w .. 16 T (w + 1) - 1, T = mtiles_ 16-row mma tiles
  // (1 or 2), each of which reads the same k and v fragments (one ldmatrix feeds T
  // mma). Per key tile and mma tile it computes its 16 x bn
  // scores as bn / 8 mma C fragments (4 f32 a thread: rows g and g + 8 of the warp's
  // 16, columns 2 tig and 2 tig + 1 of each 8), runs the
  // chain and the online softmax on them in registers (a row's max over the 4 threads
  // of its quad by two butterfly shuffles; its sum kept per thread and added over the
  // quad once at the end, the rescaling being the same for the 4), turns the
  // probabilities into mma A fragments without leaving registers (C elements of key
  // columns 16kk .. 16kk + 15 are exactly the A elements of that k step, read off
  // mma_layout.h), and multiplies them by v into output accumulators that stay in
  // registers until the store. Shared memory holds q, k and v only.

  // v exchanged with the lane `mask` away (shfl.sync.bfly), every lane of the warp.
  llvm::Value* shfl_xor(llvm::Value* v, int mask);
  // exp(x) for x <= 0 whose result is rounded to 16 bits before use (p for the second
  // product) or scales such values (alpha): 2^(x log2 e), one ex2.approx.ftz on the
  // GPU (relative error 2^-22, against libdevice's expf's eight or so instructions),
  // as FlashAttention's exp2f. A denormal result flushes to 0, below anything a
  // 16-bit p keeps next to the row's largest, which is 1.
  llvm::Value* exp_rounded(llvm::Value* x);
  // exp(x - m) for the same use, given -m log2 e: 2^fma(x, log2 e, -m log2 e), one
  // FMA where exp_rounded(x - m) takes a subtraction and a product (FlashAttention's
  // scaled exp2). The exponent's error is f32's rounding of m log2 e, under 1e-5
  // absolute for |m| below 100: p then moves by 1e-5 relative, far inside the 16-bit
  // rounding it goes through.
  llvm::Value* exp_minus(llvm::Value* x, llvm::Value* neg_m_log2e, double log2e = 1.4426950408889634);
  // max(a, x) of a row's running max and a score: llvm.maxnum (max.f32, one
  // instruction where a compare and a select took two). A NaN score is ignored, as
  // the select ignored it; a is never NaN (it starts at -inf and takes only
  // non-NaN scores). Which zero max(-0, +0) keeps does not matter: only x - max reads it.
  llvm::Value* fmax_keep(llvm::Value* a, llvm::Value* x) { return b_.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, a, x); }

  // Where A element e (0..7) of a 16 x 16 k step lies among the C fragments of its two
  // 16 x 8 column tiles: (tile 0 or 1, C element), from mma_layout.h's maps.
  static std::pair<int, int> a_from_c(int e);

  Result<void> warp_rows(llvm::Value* b, llvm::Value* kv_end);

  // Key tile kv0's products and softmax, its k and v read `kvoff` bytes after buffer 0.
  Result<void> key_tile_regs(llvm::Value* kv0, llvm::Value* kvoff);
  // Per mma tile, its n8 tiles' C fragments (4 f32 each).
  using Frags = std::vector<std::vector<llvm::Value*>>;
  // The wgmma form's pieces (no fence, commit or wait of their own): the scores of
  // the key tile whose k is `kvoff` bytes after buffer 0 added to `d` (bn / 2 f32 a
  // thread); the
  // output `d` (Ev / 2 f32) plus p's A fragments `a` times that tile's v; p's A
  // fragments per k step of 16 keys, packed from its C fragments; and a wgmma's D
  // as C fragments and back.
  std::vector<llvm::Value*> scores_wgmma(llvm::Value* kvoff, std::vector<llvm::Value*> d);
  std::vector<llvm::Value*> zeros(int64_t n);  // n f32 zeros
  std::vector<llvm::Value*> output_wgmma(const std::vector<std::vector<llvm::Value*>>& a, llvm::Value* kvoff,
                                         std::vector<llvm::Value*> d);
  std::vector<std::vector<llvm::Value*>> p_fragments(const Frags& p);
  static Frags fragments(const std::vector<llvm::Value*>& d);
  static std::vector<llvm::Value*> flat(const Frags& f);
  // wgmma = 2: FlashAttention-3's pipelining within a warpgroup over three k/v
  // buffers: tile t's scores and tile t - 1's output products in flight while tile
  // t's softmax runs (docs/kernels.md, "Attention").
  Result<void> key_loop_pipelined(llvm::Value* b, llvm::Value* kv_end);
  // Key tile kv0's scores `sc` (per mma tile) through the chain (masks, scale) and the
  // online softmax: `sc` becomes p, each row's running max and partial sum move on,
  // and the result is each row half's rescaling factor alpha = exp(m_old - m_new).
  Result<std::vector<std::array<llvm::Value*, 2>>> softmax_tile(llvm::Value* kv0, std::vector<Frags>& sc);

  DType score_dtype() const { return spec_.group.node(m_.scores).type.dtype; }
  // The host's dot products: 8 lanes, 2 partial sums (a reordered f32 sum, as the
  // host matmul's); none on NVPTX, where a thread's sum stays in order.
  kernels::LoopHints host_hints() const { return threaded() ? kernels::LoopHints{} : kernels::LoopHints{8, 2}; }

  // The batch dims' coordinates of flat batch index b, outermost first.
  std::vector<llvm::Value*> batch_coords(llvm::Value* b);

  // The element offset of (batch b, row, col) of the attention's result in the output.
  llvm::Value* store_offset(llvm::Value* b, llvm::Value* row, llvm::Value* col);

  const KernelSpec& spec_;
  const AttentionKernelInfo& info_;
  const AttentionMatch& m_;
  const Tiles& t_;
  Mode mode_;
  llvm::Value* hook_[19] = {};
  std::optional<std::pair<TmaSource, TmaSource>> tma_src_;
  llvm::Value *kmap_ = nullptr, *vmap_ = nullptr;
  int warps_n_ = 0;
  bool regs_ = false, wg_ = false, wg_pipe_ = false;
  // The register-resident form: the warp's first row, its output accumulators (ev / 8
  // C fragments) and its rows' running max and partial sum (rows g and g + 8), as
  // entry-block slots mem2reg promotes.
  llvm::Value* m0w_ = nullptr;
  llvm::Value *qrow_ = nullptr, *krow_ = nullptr, *vrow_ = nullptr;     // ldmatrix.x4 row addresses
  std::vector<llvm::Value*> in_;     // the kernel's inputs
  std::set<int> vec_params_;         // params read in dense runs of 8 (plan_vector_loads)
  llvm::Value* aligned_ = nullptr;   // every one of them 16-byte aligned
  std::map<llvm::Value*, llvm::Value*> raw_;  // load8's widened lanes -> their loaded 16-bit bits
  // Per mma tile mt of the warp: o_[mt] its ev / 8 x 4 accumulators, mrow_[mt][h]
  // and lrow_[mt][h] its rows g (h = 0) and g + 8's running max and partial sum.
  int mtiles_ = 0;
  std::vector<std::vector<llvm::Value*>> o_;
  std::vector<std::array<llvm::Value*, 2>> mrow_, lrow_;
  llvm::Value* tid32_ = nullptr;
  llvm::Value *warp_ = nullptr, *warps_ = nullptr, *g_ = nullptr, *tig_ = nullptr;
  int64_t group_ = 1, rph_ = 1;
  int64_t lpt_width_ = 0;
  bool pp_ = false;
  double fold_ = 0.0;  // scale_fold's c (0: none)
  int fold_node_ = -1;
  bool ws_ = false, consumers_only_ = false;
  int64_t consumer_threads_ = 0;
  llvm::Value *b0_ = nullptr, *q0_ = nullptr;
  llvm::IRBuilderBase& b_;
  ElementCodegen& cg_;
  GroupValues* gv_ = nullptr;
  llvm::Value *buf_ = nullptr, *tid_ = nullptr, *nthreads_ = nullptr, *out_ = nullptr;
};

}  // namespace sf::attention_detail
