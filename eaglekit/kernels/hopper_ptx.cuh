// PTX helpers shared by eaglekit/kernels/hopper.cu and benchmarks/bulk_gemv.cu (the probe kernels it grew from): shared
// addresses, mbarriers, bulk copies into shared memory, the ring's set-up and slot release, one bf16 tensor-core step,
// 4 bf16 to fp32, the two loops of an attention part (its scores; P.V for one query head), and the host's launch.
// Included inside each file's anonymous namespace.

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* b, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(smem_u32(b)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
// a consumer warp is done reading a ring slot: the producer may refill it. The refill is a bulk copy (async proxy),
// our reads plain loads (generic proxy): without the proxy fence ptxas may put the arrive before the last load has
// returned and the copy overwrite it (seen: wrong sums at 16 rows, benchmarks/NOTES.md, fifteenth session)
__device__ __forceinline__ void slot_release(uint64_t* bar, int lane) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncwarp();
  if (lane == 0) mbar_arrive(bar);
}

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void bf4(const __nv_bfloat16* p, float (&f)[4]) {  // 4 bf16 (8 bytes) -> fp32
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
}

// the ring's barriers (a slot full: one arrival and its bytes; a slot empty: its one consumer warp's arrival), then
// the successor may launch: its producer streams its own weight while we finish (it waits for our y). pdl 1: at once
// (its blocks then take room beside ours, unevenly); pdl 2: once our producer has issued its last copy (not here)
__device__ __forceinline__ void ring_init(uint64_t* full, uint64_t* empty, int nslots, int pdl) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < nslots; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (pdl == 1) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

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

// one halving stage of part_scores_rs over p[0 .. N): keep one half (the upper where this lane's bit o is set), send
// the other to lane ^ o and add what comes back; v: the first value index this lane's p[0 .. N / 2) now stand for
template <int S, int N>
__device__ __forceinline__ void halve(float (&p)[S], int lane, int o, int& v) {
  const bool up = lane & o;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const float keep = up ? p[i + N / 2] : p[i], send = up ? p[i] : p[i + N / 2];
    p[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
  }
  v += up ? N / 2 : 0;
}

// part_scores with the lanes' sums reduced by recursive halving instead of a butterfly a score: a warp's KW = ACH / NW
// keys times REP heads (V <= 32 values, v = key * REP + head) are halved between lane pairs at offsets 16, 8, ...
// until each lane holds one value's sum (V < 32: the last offsets then add the single value as the butterfly did).
// 31 shuffles for 32 scores where the butterfly takes 160, and the same pairs in the same order (offset 16 first), so
// every score has the bits part_scores gives (fp addition commutes). The default; EK_ATTN_RS=0 builds part_scores
// (NOTES, twenty-first session: -15% to -18% of the attention's time at 1-8 rows)
template <int REP, int ACH, int NW, int HD>
__device__ __forceinline__ void part_scores_rs(const __nv_bfloat16* ks, const float (&qr)[REP][4],
                                               float (&ps)[REP][ACH], int cnt, int warp, int lane) {
  constexpr int KW = ACH / NW, V = KW * REP;
  static_assert(ACH % NW == 0 && V <= 32 && (V & (V - 1)) == 0, "a warp's scores: a power of two, at most 32");
  static_assert(KW % 2 == 0, "keys in pairs");
  constexpr int LV = V == 32 ? 5 : V == 16 ? 4 : V == 8 ? 3 : V == 4 ? 2 : V == 2 ? 1 : 0;
  // the first halving as the scores come: key kk's sums against key kk + KW / 2's (values i and i + V / 2), so half
  // the values are ever held at once (all V of them spilled ~100 bytes a thread at 64 registers; four keys at a time
  // spilled more than two)
  const bool up = lane & 16;
  int v = up ? V / 2 : 0;  // the value index this lane's p[0] ends up holding
  float p[V / 2];
#pragma unroll
  for (int kk = 0; kk < KW / 2; ++kk) {
    float k[4], k2[4];
    bf4(ks + (warp + kk * NW) * HD + lane * 4, k);
    bf4(ks + (warp + (kk + KW / 2) * NW) * HD + lane * 4, k2);
#pragma unroll
    for (int r = 0; r < REP; ++r) {
      float t = 0.f, t2 = 0.f;
#pragma unroll
      for (int d = 0; d < 4; ++d) t = fmaf(qr[r][d], k[d], t), t2 = fmaf(qr[r][d], k2[d], t2);
      p[kk * REP + r] = (up ? t2 : t) + __shfl_xor_sync(0xffffffffu, up ? t : t2, 16);
    }
  }
  // (the other stages by template: every index a constant, so p stays in registers; a loop over the stages left it
  // in local memory)
  if constexpr (LV > 1) halve<V / 2, (V >> 1)>(p, lane, 8, v);
  if constexpr (LV > 2) halve<V / 2, (V >> 2)>(p, lane, 4, v);
  if constexpr (LV > 3) halve<V / 2, (V >> 3)>(p, lane, 2, v);
  if constexpr (LV > 4) halve<V / 2, (V >> 4)>(p, lane, 1, v);
#pragma unroll
  for (int o = 16 >> LV; o; o >>= 1) p[0] += __shfl_xor_sync(0xffffffffu, p[0], o);  // (V < 32: a butterfly on)
  if ((lane & (32 / V - 1)) == 0) {  // (V < 32: 32 / V lanes hold each value)
    const int j = warp + (v / REP) * NW;
    ps[v % REP][j] = j < cnt ? p[0] : -INFINITY;
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

// a launch into `stream`, as a programmatic dependent launch where pdl != 0
template <typename... Args>
int launch_ex(void (*kernel)(Args...), dim3 grid, dim3 block, size_t smem, int pdl, cudaStream_t stream,
              Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return static_cast<int>(cudaLaunchKernelEx(&cfg, kernel, args...));
}

// the entry points' host helpers: a status code's message (0 or a cudaError_t; -1 a shape the kernels do not take)
// and the current device's SM count (the products' grid is two blocks an SM)
inline const char* status_message(int e) {
  return e > 0 ? cudaGetErrorString(static_cast<cudaError_t>(e)) : "bad arguments";
}
inline int current_sm_count() {
  int dev = 0, n = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  return n;
}
