// The kernels of eaglekit.kernels.hopper: a bf16 decode layer for Hopper GPUs (sm_90) in which every kernel is a
// programmatic dependent launch (PDL) and the products stream their weights by bulk copies (cp.async.bulk) into a
// ring of shared-memory slots. Why, and where it runs: eaglekit/kernels/hopper.py; decisions: docs/performance.md#d1
// (the layer), docs/performance.md#d9 (its attention).
//
// Legend (names used below):
//   PDL     programmatic dependent launch (griddepcontrol.launch_dependents / .wait)
//   mma     mma.sync.aligned.m16n8k16 bf16 -> fp32: A 16 rows x 16 k, B 16 k x 8 columns, D 16 x 8
//   g, t    a lane's group (lane / 4) and thread in group (lane % 4) in the mma's fragment layout
//   products (gemm_rows): y[M, N] = x[M, K] @ W[N, K]^T with an epilogue
//   EPI     the epilogue: PLAIN, RESID (+ residual), SWIGLU (silu(gate) * up), QKV (rotary, k/v into the cache)
//   tile    8 weight rows (8 output columns); chunk: a tile's 512 k (8 KB), what one ring slot holds
//   piece   a tile's 512-k slice; P = K / 512 pieces a tile
//   CW      consumer warps a product block (plus one producer warp that issues the bulk copies)
//   MROW    bytes of one weight row of a chunk in shared memory (1 KB padded to 1088: conflict-free loads)
//   MSLOT   bytes of a ring slot (8 MROW)
//   NSLOTS  ring slots a block (chunks in flight)
//   RSLOTS  slots of the consumers' partial sums (a tile's CW warp sums, added in warp order)
//   MT      16-row tiles of x (A operands) a product holds: M <= 16 MT
//   LO      at most 8 rows: x's A rows 8-15 are zeros and not held
//   TG      tiles a group: a warp's piece of x serves TG tiles once loaded
//   XH      x's k-steps held in registers at a time
//   QHD     head_dim of the q/k/v product (128)
//   attention (attn_tiles): query rows over the KV cache, a row's visible keys in logical order
//   AHD     head_dim (128); ACH: keys a chunk (32)
//   REP     query heads a KV head (1, 2, 4, 8); TR = 16 / REP call rows a 16-row tile of query heads
//   TW      warps (chunk slots) a tile: a part takes TW consecutive chunks
//   MTB     tiles a block (1 or 2); TRB = TR MTB call rows a block
//   KROW    elements of a key's row in shared memory (AHD + 8: ldmatrix's rows in distinct banks)
//   SL      floats of one chunk slot's state (O [16][AHD], m [16], l [16])
//   part    a block's share of a row's keys (blockIdx.x), merged in part order by the last part to finish
//   ss      a row's partial sums of squares (an RMSNorm's statistics) handed from one kernel to the next
//
// PDL: a kernel lets its successor launch at once (griddepcontrol.launch_dependents) and waits for its predecessor's
// output (griddepcontrol.wait) only where it reads it. A product's producer warp issues its weight's copies *before*
// the wait (weights never depend on the predecessor), so the memory keeps streaming across kernel boundaries; the
// attention copies the committed keys before its wait likewise. A predecessor's output is read after the wait only.
// Safety under PDL rests on one rule every kernel here keeps: nothing written by another kernel of the step is read
// before the wait, and nothing is written before it; every kernel has blocks that wait, so a kernel's completion
// implies all earlier kernels' completion (what makes the scratch buffers and tickets safe to share across layers).
//
// Batch invariance (bf16 speculative output identical to the baseline's): a row's arithmetic never depends on the
// rows beside it. Products: x's rows are the A operand of the mma (rows past M are zeros; 16-row tiles); each output
// row reads only its own x row, and the order of its sums depends on (N, K) only. Attention: a row's logical keys
// (the committed prefix, then its tree ancestors and itself, read from the tree's block) go in fixed 32-key chunks to
// fixed places (chunk c to part c / TW, slot c % TW, the row's query heads as A rows of the mma), merged in a fixed
// order.
//
// Built at first use by eaglekit.kernels.hopper (nvcc -gencode=arch=compute_90a,code=sm_90a), loaded with ctypes;
// each entry point takes one argument struct (ek_hopper_*_args, mirrored by ctypes.Structures in hopper.py).

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace {

typedef __nv_bfloat16 bf16;

#include "hopper_ptx.cuh"

__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ float bf(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float round_bf(float v) { return __bfloat162float(__float2bfloat16(v)); }

constexpr int PDL = 1;  // every launch is a programmatic dependent launch (launch_ex)

// ---- products: y[M, N] = x[M, K] @ W[N, K]^T, M <= 16 MT, with an epilogue --------------------------------------
// A chunk is a tile of 8 weight rows by 512 k: 8 bulk copies of 1 KB into rows padded to MROW bytes (a warp's 16-byte
// loads of 8 rows x 4 column groups then hit 32 distinct banks). Which weight rows make a tile is the epilogue's
// (tile_rows): SwiGLU puts 4 gate rows and the up rows of the same outputs in a tile, the q/k/v product 4 columns of a
// head's first half and their rotary partners, so a tile holds everything its outputs need. Chunk i of a block is
// tile i / P, piece i % P (P = K / 512, a multiple of CW): warp w takes pieces w, w + CW, ... of each tile, chains
// them through mma.sync, and the warps' sums are added in warp order after a barrier of the consumers. LO (at most 8
// rows): x's rows 8-15 not held (the same mma inputs, 64 registers fewer).
constexpr int CW = 4, MROW = 1088, MSLOT = 8 * MROW, RSLOTS = 4;
// ring slots a block: what it can fetch before its wait, while the kernel before it still runs. 8 keeps a block's
// shared memory near 100 KB, two blocks an SM (12 measured slower: docs/performance.md#d3)
constexpr int NSLOTS = 8;
constexpr int QHD = 128;  // the q/k/v product's head_dim (its tiles are 16 a head)
enum { EPI_PLAIN = 0, EPI_RESID = 1, EPI_SWIGLU = 2, EPI_QKV = 3 };

struct Epi {
  const bf16* res;     // RESID: y = res + bf16(x @ W^T) ([M, N])
  bf16* kc;            // QKV: this layer's K cache [Hkv, cap, hd]; keys go to slot base + row
  bf16* vc;            // QKV: V cache, as kc
  const long long* pos;   // QKV: [M] each row's position
  const float* inv_freq;  // QKV: [hd / 2] the rotary frequencies (eaglekit.models.layers.rope_inv_freq)
  const long long* base;  // QKV: the first slot of this call's rows (the cache's committed length)
  int cap, qcols, kcols;  // QKV: cache slots a head, H * QHD, Hkv * QHD
  // a norm in the product (any EPI): x is g * h (the RMSNorm's weight times its input h, as bf16) and ss_in [M, nss]
  // holds partial sums of h's squares; their sum in order gives each row's r = rsqrt(sum / K + eps), and the epilogue
  // scales the row's sums by r before rounding. So no norm kernel runs between two products: its statistics come
  // from the RESID epilogue before it (xg, ss_out) and its scale rides in the product (five kernels a layer, not
  // seven: docs/performance.md#d2)
  const float* ss_in;
  int nss;
  float eps;
  // RESID: also xg = bf16(y * g) ([M, N], g [N] the next norm's weight) and ss_out [M, N / 8]: each row's sum of
  // y^2 over each tile's 8 columns (in a fixed order: epilogue)
  bf16* xg;
  const bf16* g;
  float* ss_out;
};

// the weight rows of tile `tile`: its rows 0-3 are rows a .. a + 3 of W, its rows 4-7 rows b .. b + 3. Computed once
// a tile from constants only: the producer's loop issues the copies, and divisions by runtime values there (a
// chunk's 8 rows each) made the q/k/v product 2x slower (docs/performance.md#d5)
template <int EPI>
__device__ __forceinline__ void tile_rows(int tile, int N, const Epi& e, int& a, int& b) {
  if (EPI == EPI_SWIGLU) {
    a = tile * 4, b = N / 2 + tile * 4;
  } else if (EPI == EPI_QKV && tile * 8 < e.qcols + e.kcols) {  // head tile / 16, columns d .. d + 3 and d + 64 ..
    a = (tile >> 4) * QHD + (tile & 15) * 4, b = a + QHD / 2;
  } else {
    a = tile * 8, b = tile * 8 + 4;
  }
}

// value v (< 128) of a 16-row tile's sums: lane v / 4's register v % 4 of the mma's D fragment
__device__ __forceinline__ int row_of(int v) { return v / 16 + (v % 4 >= 2 ? 8 : 0); }
__device__ __forceinline__ int col_of(int v) { return (v / 4 & 3) * 2 + (v & 1); }


// the warps' sums of value u of row tile mt, added in warp order (slot: [CW][MT][128])
template <int MT>
__device__ __forceinline__ float tile_sum(const float* slot, int mt, int u) {
  float s = slot[mt * 128 + u];
#pragma unroll
  for (int w = 1; w < CW; ++w) s += slot[(w * MT + mt) * 128 + u];
  return s;
}

// what value v of row tile mt of `tile` becomes. Rounding follows the torch layers it replaces (each product rounded
// to bf16 before its epilogue): PLAIN y = bf16(sum); RESID y = bf16(res + bf16(sum)); SWIGLU (values of columns 0-3,
// gate; their up partners are values v + 8) y = bf16(bf16(silu(gate)) * up); QKV: q and k columns rotated with their
// partner half a head away (x cos + rotate_half(x) sin, in fp32 from the rounded product), q to y [M, qcols], k and v
// straight into the cache at slot base + row.
// With a norm in the product (e.ss_in), every sum is first scaled by the row's r (rs[row]). RESID with e.xg also
// writes the next norm's input and the tile's share of each row's sum of squares: the row's 8 values of the tile
// (threads v with bits 0, 2, 3 free; row_of, col_of) added by three butterfly steps, to ss_out[row, tile]. Every
// thread calls it (the shuffles); a row's sums depend on its own values only, whatever block holds the tile.
template <int MT, int EPI>
__device__ __forceinline__ void epilogue(const float* slot, int v, int mt, int tile, int M, int N, bf16* y,
                                         const Epi& e, const float* rs) {
  const int row = mt * 16 + row_of(v), c = col_of(v);
  if (EPI == EPI_RESID && e.xg) {
    const size_t o = static_cast<size_t>(row) * N + tile * 8 + c;
    float f = 0.f;
    if (row < M) {
      const float sc = e.ss_in ? rs[row] : 1.f;
      const bf16 out = __float2bfloat16(bf(e.res[o]) + round_bf(sc * tile_sum<MT>(slot, mt, v)));
      y[o] = out;
      f = bf(out);
      e.xg[o] = __float2bfloat16(f * bf(e.g[tile * 8 + c]));
    }
    float q = f * f;
    q += __shfl_xor_sync(0xffffffffu, q, 1);
    q += __shfl_xor_sync(0xffffffffu, q, 4);
    q += __shfl_xor_sync(0xffffffffu, q, 8);
    if (row < M && (v & 13) == 0) e.ss_out[static_cast<size_t>(row) * (N / 8) + tile] = q;
    return;
  }
  if (row >= M) return;
  const float sc = e.ss_in ? rs[row] : 1.f;  // (x 1 is exact: without a norm the bits are as before)
  if (EPI == EPI_PLAIN) {
    y[static_cast<size_t>(row) * N + tile * 8 + c] = __float2bfloat16(sc * tile_sum<MT>(slot, mt, v));
  } else if (EPI == EPI_RESID) {
    const size_t o = static_cast<size_t>(row) * N + tile * 8 + c;
    y[o] = __float2bfloat16(bf(e.res[o]) + round_bf(sc * tile_sum<MT>(slot, mt, v)));
  } else if (EPI == EPI_SWIGLU) {
    if (c >= 4) return;
    const float gate = round_bf(sc * tile_sum<MT>(slot, mt, v)), up = round_bf(sc * tile_sum<MT>(slot, mt, v + 8));
    const float act = round_bf(gate / (1.f + __expf(-gate)));
    y[static_cast<size_t>(row) * (N / 2) + tile * 4 + c] = __float2bfloat16(act * up);
  } else if (tile * 8 < e.qcols + e.kcols) {  // QKV, a q or k head: this value and its rotary partner
    if (c >= 4) return;
    const int head = tile >> 4, d = (tile & 15) * 4 + c, half = QHD / 2;
    const float x1 = round_bf(sc * tile_sum<MT>(slot, mt, v)), x2 = round_bf(sc * tile_sum<MT>(slot, mt, v + 8));
    // cos and sin as eaglekit.models.layers.Rotary makes them (the angle's product in fp32, the result in bf16);
    // columns d and d + hd / 2 share a frequency
    const float angle = static_cast<float>(e.pos[row]) * e.inv_freq[d];
    const float cs = round_bf(cosf(angle)), sn = round_bf(sinf(angle));
    const bf16 o1 = __float2bfloat16(x1 * cs - x2 * sn);
    const bf16 o2 = __float2bfloat16(x2 * cs + x1 * sn);
    const int col = head * QHD + d;
    if (col < e.qcols) {
      y[static_cast<size_t>(row) * e.qcols + col] = o1;
      y[static_cast<size_t>(row) * e.qcols + col + half] = o2;
    } else {
      bf16* dst = e.kc + (static_cast<size_t>(head - e.qcols / QHD) * e.cap + *e.base + row) * QHD;
      dst[d] = o1;
      dst[d + half] = o2;
    }
  } else {  // QKV, a v head
    const int col = tile * 8 + c - e.qcols - e.kcols;
    e.vc[(static_cast<size_t>(col / QHD) * e.cap + *e.base + row) * QHD + col % QHD] =
        __float2bfloat16(sc * tile_sum<MT>(slot, mt, v));
  }
}

// how a product reads x, its predecessor's output: a plain load (cached in L1: the warps' and tiles' repeated reads of
// x hit L1 rather than L2). Safe because x is read after griddepcontrol.wait only, which makes the predecessor's
// writes visible to this grid (L2-only loads gave the same bits, slower: docs/performance.md#d6)
__device__ __forceinline__ uint4 load_x(const uint4* p) { return *p; }

// TG tiles a group (TG_WIDE = 2 past 8 rows: a warp has two ring slots): a warp's piece of x, once loaded, serves the
// TG tiles of a group (chunks ordered group, piece, tile), so x is read from L1/L2 once per TG tiles. Past 8 rows x's
// reads, not the weight's, bound the product (M / 8 bytes of x a weight byte). Every tile's sums are the same chain
// of mma steps whatever TG, so the bits do not depend on it. XH_WIDE: x's steps held at a time where row tiles times
// tiles a group reach 4 (more, and the registers pass 200: one block an SM).
constexpr int TG_WIDE = 2, XH_WIDE = 4;
// up to 8 rows (x's rows 8-15 not held), tile pairs from this many rows on. Pairs halve x's reads but also a warp's
// look-ahead in the ring (8 slots: its pair, no next chunk), so they pay only where x's reads weigh: the residual
// products from 7 rows, the others from 8, the q/k/v product never (99: it lost at every row count measured;
// docs/performance.md#d8)
constexpr int TG_LO_FROM = 8, TG_LO_FROM_RESID = 7, TG_LO_FROM_QKV = 99;
template <int MT, bool LO, int EPI, int TG>
__global__ void __launch_bounds__((CW + 1) * 32, 2)  // two blocks an SM: at most 204 registers
    gemm_rows(const bf16* __restrict__ W, const bf16* x, bf16* y, int M, int N, int K, int ldx, Epi e) {
  static_assert(!LO || MT == 1, "LO: at most 8 rows");
  static_assert(NSLOTS % (CW * TG) == 0,
                "each ring slot serves one consumer warp (a phase-aliased wait returns at once)");
  static_assert(RSLOTS >= 2 * TG, "a warp is at most one barrier (TG tiles) ahead of the slowest");
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + NSLOTS * MSLOT);
  uint64_t* empty = full + NSLOTS;
  float* red = reinterpret_cast<float*>(empty + NSLOTS);  // [RSLOTS][CW][MT][128]: a tile's warp sums
  float* rs = red + RSLOTS * CW * MT * 128;                 // [64]: each row's norm scale (e.ss_in)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int groups = N / 8 / TG, P = K / 512;
  const int g0 = static_cast<int>(static_cast<long long>(groups) * blockIdx.x / gridDim.x);
  const int g1 = static_cast<int>(static_cast<long long>(groups) * (blockIdx.x + 1) / gridDim.x);
  const int nchunks = (g1 - g0) * P * TG;  // chunk i: group g0 + i / (P TG), piece i / TG % P, tile i % TG of it

  ring_init(full, empty, NSLOTS, 1);  // then the successor may launch: its blocks take an SM only as ours leave

  if (warp == CW) {  // the producer: weights never depend on the predecessor, so no wait before streaming them
    // lane 0 waits for a free slot and arms its barrier; the chunk's 8 row copies are issued by lanes 0-7 at once
    if (lane < 8) {
      int grp = g0, piece = 0, j = 0, a, b;
      tile_rows<EPI>(grp * TG, N, e, a, b);
      for (int i = 0; i < nchunks; ++i) {
        const int s = i % NSLOTS;
        if (lane == 0) {
          if (i >= NSLOTS) mbar_wait(&empty[s], ((i / NSLOTS) - 1) & 1);
          mbar_expect_tx(&full[s], 8 * 1024);
        }
        const bf16* wa = W + static_cast<size_t>(a) * K + piece * 512;
        const bf16* wb = W + static_cast<size_t>(b) * K + piece * 512;
        __syncwarp(0xffu);
        const int r = lane & 3;
        bulk_load(ring + s * MSLOT + lane * MROW, (lane < 4 ? wa : wb) + static_cast<size_t>(r) * K, 1024, &full[s]);
        if (++j == TG) {
          j = 0;
          if (++piece == P) piece = 0, ++grp;
        }
        tile_rows<EPI>(grp * TG + j, N, e, a, b);  // (the next chunk's; constants only, no divisions by runtime values)
      }
    }
    return;
  }

  pdl_wait();  // x (and the residual, and the norm's statistics) are the predecessor's
  if (e.ss_in) {  // each row's r: its partial sums added in order (lanes i, i + 32, ..., then a butterfly)
    for (int row = warp; row < M; row += CW) {
      float s = 0.f;
      for (int i = lane; i < e.nss; i += 32) s += __ldcg(e.ss_in + static_cast<size_t>(row) * e.nss + i);
#pragma unroll
      for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) rs[row] = rsqrtf(s / K + e.eps);  // (read after the first group's barrier)
    }
  }
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float d[TG][MT][2][4];  // per tile of the group and row tile, even and odd steps
#pragma unroll
  for (int jt = 0; jt < TG; ++jt)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 4; ++r) d[jt][mt][0][r] = d[jt][mt][1][r] = 0.f;
  // a warp's pieces w, w + CW, ... of each group (P is a multiple of CW), TG chunks a piece
  for (int grp = g0, piece = warp; grp < g1;) {
    const int i0 = ((grp - g0) * P + piece) * TG, kq = piece * 64;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      // this lane's x rows: mt * 16 + g (A rows 0-7) and + 8 (A rows 8-15); rows past M are zeros. Step j covers
      // k = piece * 512 + j * 32 + t * 8 .. + 7 of a row (the same permutation of k for W and x). x is held XH steps
      // at a time (more row tiles or tiles a group: fewer, or the registers pass 200 and one block an SM fits); the
      // steps' order, so the bits, stay the same
      constexpr int XH = (MT == 1 && TG == 1) ? 16 : (MT * TG >= 4 ? XH_WIDE : 8);
      const int r0 = mt * 16 + g;
      const bool lo = r0 < M, hi = !LO && r0 + 8 < M;
      const uint4* xlo = reinterpret_cast<const uint4*>(x + static_cast<size_t>(r0) * ldx) + kq + t;
      const uint4* xhi = reinterpret_cast<const uint4*>(x + static_cast<size_t>(r0 + 8) * ldx) + kq + t;
#pragma unroll(MT == 1 ? 16 : 1)  // (more row tiles: a rolled loop, or ptxas hoists the loads and spills)
      for (int h = 0; h < 16; h += XH) {
        uint4 xa[XH], xb[LO ? 1 : XH];
#pragma unroll
        for (int j = 0; j < XH; ++j) {
          xa[j] = lo ? load_x(xlo + (h + j) * 4) : zero;
          if (!LO) xb[LO ? 0 : j] = hi ? load_x(xhi + (h + j) * 4) : zero;
        }
        if (mt == 0 && h == 0)
#pragma unroll
          for (int jt = 0; jt < TG; ++jt) mbar_wait(&full[(i0 + jt) % NSLOTS], ((i0 + jt) / NSLOTS) & 1);
#pragma unroll
        for (int jt = 0; jt < TG; ++jt) {
          const unsigned char* wrow = ring + ((i0 + jt) % NSLOTS) * MSLOT + g * MROW + t * 16;
#pragma unroll
          for (int j = 0; j < XH; ++j) {
            const uint4 w = *reinterpret_cast<const uint4*>(wrow + (h + j) * 64);
            const uint4 xh = LO ? zero : xb[LO ? 0 : j];
            mma16816(d[jt][mt][j & 1], xa[j].x, xh.x, xa[j].y, xh.y, w.x, w.y);
            mma16816(d[jt][mt][j & 1], xa[j].z, xh.z, xa[j].w, xh.w, w.z, w.w);
          }
        }
      }
    }
#pragma unroll
    for (int jt = 0; jt < TG; ++jt) slot_release(&empty[(i0 + jt) % NSLOTS], lane);
    if (piece + CW >= P) {  // this warp's last piece of the group: leave its sums, the barrier, the epilogues
#pragma unroll
      for (int jt = 0; jt < TG; ++jt) {
        float* slot = red + (((grp - g0) * TG + jt) % RSLOTS) * CW * MT * 128;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            slot[(warp * MT + mt) * 128 + lane * 4 + r] = d[jt][mt][0][r] + d[jt][mt][1][r];
            d[jt][mt][0][r] = d[jt][mt][1][r] = 0.f;
          }
      }
      // (RSLOTS >= 2 TG slots: a warp can be at most one barrier ahead of the slowest, so a slot is read before
      // its reuse)
      asm volatile("bar.sync 1, %0;" ::"r"(CW * 32) : "memory");
#pragma unroll
      for (int jt = 0; jt < TG; ++jt) {
        const float* slot = red + (((grp - g0) * TG + jt) % RSLOTS) * CW * MT * 128;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) epilogue<MT, EPI>(slot, threadIdx.x, mt, grp * TG + jt, M, N, y, e, rs);
      }
    }
    piece += CW;
    if (piece >= P) piece -= P, ++grp;
  }
}

template <int MT, bool LO, int EPI, int TG>
int launch_gemm(const bf16* W, const bf16* x, bf16* y, int M, int N, int K, int ldx, const Epi& e, int grid,
                cudaStream_t stream) {
  // at least 100 KB a block: two fit an SM and a successor's block only as one of ours leaves (blocks that fit beside
  // the running ones take room early and unevenly, and the chain got slower: docs/performance.md#d4)
  const size_t need = NSLOTS * MSLOT + 2 * NSLOTS * 8 + (RSLOTS * CW * MT * 128 + 64) * 4;
  const size_t smem = need > 100 * 1024 ? need : 100 * 1024;
  static bool ready = false;
  if (!ready) {
    const cudaError_t err = cudaFuncSetAttribute(gemm_rows<MT, LO, EPI, TG>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return static_cast<int>(err);
    ready = true;
  }
  return launch_ex(gemm_rows<MT, LO, EPI, TG>, dim3(grid), dim3((CW + 1) * 32), smem, PDL, stream, W, x, y, M, N,
                   K, ldx, e);
}


template <int EPI>
int gemm_rows_for(const bf16* W, const bf16* x, bf16* y, int M, int N, int K, int ldx, const Epi& e, int grid,
                  cudaStream_t s) {
  constexpr int TW = TG_WIDE;
  if (M <= 8) {  // (pairs of tiles from the product's threshold above: x's L1/L2 reads, M / 8 of the weight's, halved)
    constexpr int from = EPI == EPI_QKV ? TG_LO_FROM_QKV : EPI == EPI_RESID ? TG_LO_FROM_RESID : TG_LO_FROM;
    if (M >= from && N / 8 % 2 == 0) return launch_gemm<1, true, EPI, 2>(W, x, y, M, N, K, ldx, e, grid, s);
    return launch_gemm<1, true, EPI, 1>(W, x, y, M, N, K, ldx, e, grid, s);
  }
  if (N / 8 % TW) {  // (an odd number of tiles, e.g. a vocabulary of 8 x odd: one tile a group, the same bits)
    if (M <= 16) return launch_gemm<1, false, EPI, 1>(W, x, y, M, N, K, ldx, e, grid, s);
    if (M <= 32) return launch_gemm<2, false, EPI, 1>(W, x, y, M, N, K, ldx, e, grid, s);
    return launch_gemm<4, false, EPI, 1>(W, x, y, M, N, K, ldx, e, grid, s);
  }
  if (M <= 16) return launch_gemm<1, false, EPI, TW>(W, x, y, M, N, K, ldx, e, grid, s);
  // (17-32 rows: one tile a group, where pairs measured slower for a 17-row step; the same bits either way)
  if (M <= 32) return launch_gemm<2, false, EPI, 1>(W, x, y, M, N, K, ldx, e, grid, s);
  return launch_gemm<4, false, EPI, TW>(W, x, y, M, N, K, ldx, e, grid, s);
}

// ---- the first layer's norm, one block a row: its statistics for the q/k/v product that applies it ----------------
// y = bf16(w * x) and sums[row] = the row's sum of x^2 in fp32 in a fixed order (Epi.ss_in with nss 1); every later
// norm's statistics come from a RESID epilogue
__global__ void __launch_bounds__(256)
    rms_stats(const bf16* x, const bf16* __restrict__ w, bf16* y, int K, float* sums) {
  __shared__ float part[8];
  pdl_trigger();
  pdl_wait();
  const uint4* xr = reinterpret_cast<const uint4*>(x + static_cast<size_t>(blockIdx.x) * K);
  uint4* yr = reinterpret_cast<uint4*>(y + static_cast<size_t>(blockIdx.x) * K);
  float ss = 0.f;
  for (int i = threadIdx.x; i < K / 8; i += 256) {
    const uint4 v = __ldcg(xr + i);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      ss = fmaf(f.x, f.x, ss);
      ss = fmaf(f.y, f.y, ss);
    }
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float tot = part[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) tot += part[i];
  if (threadIdx.x == 0) sums[blockIdx.x] = tot;
  const uint4* wr = reinterpret_cast<const uint4*>(w);
  for (int i = threadIdx.x; i < K / 8; i += 256) {
    uint4 v = __ldcg(xr + i);
    const uint4 wv = wr[i];
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
    const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&wv);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]), s = __bfloat1622float2(wh[j]);
      h[j] = __floats2bfloat162_rn(s.x * f.x, s.y * f.y);
    }
    yr[i] = v;
  }
}

// ---- attention of query rows (GQA, head_dim 128), each over its own visible keys ----------------------------------
// Row t sees the committed prefix (slots 0 .. base - 1) and the pending keys c whose block[t, c] is set (block [rows,
// C], C <= 64: in a verify this call's tokens, C = rows, its tree ancestors and itself; in a draft tree every pending
// node so far), in that order: logical key j < base at slot j, key base + m at slot base + c_m, c_m the row's m-th set
// column. Keys come in chunks of ACH: chunk c is logical keys [ACH c, ACH c + ACH). The pending keys come from the
// cache (a verify's: written by the q/k/v product's epilogue), except with new0 (the draft's calls): this call's own
// rows' keys r, at slots *new0 + r, are read from kn/vn, and part 0 writes them to the cache there (no other block
// reads those slots; so torch.compile can pass the cache itself to the op, where an index_copy_ beside it made
// inductor copy the whole cache each call: docs/performance.md#d11).
constexpr int AHD = 128, ACH = 32;

// this call's row r's key (or value) for KV head g, where the draft's calls hand them apart (kn/vn: element strides)
__device__ __forceinline__ const bf16* new_row(const bf16* kn, const bf16* vn, int r, int g, int kn_t, int kn_h,
                                               int vn_t, int vn_h, bool key) {
  return key ? kn + static_cast<size_t>(r) * kn_t + static_cast<size_t>(g) * kn_h
             : vn + static_cast<size_t>(r) * vn_t + static_cast<size_t>(g) * vn_h;
}

// ---- attn_tiles: the attention on the tensor cores, all of a KV head's query rows at once ------------------------
// Block (part p, KV head g, z) holds MTB 16-row tiles of query heads (16 / REP rows of the call, REP heads each) as
// the A operands of the mma and reads each chunk's keys once for all of them (a block a row read the same keys once
// a row and ran out of issue slots at 8 rows: docs/performance.md#d9): scores S = Q K^T and O += P V on the
// tensor cores. Chunk slot w (warps w, w + TW, ...: one a tile) takes chunks
// TW p + w, then + TW P, ... (P = gridDim.x parts, set by the span alone), folding them FlashAttention-2 style: a
// running max and sum a query row, O rescaled by 2^(m_old - m_new) and the chunk's P V (P rounded to bf16, as
// FlashAttention does) added by one fma; the slots' states are combined in slot order, the parts merged in part order
// by the last part to finish (a ticket a (row, KV head), reset by it for the next launch). The committed keys of a
// part's first chunk are copied before the wait (the committed cache never depends on the predecessor).
// Row invariance: an mma's D row reads its own A row only (the products rely on it too), every sum runs in an order
// set by logical key positions, and a chunk's keys sit where the row's logical order puts them: a chunk wholly below
// the committed length holds the same keys for every row (loaded once, the tile's rows in one pass); a chunk past it
// is a "tail": each row takes its own pass over it, its keys addressed through ldmatrix's per-lane row addresses (the
// committed ones in the slot's tile, the row's pending ones in a pool of the call's pending keys, a zero row past the
// row's last key), and only that row's state takes the pass's result (a select: the others keep their bits).
constexpr int TW = 4;           // warps a block (chunks a part)
constexpr int KROW = AHD + 8;   // a key's row in shared memory: 272 bytes, so ldmatrix's eight rows hit distinct banks

__device__ __forceinline__ void cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void named_sync(int id, int threads) {  // the warps of one chunk slot (barrier id >= 1)
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {  // lo in the low half (the lower column)
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// the dynamic shared memory of attn_tiles for a call of C pending columns: TW tiles of ACH keys and values, the pool of
// C pending keys and values, a zero row, TW slots of fp32 state for 16 query rows a tile (MTB tiles a block)
__host__ __device__ constexpr int tiles_smem(int C, int MTB) {
  return (TW * 2 * ACH + 2 * C + 1) * KROW * 2 + TW * MTB * (16 * AHD + 32) * 4;
}

template <int REP, int MTB>
__global__ void __launch_bounds__(32 * TW * MTB)
    attn_tiles(const bf16* q, int ldq, const bf16* K, const bf16* V, int cap, const long long* base_ptr,
               const unsigned char* block, int C, int R, float* part_acc, float* part_ml, unsigned* tickets, bf16* out,
               int ldo, float scale_log2, const long long* new0, const bf16* kn, const bf16* vn, int kn_t, int kn_h,
               int vn_t, int vn_h) {
  constexpr int TR = 16 / REP, TRB = TR * MTB, NT = 32 * TW * MTB;  // rows of the call a tile, a block; threads
  constexpr int SL = 16 * AHD + 32;                                  // a slot's floats
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* const tiles = reinterpret_cast<bf16*>(smem);  // [TW][2][ACH][KROW]: chunk slot w's keys, then values
  bf16* const kp = tiles + TW * 2 * ACH * KROW;        // [C][KROW] the pending keys (column order), then values
  bf16* const vp = kp + C * KROW;
  bf16* const zero = vp + C * KROW;
  __shared__ unsigned char cols[TRB][64];  // a row's set columns of block, in order
  __shared__ int nk[TRB];                  // a row's logical keys (0: past the call's rows)
  __shared__ int is_last;
  pdl_trigger();
  const int p = blockIdx.x, g = blockIdx.y, P = gridDim.x, Hkv = gridDim.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
  const int wk = warp % TW, wt = warp / TW;  // this warp's chunk slot and tile: tile wt's rows, chunks TW p + wk, ...
  const long long L = *base_ptr;  // (block and base are written before the step's layers: read before the wait)
  const int Li = static_cast<int>(L), r0 = blockIdx.z * TRB;  // the block's rows r0 ..; tile wt's: r0 + wt TR ..
  for (int rr = warp; rr < TRB; rr += TW * MTB) {
    const int r = r0 + rr;
    if (r >= R) {
      if (lane == 0) nk[rr] = 0;
      continue;
    }
    const unsigned char* brow = block + static_cast<size_t>(r) * C;
    const unsigned m0 = __ballot_sync(0xffffffffu, lane < C && brow[lane]);
    const unsigned m1 = __ballot_sync(0xffffffffu, lane + 32 < C && brow[lane + 32]);
    if (m0 >> lane & 1) cols[rr][__popc(m0 & ((1u << lane) - 1))] = lane;
    if (m1 >> lane & 1) cols[rr][__popc(m0) + __popc(m1 & ((1u << lane) - 1))] = lane + 32;
    if (lane == 0) nk[rr] = Li + __popc(m0) + __popc(m1);
  }
  for (int i = tid; i < KROW / 8; i += NT) reinterpret_cast<uint4*>(zero)[i] = make_uint4(0, 0, 0, 0);
  __syncthreads();
  int nmax = 0;
#pragma unroll
  for (int rr = 0; rr < TRB; ++rr) nmax = max(nmax, nk[rr]);
  const int cmax = (nmax + ACH - 1) / ACH;  // the chunks of the block's longest row
  if (TW * p >= cmax) return;               // no chunk here for any of its rows (no ticket either)
  const size_t head = static_cast<size_t>(g) * cap;
  bf16* const kt = tiles + wk * 2 * ACH * KROW;  // (the MTB warps of slot wk share its tile: each loads a share)
  bf16* const vt = kt + ACH * KROW;
  auto load_committed = [&](int c) {  // chunk c's committed keys (below L) into the slot's tile, row j: key 32 c + j
    const int lo = c * ACH, pre = max(0, min(ACH, Li - lo));
    const bf16* src = (lane < 16 ? K : V) + (head + lo) * AHD + (lane % 16) * 8;
    bf16* dst = (lane < 16 ? kt : vt) + (lane % 16) * 8;
    for (int j = wt; j < pre; j += MTB) cp16(dst + j * KROW, src + static_cast<size_t>(j) * AHD);
    cp_commit();
  };
  int c = TW * p + wk;
  if (c < cmax) load_committed(c);  // (the committed cache never depends on the predecessor: before the wait)
  pdl_wait();                       // q and this call's keys are the q/k/v product's
  const int c0 = new0 ? static_cast<int>(*new0 - L) : 0, nrow = new0 ? R : 0;  // kn/vn: columns c0 + r
  if (new0 && p == 0)  // this block's rows' keys (lanes 0-15) and values (16-31) into the cache
    for (int rr = warp; rr < TRB && r0 + rr < R; rr += TW * MTB) {
      const int r = r0 + rr;
      const bf16* src = new_row(kn, vn, r, g, kn_t, kn_h, vn_t, vn_h, lane < 16);
      bf16* dst = const_cast<bf16*>(lane < 16 ? K : V) + (head + L + c0 + r) * AHD;
      reinterpret_cast<uint4*>(dst)[lane % 16] = reinterpret_cast<const uint4*>(src)[lane % 16];
    }
  bool tail = false;  // a chunk of this part at or past the committed length's: the pool is needed
  for (int cc = TW * p; cc < cmax; cc += TW * P) tail |= cc + TW - 1 >= Li / ACH;
  if (tail) {
    for (int i = tid; i < C * 32; i += NT) {  // column col: 16 units of 16 bytes of its key, then 16 of its value
      const int col = i / 32, u = i % 32, r = col - c0;
      const bf16* src = static_cast<unsigned>(r) < static_cast<unsigned>(nrow)
                            ? new_row(kn, vn, r, g, kn_t, kn_h, vn_t, vn_h, u < 16)
                            : (u < 16 ? K : V) + (head + L + col) * AHD;
      cp16((u < 16 ? kp : vp) + col * KROW + (u % 16) * 8, src + (u % 16) * 8);
    }
    cp_commit();
  }
  // tile wt's query heads as A fragments, k-step kk (dims 16 kk ..): query row qi -> row r0 + wt TR + qi / REP, head
  // g REP + qi % REP; this lane's rows gid (h2 0) and gid + 8 (h2 1); rows past the call's: zeros
  uint32_t qa[8][4];
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int qi = gid + 8 * h2, r = r0 + wt * TR + qi / REP;
    const bf16* qrow = q + static_cast<size_t>(r < R ? r : 0) * ldq + static_cast<size_t>(g * REP + qi % REP) * AHD;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      qa[kk][h2] = r < R ? *reinterpret_cast<const uint32_t*>(qrow + 16 * kk + 2 * tig) : 0u;
      qa[kk][2 + h2] = r < R ? *reinterpret_cast<const uint32_t*>(qrow + 16 * kk + 8 + 2 * tig) : 0u;
    }
  }
  cp_wait_all();
  __syncthreads();  // (the pool, the first tiles)
  float m_[2] = {-INFINITY, -INFINITY}, l_[2] = {0.f, 0.f}, o[16][4];
#pragma unroll
  for (int dn = 0; dn < 16; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
  // one pass over chunk [lo, lo + 32) for the tile's row rr (all its rows where rr < 0): n the row's keys (keys at or
  // past it are masked), its pending keys in cols[wt TR + rr], the chunk's committed keys in the tile tk, tv
  auto pass = [&](int lo, int rr, int n, const bf16* tk, const bf16* tv) {
    auto addr = [&](int j, bool val) {  // the smem row of the chunk's key j (0..31) for this pass
      const int J = lo + j;
      const bf16* row = J < Li ? (val ? tv : tk) + j * KROW
                               : J < n ? (val ? vp : kp) + cols[wt * TR + (rr < 0 ? 0 : rr)][J - Li] * KROW : zero;
      return smem_u32(row);
    };
    float s[4][4];
#pragma unroll
    for (int jt = 0; jt < 4; ++jt) {  // keys 8 jt ..: this lane addresses key 8 jt + lane % 8, dims 8 (lane / 8) ..
      s[jt][0] = s[jt][1] = s[jt][2] = s[jt][3] = 0.f;
      const uint32_t ka = addr(8 * jt + (lane & 7), false) + (lane >> 3) * 16;
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) {  // dims 32 qq ..: k-steps 2 qq and 2 qq + 1
        uint32_t b[4];
        ldsm4(b, ka + qq * 64);
        mma16816(s[jt], qa[2 * qq][0], qa[2 * qq][1], qa[2 * qq][2], qa[2 * qq][3], b[0], b[1]);
        mma16816(s[jt], qa[2 * qq + 1][0], qa[2 * qq + 1][1], qa[2 * qq + 1][2], qa[2 * qq + 1][3], b[2], b[3]);
      }
    }
    bool sel[2];
    float alpha[2], mnew[2];
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {  // s[jt][2 h2 + e]: query row gid + 8 h2, key 8 jt + 2 tig + e
      sel[h2] = rr < 0 || (gid + 8 * h2) / REP == rr;
      float mx = -INFINITY;
#pragma unroll
      for (int jt = 0; jt < 4; ++jt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& v = s[jt][2 * h2 + e];
          v = lo + 8 * jt + 2 * tig + e < n ? v * scale_log2 : -INFINITY;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mnew[h2] = sel[h2] ? fmaxf(m_[h2], mx) : m_[h2];
      alpha[h2] = sel[h2] ? exp2f(m_[h2] - mnew[h2]) : 1.f;
      float sum = 0.f;
#pragma unroll
      for (int jt = 0; jt < 4; ++jt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& v = s[jt][2 * h2 + e];
          v = sel[h2] ? exp2f(v - mnew[h2]) : 0.f;
          sum += v;
        }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (sel[h2]) l_[h2] = fmaf(l_[h2], alpha[h2], sum), m_[h2] = mnew[h2];
    }
    uint32_t pa[2][4];  // P as A fragments: k-step ks takes keys 16 ks .. 16 ks + 15 (n-tiles 2 ks, 2 ks + 1)
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      pa[ks][0] = pack_bf2(s[2 * ks][0], s[2 * ks][1]);
      pa[ks][1] = pack_bf2(s[2 * ks][2], s[2 * ks][3]);
      pa[ks][2] = pack_bf2(s[2 * ks + 1][0], s[2 * ks + 1][1]);
      pa[ks][3] = pack_bf2(s[2 * ks + 1][2], s[2 * ks + 1][3]);
    }
    uint32_t va[2];  // values (ldmatrix.trans): this lane addresses key 16 ks + 8 ((lane / 8) % 2) + lane % 8
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) va[ks] = addr(16 * ks + ((lane >> 3) & 1) * 8 + (lane & 7), true) + (lane >> 4) * 16;
#pragma unroll
    for (int dd = 0; dd < 8; ++dd) {  // dims 16 dd .. 16 dd + 15: n-tiles 2 dd, 2 dd + 1
      float t0[4] = {0.f, 0.f, 0.f, 0.f}, t1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        uint32_t b[4];
        ldsm4t(b, va[ks] + dd * 32);
        mma16816(t0, pa[ks][0], pa[ks][1], pa[ks][2], pa[ks][3], b[0], b[1]);
        mma16816(t1, pa[ks][0], pa[ks][1], pa[ks][2], pa[ks][3], b[2], b[3]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h2 = e / 2;
        o[2 * dd][e] = sel[h2] ? fmaf(o[2 * dd][e], alpha[h2], t0[e]) : o[2 * dd][e];
        o[2 * dd + 1][e] = sel[h2] ? fmaf(o[2 * dd + 1][e], alpha[h2], t1[e]) : o[2 * dd + 1][e];
      }
    }
  };
  // a tail chunk (past the committed length: a pass a row) of a block whose rows all end in the first round is left to
  // the step after this loop, which spreads the passes over the tile's warps: there each slot folds at most one chunk
  // a row, so a pass starts from a fresh state wherever it runs and gives the bits its own slot's warp would
  const bool one_round = cmax <= TW * P;
  for (int k = 0; c < cmax; c += TW * P, ++k) {
    if (k > 0) {  // (spans past TW P chunks: the slot's next chunk, once its warps' last passes are done with the tile)
      named_sync(1 + wk, 32 * MTB);
      load_committed(c);
      cp_wait_all();
      named_sync(1 + wk, 32 * MTB);
    }
    const int lo = c * ACH;
    if (lo + ACH <= Li) {
      pass(lo, -1, lo + ACH, kt, vt);
    } else if (!one_round) {
      for (int rr = 0; rr < TR; ++rr)
        if (lo < nk[wt * TR + rr]) pass(lo, rr, nk[wt * TR + rr], kt, vt);
    }
  }
  // the slots: chunk slot w's (O, m, l) for tile t's 16 query rows, combined in slot order below
  float* const cw = reinterpret_cast<float*>(zero + KROW);  // [TW][MTB][SL]: O [16][AHD], m [16], l [16]
  auto to_slot = [&](int w, int rr) {  // this warp's state into slot w of its tile: tile row rr's rows (all: rr < 0)
    float* ws = cw + (w * MTB + wt) * SL;
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      if (rr >= 0 && (gid + 8 * h2) / REP != rr) continue;
#pragma unroll
      for (int dn = 0; dn < 16; ++dn)
        *reinterpret_cast<float2*>(ws + (gid + 8 * h2) * AHD + 8 * dn + 2 * tig) =
            make_float2(o[dn][2 * h2], o[dn][2 * h2 + 1]);
      if (tig == 0) ws[16 * AHD + gid + 8 * h2] = m_[h2], ws[16 * AHD + 16 + gid + 8 * h2] = l_[h2];
    }
  };
  to_slot(wk, -1);
  __syncthreads();
  if (one_round) {  // the part's tail chunks times tile wt's rows, pair i to the tile's warp i % TW
    const int cf = max(TW * p, Li / ACH), cl = min(TW * p + TW, cmax);
    for (int i = wk; i < (cl - cf) * TR; i += TW) {
      const int cc = cf + i / TR, rr = i % TR, lo = cc * ACH, n = nk[wt * TR + rr];
      if (lo >= n) continue;
      m_[0] = m_[1] = -INFINITY, l_[0] = l_[1] = 0.f;
#pragma unroll
      for (int dn = 0; dn < 16; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.f;
      const bf16* tk = tiles + (cc % TW) * 2 * ACH * KROW;  // (the committed keys of chunk cc: its slot's tile)
      pass(lo, rr, n, tk, tk + ACH * KROW);
      to_slot(cc % TW, rr);
    }
    __syncthreads();
  }
  // this thread: 16 dims of query row qi of tile t
  const int t = tid / 128, qi = tid % 128 / 8, d0 = (tid % 8) * 16, rb = t * TR + qi / REP, r = r0 + rb, h = qi % REP;
  const size_t first = (static_cast<size_t>(r) * Hkv + g) * P * REP + h;  // (row, g, part 0, head h)
  if (r < R) {
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < TW; ++w) M = fmaxf(M, cw[(w * MTB + t) * SL + 16 * AHD + qi]);
    if (M > -INFINITY) {  // this part holds keys of the row
      float Ls = 0.f, a[16];
#pragma unroll
      for (int d = 0; d < 16; ++d) a[d] = 0.f;
#pragma unroll
      for (int w = 0; w < TW; ++w) {
        const float* ws = cw + (w * MTB + t) * SL;
        const float mw = ws[16 * AHD + qi];
        if (mw == -INFINITY) continue;  // (no chunk of the row in this slot)
        const float wgt = exp2f(mw - M);
        Ls = fmaf(ws[16 * AHD + 16 + qi], wgt, Ls);
#pragma unroll
        for (int d = 0; d < 16; ++d) a[d] = fmaf(ws[qi * AHD + d0 + d], wgt, a[d]);
      }
      const size_t slot = first + static_cast<size_t>(p) * REP;
#pragma unroll
      for (int d = 0; d < 16; d += 4)
        *reinterpret_cast<float4*>(part_acc + slot * AHD + d0 + d) = make_float4(a[d], a[d + 1], a[d + 2], a[d + 3]);
      if (d0 == 0) part_ml[slot * 2] = M, part_ml[slot * 2 + 1] = Ls;
    }
  }
  __threadfence();
  __syncthreads();
  unsigned* ticket = tickets + static_cast<size_t>(blockIdx.z) * Hkv + g;
  if (tid == 0) {
    const int parts = min((cmax + TW - 1) / TW, P);
    is_last = atomicAdd(ticket, 1u) == static_cast<unsigned>(parts - 1);
    if (is_last) *ticket = 0;  // every part has arrived: ready for the next launch
  }
  __syncthreads();
  if (!is_last || r >= R) return;
  __threadfence();
  // the merge of the row's parts, in part order (other blocks' values: L2 reads)
  const int parts = min(((nk[rb] + ACH - 1) / ACH + TW - 1) / TW, P);
  float M = -INFINITY, Ls = 0.f, a[16];
#pragma unroll 4
  for (int cpart = 0; cpart < parts; ++cpart) M = fmaxf(M, __ldcg(part_ml + (first + cpart * REP) * 2));
#pragma unroll
  for (int d = 0; d < 16; ++d) a[d] = 0.f;
#pragma unroll 4  // (four parts' loads in flight at once: each part is a round trip to L2 otherwise)
  for (int cpart = 0; cpart < parts; ++cpart) {
    const size_t slot = first + static_cast<size_t>(cpart) * REP;
    const float wgt = exp2f(__ldcg(part_ml + slot * 2) - M);
    Ls = fmaf(__ldcg(part_ml + slot * 2 + 1), wgt, Ls);
#pragma unroll
    for (int d = 0; d < 16; d += 4) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(part_acc + slot * AHD + d0 + d));
      a[d] = fmaf(v.x, wgt, a[d]), a[d + 1] = fmaf(v.y, wgt, a[d + 1]);
      a[d + 2] = fmaf(v.z, wgt, a[d + 2]), a[d + 3] = fmaf(v.w, wgt, a[d + 3]);
    }
  }
  bf16* dst = out + static_cast<size_t>(r) * ldo + (static_cast<size_t>(g) * REP + h) * AHD + d0;
#pragma unroll
  for (int d = 0; d < 16; d += 2)
    *reinterpret_cast<__nv_bfloat162*>(dst + d) = __floats2bfloat162_rn(a[d] / Ls, a[d + 1] / Ls);
}

// the pending keys' source for launch_attn: this call's rows' keys in kn/vn from slot *first on (strides in elements:
// a row, a KV head), or first null (every pending key in the cache)
struct NewKeys {
  const long long* first;
  const bf16 *kn, *vn;
  int kn_t, kn_h, vn_t, vn_h;
};

// attn_tiles with MTB tiles a block (two: a chunk's keys read once for both, the block twice the warps)
template <int REP, int MTB>
int launch_tiles(const bf16* q, int ldq, const bf16* K, const bf16* V, int cap, const long long* base,
                 const unsigned char* block, int cols, float* acc, float* ml, unsigned* tickets, bf16* out, int ldo,
                 int rows, int hkv, int parts, int blocks, const NewKeys& nk, cudaStream_t s) {
  int dev = 0;
  cudaGetDevice(&dev);
  static unsigned long long big_smem = 0;  // the devices on which it may take its most shared memory
  if (!(big_smem >> dev & 1)) {
    const cudaError_t e = cudaFuncSetAttribute(attn_tiles<REP, MTB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               tiles_smem(64, MTB));
    if (e != cudaSuccess) return static_cast<int>(e);
    big_smem |= 1ull << dev;
  }
  return launch_ex(attn_tiles<REP, MTB>, dim3(parts, hkv, blocks), dim3(32 * TW * MTB),
                   static_cast<size_t>(tiles_smem(cols, MTB)), PDL, s, q, ldq, K, V, cap, base, block, cols, rows,
                   acc, ml, tickets, out, ldo, 1.4426950408889634f / sqrtf(static_cast<float>(AHD)), nk.first, nk.kn,
                   nk.vn, nk.kn_t, nk.kn_h, nk.vn_t, nk.vn_h);
}

// the attention's launch: a part of attn_tiles is TW chunks, its parts counted from the span's (`parts`: the span's
// 32-key chunks, capped), so they depend on the span alone. Two tiles a block from three tiles on (a chunk's keys read
// once for both); at one or two tiles, one a block (two measured slower there; the bits are the same either way:
// docs/performance.md#d10).
template <int REP>
int launch_attn(const bf16* q, int ldq, const bf16* K, const bf16* V, int cap, const long long* base,
                const unsigned char* block, int cols, float* acc, float* ml, unsigned* tickets, bf16* out, int ldo,
                int rows, int hkv, int parts, const NewKeys& nk, cudaStream_t s) {
  const int tr = 16 / REP, tiles = (rows + tr - 1) / tr, P = (parts + TW - 1) / TW;
  if (tiles > 2)
    return launch_tiles<REP, 2>(q, ldq, K, V, cap, base, block, cols, acc, ml, tickets, out, ldo, rows, hkv, P,
                                (tiles + 1) / 2, nk, s);
  return launch_tiles<REP, 1>(q, ldq, K, V, cap, base, block, cols, acc, ml, tickets, out, ldo, rows, hkv, P, tiles,
                              nk, s);
}

// the norm arguments of a product (Epi): ss_in [M, nss] (null: no norm in it), eps; and for RESID, xg [M, N] and
// ss_out [M, N / 8] written with g [N] (null xg: neither)
void set_norm(Epi& e, const void* ss_in, int nss, float eps, void* xg, const void* g, void* ss_out) {
  e.ss_in = static_cast<const float*>(ss_in), e.nss = nss, e.eps = eps;
  e.xg = static_cast<bf16*>(xg), e.g = static_cast<const bf16*>(g), e.ss_out = static_cast<float*>(ss_out);
}

}  // namespace

// ---- the entry points ---------------------------------------------------------------------------------------------
// eaglekit.kernels.hopper calls them through ctypes, each with a pointer to its argument struct (mirrored field by
// field, in order, by a ctypes.Structure there; tests/kernels/test_hopper.py checks the two agree). Each returns 0 on
// success, a cudaError_t, or -1 (a shape these kernels do not take; hopper.py checks shapes first, so -1 means a bug
// there). Pointers are device pointers (bf16 unless said), `stream` a cudaStream_t; one field a line.
extern "C" {

// y = x @ W^T with epilogue `epi` (0 plain, 1 + res, 2 SwiGLU over [gate; up] rows: y [M, N / 2]); M <= 64,
// N % 8 == 0 (SwiGLU: N % 16), K % 2048 == 0. A norm in it where ss_in is set (Epi says how); RESID with xg set also
// writes the next norm's input and statistics
struct ek_hopper_linear_args {
  int epi;
  const void* W;       // [N, K]
  const void* x;       // [M, K], row stride ldx
  void* y;             // [M, N] (SwiGLU: [M, N / 2])
  const void* res;     // RESID: [M, N]
  int M;
  int N;
  int K;
  int ldx;
  const void* ss_in;   // or null: [M, nss] fp32, the norm's partial sums of squares
  int nss;
  float eps;
  void* xg;            // or null (RESID only): [M, N] = bf16(y * g)
  const void* g;       // with xg: [N], the next norm's weight
  void* ss_out;        // with xg: [M, N / 8] fp32, each 8 columns' sum of y^2
  int grid;            // blocks (two an SM)
  void* stream;
};

// the q/k/v product of a layer: W [(H + 2 Hkv) hd, K] ([q; k; v] rows); q (rotated) -> q_out [M, H hd]; k (rotated)
// and v -> the cache [Hkv, cap, hd] at slots *base + row; the norm before it in the product where ss_in is set
struct ek_hopper_qkv_args {
  const void* W;
  const void* x;         // [M, K], row stride ldx
  void* q_out;
  int M;
  int K;
  int ldx;
  int H;
  int Hkv;
  int hd;                // 128
  void* kc;              // [Hkv, cap, hd]
  void* vc;              // [Hkv, cap, hd]
  const void* pos;       // [M] int64: each row's position
  const void* inv_freq;  // [hd / 2] fp32: the rotary frequencies
  const void* base;      // [1] int64: the slot of row 0 (the cache's committed length)
  int cap;
  const void* ss_in;     // or null: as ek_hopper_linear_args's
  int nss;
  float eps;
  int grid;
  void* stream;
};

// the first layer's norm statistics (rms_stats): y = bf16(w * x) [M, K] and ss [M] fp32, each row's sum of x^2
struct ek_hopper_rms_args {
  const void* x;
  const void* w;
  void* y;
  int M;
  int K;
  void* ss;
  void* stream;
};

// attention of `rows` (<= 64) query rows (attn_tiles): q [rows, >= H * 128] (row stride ldq), K/V [Hkv, cap, 128],
// base: the committed length (slot base + c: pending key c), block [rows, cols] bool (cols <= 64; row t sees pending
// key c where set); acc [rows, Hkv, parts, rep, 128] fp32, ml [rows, Hkv, parts, rep, 2] fp32, tickets [rows * Hkv]
// zeros (left zero); out [rows, H * 128] (stride ldo); parts >= 1: the span's 32-key chunks, capped. first (or null):
// the slot of this call's row 0 key, row r's key and value read from kn + r kn_t + g kn_h (vn likewise; KV head g;
// 16-byte aligned) instead of the cache, and written to the cache at slot *first + r
struct ek_hopper_attn_args {
  int rep;               // query heads a KV head: 1, 2, 4 or 8
  const void* q;
  int ldq;
  const void* K;
  const void* V;
  int cap;
  const void* base;      // [1] int64
  const void* block;     // [rows, cols] bool
  int cols;
  void* acc;
  void* ml;
  void* tickets;
  void* out;
  int ldo;
  int rows;
  int hkv;
  int parts;
  const void* first;     // or null: [1] int64
  const void* kn;
  const void* vn;
  int kn_t;
  int kn_h;
  int vn_t;
  int vn_h;
  void* stream;
};

int ek_hopper_linear(const ek_hopper_linear_args* a) {
  const int M = a->M, N = a->N, K = a->K, ldx = a->ldx;
  if (M < 1 || M > 64 || N % (a->epi == EPI_SWIGLU ? 16 : 8) || K % (512 * CW) || ldx % 8) return -1;
  if ((a->xg && (a->epi != EPI_RESID || !a->g || !a->ss_out)) || (a->ss_in && a->nss < 1)) return -1;
  Epi e = {};
  e.res = static_cast<const bf16*>(a->res);
  set_norm(e, a->ss_in, a->nss, a->eps, a->xg, a->g, a->ss_out);
  const bf16* w = static_cast<const bf16*>(a->W);
  const bf16* xx = static_cast<const bf16*>(a->x);
  bf16* yy = static_cast<bf16*>(a->y);
  cudaStream_t s = static_cast<cudaStream_t>(a->stream);
  switch (a->epi) {
    case EPI_PLAIN: return gemm_rows_for<EPI_PLAIN>(w, xx, yy, M, N, K, ldx, e, a->grid, s);
    case EPI_RESID: return gemm_rows_for<EPI_RESID>(w, xx, yy, M, N, K, ldx, e, a->grid, s);
    case EPI_SWIGLU: return gemm_rows_for<EPI_SWIGLU>(w, xx, yy, M, N, K, ldx, e, a->grid, s);
    default: return -1;
  }
}

int ek_hopper_qkv(const ek_hopper_qkv_args* a) {
  if (a->M < 1 || a->M > 64 || a->hd != QHD || a->K % (512 * CW) || a->ldx % 8 || (a->ss_in && a->nss < 1)) return -1;
  Epi e = {};
  set_norm(e, a->ss_in, a->nss, a->eps, nullptr, nullptr, nullptr);
  e.kc = static_cast<bf16*>(a->kc);
  e.vc = static_cast<bf16*>(a->vc);
  e.pos = static_cast<const long long*>(a->pos);
  e.inv_freq = static_cast<const float*>(a->inv_freq);
  e.base = static_cast<const long long*>(a->base);
  e.cap = a->cap, e.qcols = a->H * a->hd, e.kcols = a->Hkv * a->hd;
  return gemm_rows_for<EPI_QKV>(static_cast<const bf16*>(a->W), static_cast<const bf16*>(a->x),
                                static_cast<bf16*>(a->q_out), a->M, (a->H + 2 * a->Hkv) * a->hd, a->K, a->ldx, e,
                                a->grid, static_cast<cudaStream_t>(a->stream));
}

int ek_hopper_rms(const ek_hopper_rms_args* a) {
  if (a->K % 8 || !a->ss) return -1;
  return launch_ex(rms_stats, dim3(a->M), dim3(256), 0, PDL, static_cast<cudaStream_t>(a->stream),
                   static_cast<const bf16*>(a->x), static_cast<const bf16*>(a->w), static_cast<bf16*>(a->y), a->K,
                   static_cast<float*>(a->ss));
}

int ek_hopper_attn(const ek_hopper_attn_args* a) {
  if (a->rows < 1 || a->rows > 64 || a->cols < 1 || a->cols > 64 || (a->first && (!a->kn || !a->vn))) return -1;
  cudaStream_t s = static_cast<cudaStream_t>(a->stream);
  const bf16 *q = static_cast<const bf16*>(a->q), *K = static_cast<const bf16*>(a->K);
  const bf16* V = static_cast<const bf16*>(a->V);
  const long long* b = static_cast<const long long*>(a->base);
  const unsigned char* bl = static_cast<const unsigned char*>(a->block);
  float *acc = static_cast<float*>(a->acc), *ml = static_cast<float*>(a->ml);
  unsigned* t = static_cast<unsigned*>(a->tickets);
  bf16* o = static_cast<bf16*>(a->out);
  const NewKeys nk = {static_cast<const long long*>(a->first), static_cast<const bf16*>(a->kn),
                      static_cast<const bf16*>(a->vn), a->kn_t, a->kn_h, a->vn_t, a->vn_h};
  const int ldq = a->ldq, cap = a->cap, cols = a->cols, ldo = a->ldo, rows = a->rows, hkv = a->hkv, P = a->parts;
  switch (a->rep) {
    case 1: return launch_attn<1>(q, ldq, K, V, cap, b, bl, cols, acc, ml, t, o, ldo, rows, hkv, P, nk, s);
    case 2: return launch_attn<2>(q, ldq, K, V, cap, b, bl, cols, acc, ml, t, o, ldo, rows, hkv, P, nk, s);
    case 4: return launch_attn<4>(q, ldq, K, V, cap, b, bl, cols, acc, ml, t, o, ldo, rows, hkv, P, nk, s);
    case 8: return launch_attn<8>(q, ldq, K, V, cap, b, bl, cols, acc, ml, t, o, ldo, rows, hkv, P, nk, s);
    default: return -1;
  }
}

const char* ek_hopper_error(int e) { return status_message(e); }

int ek_hopper_sm_count() { return current_sm_count(); }
}
