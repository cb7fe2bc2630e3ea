"""CPU emulation of the cuda backend's small-M FP4 GEMM (torch_fp4/csrc/mm_small_m.cuh): no GPU.

The kernel body is written against a context object (indices, barriers, cp.async, the warp MMA,
clusters); on the GPU that is DeviceCtx (mm_small_m.cu), here the C++ emulator below, built with
the host compiler from the same header. It runs one cooperative fiber per GPU thread (round
robin, deterministic), a warp-collective m16n8k16 MMA that follows the PTX fragment layout (exact
products, one fp32 rounding per MMA), cp.async groups whose copies land when the issuing thread
waits for them (or at once), CTA and cluster barriers and distributed shared memory. Shared memory
starts as NaN patterns, outputs as 0xFF bytes; every copy's source range and alignment is checked.

Checks: the decode of every (scale byte, code) pair in the three formats against the contract;
bit-exact results on grid-exact operands for every compiled tile (M, N and K tails, K % 32 == 16,
split-K 1..3, 2..4 stages, every output type, alpha); W4A4 through the exact bf16 dequantization;
random operands within the spec's bound; NaN/Inf scales; bank-conflict-free shared loads (the
addresses each warp executes); the tactic space's shared-memory formula and tile list against the
C++ ones (the tactic space itself: test_cuda_mm_tactics.py). Skipped when no C++ compiler is found.
"""
import os
import shutil
import struct
import subprocess

import pytest
import torch

import torch_fp4 as t4
from torch_fp4 import formats as F
from torch_fp4 import testing as T
from torch_fp4.kernels.cuda import build
from torch_fp4.kernels.cuda import mm_tactics as MT
from torch_fp4.reference.gemm import mm_fp4 as reference_mm

OUT_CODES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
FORMATS = [("nvfp4", torch.bfloat16), ("mxfp4", torch.bfloat16), ("nvfp4", torch.float16)]
FMTS = {"nvfp4": F.NVFP4, "mxfp4": F.MXFP4}

EMULATOR = r"""// CPU emulator of the small-M FP4 GEMM kernel: runs the kernel body of torch_fp4/csrc/mm_small_m.cuh
// with one cooperative fiber per GPU thread (deterministic round-robin), a warp-collective MMA,
// cp.async groups whose copies land when the issuing thread waits for them (or at issue), CTA and
// cluster barriers and distributed shared memory. Checks every copy's source range and alignment.
//
// Usage: see the Python side of tests/test_cuda_mm_emulation.py.
#define TORCH_FP4_MM_EMULATION 1
#include "mm_small_m.cuh"

#include <ucontext.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <type_traits>
#include <vector>

using namespace torch_fp4::small_m;

[[noreturn]] static void die(const char* msg) {
  std::fprintf(stderr, "emulator: %s\n", msg);
  std::exit(2);
}

// ---- fibers ---------------------------------------------------------------------------------
struct Fiber {
  ucontext_t uc;
  std::vector<char> stack;
  bool done = false;
};

static ucontext_t g_sched;
static Fiber* g_current = nullptr;

static void yield_fiber() { swapcontext(&g_current->uc, &g_sched); }

// A fresh fiber running fn(lo, hi) on its own stack (getcontext returns twice only for contexts
// that are resumed; this one is rewritten by makecontext before anyone resumes it).
__attribute__((noinline)) static void make_fiber(Fiber& f, void (*fn)(int, int), int lo, int hi) {
  f.stack.resize(256 * 1024);
  getcontext(&f.uc);
  f.uc.uc_stack.ss_sp = f.stack.data();
  f.uc.uc_stack.ss_size = f.stack.size();
  f.uc.uc_link = &g_sched;
  makecontext(&f.uc, reinterpret_cast<void (*)()>(fn), 2, lo, hi);
}

// Barrier over `n` fibers: arrive, then yield until the generation changes.
struct Barrier {
  int n, arrived = 0;
  long gen = 0;
  explicit Barrier(int n_) : n(n_) {}
  void wait() {
    const long g = gen;
    if (++arrived == n) {
      arrived = 0;
      ++gen;
      return;
    }
    while (gen == g) yield_fiber();
  }
};

// ---- emulated device state ----------------------------------------------------------------
struct Range {
  const char* lo;
  const char* hi;
};
static std::vector<Range> g_sources;  // global buffers a copy may read

static void check_source(const void* src, int bytes, int align) {
  const char* s = static_cast<const char*>(src);
  if (reinterpret_cast<uintptr_t>(s) % align) die("cp.async source not aligned to its size");
  for (const Range& r : g_sources) {
    if (s >= r.lo && s + bytes <= r.hi && s < r.hi) return;
  }
  die("cp.async source outside every input buffer");
}

struct WarpX {
  Barrier bar{32};
  uint32_t a[32][4];
  uint32_t b[32][2];
  const char* rows[32];
};

constexpr int kGuard = 256;  // canary bytes after each CTA's shared memory

struct Cta {
  std::vector<char> smem;
  int bytes = 0;
  std::unique_ptr<Barrier> bar;
  std::vector<std::unique_ptr<WarpX>> warps;
};

struct Cluster {
  std::unique_ptr<Barrier> bar;
  std::vector<Cta*> ctas;
};

struct Copy {
  char* dst;
  const char* src;
  int size, bytes;
};

struct Access {
  int addr, size;
};

static bool g_late = true;  // copies land at wait (true) or at issue (false)
static std::vector<std::vector<Access>>* g_logs = nullptr;  // per-thread shared loads (tile 0, rank 0)

// Shared-memory wavefronts of one warp-wide load: lanes in groups of 128 / size bytes (one
// request each); a request needs as many wavefronts as the most distinct 4-byte words any of
// the 32 banks holds (equal words are broadcast).
static int wavefronts(const std::vector<Access>& lanes) {
  const int size = lanes[0].size;
  const int per = 128 / size < 32 ? 128 / size : 32;
  int total = 0;
  for (size_t base = 0; base < lanes.size(); base += per) {
    std::vector<std::vector<int>> bank(32);
    for (size_t l = base; l < base + per && l < lanes.size(); ++l) {
      for (int w = 0; w < size / 4; ++w) {
        const int word = lanes[l].addr / 4 + w;
        auto& b = bank[word % 32];
        bool seen = false;
        for (int x : b) seen |= x == word;
        if (!seen) b.push_back(word);
      }
    }
    int worst = 0;
    for (auto& b : bank) worst = b.size() > static_cast<size_t>(worst) ? static_cast<int>(b.size()) : worst;
    total += worst;
  }
  return total;
}

static double half_value(uint32_t h, bool fp16) {
  return fp16 ? static_cast<double>(host_f16_to_f32(h)) : static_cast<double>(host_bf16_to_f32(h));
}

struct HostCtx {
  int tid_, tile_, rank_, splits_;
  std::vector<Access>* log = nullptr;  // shared loads of this thread, in program order
  Cta* cta;
  Cluster* cl;
  std::vector<Copy> cur;
  std::deque<std::vector<Copy>> pending;

  char* smem() const { return cta->smem.data(); }
  int tid() const { return tid_; }
  int tile() const { return tile_; }
  int rank() const { return rank_; }
  int splits() const { return splits_; }
  void sync() const { cta->bar->wait(); }
  template <class T>
  T lds(const T* p) {
    const char* c = reinterpret_cast<const char*>(p);
    if (c < cta->smem.data() || c + sizeof(T) > cta->smem.data() + cta->bytes) die("shared load outside shared memory");
    if ((c - cta->smem.data()) % sizeof(T)) die("misaligned shared load");
    if (log) log->push_back({static_cast<int>(c - cta->smem.data()), static_cast<int>(sizeof(T))});
    return *p;
  }
  // Warp-collective ldmatrix.x4 (b16, not transposed): lane l gives the 16-byte row l % 8 of
  // matrix l / 8 and receives word l % 4 of row l / 4 of each matrix.
  U128 ldmatrix_x4(const void* row) {
    const char* c = static_cast<const char*>(row);
    if (c < cta->smem.data() || c + 16 > cta->smem.data() + cta->bytes) die("ldmatrix row outside shared memory");
    if ((c - cta->smem.data()) % 16) die("misaligned ldmatrix row");
    if (log) log->push_back({static_cast<int>(c - cta->smem.data()), 16});
    WarpX& w = *cta->warps[tid_ >> 5];
    const int lane = tid_ & 31;
    w.rows[lane] = c;
    w.bar.wait();
    uint32_t r[4];
    for (int q = 0; q < 4; ++q) std::memcpy(&r[q], w.rows[8 * q + lane / 4] + 4 * (lane % 4), 4);
    w.bar.wait();
    return U128{r[0], r[1], r[2], r[3]};
  }
  void cluster_sync() const { cl->bar->wait(); }
  void pdl_wait() const {}
  void pdl_launch_dependents() const {}
  const float* remote(const float* p, int r) const {
    if (r < 0 || r >= splits_) die("remote rank out of range");
    return reinterpret_cast<const float*>(cl->ctas[r]->smem.data() + (reinterpret_cast<const char*>(p) - cta->smem.data()));
  }

  static void land(const Copy& c) {
    std::memcpy(c.dst, c.src, c.bytes);
    std::memset(c.dst + c.bytes, 0, c.size - c.bytes);
  }
  void copy(void* dst, const void* src, int size, int bytes) {
    char* d = static_cast<char*>(dst);
    if (bytes < 0 || bytes > size) die("cp.async src-size out of range");
    if (d < cta->smem.data() || d + size > cta->smem.data() + cta->bytes) die("cp.async destination outside shared memory");
    if ((d - cta->smem.data()) % size) die("cp.async destination not aligned to its size");
    check_source(src, bytes, size);
    Copy c{d, static_cast<const char*>(src), size, bytes};
    if (g_late) {
      cur.push_back(c);
    } else {
      land(c);
    }
  }
  void cp_async16_stream(void* d, const void* s, int b) { copy(d, s, 16, b); }
  void cp_async16(void* d, const void* s, int b) { copy(d, s, 16, b); }
  void cp_async8(void* d, const void* s, int b) { copy(d, s, 8, b); }
  void cp_async4(void* d, const void* s, int b) { copy(d, s, 4, b); }
  void cp_commit() {
    pending.push_back(std::move(cur));
    cur.clear();
  }
  void cp_wait(int n) {
    while (static_cast<int>(pending.size()) > n) {
      for (const Copy& c : pending.front()) land(c);
      pending.pop_front();
    }
  }
  void cp_wait_all() {
    cp_commit();
    cp_wait(0);
  }

  // Warp-collective m16n8k16 MMA: every lane publishes its fragments, then computes its own four
  // outputs exactly (fp64 products and sum of the 16 terms plus the accumulator, one rounding).
  template <bool kFp16>
  void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    WarpX& w = *cta->warps[tid_ >> 5];
    const int lane = tid_ & 31;
    w.a[lane][0] = a0; w.a[lane][1] = a1; w.a[lane][2] = a2; w.a[lane][3] = a3;
    w.b[lane][0] = b0; w.b[lane][1] = b1;
    w.bar.wait();
    const int g = lane >> 2, t = lane & 3;
    float out[4];
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
      double acc = d[e];
      for (int k = 0; k < 16; ++k) {
        const int al = (row % 8) * 4 + (k % 8) / 2, areg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
        const int bl = col * 4 + (k % 8) / 2, breg = k >= 8 ? 1 : 0;
        const uint32_t ah = (w.a[al][areg] >> (16 * (k & 1))) & 0xFFFFu;
        const uint32_t bh = (w.b[bl][breg] >> (16 * (k & 1))) & 0xFFFFu;
        acc += half_value(ah, kFp16) * half_value(bh, kFp16);
      }
      out[e] = static_cast<float>(acc);
    }
    w.bar.wait();  // nobody overwrites the exchange before every lane has read it
    for (int e = 0; e < 4; ++e) d[e] = out[e];
  }
};

// ---- running a grid -----------------------------------------------------------------------
struct Problem {
  int m, n, k, kp, np, fp16, mx, out_dtype, warps, wr, bk, stages, split, has_alpha, late, packed;
  float alpha, w_gs, a_gs;   // has_alpha: 0 none, 1 alpha, 2 w_gs, 3 w_gs and a_gs (epilogue_alpha)
  std::vector<uint16_t> act;
  std::vector<uint8_t> w, w_scale;
};

template <class Cfg>
struct Runner {
  struct Thread {
    Fiber fiber;
    HostCtx ctx;
  };
  static const Params* params;
  static int stages;
  static void entry(int lo, int hi) {
    (void)hi;
    Thread* th = reinterpret_cast<Thread*>((static_cast<uintptr_t>(static_cast<uint32_t>(hi)) << 32) |
                                           static_cast<uint32_t>(lo));
    small_m_mm<Cfg>(*params, th->ctx, stages);
    th->fiber.done = true;
    swapcontext(&th->fiber.uc, &g_sched);
  }

  static void run(const Problem& pr, const Params& p, int split) {
    params = &p;
    stages = pr.stages;
    const int tiles = (pr.n + Cfg::kBN - 1) / Cfg::kBN;
    const int smem = smem_bytes<Cfg>(pr.stages);
    for (int tile = 0; tile < tiles; ++tile) {
      Cluster cl;
      cl.bar = std::make_unique<Barrier>(split * Cfg::kThreads);
      std::vector<std::unique_ptr<Cta>> ctas;
      for (int r = 0; r < split; ++r) {
        auto c = std::make_unique<Cta>();
        c->bytes = smem;
        c->smem.assign(smem + kGuard, 0);
        // Fill with a NaN pattern: a read of memory no copy wrote shows up in the results.
        for (int i = 0; i + 4 <= smem; i += 4) {
          const uint32_t nan = 0x7FC07FC0u;
          std::memcpy(c->smem.data() + i, &nan, 4);
        }
        for (int i = smem; i < smem + kGuard; ++i) c->smem[i] = static_cast<char>(0xA5);
        c->bar = std::make_unique<Barrier>(Cfg::kThreads);
        for (int w = 0; w < Cfg::kWarps; ++w) c->warps.push_back(std::make_unique<WarpX>());
        cl.ctas.push_back(c.get());
        ctas.push_back(std::move(c));
      }
      std::vector<std::unique_ptr<Thread>> threads;
      for (int r = 0; r < split; ++r) {
        for (int t = 0; t < Cfg::kThreads; ++t) {
          auto th = std::make_unique<Thread>();
          th->ctx.tid_ = t;
          th->ctx.tile_ = tile;
          th->ctx.rank_ = r;
          th->ctx.splits_ = split;
          th->ctx.cta = ctas[r].get();
          th->ctx.cl = &cl;
          if (g_logs && tile == 0 && r == 0) th->ctx.log = &(*g_logs)[t];
          const uintptr_t ptr = reinterpret_cast<uintptr_t>(th.get());
          make_fiber(th->fiber, &entry, static_cast<int>(ptr & 0xFFFFFFFFu), static_cast<int>(ptr >> 32));
          threads.push_back(std::move(th));
        }
      }
      for (;;) {
        bool all_done = true;
        for (auto& th : threads) {
          if (th->fiber.done) continue;
          all_done = false;
          g_current = &th->fiber;
          swapcontext(&g_sched, &th->fiber.uc);
        }
        if (all_done) break;
      }
      for (auto& c : ctas) {
        for (int i = smem; i < smem + kGuard; ++i) {
          if (c->smem[i] != static_cast<char>(0xA5)) die("shared-memory write beyond the kernel's allocation");
        }
      }
    }
  }
};
template <class Cfg>
const Params* Runner<Cfg>::params = nullptr;
template <class Cfg>
int Runner<Cfg>::stages = 0;

// The tactic's tile: the launchers' own list (with_tile in mm_small_m.cuh).
static torch_fp4::SmallMMmArgs tile_args(int warps, int wr, int bk) {
  torch_fp4::SmallMMmArgs a{};
  a.warps = warps;
  a.tiles_per_warp = wr;
  a.block_k = bk;
  return a;
}

template <int kNB, bool kFp16, bool kMx, bool kPacked>
static bool dispatch_nb(const Problem& pr, const Params& p, int split) {
  return with_tile<kNB, kFp16, kMx, kPacked, false>(tile_args(pr.warps, pr.wr, pr.bk), [&](auto cfg) {
    Runner<decltype(cfg)>::run(pr, p, split);
    return true;
  });
}

template <bool kFp16, bool kMx>
static bool dispatch(const Problem& pr, const Params& p, int split) {
  const int nb = (pr.m + 7) / 8;
  if (pr.packed) {  // the launcher's checks (mm_small_m.cu launch_format)
    if (pr.n % 128 != 0 || pr.k % 64 != 0) return false;
    if (nb <= 1) return dispatch_nb<1, kFp16, kMx, true>(pr, p, split);
    if (nb <= 2) return dispatch_nb<2, kFp16, kMx, true>(pr, p, split);
    if (nb <= 4) return dispatch_nb<4, kFp16, kMx, true>(pr, p, split);
    return false;
  }
  if (nb <= 1) return dispatch_nb<1, kFp16, kMx, false>(pr, p, split);
  if (nb <= 2) return dispatch_nb<2, kFp16, kMx, false>(pr, p, split);
  if (nb <= 4) return dispatch_nb<4, kFp16, kMx, false>(pr, p, split);
  if (nb <= 8) return dispatch_nb<8, kFp16, kMx, false>(pr, p, split);
  return false;
}

template <class T>
static void read_vec(FILE* f, std::vector<T>& v, size_t n) {
  v.resize(n);
  if (n && std::fread(v.data(), sizeof(T), n, f) != n) die("short read");
}

// Prints "smem <bytes>" for a configuration (the Python tactic space checks its formula).
static int smem_query(int nb, int warps, int wr, int bk, int fp16, int mx, int stages, int packed);

// "decode <fp16> <mx>": for every scale byte s (a line) and code c (a column), the float bits of
// the 16-bit weight operand the kernel forms from c under s (bit placement, the 2^126 / 2^14
// multiply unless folded into the table, the table multiply). Every element pair of a word made
// of one code must agree.
template <class Cfg>
static void decode_table() {
  for (uint32_t s = 0; s < 256; ++s) {
    const uint32_t s2 = scale_table_entry<Cfg>(s);
    for (uint32_t c = 0; c < 16; ++c) {
      uint32_t d[4];
      if constexpr (Cfg::kFp16) {
        place_f16(c * 0x11111111u, d);
      } else {
        place_bf16(c * 0x11111111u, d);
      }
      uint32_t a[4];
      for (int e = 0; e < 4; ++e) {
        a[e] = apply_scale<Cfg>(d[e], s2);
        if (a[e] != a[0] || (a[e] >> 16) != (a[e] & 0xFFFFu)) die("element pairs of a one-code word differ");
      }
      const float f = Cfg::kFp16 ? host_f16_to_f32(a[0] & 0xFFFFu) : host_bf16_to_f32(a[0] & 0xFFFFu);
      std::printf("%08x%c", float_to_bits(f), c == 15 ? '\n' : ' ');
    }
  }
}

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "decode") == 0) {
    const int fp16 = std::atoi(argv[2]), mx = std::atoi(argv[3]);
    if (fp16 && mx) die("fp16 activations with MXFP4 are not compiled");
    if (fp16) decode_table<Config<1, 8, 1, 256, true, false, false>>();
    else if (mx) decode_table<Config<1, 8, 1, 256, false, true, false>>();
    else decode_table<Config<1, 8, 1, 256, false, false, false>>();
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "tiles") == 0) {  // nb warps tiles block_k packed, one per line
    const int shapes[6][3] = {{8, 1, 256}, {8, 1, 128}, {4, 1, 256}, {4, 1, 128}, {4, 2, 256}, {4, 2, 128}};
    for (int nb : {1, 2, 4, 8})
      for (const auto& t : shapes)
        if (tile_compiled(nb, t[0], t[1], t[2]))
          std::printf("%d %d %d %d %d\n", nb, t[0], t[1], t[2], packed_compiled(nb, t[0], t[1]) ? 1 : 0);
    return 0;
  }
  if (argc == 10 && std::strcmp(argv[1], "smem") == 0) {
    std::printf("%d\n", smem_query(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]),
                                   std::atoi(argv[6]), std::atoi(argv[7]), std::atoi(argv[8]), std::atoi(argv[9])));
    return 0;
  }
  if (argc != 3) die("usage: emu problem.bin out.bin | emu smem nb warps wr bk fp16 mx stages packed");
  FILE* f = std::fopen(argv[1], "rb");
  if (!f) die("cannot open the problem file");
  Problem pr{};
  int32_t hdr[16];
  if (std::fread(hdr, 4, 16, f) != 16) die("short header");
  pr.m = hdr[0]; pr.n = hdr[1]; pr.k = hdr[2]; pr.kp = hdr[3]; pr.np = hdr[4]; pr.fp16 = hdr[5]; pr.mx = hdr[6];
  pr.out_dtype = hdr[7]; pr.warps = hdr[8]; pr.wr = hdr[9]; pr.bk = hdr[10]; pr.stages = hdr[11]; pr.split = hdr[12];
  pr.has_alpha = hdr[13]; pr.late = hdr[14]; pr.packed = hdr[15];
  if (std::fread(&pr.alpha, 4, 1, f) != 1 || std::fread(&pr.w_gs, 4, 1, f) != 1 || std::fread(&pr.a_gs, 4, 1, f) != 1)
    die("short alpha");
  read_vec(f, pr.act, static_cast<size_t>(pr.m) * pr.k);
  read_vec(f, pr.w, static_cast<size_t>(pr.n) * pr.k / 2);
  read_vec(f, pr.w_scale, static_cast<size_t>(pr.np) * pr.kp);
  std::fclose(f);
  g_late = pr.late != 0;
  std::vector<std::vector<Access>> logs(256);
  const bool banks = std::getenv("EMU_BANKS") != nullptr;
  if (banks) g_logs = &logs;

  const size_t out_elems = static_cast<size_t>(pr.m) * pr.n;
  const int out_size = pr.out_dtype == kOutF32 ? 4 : 2;
  std::vector<char> out(out_elems * out_size);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(0xFF);  // poisoned
  g_sources = {{reinterpret_cast<const char*>(pr.act.data()), reinterpret_cast<const char*>(pr.act.data() + pr.act.size())},
               {reinterpret_cast<const char*>(pr.w.data()), reinterpret_cast<const char*>(pr.w.data() + pr.w.size())},
               {reinterpret_cast<const char*>(pr.w_scale.data()),
                reinterpret_cast<const char*>(pr.w_scale.data() + pr.w_scale.size())}};

  // The launcher's arithmetic (mm_small_m.cu launch_cfg).
  const int steps = (pr.k + pr.bk - 1) / pr.bk;
  int split = pr.split < 1 ? 1 : pr.split;
  if (split > (steps > 1 ? steps : 1)) split = steps > 1 ? steps : 1;
  Params p{};
  p.act = pr.act.data();
  p.w = pr.w.data();
  p.w_scale = pr.w_scale.data();
  p.alpha = pr.has_alpha == 1 ? &pr.alpha : nullptr;
  p.w_gs = pr.has_alpha >= 2 ? &pr.w_gs : nullptr;
  p.a_gs = pr.has_alpha == 3 ? &pr.a_gs : nullptr;
  p.out = out.data();
  p.m = pr.m; p.n = pr.n; p.k = pr.k; p.kp = pr.kp;
  p.steps_per_split = (steps + split - 1) / split;
  p.out_dtype = pr.out_dtype;
  p.w_aligned16 = (pr.k % 32 == 0) ? 1 : 0;  // always for "sm90" weights (K % 64 == 0)
  bool ok;
  if (pr.fp16 && pr.mx) {
    ok = false;
  } else if (pr.fp16) {
    ok = dispatch<true, false>(pr, p, split);
  } else if (pr.mx) {
    ok = dispatch<false, true>(pr, p, split);
  } else {
    ok = dispatch<false, false>(pr, p, split);
  }
  if (!ok) die("configuration not compiled");
  if (banks) {  // "banks <loads> <wavefronts> <ideal wavefronts>" over every warp of tile 0, rank 0
    long loads = 0, waves = 0, ideal = 0, table_loads = 0, table_waves = 0;
    for (int w = 0; w < pr.warps; ++w) {
      const size_t n = logs[32 * w].size();
      for (int l = 1; l < 32; ++l) {
        if (logs[32 * w + l].size() != n) die("lanes of a warp made different numbers of shared loads");
      }
      for (size_t i = 0; i < n; ++i) {
        std::vector<Access> lanes;
        for (int l = 0; l < 32; ++l) lanes.push_back(logs[32 * w + l][i]);
        for (int l = 1; l < 32; ++l) {
          if (lanes[l].size != lanes[0].size) die("lanes of a warp made loads of different sizes");
        }
        if (lanes[0].addr < kLutBytes) {  // scale-table lookups: data-dependent banks
          ++table_loads;
          table_waves += wavefronts(lanes);
          continue;
        }
        ++loads;
        waves += wavefronts(lanes);
        ideal += lanes[0].size / 4;  // 32 lanes x size bytes / 128 bytes per wavefront
      }
    }
    std::printf("banks %ld %ld %ld %ld %ld\n", loads, waves, ideal, table_loads, table_waves);
  }
  FILE* o = std::fopen(argv[2], "wb");
  if (!o) die("cannot open the output file");
  std::fwrite(out.data(), 1, out.size(), o);
  std::fclose(o);
  return 0;
}

template <int kNB, bool kFp16, bool kMx, bool kPacked>
static int smem_nb(int warps, int wr, int bk, int stages) {
  int bytes = -1;
  with_tile<kNB, kFp16, kMx, kPacked, false>(tile_args(warps, wr, bk), [&](auto cfg) {
    bytes = smem_bytes<decltype(cfg)>(stages);
    return true;
  });
  return bytes;
}

static int smem_query(int nb, int warps, int wr, int bk, int fp16, int mx, int stages, int packed) {
  auto by_nb = [&](auto f16, auto m) {
    constexpr bool F = decltype(f16)::value, X = decltype(m)::value;
    if (packed) {
      if (nb == 1) return smem_nb<1, F, X, true>(warps, wr, bk, stages);
      if (nb == 2) return smem_nb<2, F, X, true>(warps, wr, bk, stages);
      if (nb == 4) return smem_nb<4, F, X, true>(warps, wr, bk, stages);
      return -1;
    }
    if (nb == 1) return smem_nb<1, F, X, false>(warps, wr, bk, stages);
    if (nb == 2) return smem_nb<2, F, X, false>(warps, wr, bk, stages);
    if (nb == 4) return smem_nb<4, F, X, false>(warps, wr, bk, stages);
    if (nb == 8) return smem_nb<8, F, X, false>(warps, wr, bk, stages);
    return -1;
  };
  if (fp16 && mx) return -1;
  if (fp16) return by_nb(std::true_type{}, std::false_type{});
  if (mx) return by_nb(std::false_type{}, std::true_type{});
  return by_nb(std::false_type{}, std::false_type{});
}
"""


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    """Path of the emulator executable, built once per test session."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++, c++ or clang++) found")
    root = tmp_path_factory.mktemp("mm_small_m_emulator")
    src, exe = root / "emu.cpp", root / "emu"
    src.write_text(EMULATOR)
    proc = subprocess.run([cxx, "-std=c++17", "-O2", "-Wno-unknown-pragmas", f"-I{build.CSRC}", "-o", str(exe),
                           str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return exe


def emulate(emu, a16, wd, ws, fmt, out_dtype, tactic, alpha=None, late=True, banks=False, tmp=None,
            packed=False, gs=None):
    """Run the kernel on a16 [M, K] (bf16/fp16), row-major FP4 weight data [N, K/2] (passed to the
    kernel in the "sm90" layout when `packed`) and 128x4 scales; returns (out, emulator stdout).
    gs = (w_gs, a_gs or None): the kernel forms alpha from these global scales (alpha None)."""
    m, k = a16.shape
    n = wd.shape[0]
    ws8 = ws.view(torch.uint8)
    hdr = [m, n, k, ws8.shape[1], ws8.shape[0], int(a16.dtype == torch.float16), int(fmt is F.MXFP4),
           OUT_CODES[out_dtype], tactic.warps, tactic.tiles_per_warp, tactic.block_k, tactic.stages,
           tactic.split_k, 3 if gs and gs[1] is not None else 2 if gs else int(alpha is not None), int(late),
           int(packed)]
    w8 = F.to_weight_layout(wd, "sm90") if packed else wd.view(torch.uint8)
    pf, of = os.path.join(tmp, "problem.bin"), os.path.join(tmp, "out.bin")
    with open(pf, "wb") as f:
        f.write(struct.pack("16i", *hdr))
        f.write(struct.pack("3f", 1.0 if alpha is None else alpha, *(gs[0], gs[1] or 1.0) if gs else (1.0, 1.0)))
        f.write(a16.contiguous().view(torch.int16).numpy().tobytes())
        f.write(w8.contiguous().numpy().tobytes())
        f.write(ws8.contiguous().numpy().tobytes())
    env = dict(os.environ, EMU_BANKS="1") if banks else None
    proc = subprocess.run([str(emu), pf, of], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"{tactic.label()} M={m} N={n} K={k}: {proc.stderr}"
    raw = bytearray(open(of, "rb").read())
    return torch.frombuffer(raw, dtype=out_dtype).view(m, n).clone(), proc.stdout


def reference(a16, wd, ws, fmt, out_dtype, alpha=None):
    al = None if alpha is None else torch.tensor([alpha])
    return reference_mm(a16, wd.T, None, ws.T, al, out_dtype, fmt, F.SfLayout.LAYOUT_128x4)


def grid_problem(m, n, k, fmt, act_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    wd, ws, _ = T.grid_exact_operand(n, k, fmt, "128x4", g)
    a = torch.randint(-16, 17, (m, k), generator=g).float().div(8).to(act_dtype)
    return a, wd, ws


def random_weight(n, k, fmt, g):
    """A Gaussian weight [n, k] quantized by the reference: (data, 128x4 scales, dequantized fp32)."""
    w = torch.randn(n, k, generator=g)
    if fmt is F.NVFP4:
        wd, ws = t4.nvfp4_quantize(w, torch.full((1,), 2688.0 / w.abs().max().item()), backend="reference")
    else:
        wd, ws = t4.mxfp4_quantize(w, backend="reference")
    what = t4.fp4_dequantize(wd, ws, None, block_size=fmt.block_size, out_dtype=torch.float32,
                             backend="reference")
    return wd, ws, what


def tiles_for(m, packed=False):
    nb = MT.n_blocks(m)
    return [s for s in MT.TILE_SHAPES if MT.compiled(nb, *s, packed)]


def layouts_for(m):
    """The weight layouts compiled for M: "sm90" (packed) up to mm_tactics.PACKED_MAX_M."""
    return (False, True) if m <= MT.PACKED_MAX_M else (False,)


# ---- decode, tile list, shared-memory formula -------------------------------------------------
@pytest.mark.parametrize("fmt_name,act_dtype", FORMATS)
def test_decode_of_every_code_and_scale_byte_is_exact(emu, fmt_name, act_dtype):
    """The weight operand formed from code c under scale byte s is LUT[c] * scale(s) exactly
    (times 2^-7 for NVFP4, whose folded table the epilogue undoes), as fp32 rounds it: signed
    zeros, e4m3 subnormal scales, NaN bytes and UE8M0 0 / 254 / 255 included."""
    fmt = FMTS[fmt_name]
    out = subprocess.run([str(emu), "decode", str(int(act_dtype == torch.float16)), str(int(fmt is F.MXFP4))],
                         capture_output=True, text=True, check=True).stdout.split()
    got = torch.tensor([int(x, 16) for x in out], dtype=torch.int64).to(torch.int32).view(torch.float32)
    got = got.view(256, 16)
    lut = F.e2m1_decode(torch.arange(16, dtype=torch.uint8)).float()
    scale = torch.arange(256, dtype=torch.uint8).view(fmt.scale_dtype).float()
    want = lut[None, :] * scale[:, None] * (1.0 if fmt is F.MXFP4 else 2.0 ** -7)
    same = (got == want) | (got.isnan() & want.isnan())
    assert bool(same.all()), (~same).nonzero()[:8].tolist()
    finite = ~want.isnan()
    assert torch.equal(torch.signbit(got[finite]), torch.signbit(want[finite]))


def test_compiled_tiles_and_shared_memory_match_the_tactic_space(emu):
    out = subprocess.run([str(emu), "tiles"], capture_output=True, text=True, check=True).stdout
    cpp = {tuple(int(x) for x in line.split()) for line in out.splitlines()}
    py = {(nb, *s, int(MT.packed_compiled(nb, *s[:2]))) for nb in (1, 2, 4, 8) for s in MT.TILE_SHAPES
          if MT.tile_compiled(nb, *s)}
    assert cpp == py
    for nb, warps, tiles, bk, packed_too in sorted(py):
        for fp16, mx, packed in ((0, 0, 0), (0, 1, 0), (1, 0, 0), (0, 0, 1), (0, 1, 1), (1, 0, 1)):
            if packed and not packed_too:
                continue
            for stages in MT.STAGES:
                got = subprocess.run([str(emu), "smem", str(nb), str(warps), str(tiles), str(bk), str(fp16),
                                      str(mx), str(stages), str(packed)], capture_output=True, text=True,
                                     check=True).stdout
                t = MT.CudaMmTactic(warps, tiles, bk, stages, 1)
                assert int(got) == MT.smem_bytes(t, nb, 32 if mx else 16, bool(packed)), (nb, t.label(), fp16, mx)


# ---- results -----------------------------------------------------------------------------------
def test_alpha_formed_from_the_global_scales(emu, tmp_path):
    """With the global scales (w_gs, and a_gs for W4A4) instead of alpha, the epilogue forms
    alpha = RN(1 / RN(a_gs * w_gs)) (RN(1 / w_gs) without a_gs): the bits of the kernel given
    formats.nvfp4_alpha's alpha, on scales whose product rounds."""
    g = torch.Generator().manual_seed(7)
    t = MT.CudaMmTactic(8, 1, 256, 2, 2)
    for i, (w_gs, a_gs) in enumerate([(3.3e-3, None), (1.7e5, 2.9e-4), (448.0 * 6 / 1.1e-3, 0.37),
                                      (float(torch.rand(1, generator=g)) * 1e4, float(torch.rand(1, generator=g)))]):
        a, wd, ws = grid_problem(5, 72, 256, F.NVFP4, torch.bfloat16, seed=i)
        out_dtype = (torch.float32, torch.bfloat16)[i % 2]
        got, _ = emulate(emu, a, wd, ws, F.NVFP4, out_dtype, t, tmp=tmp_path, gs=(w_gs, a_gs))
        alpha = F.nvfp4_alpha(None if a_gs is None else torch.tensor([a_gs]), torch.tensor([w_gs]))
        given, _ = emulate(emu, a, wd, ws, F.NVFP4, out_dtype, t, float(alpha), tmp=tmp_path)
        assert torch.equal(got, given), (w_gs, a_gs)
        assert torch.equal(got, reference(a, wd, ws, F.NVFP4, out_dtype, float(alpha))), (w_gs, a_gs)


@pytest.mark.parametrize("fmt_name,act_dtype", FORMATS)
def test_grid_exact_every_tile(emu, tmp_path, fmt_name, act_dtype):
    """Bit-exact on grid-exact operands (every partial sum exact in fp32) for every compiled tile,
    with N and K tails (N = 200: a partial CTA; K = 640: a partial last stage), M tails, split-K,
    stage counts, output types, alpha, and cp.async copies landing late (at the wait) or early."""
    fmt = FMTS[fmt_name]
    i = 0
    for m in (1, 7, 16, 23, 40, 64):
        for warps, tiles, bk in tiles_for(m):
            out_dtype = (torch.float32, torch.bfloat16, torch.float16)[i % 3]
            t = MT.CudaMmTactic(warps, tiles, bk, 2 + i % 3, 1 + i % 3)
            alpha = 0.75 if i % 2 else None
            a, wd, ws = grid_problem(m, 200, 640, fmt, act_dtype, seed=i)
            got, _ = emulate(emu, a, wd, ws, fmt, out_dtype, t, alpha, late=i % 4 != 1, tmp=tmp_path)
            want = reference(a, wd, ws, fmt, out_dtype, alpha)
            assert torch.equal(got, want), (m, t.label(), out_dtype, alpha, (got.double() - want.double()).abs().max())
            i += 1


@pytest.mark.parametrize("fmt_name,act_dtype", FORMATS)
def test_sm90_weights_grid_exact_every_tile(emu, tmp_path, fmt_name, act_dtype):
    """Weights in the "sm90" layout (M <= 32): bit-exact against the reference and bit-identical
    to the same tactic on row-major weights, for every compiled tile, with a partial last stage
    (K = 640 or 192: 64-K tiles past K zero-filled), 64-row CTAs inside a 128-row group, split-K,
    stages, output types, alpha, copies landing late or early."""
    fmt = FMTS[fmt_name]
    i = 0
    for m in (1, 7, 16, 17, 32):
        for warps, tiles, bk in tiles_for(m, packed=True):
            k = 640 if i % 3 else 192
            out_dtype = (torch.float32, torch.bfloat16, torch.float16)[i % 3]
            t = MT.CudaMmTactic(warps, tiles, bk, 2 + i % 3, 1 + i % 2)
            alpha = 0.75 if i % 2 else None
            a, wd, ws = grid_problem(m, 256, k, fmt, act_dtype, seed=50 + i)
            got, _ = emulate(emu, a, wd, ws, fmt, out_dtype, t, alpha, late=i % 4 != 1, tmp=tmp_path, packed=True)
            row, _ = emulate(emu, a, wd, ws, fmt, out_dtype, t, alpha, late=i % 4 != 1, tmp=tmp_path)
            want = reference(a, wd, ws, fmt, out_dtype, alpha)
            assert torch.equal(got, want), (m, k, t.label(), out_dtype, alpha)
            assert torch.equal(got.view(torch.uint8) if got.dtype != torch.float32 else got.view(torch.int32),
                               row.view(torch.uint8) if row.dtype != torch.float32 else row.view(torch.int32))
            i += 1


@pytest.mark.parametrize("fmt_name,act_dtype", FORMATS)
def test_sm90_weights_random_within_bound(emu, tmp_path, fmt_name, act_dtype):
    fmt = FMTS[fmt_name]
    for i, (m, t) in enumerate([(1, MT.CudaMmTactic(4, 2, 256, 4, 2)), (13, MT.CudaMmTactic(8, 1, 128, 3, 3))]):
        g = torch.Generator().manual_seed(200 + i)
        wd, ws, what = random_weight(256, 1536, fmt, g)
        a = torch.randn(m, 1536, generator=g).to(act_dtype)
        got, _ = emulate(emu, a, wd, ws, fmt, torch.float32, t, 0.37, tmp=tmp_path, packed=True)
        T.assert_mm_within_bound(got, a.float(), what, 0.37)


@pytest.mark.parametrize("fmt_name,k", [("nvfp4", 592), ("nvfp4", 1040), ("mxfp4", 608)])
def test_grid_exact_k_not_a_multiple_of_32_or_of_the_stage(emu, tmp_path, fmt_name, k):
    """K = 16 * odd (NVFP4): weight rows are only 8-byte aligned (8-byte copies); every K leaves a
    partial last stage whose scale words lie partly beyond the padded scale matrix."""
    fmt = FMTS[fmt_name]
    for i, (m, t) in enumerate([(3, MT.CudaMmTactic(8, 1, 256, 3, 2)), (16, MT.CudaMmTactic(4, 2, 128, 4, 1)),
                                (33, MT.CudaMmTactic(4, 1, 128, 2, 3))]):
        a, wd, ws = grid_problem(m, 72, k, fmt, torch.bfloat16, seed=k + i)
        got, _ = emulate(emu, a, wd, ws, fmt, torch.float32, t, tmp=tmp_path)
        assert torch.equal(got, reference(a, wd, ws, fmt, torch.float32)), (m, t.label())


@pytest.mark.parametrize("layout", ["128x4", "8x4", "linear"])
def test_w4a4_is_the_kernel_on_exactly_dequantized_activations(emu, tmp_path, layout):
    """The launcher runs W4A4 as fp4_dequantize(a) -> bf16 (exact) followed by the kernel: that
    equals the reference W4A4 product bit for bit on grid-exact operands."""
    for fmt in (F.NVFP4, F.MXFP4):
        g = torch.Generator().manual_seed(7)
        wd, ws, _ = T.grid_exact_operand(136, 1024, fmt, "128x4", g)
        ad, as_, _ = T.grid_exact_operand(12, 1024, fmt, layout, g)
        a16 = t4.fp4_dequantize(ad, as_, None, block_size=fmt.block_size, sf_layout=layout,
                                out_dtype=torch.bfloat16, backend="reference")
        got, _ = emulate(emu, a16, wd, ws, fmt, torch.bfloat16, MT.CudaMmTactic(8, 1, 256, 3, 2), 1.5,
                         tmp=tmp_path)
        want = reference_mm(ad, wd.T, as_, ws.T, torch.tensor([1.5]), torch.bfloat16, fmt,
                            F.SfLayout.parse(layout))
        assert torch.equal(got, want), (fmt.name, layout)


@pytest.mark.parametrize("fmt_name,act_dtype", FORMATS)
def test_random_within_bound(emu, tmp_path, fmt_name, act_dtype):
    fmt = FMTS[fmt_name]
    for i, (m, t) in enumerate([(1, MT.CudaMmTactic(8, 1, 256, 4, 2)), (13, MT.CudaMmTactic(4, 2, 256, 2, 1)),
                                (40, MT.CudaMmTactic(4, 2, 128, 3, 3)), (64, MT.CudaMmTactic(8, 1, 128, 4, 2))]):
        g = torch.Generator().manual_seed(100 + i)
        wd, ws, what = random_weight(264, 2048, fmt, g)
        a = torch.randn(m, 2048, generator=g).to(act_dtype)
        for out_dtype, alpha in ((torch.float32, 0.37), (torch.bfloat16, None)):
            got, _ = emulate(emu, a, wd, ws, fmt, out_dtype, t, alpha, tmp=tmp_path)
            T.assert_mm_within_bound(got, a.float(), what, 1.0 if alpha is None else alpha)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("fmt_name,act_dtype", FORMATS)
def test_nan_and_inf_scales_match_the_reference(emu, tmp_path, fmt_name, act_dtype, packed):
    """Every scale byte occurs (e4m3 NaN 0x7F/0xFF, UE8M0 255 and the exponents that overflow in
    rows 0..3): NaN and Inf land where the reference's do, finite results within the bound."""
    fmt = FMTS[fmt_name]
    g = torch.Generator().manual_seed(3)
    m, n, k = 3, 128, 4096 if fmt is F.NVFP4 else 8192
    kb = k // fmt.block_size
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    sb = torch.arange(n * kb).remainder(256).view(n, kb)[torch.randperm(n, generator=g)]
    special = (sb == 0xFF) | ((sb & 0x7F) == 0x7F) if fmt is F.NVFP4 else (sb >= 200) | (sb < 60)
    keep = torch.zeros(n, 1, dtype=torch.bool)
    keep[:4] = True
    sb = torch.where(special & ~keep, (sb & 0x3F) + 32, sb).to(torch.uint8)
    wd = F.pack_e2m1(codes).view(torch.float4_e2m1fn_x2)
    ws = F.swizzle(sb.view(fmt.scale_dtype), "128x4")
    lim = 8 if act_dtype == torch.float16 else 20
    a = (torch.randn(m, k, generator=g) * 2.0 ** torch.randint(-lim - 12, lim, (m, k), generator=g)).to(act_dtype)
    got, _ = emulate(emu, a, wd, ws, fmt, torch.float32, MT.CudaMmTactic(8, 1, 256, 3, 2), tmp=tmp_path,
                     packed=packed)
    want = reference(a, wd, ws, fmt, torch.float32)
    assert torch.equal(got.isnan(), want.isnan())
    inf = want.isinf()
    assert torch.equal(got.isinf(), inf) and torch.equal(got[inf], want[inf])
    what = t4.fp4_dequantize(wd, ws, None, block_size=fmt.block_size, out_dtype=torch.float32, backend="reference")
    ref64, abs_sum = T.mm_reference(a.float(), what.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0))
    tol = T.mm_bound(ref64, abs_sum, k, torch.float32)
    finite = want.isfinite()
    assert finite.sum() > 0.9 * (n - 4) * m
    assert bool(((got.double() - want.double()).abs()[finite] <= tol[finite]).all())


# ---- shared-memory banks -----------------------------------------------------------------------
def test_shared_loads_are_bank_conflict_free(emu, tmp_path):
    """Every main-loop shared load a warp executes (weight vectors, activation B fragments (ldmatrix
    rows for "sm90" weights), scale words) takes the minimum number of wavefronts, for every
    compiled tile, format and weight layout. (The scale-table lookups are left out: their banks
    depend on the scale values.)"""
    for m in (8, 16, 32, 64):
        for packed in layouts_for(m):
            for warps, tiles, bk in tiles_for(m, packed):
                for fmt_name, act_dtype in FORMATS:
                    fmt = FMTS[fmt_name]
                    t = MT.CudaMmTactic(warps, tiles, bk, 3, 1)
                    a, wd, ws = grid_problem(m, 128, 512, fmt, act_dtype, seed=m)
                    _, log = emulate(emu, a, wd, ws, fmt, torch.float32, t, banks=True, tmp=tmp_path,
                                     packed=packed)
                    _, loads, waves, ideal, _, _ = log.split()
                    assert int(loads) > 0 and int(waves) == int(ideal), (m, t.label(), fmt_name, packed, log)
