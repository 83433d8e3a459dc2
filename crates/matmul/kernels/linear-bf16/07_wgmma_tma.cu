// linear-bf16, stage 7: wgmma-tma (Hopper's warpgroup MMA on operands TMA put in shared memory).
// Changed from stage 6: the tiles are loaded by the tensor memory accelerator (one thread issues a
//   cp.async.bulk.tensor per 128 x 64 tile, completing on an mbarrier with the byte count), in the
//   128-byte swizzled layout wgmma reads directly through shared-memory descriptors; each of the 2
//   warpgroups issues wgmma.m64n128k16 (64 x 128 x 16 per instruction, 4 per 64-wide K step) instead
//   of 8 warps issuing m16n8k16 on ldmatrix fragments. Tails need no code: the TMA zero-fills the
//   parts of a box past M, N or K. The block tile is 128 x 128 x 64, WG_STAGES stages in flight.
//   Not yet: warp specialization (a producer warpgroup), wgmma overlapped with the next wgmma
//   (each K step waits for its own), clusters, a persistent grid: stages 8 and 9.
// Why it should be faster: wgmma runs at the Hopper tensor-core rate that mma.sync cannot reach
//   (about 2x per SM), needs no fragment loads through registers (stage 6 spends 6 ldmatrix per 16
//   mma), and the TMA replaces 256 threads' address arithmetic and cp.async. Predicted 1.5-2x stage 6
//   at 4096^3; the wait after every K step keeps it short of cuBLASLt.
// Launch: linear_bf16_wgmma: grid (ceil(N/128), ceil(M/128)), block 256 (2 warpgroups), dynamic
//   shared memory WG_STAGES * 32 KiB + 1 KiB (alignment) + barriers; two CUtensorMaps by value.
// Constraints: sm_90a; K % 8 == 0 (the TMA's global row stride is a multiple of 16 bytes); M, N,
//   K >= 1; M*K, N*K, M*N < 2^31; M <= 65535 * 128.
// Tolerance: bf16 preset (operands bf16, fp32 accumulation).
// Limits: M * K < 2^31; N * K < 2^31; M * N < 2^31; M <= 65535 * 128; K % 8 == 0
#include <cuda_bf16.h>

#ifndef WG_STAGES
#error "WG_STAGES is a tunable: the stage list sets it"
#endif

#define WG_BM 128
#define WG_BN 128
#define WG_BK 64
#define WG_TILE_BYTES (WG_BM * WG_BK * 2)  // one operand's tile; A and B tiles are the same size

// CUtensorMap (128 bytes, 64-byte aligned) as the kernel sees it: opaque, passed by value.
struct __align__(64) TmaMap {
    unsigned long long v[16];
};

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned phase) {
    unsigned ok;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(ok)
        : "r"(bar), "r"(phase)
        : "memory");
    return ok != 0;
}

// A 2-D box of the tensor map at (x = column along K, y = row) into shared memory, completing on bar.
__device__ __forceinline__ void tma_load(unsigned dst, const TmaMap* map, unsigned bar, int x, int y) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(dst),
        "l"(map), "r"(x), "r"(y), "r"(bar)
        : "memory");
}

// Shared-memory matrix descriptor of a K-major tile in the 128-byte swizzle: start address, the
// leading offset (unused for swizzled K-major tiles), the stride between 8-row groups (1024 bytes),
// and the swizzle mode (1 = 128 bytes).
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// One wgmma.m64n128k16 (bf16 in, fp32 accumulate into d), both operands K-major in shared
// memory described by descriptors.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], unsigned long long a, unsigned long long b) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "%64, %65, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(1));
}

extern "C" __global__ void __launch_bounds__(256, 1)
    linear_bf16_wgmma(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, float* out,
                      const float* bias, int M, int N, int K) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // The 128-byte swizzle needs 1024-byte aligned tiles.
    const unsigned base = (smem_addr(smem_raw) + 1023) & ~1023u;
    auto a_tile = [&](int s) { return base + (unsigned)s * 2 * WG_TILE_BYTES; };
    auto b_tile = [&](int s) { return base + (unsigned)s * 2 * WG_TILE_BYTES + WG_TILE_BYTES; };
    const unsigned bars = base + WG_STAGES * 2 * WG_TILE_BYTES;  // one 8-byte mbarrier per stage
    auto full = [&](int s) { return bars + 8u * s; };

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int m0 = blockIdx.y * WG_BM, n0 = blockIdx.x * WG_BN;
    const int ktiles = (K + WG_BK - 1) / WG_BK;

    if (tid == 0) {
        for (int s = 0; s < WG_STAGES; ++s) mbar_init(full(s), 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int kt) {
        const int s = kt % WG_STAGES;
        mbar_expect_tx(full(s), 2 * WG_TILE_BYTES);
        tma_load(a_tile(s), &map_a, full(s), kt * WG_BK, m0);
        tma_load(b_tile(s), &map_b, full(s), kt * WG_BK, n0);
    };
    if (tid == 0)
        for (int kt = 0; kt < WG_STAGES && kt < ktiles; ++kt) issue(kt);

    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.0f;

    for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt % WG_STAGES;
        while (!mbar_try_wait(full(s), (kt / WG_STAGES) & 1)) {
        }
        // Warpgroup wg takes rows 64 wg .. 64 wg + 63 of the A tile (8 KiB in: a 1024-byte multiple).
        const unsigned a = a_tile(s) + wg * 64 * 128, b = b_tile(s);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; ++kk)  // 16 bf16 = 32 bytes along the swizzled 128-byte row
            wgmma_m64n128k16(d, wgmma_desc(a + 32 * kk), wgmma_desc(b + 32 * kk));
        wgmma_commit();
        wgmma_wait_all();
        __syncthreads();  // both warpgroups are done with stage s: it can be refilled
        if (tid == 0 && kt + WG_STAGES < ktiles) issue(kt + WG_STAGES);
    }

    // d[4j + 0..1]: row g, columns 8j + 2t, +1 of the warp's 16 rows; d[4j + 2..3]: row g + 8.
    const int g = lane >> 2, t = lane & 3;
    const bool pairs = (N & 1) == 0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int col = n0 + 8 * j + 2 * t;
        if (col >= N) continue;
        const float b0 = bias != nullptr ? bias[col] : 0.0f;
        const float b1 = bias != nullptr && col + 1 < N ? bias[col + 1] : 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = m0 + 64 * wg + 16 * warp + g + 8 * h;
            if (row >= M) continue;
            float* o = out + (size_t)row * N + col;
            const float x = d[4 * j + 2 * h] + b0, y = d[4 * j + 2 * h + 1] + b1;
            if (pairs) {
                *reinterpret_cast<float2*>(o) = make_float2(x, y);
            } else {
                o[0] = x;
                if (col + 1 < N) o[1] = y;
            }
        }
    }
}
