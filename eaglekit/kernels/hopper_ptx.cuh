// PTX helpers of eaglekit/kernels/hopper.cu, once shared with the probe kernels it grew from (benchmarks/lab/bulk_gemv.cu,
// in git before 3620f2a):
// shared addresses, mbarriers, bulk copies into shared memory, the ring's set-up and slot release, one bf16
// tensor-core step, 4 bf16 to fp32, and the host's launch. Included inside each file's anonymous namespace.

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
// returned and the copy overwrite it (wrong sums at 16 rows without it:
// docs/performance.md#d7)
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
