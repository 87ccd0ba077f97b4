// Products whose weight streams into a ring of shared-memory slots by bulk copies (cp.async.bulk, completing on
// mbarriers), issued by one producer thread ahead of CW consumer warps. Launched as a programmatic dependent launch
// (PDL), a kernel lets its successor start early, and the successor's producer fills its ring with *its* weight
// before it waits (griddepcontrol.wait) for the predecessor's output, its x. So the memory can keep streaming across a
// kernel boundary, where a plain launch drains and ramps (benchmarks/NOTES.md: ~4-7 us a product, "one kernel per
// weight is the wall"). Four families, for benchmarks/bulk_probe.py (NOTES: "Weights streamed by bulk copies"):
//   gemv_bulk  one row, fp32 multiply-adds on the CUDA cores (below);
//   gemm_bulk  up to 16 rows on the tensor cores, each row's bits independent of the others (what a verify needs);
//              variants: W packed into the lanes' read order, at most 8 rows (layer_probe.py);
//   rms_rows, attn_like  stand-ins for a layer's latency-bound kernels, as PDL participants;
//   attn_decode  a real one-row GQA decode attention as a PDL participant (benchmarks/layer_probe.py).
// The x rows are read through the read-only path (const __restrict__ / __ldg: LDG.E.128.CONSTANT in the SASS); that is
// how the figures were measured; a product version should read a predecessor's output with coherent loads under PDL.
// A consumer releases a ring slot through slot_release (a proxy fence first): without it the refill's bulk copy could
// overwrite data whose loads were still in flight (found 2026-12-03: wrong sums at 16 rows).
//
// gemv_bulk's layout: block c owns output rows [N*c/G, N*(c+1)/G): a contiguous span of W. A chunk is one row (K*2 <=
// SLOT) or one of CW equal segments of a row; one bulk copy a chunk. Chunk i goes to consumer warp i % CW, which owns
// it alone (no block-wide step between chunks): a whole row, or segment w of every row, the segments then added by
// warp 0 after a barrier of the consumers. A row's sum has a fixed order (each lane over its 8-element pieces, two
// accumulators by alternate 256-element groups, a butterfly over lanes, segments in order): the same bits for a row
// whatever the grid or slot count.
//
// Build: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -shared -Xcompiler -fPIC -o libbulk_gemv.so bulk_gemv.cu

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace {

constexpr int SLOT = 8192;  // bytes a ring slot: one row of a 4096-wide weight
constexpr int XMAX = 14336;  // widest K (the x row is staged in shared memory)

#include "../../eaglekit/kernels/hopper_ptx.cuh"  // smem_u32, mbar_*, bulk_load, slot_release, mma16816, bf4

// the scores of an attention part: REP query heads (qr: this lane's 4 of HD dims each, pre-scaled) against ACH keys ks
// [ACH, HD]; warp w of NW takes keys w, w + NW, ..., a lane 4 dims, then a butterfly over the lanes. Keys past cnt are
// computed on whatever the slot holds and masked to -inf (no branch: the butterflies of several keys interleave)
template <int REP, int ACH, int NW, int HD>
__device__ __forceinline__ void part_scores(const __nv_bfloat16* ks, const float (&qr)[REP][4], float (&ps)[REP][ACH],
                                            int cnt, int warp, int lane) {
#pragma unroll 4
  for (int j = warp; j < ACH; j += NW) {
    float k[4], s[REP];
    bf4(ks + j * HD + lane * 4, k);
#pragma unroll
    for (int r = 0; r < REP; ++r) {
      s[r] = 0.f;
#pragma unroll
      for (int d = 0; d < 4; ++d) s[r] = fmaf(qr[r][d], k[d], s[r]);
#pragma unroll
      for (int o = 16; o; o >>= 1) s[r] += __shfl_xor_sync(0xffffffffu, s[r], o);
    }
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < REP; ++r) ps[r][j] = j < cnt ? s[r] : -INFINITY;
  }
}

// P.V of one query head over a part's first cnt keys: acc (this lane's 4 of HD dims) += p[j] vs[j], j in order
template <int HD>
__device__ __forceinline__ void part_pv(const __nv_bfloat16* vs, const float* p, int cnt, int lane, float (&acc)[4]) {
  for (int j = 0; j < cnt; ++j) {
    const float pj = p[j];
    float v[4];
    bf4(vs + j * HD + lane * 4, v);
#pragma unroll
    for (int d = 0; d < 4; ++d) acc[d] = fmaf(pj, v[d], acc[d]);
  }
}

// the ring's smem limit raised once per kernel (a block may take more than 48 KB)
template <typename K>
int allow_smem(K kernel, bool& ready) {
  if (ready) return 0;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
  ready = e == cudaSuccess;
  return static_cast<int>(e);
}

// acc += <w, x> over 8 bf16, in element order
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 a = __bfloat1622float2(wp[j]);
    const float2 b = __bfloat1622float2(xp[j]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

// the chunks of rows [r0, r1): chunk i is segment i % nseg of row r0 + i / nseg
struct Span {
  int r0, r1, nseg, seg_len;
  __device__ int chunks() const { return (r1 - r0) * nseg; }
};

template <int CW, int NSLOTS>
__global__ void __launch_bounds__((CW + 1) * 32)
    gemv_bulk(const __nv_bfloat16* __restrict__ W, const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y,
              int N, int K, int nseg, int pdl) {
  // slot s serves chunks s, s + NSLOTS, ...: all of one warp's when NSLOTS is a multiple of CW, so a chunk's wait
  // can never see the parity of a use two phases back (a phase-aliased mbarrier wait returns at once)
  static_assert(NSLOTS % CW == 0, "each slot must be used by one consumer warp only");
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem + NSLOTS * SLOT);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + NSLOTS * SLOT + K * 2);  // (K: a multiple of 256)
  uint64_t* empty = full + NSLOTS;
  float* red = reinterpret_cast<float*>(empty + NSLOTS);  // [2][CW]: a row's segment sums, by row parity

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Span sp{static_cast<int>(static_cast<long long>(N) * blockIdx.x / gridDim.x),
                static_cast<int>(static_cast<long long>(N) * (blockIdx.x + 1) / gridDim.x), nseg, K / nseg};
  const int nchunks = sp.chunks();

  ring_init(full, empty, NSLOTS, pdl);

  if (warp == CW) {  // the producer: a weight never depends on a predecessor, so no wait before it
    if (lane == 0) {
      for (int i = 0; i < nchunks; ++i) {
        const int s = i % NSLOTS;
        if (i >= NSLOTS) mbar_wait(&empty[s], ((i / NSLOTS) - 1) & 1);
        const __nv_bfloat16* src =
            W + static_cast<size_t>(sp.r0 + i / nseg) * K + static_cast<size_t>(i % nseg) * sp.seg_len;
        mbar_expect_tx(&full[s], sp.seg_len * 2);
        bulk_load(ring + s * SLOT, src, sp.seg_len * 2, &full[s]);
      }
      if (pdl == 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }
    return;
  }

  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");  // the predecessor's y (our x) is complete
  for (int i = threadIdx.x; i < K / 8; i += CW * 32)
    reinterpret_cast<uint4*>(xs)[i] = reinterpret_cast<const uint4*>(x)[i];
  asm volatile("bar.sync 1, %0;" ::"r"(CW * 32) : "memory");

  const int gps = sp.seg_len / 256;  // 256-element groups a chunk
  for (int i = warp; i < nchunks; i += CW) {
    const int s = i % NSLOTS, row = sp.r0 + i / nseg, seg = i % nseg;
    mbar_wait(&full[s], (i / NSLOTS) & 1);
    const uint4* wv = reinterpret_cast<const uint4*>(ring + s * SLOT) + lane;
    const uint4* xv = reinterpret_cast<const uint4*>(xs + seg * sp.seg_len) + lane;
    float a0 = 0.f, a1 = 0.f;
    int g = 0;
    for (; g + 1 < gps; g += 2) {
      const uint4 w0 = wv[g * 32], x0 = xv[g * 32], w1 = wv[(g + 1) * 32], x1 = xv[(g + 1) * 32];
      a0 = dot8(w0, x0, a0);
      a1 = dot8(w1, x1, a1);
    }
    if (g < gps) a0 = dot8(wv[g * 32], xv[g * 32], a0);
    slot_release(&empty[s], lane);  // this warp is done with the slot
    float a = a0 + a1;
#pragma unroll
    for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    if (nseg == 1) {
      if (lane == 0) y[row] = __float2bfloat16(a);
    } else {  // warp w holds segment w of this row (nseg == CW): warp 0 adds them in order
      float* rb = red + (row & 1) * CW;
      if (lane == 0) rb[warp] = a;
      asm volatile("bar.sync 1, %0;" ::"r"(CW * 32) : "memory");
      if (warp == 0 && lane == 0) {
        float t = rb[0];
        for (int w = 1; w < CW; ++w) t += rb[w];
        y[row] = __float2bfloat16(t);
      }
    }
  }
}

template <int CW, int NSLOTS>
int launch(const void* W, const void* x, void* y, int N, int K, int grid, int pdl, int min_smem, cudaStream_t stream) {
  // the ring, x, the barriers and the segment sums: sized by K, so narrow weights leave room for more blocks
  // (min_smem: more than the block needs, to cap how many blocks share a multiprocessor)
  const size_t need = NSLOTS * SLOT + K * 2 + 2 * NSLOTS * 8 + 2 * CW * 4;
  const size_t smem = need > static_cast<size_t>(min_smem) ? need : static_cast<size_t>(min_smem);
  static bool ready = false;
  if (const int e = allow_smem(gemv_bulk<CW, NSLOTS>, ready)) return e;
  // a row in one chunk, or in CW segments of 256-element groups that each fit a slot
  const int nseg = K * 2 <= SLOT ? 1 : CW;
  if (K > XMAX || K % (nseg * 256) || (K / nseg) * 2 > SLOT) return -1;
  return launch_ex(gemv_bulk<CW, NSLOTS>, dim3(grid), dim3((CW + 1) * 32), smem, pdl, stream,
                   static_cast<const __nv_bfloat16*>(W), static_cast<const __nv_bfloat16*>(x),
                   static_cast<__nv_bfloat16*>(y), N, K, nseg, pdl);
}


// ---- the same stream feeding the tensor cores: y[M, N] = x[M, K] @ W[N, K]^T for M <= 16 rows --------------------
// A chunk is a tile of 8 weight rows by 512 k (8 bulk copies of 1 KB into rows padded to MROW bytes, so a warp's
// 16-byte loads of 8 rows x 4 column groups hit 32 distinct banks). Chunk i is tile i / P, piece i % P (P = K / 512,
// a multiple of CW): warp w takes pieces w, w + CW, ... of every tile, chains them through mma.sync m16n8k16 (x's
// rows as A, padded to 16 with zeros; the weight tile as B), and the warps' sums are added in warp order after a
// barrier. Each output row's arithmetic reads only its own x row (the tensor core's row of A), so a row's bits do
// not depend on M: the batch invariance bf16 losslessness needs. Within a 32-k step a lane holds 8 consecutive k of
// one weight row and of one x row; the two mma of the step take k 0-3 and 4-7 of each lane's eight (a fixed
// permutation of k, the same for W and x).
constexpr int MROW = 1088;  // bytes a weight row takes in a slot: 1024 + 64 (a 16-byte-unit shift of 4 a row)
constexpr int MSLOT = 8 * MROW;

// XS (one row only): x staged in shared memory once after the wait, as gemv_bulk does, instead of read per chunk.
// RED: how a tile's warp sums meet. 0: a barrier of the consumer warps a tile, then each thread adds one value over
// the warps; 1: no barrier: each warp leaves its sums and counts itself in, and the last warp of the tile adds them,
// in the same warp order (the same bits as 0, checked; no faster: NOTES, fifteenth session). RED 1 keeps RSLOTS
// tiles' sums: a warp runs at most NSLOTS chunks ahead of the slowest (the producer waits for a slot's release), i.e.
// NSLOTS / P <= NSLOTS / CW tiles, so a slot is not reused while its tile is still being added.
// PK: W packed so a chunk is 8 KB in one piece, in the order the lanes read it (pack_gemm in layer_probe.py:
// [tile][piece][step j][row g][column group t][8 k]): one bulk copy a chunk instead of eight of 1 KB, and a warp's
// 16-byte loads of a step read 512 contiguous bytes (no padding needed). The same mma inputs: the same bits.
// LO (at most 8 rows): x's rows 8-15 (A's zero half) not held in registers: the same mma inputs, 64 fewer registers.
// EPI (with RED 0): what a tile's sums become. 0: y = the product; 1: SwiGLU, W's tile rows 0-3 gate rows and 4-7 the
// up rows of the same outputs (layer_probe.pack_swiglu), y [M, N / 2] = silu(gate) * up; 2: the residual add, y += the
// product (y holds the residual stream, read once after the wait).
constexpr int RSLOTS = 4;

template <int CW, int NSLOTS, bool XS = false, int RED = 0, bool PK = false, bool LO = false, int EPI = 0>
__global__ void __launch_bounds__((CW + 1) * 32)
    gemm_bulk(const __nv_bfloat16* __restrict__ W, const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y,
              int M, int N, int K, int ldx, int pdl) {
  static_assert(NSLOTS % CW == 0, "each slot must be used by one consumer warp only");
  static_assert(RED != 1 || NSLOTS / CW + 2 <= RSLOTS, "warps may run apart by more tiles than there are sum slots");
  static_assert(EPI == 0 || RED == 0, "the epilogues read a tile's sums after its barrier");
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = smem;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + NSLOTS * MSLOT);
  uint64_t* empty = full + NSLOTS;
  float* red = reinterpret_cast<float*>(empty + NSLOTS);  // [RSLOTS][CW][32 lanes][4]: a tile's warp sums
  int* arrived = reinterpret_cast<int*>(red + RSLOTS * CW * 128);  // [RSLOTS]: warps in, over all uses of a slot
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(arrived + RSLOTS);  // XS: x's one row

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int tiles = N / 8, P = K / 512;
  const int t0 = static_cast<int>(static_cast<long long>(tiles) * blockIdx.x / gridDim.x);
  const int t1 = static_cast<int>(static_cast<long long>(tiles) * (blockIdx.x + 1) / gridDim.x);
  const int nchunks = (t1 - t0) * P;

  if (threadIdx.x < RSLOTS) arrived[threadIdx.x] = 0;  // (published by ring_init's barrier)
  ring_init(full, empty, NSLOTS, pdl);

  if (warp == CW) {
    if (lane == 0) {
      for (int i = 0; i < nchunks; ++i) {
        const int s = i % NSLOTS;
        if (i >= NSLOTS) mbar_wait(&empty[s], ((i / NSLOTS) - 1) & 1);
        mbar_expect_tx(&full[s], 8 * 1024);
        if (PK) {  // chunk (tile, piece) is the 4096 elements at (tile * P + piece) * 4096
          bulk_load(ring + s * MSLOT, W + (static_cast<size_t>(t0) * P + i) * 4096, 8 * 1024, &full[s]);
        } else {  // 8 rows of 512 k from W as it is
          const __nv_bfloat16* src = W + static_cast<size_t>(t0 + i / P) * 8 * K + static_cast<size_t>(i % P) * 512;
          for (int r = 0; r < 8; ++r)
            bulk_load(ring + s * MSLOT + r * MROW, src + static_cast<size_t>(r) * K, 1024, &full[s]);
        }
      }
      if (pdl == 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }
    return;
  }

  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (XS) {
    for (int i = threadIdx.x; i < K / 8; i += CW * 32)
      reinterpret_cast<uint4*>(xs)[i] = reinterpret_cast<const uint4*>(x)[i];
    asm volatile("bar.sync 1, %0;" ::"r"(CW * 32) : "memory");
  }
  // this lane's x rows: g (A rows 0-7) and g + 8 (A rows 8-15); rows past M are zeros
  const bool lo = g < M, hi = g + 8 < M;
  const uint4* xlo = XS ? reinterpret_cast<const uint4*>(xs) + t
                        : reinterpret_cast<const uint4*>(x + static_cast<size_t>(g) * ldx) + t;
  const uint4* xhi = reinterpret_cast<const uint4*>(x + static_cast<size_t>(g + 8) * ldx) + t;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};  // even and odd steps
  for (int i = warp; i < nchunks; i += CW) {
    const int s = i % NSLOTS, tile = t0 + i / P, piece = i % P;
    const int kq = piece * 64;  // this piece's first 16-byte unit of a row
    uint4 xa[16], xb[LO ? 1 : 16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {  // step j: k = piece * 512 + j * 32 + t * 8 .. + 7
      xa[j] = lo ? (XS ? xlo[kq + j * 4] : __ldg(xlo + kq + j * 4)) : zero;
      if (!LO) xb[j] = hi ? __ldg(xhi + kq + j * 4) : zero;
    }
    mbar_wait(&full[s], (i / NSLOTS) & 1);
    const unsigned char* wrow = PK ? ring + s * MSLOT + lane * 16 : ring + s * MSLOT + g * MROW + t * 16;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint4 w = *reinterpret_cast<const uint4*>(wrow + j * (PK ? 512 : 64));
      float(&d)[4] = (j & 1) ? d1 : d0;
      const uint4 xh = LO ? zero : xb[LO ? 0 : j];  // A's rows 8-15
      mma16816(d, xa[j].x, xh.x, xa[j].y, xh.y, w.x, w.y);
      mma16816(d, xa[j].z, xh.z, xa[j].w, xh.w, w.z, w.w);
    }
    slot_release(&empty[s], lane);
    if (piece + CW >= P) {  // this warp's last piece of the tile: hand its sums over, warp order decides the rest
      const int rs = (tile - t0) % RSLOTS, use = (tile - t0) / RSLOTS;
      float* slot = red + rs * CW * 128;
      float* rb = slot + warp * 128 + lane * 4;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        rb[r] = d0[r] + d1[r];
        d0[r] = d1[r] = 0.f;
      }
      // value v of the tile (< 128: lane v / 4's register v % 4) is the sum over the warps of slot[w * 128 + v]; it is
      // output row (sl >> 2) + 8 (r >= 2), column 8 tile + (sl & 3) * 2 + (r & 1) (sl = v / 4, r = v % 4)
      auto row_of = [](int v) { return (v / 16) + (v % 4 >= 2 ? 8 : 0); };
      auto col_of = [](int v) { return (v / 4 & 3) * 2 + (v & 1); };  // within the tile
      auto put = [&](int v, float sum) {
        if (row_of(v) < M) y[static_cast<size_t>(row_of(v)) * N + tile * 8 + col_of(v)] = __float2bfloat16(sum);
      };
      auto add = [&](int v) {
        float sum = slot[v];
        for (int w = 1; w < CW; ++w) sum += slot[w * 128 + v];
        return sum;
      };
      if (RED == 0) {
        asm volatile("bar.sync 1, %0;" ::"r"(CW * 32) : "memory");
        const int v = threadIdx.x, row = row_of(v);
        if (EPI == 0 && v < 128) put(v, add(v));
        if (EPI == 1 && v < 128 && col_of(v) < 4 && row < M) {  // a gate column; its up column is 4 on: value v + 8
          const float gate = add(v), up = add(v + 8), silu = gate / (1.f + __expf(-gate));
          y[static_cast<size_t>(row) * (N / 2) + tile * 4 + col_of(v)] = __float2bfloat16(silu * up);
        }
        if (EPI == 2 && v < 128 && row < M) {
          __nv_bfloat16* o = y + static_cast<size_t>(row) * N + tile * 8 + col_of(v);
          *o = __float2bfloat16(__bfloat162float(*o) + add(v));
        }
      } else {
        __threadfence_block();  // our sums before our count
        __syncwarp();
        int before = 0;
        if (lane == 0) before = atomicAdd(&arrived[rs], 1);
        before = __shfl_sync(0xffffffffu, before, 0);
        if (before == CW * (use + 1) - 1) {  // the tile's last warp: the others' sums are in
          __threadfence_block();
#pragma unroll
          for (int r = 0; r < 4; ++r) put(lane * 4 + r, add(lane * 4 + r));
        }
      }
    }
  }
}

template <int CW, int NSLOTS, bool XS = false, int RED = 0, bool PK = false, bool LO = false, int EPI = 0>
int launch_mma(const void* W, const void* x, void* y, int M, int N, int K, int ldx, int grid, int pdl, int min_smem,
               cudaStream_t stream) {
  const size_t need = NSLOTS * MSLOT + 2 * NSLOTS * 8 + RSLOTS * CW * 128 * 4 + RSLOTS * 4 + (XS ? K * 2 : 0);
  const size_t smem = need > static_cast<size_t>(min_smem) ? need : static_cast<size_t>(min_smem);
  static bool ready = false;
  if (const int e = allow_smem(gemm_bulk<CW, NSLOTS, XS, RED, PK, LO, EPI>, ready)) return e;
  if (M < 1 || M > (XS ? 1 : LO ? 8 : 16) || N % 8 || K % (512 * CW) || ldx % 8 || (XS && K > XMAX)) return -1;
  return launch_ex(gemm_bulk<CW, NSLOTS, XS, RED, PK, LO, EPI>, dim3(grid), dim3((CW + 1) * 32), smem, pdl, stream,
                   static_cast<const __nv_bfloat16*>(W), static_cast<const __nv_bfloat16*>(x),
                   static_cast<__nv_bfloat16*>(y), M, N, K, ldx, pdl);
}

// ---- stand-ins for a layer's latency-bound kernels, as PDL participants ---------------------------------------------
// Each lets its successor launch at once and waits for its predecessor only where it reads the predecessor's output,
// so a product after it can stream its weight while it runs. rms_rows: y[m] = bf16(x[m] / rms(x[m])) (one block a
// row; the norm weight left out). attn_like: what a decode attention costs in latency, not in arithmetic: a block reads
// 16 KB of a "KV" buffer (before the wait: the cache never depends on the predecessor) and 32 columns of q, and
// writes those columns (+ 1e-30 of its KV sum, so nothing is optimised away).
__global__ void __launch_bounds__(256) rms_rows(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y,
                                                int K, int ldx, int pdl) {
  __shared__ float part[8];
  if (pdl) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  const uint4* xr = reinterpret_cast<const uint4*>(x + static_cast<size_t>(blockIdx.x) * ldx);
  uint4* yr = reinterpret_cast<uint4*>(y + static_cast<size_t>(blockIdx.x) * K);
  float ss = 0.f;
  for (int i = threadIdx.x; i < K / 8; i += 256) {
    const uint4 v = xr[i];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      ss = fmaf(f.x, f.x, ss);
      ss = fmaf(f.y, f.y, ss);
    }
  }
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float tot = part[0];
  for (int w = 1; w < 8; ++w) tot += part[w];
  const float r = rsqrtf(tot / K + 1e-6f);
  for (int i = threadIdx.x; i < K / 8; i += 256) {
    uint4 v = xr[i];
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h[j]);
      h[j] = __floats2bfloat162_rn(f.x * r, f.y * r);
    }
    yr[i] = v;
  }
}

__global__ void __launch_bounds__(128) attn_like(const __nv_bfloat16* __restrict__ q, const uint4* __restrict__ kv,
                                                 __nv_bfloat16* __restrict__ out, int ldq, int pdl) {
  __shared__ float part[4];
  if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const uint4* mine = kv + static_cast<size_t>(blockIdx.x) * 1024;  // 16 KB a block
  uint4 v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = mine[threadIdx.x + j * 128];
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v[j]);
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      s += f.x + f.y;
    }
  }
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");  // q: the predecessor's output
  const int row = blockIdx.y, c = blockIdx.x * 32 + threadIdx.x % 32;
  s *= __bfloat162float(q[static_cast<size_t>(row) * ldq + c]);
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    const float tot = part[0] + part[1] + part[2] + part[3];
    out[static_cast<size_t>(row) * 4096 + c] =
        __float2bfloat16(__bfloat162float(q[static_cast<size_t>(row) * ldq + c]) + tot * 1e-30f);
  }
}


// ---- a decode attention as a PDL participant: one query row, GQA (4 query heads a KV head), head_dim 128 ------------
// Block (part p, KV head g) takes keys [p * ACH, p * ACH + ACH) of the n the row sees (n: a device scalar, so a graph
// replays at any context; parts past n exit at once). Its K and V rows stream into shared memory by bulk copies
// *before* griddepcontrol.wait: the committed cache never depends on the predecessor. Key n - 1 is this step's own,
// written by the step's q/k/v product (in an integrated layer, its epilogue): that one is copied after the wait, with
// q. Scores, softmax and P.V run on the CUDA cores, each in a fixed order (a row's bits never depend on other rows or
// on which block ends first); each part leaves (acc, max, sum) in global memory, and the last part of a KV head to
// finish (a ticket, reset by that block for the next launch) merges the parts in a fixed order. What an integrated
// layer's attention could be, measured in benchmarks/layer_probe.py (the `pdl` modes below are that probe's
// variants); n is read before the wait, which is safe there (written before the graph), not in general under PDL.
constexpr int AHD = 128, AREP = 4;

// ACH keys a part: 32 keeps a block's shared memory (18.6 KB) small enough to start beside two product blocks of
// 100 KB (its K/V copies then run under the product before it); 64 (35.9 KB) must wait for a product block to exit
template <int ACH>
__global__ void __launch_bounds__(128)
    attn_decode(const __nv_bfloat16* q, const __nv_bfloat16* __restrict__ K, const __nv_bfloat16* __restrict__ V,
                const int* __restrict__ n_ptr, int cap, float* part_acc, float* part_ml, unsigned* tickets,
                __nv_bfloat16* out, float scale_log2, int pdl) {
  __shared__ __align__(128) __nv_bfloat16 ks[ACH * AHD];
  __shared__ __align__(128) __nv_bfloat16 vs[ACH * AHD];
  __shared__ float ps[AREP][ACH];
  __shared__ float qs[AREP][AHD];
  __shared__ __align__(8) uint64_t bar;
  __shared__ int is_last;
  // pdl 1: the successor may launch at once; 2: once this block's K/V have landed (after the wait); 3: at exit;
  // + 4: key n - 1 by plain loads after the wait, not by a bulk copy (which queues behind other blocks' copies);
  // + 8: the K/V rows by cp.async (16 bytes a thread) instead of bulk copies, and key n - 1 by plain loads
  const bool lgs = pdl & 8, tail_ld = (pdl & 4) || lgs;
  pdl &= 3;
  if (pdl == 1) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int p = blockIdx.x, g = blockIdx.y, P = gridDim.x, n = *n_ptr, lo = p * ACH;
  if (lo >= n) return;
  const int cnt = min(ACH, n - lo), pre = min(cnt, n - 1 - lo);  // before the wait: all but key n - 1
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const size_t head = static_cast<size_t>(g) * cap;
  if (tid == 0) {
    mbar_init(&bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    mbar_expect_tx(&bar, lgs ? 0 : (tail_ld ? pre : cnt) * AHD * 2 * 2);  // the part's bulk-copied bytes
    if (pre > 0 && !lgs) {
      bulk_load(ks, K + (head + lo) * AHD, pre * AHD * 2, &bar);
      bulk_load(vs, V + (head + lo) * AHD, pre * AHD * 2, &bar);
    }
  }
  if (lgs) {
    const int units = pre * AHD / 8;  // 16-byte units of K, then as many of V
    for (int i = tid; i < 2 * units; i += 128) {
      const bool isv = i >= units;
      const int u = isv ? i - units : i;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32((isv ? vs : ks) + u * 8)),
                   "l"((isv ? V : K) + (head + lo) * AHD + u * 8)
                   : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");  // q and key n - 1 are the predecessor's
  if (pre < cnt && !tail_ld && tid == 0) {
    bulk_load(ks + pre * AHD, K + (head + n - 1) * AHD, AHD * 2, &bar);
    bulk_load(vs + pre * AHD, V + (head + n - 1) * AHD, AHD * 2, &bar);
  }
  if (pre < cnt && tail_ld && tid < 32) {  // 2 x 256 bytes: 16 bytes a lane
    const uint4* src = reinterpret_cast<const uint4*>((tid < 16 ? K : V) + (head + n - 1) * AHD) + tid % 16;
    reinterpret_cast<uint4*>((tid < 16 ? ks : vs) + pre * AHD)[tid % 16] = *src;
  }
  for (int i = tid; i < AREP * AHD; i += 128)  // q pre-scaled by log2(e) / sqrt(head_dim): exp2 below
    qs[i / AHD][i % AHD] = __bfloat162float(q[static_cast<size_t>(g) * AREP * AHD + i]) * scale_log2;
  if (lgs) asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncthreads();
  float qr[AREP][4];
#pragma unroll
  for (int r = 0; r < AREP; ++r)
#pragma unroll
    for (int d = 0; d < 4; ++d) qr[r][d] = qs[r][lane * 4 + d];
  mbar_wait(&bar, 0);
  if (pdl == 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  part_scores<AREP, ACH, 4, AHD>(ks, qr, ps, cnt, warp, lane);  // warp w: keys w, w + 4, ...
  __syncthreads();
  // softmax and P.V: warp r takes query head r, a lane 4 of its dims
  const int r = warp;
  constexpr int PL = ACH / 32;  // scores a lane
  float sc[PL], m = -INFINITY, l = 0.f;
#pragma unroll
  for (int i = 0; i < PL; ++i) m = fmaxf(m, sc[i] = ps[r][lane + 32 * i]);
#pragma unroll
  for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
#pragma unroll
  for (int i = 0; i < PL; ++i) l += sc[i] = exp2f(sc[i] - m);
#pragma unroll
  for (int o = 16; o; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
#pragma unroll
  for (int i = 0; i < PL; ++i) ps[r][lane + 32 * i] = sc[i];
  __syncwarp();
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  part_pv<AHD>(vs, ps[r], cnt, lane, acc);
  const size_t slot = (static_cast<size_t>(g) * P + p) * AREP + r;
  *reinterpret_cast<float4*>(part_acc + slot * AHD + lane * 4) = make_float4(acc[0], acc[1], acc[2], acc[3]);
  if (lane == 0) part_ml[slot * 2] = m, part_ml[slot * 2 + 1] = l;
  __threadfence();
  __syncthreads();
  const int parts = (n + ACH - 1) / ACH;
  if (tid == 0) {
    is_last = atomicAdd(&tickets[g], 1u) == static_cast<unsigned>(parts - 1);
    if (is_last) tickets[g] = 0;  // every part has arrived: ready for the next launch
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  // the merge (L2 reads: other blocks wrote them): lane c takes part c's (max, sum) in one round (parts <= 32), a
  // part's weight is exp2(m_c - M) (0 for lanes past the parts), and the accumulators come eight loads in flight,
  // added in part order: the same bits whichever block merges
  const size_t first = static_cast<size_t>(g) * P * AREP + r;
  float mc = -INFINITY, lc = 0.f;
  if (lane < parts) {
    const float* ml = part_ml + (first + lane * AREP) * 2;
    mc = __ldcg(ml), lc = __ldcg(ml + 1);
  }
  float M = mc;
#pragma unroll
  for (int o = 16; o; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  const float wc = exp2f(mc - M);
  float L = lc * wc, o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int k = 16; k; k >>= 1) L += __shfl_xor_sync(0xffffffffu, L, k);
  for (int c0 = 0; c0 < parts; c0 += 8) {
    float4 a[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4* src = reinterpret_cast<const float4*>(part_acc + (first + (c0 + i) * AREP) * AHD) + lane;
      a[i] = c0 + i < parts ? __ldcg(src) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float w = __shfl_sync(0xffffffffu, wc, (c0 + i) & 31);
      o[0] = fmaf(a[i].x, w, o[0]), o[1] = fmaf(a[i].y, w, o[1]);
      o[2] = fmaf(a[i].z, w, o[2]), o[3] = fmaf(a[i].w, w, o[3]);
    }
  }
  __nv_bfloat16* dst = out + (static_cast<size_t>(g) * AREP + r) * AHD + lane * 4;
#pragma unroll
  for (int d = 0; d < 4; ++d) dst[d] = __float2bfloat16(o[d] / L);
}

}  // namespace

extern "C" {

// 0 on success, a cudaError_t, or -1 (a K this kernel cannot cut into slots) / -3 (no such variant)
int bulk_gemv(int warps, int nslots, const void* W, const void* x, void* y, int N, int K, int grid, int pdl,
              int min_smem, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int v = warps * 100 + nslots;
  switch (v) {
    case 404: return launch<4, 4>(W, x, y, N, K, grid, pdl, min_smem, s);
    case 408: return launch<4, 8>(W, x, y, N, K, grid, pdl, min_smem, s);
    case 412: return launch<4, 12>(W, x, y, N, K, grid, pdl, min_smem, s);
    case 416: return launch<4, 16>(W, x, y, N, K, grid, pdl, min_smem, s);
    case 808: return launch<8, 8>(W, x, y, N, K, grid, pdl, min_smem, s);
    case 816: return launch<8, 16>(W, x, y, N, K, grid, pdl, min_smem, s);
    default: return -3;
  }
}

// the tensor-core variant: x [M, K] with row stride ldx, y [M, N]; M <= 16 (508, 608, 718, 728: M <= 8), N % 8 == 0,
// K % 2048 == 0; 408, 508, 718 and 728 take W packed (layer_probe.pack_gemm)
int bulk_gemm(int nslots, const void* W, const void* x, void* y, int M, int N, int K, int ldx, int grid, int pdl,
              int min_smem, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (nslots) {
    case 4: return launch_mma<4, 4>(W, x, y, M, N, K, ldx, grid, pdl, min_smem, s);
    case 8: return launch_mma<4, 8>(W, x, y, M, N, K, ldx, grid, pdl, min_smem, s);
    case 12: return launch_mma<4, 12>(W, x, y, M, N, K, ldx, grid, pdl, min_smem, s);
    case 108: return launch_mma<4, 8, true>(W, x, y, M, N, K, ldx, grid, pdl, min_smem, s);  // x staged, one row
    case 208: return launch_mma<4, 8, false, 1>(W, x, y, M, N, K, ldx, grid, pdl, min_smem, s);  // no tile barrier
    case 408: return launch_mma<4, 8, false, 0, true>(W, x, y, M, N, K, ldx, grid, pdl, min_smem, s);  // W packed
    // at most 8 rows (x's rows 8-15 not held), W packed / as it is
    case 508: return launch_mma<4, 8, false, 0, true, true>(W, x, y, M, N, K, ldx, grid, pdl, min_smem, s);
    case 608: return launch_mma<4, 8, false, 0, false, true>(W, x, y, M, N, K, ldx, grid, pdl, min_smem, s);
    // 508 with an epilogue: SwiGLU (W from pack_swiglu; y [M, N / 2]) / the residual add (y += x @ W^T)
    case 718: return launch_mma<4, 8, false, 0, true, true, 1>(W, x, y, M, N, K, ldx, grid, pdl, min_smem, s);
    case 728: return launch_mma<4, 8, false, 0, true, true, 2>(W, x, y, M, N, K, ldx, grid, pdl, min_smem, s);
    default: return -3;
  }
}

// x [M, K] (row stride ldx) -> y [M, K] contiguous
int bulk_rms(const void* x, void* y, int M, int K, int ldx, int pdl, void* stream) {
  return launch_ex(rms_rows, dim3(M), dim3(256), 0, pdl, static_cast<cudaStream_t>(stream),
                   static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(y), K, ldx, pdl);
}

// q [M, >= 4096] (row stride ldq), kv: 2 MB -> out [M, 4096]
int bulk_attn_like(const void* q, const void* kv, void* out, int M, int ldq, int pdl, void* stream) {
  return launch_ex(attn_like, dim3(128, M), dim3(128), 0, pdl, static_cast<cudaStream_t>(stream),
                   static_cast<const __nv_bfloat16*>(q), static_cast<const uint4*>(kv),
                   static_cast<__nv_bfloat16*>(out), ldq, pdl);
}

// one query row: q [32 * 128] (the q/k/v product's first 4096 columns), K, V [8, cap, 128] (the layer's cache, keys
// 0..n-1 valid, n = *n_dev), out [32 * 128]; part_acc [8 * parts * 4 * 128] fp32, part_ml [8 * parts * 4 * 2] fp32,
// tickets [8] zeros (left zero); parts = cap / ach, ach 32 or 64 keys a part
int bulk_attn_decode(int ach, const void* q, const void* K, const void* V, const void* n_dev, int cap, void* part_acc,
                     void* part_ml, void* tickets, void* out, int pdl, void* stream) {
  if ((ach != 32 && ach != 64) || cap % ach || cap / ach > 32) return -1;  // the merge: a part a lane
  return launch_ex(ach == 32 ? attn_decode<32> : attn_decode<64>, dim3(cap / ach, 8), dim3(128), 0, pdl,
                   static_cast<cudaStream_t>(stream),
                   static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(K),
                   static_cast<const __nv_bfloat16*>(V), static_cast<const int*>(n_dev), cap,
                   static_cast<float*>(part_acc), static_cast<float*>(part_ml), static_cast<unsigned*>(tickets),
                   static_cast<__nv_bfloat16*>(out), 1.4426950408889634f / sqrtf(static_cast<float>(AHD)), pdl);
}

const char* bulk_error(int e) { return status_message(e); }

int bulk_sm_count() { return current_sm_count(); }
}
