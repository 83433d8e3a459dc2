// matmul_fp8_gemm.cuh: linear-fp8's parts. Every stage shares the tile of 128 columns and 128 codes
// of K (128 rows; stage 5's 192), a thread's scales, a K step's four e4m3 wgmma into a fresh fp32
// tile, and the promotion of that tile into the thread's fp32 accumulator (DeepGEMM's scheme; the
// headers of linear-fp8/ say why). The stages compose the rest from the parts below: the ring, the
// split into a producer and the consumer warpgroups (1 on), the producer, a consumer K loop (each
// step waited for, or the promotion overlapped with the next step's wgmma) and the persistent
// stages' tile order; each stage file names its recipe.
#pragma once
#include "matmul_fp8_quantize.cuh"
#include "matmul_tail.cuh"
#include "matmul_wgmma.cuh"

// Every stage's ring is WG_STAGES K steps deep.
#ifndef WG_STAGES
#error "WG_STAGES is a tunable: the stage list sets it"
#endif

#define F8_BM 128
#define F8_BN 128
#define F8_BK 128                      // codes (bytes) a K step: one scale group, one swizzled row
#define F8_TILE_BYTES (F8_BM * F8_BK)  // one operand's tile; A and B tiles are the same size

// A thread's two rows of out, row0 and row0 + 8 (wgmma's layout: d[4j + 0..1] and d[4j + 2..3]),
// their rows of A scales and the block's row of W scales (its 128 columns are one W block). A row
// past M reads row M - 1's scales; it is never stored.
struct StepScales {
    const float* a0;
    const float* a1;
    const float* w;
    __device__ __forceinline__ StepScales() {}
    __device__ __forceinline__ StepScales(const float* a_scales, const float* b_scales, int row0, int n0, int M,
                                          int ktiles)
        : a0(a_scales + (size_t)min(row0, M - 1) * ktiles),
          a1(a_scales + (size_t)min(row0 + 8, M - 1) * ktiles),
          w(b_scales + (size_t)(n0 / F8_BN) * ktiles) {}
};

// A K step's four wgmma.m64n128k32 (32 codes = 32 bytes along the swizzled 128-byte rows) of the
// warpgroup's 64 rows at `a` and the 128 columns at `b`, into `part` (the first with the accumulator
// off), committed as one group and not waited for.
__device__ __forceinline__ void fp8_k_issue(float (&part)[64], unsigned a, unsigned b) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < F8_BK / 32; ++kk)
        wgmma_m64n128k32_e4m3(part, wgmma_desc(a + 32 * kk), wgmma_desc(b + 32 * kk), kk > 0);
    wgmma_commit();
}

// fp8_k_issue, waited for.
__device__ __forceinline__ void fp8_k_step(float (&part)[64], unsigned a, unsigned b) {
    fp8_k_issue(part, a, b);
    wgmma_wait_all();
}

// The promotion: a K step's partial tile added into the fp32 accumulator times its scales, scale0 for
// the thread's first row and scale1 for its second (the row's A scale times the block's W scale).
__device__ __forceinline__ void fp8_promote(float (&acc)[64], const float (&part)[64], float scale0, float scale1) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        acc[4 * j] += part[4 * j] * scale0;
        acc[4 * j + 1] += part[4 * j + 1] * scale0;
        acc[4 * j + 2] += part[4 * j + 2] * scale1;
        acc[4 * j + 3] += part[4 * j + 3] * scale1;
    }
}

// The ring: STAGES stages of an A tile of A_ROWS rows and a W tile of B_ROWS rows at `base`
// (1024-byte aligned for the swizzle), then a `full` mbarrier a stage (its tiles have landed) and, in
// the warp-specialized stages, an `empty` one (its consumers are done with it); stage 0 frees a stage
// with a block barrier instead.
template <int STAGES, int A_ROWS = F8_BM, int B_ROWS = F8_BN>
struct Fp8Ring {
    unsigned base;
    static constexpr unsigned A_BYTES = A_ROWS * F8_BK, STEP_BYTES = A_BYTES + B_ROWS * F8_BK;
    static constexpr unsigned BYTES = STAGES * STEP_BYTES + 16 * STAGES;
    __device__ __forceinline__ unsigned a(int s) const { return base + (unsigned)s * STEP_BYTES; }
    __device__ __forceinline__ unsigned b(int s) const { return a(s) + A_BYTES; }
    __device__ __forceinline__ unsigned full(int s) const { return base + STAGES * STEP_BYTES + 8u * s; }
    __device__ __forceinline__ unsigned empty(int s) const { return full(STAGES + s); }
    // K step kt's A and W tiles (rows from m0 and n0) into stage s, counted on its `full` barrier.
    __device__ __forceinline__ void load(int s, const TmaMap* map_a, const TmaMap* map_b, int kt, int m0,
                                         int n0) const {
        mbar_expect_tx(full(s), STEP_BYTES);
        tma_load(a(s), map_a, full(s), kt * F8_BK, m0);
        tma_load(b(s), map_b, full(s), kt * F8_BK, n0);
    }
    // One thread: `full` takes the producer's one arrival, `empty` one from each of RELEASES
    // consumer warpgroups (none: the ring has no `empty` barriers).
    template <unsigned RELEASES>
    __device__ __forceinline__ void init() const {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(full(s), 1);
            if constexpr (RELEASES > 0) mbar_init(empty(s), RELEASES);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
};

// The ring at the start of dynamic shared memory, rounded up to the swizzle's 1024 bytes (the launch
// asks for 1 KiB more than the ring).
template <int STAGES, int A_ROWS = F8_BM, int B_ROWS = F8_BN>
__device__ __forceinline__ Fp8Ring<STAGES, A_ROWS, B_ROWS> fp8_ring() {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    return Fp8Ring<STAGES, A_ROWS, B_ROWS>{(smem_u32(smem_raw) + 1023) & ~1023u};
}

// The warp-specialized stages' split of a block of 128 x (1 + CONSUMERS) threads (this thread in
// warpgroup wg): thread 0 initializes the ring for the consumer warpgroups and the block waits for
// it. The producer warpgroup (wg 0) gives its registers away (PRODUCER_REGS a thread) and one thread
// of it runs produce(); it gets false and leaves. A consumer warpgroup takes CONSUMER_REGS a thread
// and gets true.
template <int CONSUMERS = 2, int PRODUCER_REGS = 40, int CONSUMER_REGS = 232, int STAGES, int A_ROWS, int B_ROWS,
          class Produce>
__device__ __forceinline__ bool fp8_consumer(const Fp8Ring<STAGES, A_ROWS, B_ROWS>& ring, int wg, Produce produce) {
    static_assert(128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= 65536, "the register file");
    const int tid = threadIdx.x;
    if (tid == 0) ring.template init<CONSUMERS>();
    __syncthreads();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        if (tid == 0) produce();
        return false;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
    return true;
}

// The producer (one thread): K step kt's A and W tiles into ring position first + kt (stage
// (first + kt) % STAGES) as soon as its `empty` barrier says the previous round's consumers let it
// go. `first` is how many steps the ring has carried before this tile (0 but in a persistent loop).
template <int STAGES, int A_ROWS, int B_ROWS>
__device__ __forceinline__ void fp8_produce(const Fp8Ring<STAGES, A_ROWS, B_ROWS>& ring, const TmaMap* map_a,
                                            const TmaMap* map_b, int m0, int n0, int ktiles, int first = 0) {
    for (int kt = 0; kt < ktiles; ++kt) {
        const int i = first + kt, s = i % STAGES;
        if (i >= STAGES) mbar_wait(ring.empty(s), ((i / STAGES) - 1) & 1);
        ring.load(s, map_a, map_b, kt, m0, n0);
    }
}

// The consumer with each K step waited for (stages 0 and 1): a step's wgmma into `part`, waited for,
// then release(kt, s) (the warpgroup is done with ring stage s), then the promotion. A step's scales
// are requested before the wait for its tiles: they arrive with them. The warpgroup's A rows start
// `a_row_bytes` into a stage's A tile.
template <int STAGES, class Release>
__device__ __forceinline__ void fp8_consume_waited(float (&acc)[64], const Fp8Ring<STAGES>& ring, unsigned a_row_bytes,
                                                   const StepScales& scales, int ktiles, const Release& release) {
    float part[64];
    for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt % STAGES;
        const float w_scale = scales.w[kt], scale0 = scales.a0[kt] * w_scale, scale1 = scales.a1[kt] * w_scale;
        mbar_wait(ring.full(s), (kt / STAGES) & 1);
        fp8_k_step(part, ring.a(s) + a_row_bytes, ring.b(s));
        release(kt, s);
        fp8_promote(acc, part, scale0, scale1);
    }
}

// The consumer with the promotion overlapped (stage 2 on): step kt + 1's wgmma are issued before
// step kt's are waited for (wait_group 1), so the tensor cores run step kt + 1 while this warpgroup
// releases stage kt and promotes its tile. Two partial tiles alternate (64 + 64 registers beside the
// accumulator's 64). A step's three scales are loaded when it is issued and multiplied when it is
// promoted, a step later, so their latency is off the issue path. The warpgroup lets ring stage s go
// once its wgmma are complete with one arrival on its `empty` barrier, without a branch (an arrive
// predicated on the warpgroup's thread 0): a branch while a wgmma group is open makes ptxas wait for
// it there and serialize every wgmma (C7517, C7514). The warpgroup's A rows start `a_row_bytes`
// into a stage's A tile; step kt sits at ring position first + kt (fp8_produce's).
// `under_first_step()` runs while step 0's wgmma are in flight, before anything is promoted into acc
// (stage 4 stores the previous tile from acc there).
template <int STAGES, int A_ROWS, class UnderFirstStep>
__device__ __forceinline__ void fp8_consume_overlapped(float (&acc)[64], const Fp8Ring<STAGES, A_ROWS>& ring,
                                                       unsigned a_row_bytes, const StepScales& scales, int ktiles,
                                                       int first, UnderFirstStep under_first_step) {
    float part0[64], part1[64];
    float3 scale0, scale1;  // a0, a1, w of a step
    auto issue = [&](float(&part)[64], float3& scale, int kt) {
        const int i = first + kt, s = i % STAGES;
        scale = make_float3(scales.a0[kt], scales.a1[kt], scales.w[kt]);
        mbar_wait(ring.full(s), (i / STAGES) & 1);
        fp8_k_issue(part, ring.a(s) + a_row_bytes, ring.b(s));
    };
    auto retire = [&](const float(&part)[64], float3 scale, int kt) {
        mbar_arrive_if(ring.empty((first + kt) % STAGES), (threadIdx.x & 127) == 0);
        fp8_promote(acc, part, scale.x * scale.z, scale.y * scale.z);
    };
    // The steady state has no branch between an issue and its wait, so ptxas can follow which
    // group each wait_group 1 retires; the last one or two steps are peeled after it.
    issue(part0, scale0, 0);
    under_first_step();
    int kt = 0;
    for (; kt + 2 < ktiles; kt += 2) {
        issue(part1, scale1, kt + 1);
        wgmma_wait_one();
        retire(part0, scale0, kt);
        issue(part0, scale0, kt + 2);
        wgmma_wait_one();
        retire(part1, scale1, kt + 1);
    }
    if (kt + 1 < ktiles) {
        issue(part1, scale1, kt + 1);
        wgmma_wait_one();
        retire(part0, scale0, kt);
        wgmma_wait_all();
        retire(part1, scale1, kt + 1);
    } else {
        wgmma_wait_all();
        retire(part0, scale0, kt);
    }
}

// The waited consumer of a persistent stage with a staged store (stage 5, whose three consumers have
// no registers for a second partial tile): fp8_consume_waited at ring positions first + kt, the
// warpgroup's one arrival on a stage's `empty` barrier once its wgmma are complete (predicated, as in
// fp8_consume_overlapped), and `under_first_step()` while step 0's wgmma are in flight, before
// anything is promoted into acc. Step 0 is peeled so no branch sits inside its open group.
template <int STAGES, int A_ROWS, class UnderFirstStep>
__device__ __forceinline__ void fp8_consume_waited_staged(float (&acc)[64], const Fp8Ring<STAGES, A_ROWS>& ring,
                                                          unsigned a_row_bytes, const StepScales& scales, int ktiles,
                                                          int first, UnderFirstStep under_first_step) {
    float part[64];
    auto issue = [&](int kt) {
        const int i = first + kt, s = i % STAGES;
        const float w_scale = scales.w[kt], scale0 = scales.a0[kt] * w_scale, scale1 = scales.a1[kt] * w_scale;
        mbar_wait(ring.full(s), (i / STAGES) & 1);
        fp8_k_issue(part, ring.a(s) + a_row_bytes, ring.b(s));
        return make_float2(scale0, scale1);
    };
    auto retire = [&](float2 scale, int kt) {
        wgmma_wait_all();
        mbar_arrive_if(ring.empty((first + kt) % STAGES), (threadIdx.x & 127) == 0);
        fp8_promote(acc, part, scale.x, scale.y);
    };
    const float2 scale = issue(0);
    under_first_step();
    retire(scale, 0);
    for (int kt = 1; kt < ktiles; ++kt) retire(issue(kt), kt);
}

// Stage 8's consumer: a warpgroup's 64 rows over a tile of two column halves of 128 (each half one W
// scale block, `scales[h]`) with one partial tile for both: a step's left half, four wgmma into
// `part`, waited for and promoted into acc[0]; then the right half's four (the W tile's second 128
// rows), waited for, the ring stage let go, promoted into acc[1]. Two partial tiles beside the 128
// accumulator registers would be 256; this is 192. While one warpgroup waits for its half and
// promotes it, the other's wgmma keep the tensor cores busy (DeepGEMM's schedule).
// `under_first_step(h)` runs while step 0's half h is in flight, before anything is promoted into
// acc[h] (the previous tile's half h is stored there, one half's registers at a time); step 0 is
// peeled so no branch sits inside its open groups.
template <int STAGES, int A_ROWS, int B_ROWS, class UnderFirstStep>
__device__ __forceinline__ void fp8_consume_halves(float (&acc)[2][64], const Fp8Ring<STAGES, A_ROWS, B_ROWS>& ring,
                                                   unsigned a_row_bytes, const StepScales (&scales)[2], int ktiles,
                                                   int first, UnderFirstStep under_first_step) {
    static_assert(B_ROWS == 2 * F8_BN, "a W tile of two 128-row halves");
    float part[64];
    // Step kt's scales (a0, a1, w of the left half, w of the right), loaded before the wait for its
    // tiles, so they arrive with them.
    const auto wait_step = [&](int kt) {
        const int i = first + kt;
        const float4 scale = make_float4(scales[0].a0[kt], scales[0].a1[kt], scales[0].w[kt], scales[1].w[kt]);
        mbar_wait(ring.full(i % STAGES), (i / STAGES) & 1);
        return scale;
    };
    const auto issue = [&](int kt, int h) {
        const int s = (first + kt) % STAGES;
        fp8_k_issue(part, ring.a(s) + a_row_bytes, ring.b(s) + h * F8_TILE_BYTES);
    };
    const auto release = [&](int kt) { mbar_arrive_if(ring.empty((first + kt) % STAGES), (threadIdx.x & 127) == 0); };
    {
        const float4 scale = wait_step(0);
        issue(0, 0);
        under_first_step(0);
        wgmma_wait_all();
        fp8_promote(acc[0], part, scale.x * scale.z, scale.y * scale.z);
        issue(0, 1);
        under_first_step(1);
        wgmma_wait_all();
        release(0);
        fp8_promote(acc[1], part, scale.x * scale.w, scale.y * scale.w);
    }
    for (int kt = 1; kt < ktiles; ++kt) {
        const float4 scale = wait_step(kt);
        issue(kt, 0);
        wgmma_wait_all();
        fp8_promote(acc[0], part, scale.x * scale.z, scale.y * scale.z);
        issue(kt, 1);
        wgmma_wait_all();
        release(kt);
        fp8_promote(acc[1], part, scale.x * scale.w, scale.y * scale.w);
    }
}

// Stages 1 and 2's kernel: a block a 128 x 128 tile of the grid (column tile blockIdx.x, row tile
// blockIdx.y), one producer thread (fp8_produce) and two consumer warpgroups of 64 rows. A consumer
// runs consume(acc, ring, a_row_bytes, scales, ktiles), its K loop into its zeroed accumulator (its A
// rows `a_row_bytes` into a stage's A tile), then stores its rows plus the bias.
template <class Consume>
__device__ __forceinline__ void fp8_ws_tile(const TmaMap& map_a, const TmaMap& map_b, float* out, const float* a_scales,
                                            const float* b_scales, const float* bias, int M, int N, int K,
                                            const Consume& consume) {
    const Fp8Ring<WG_STAGES> ring = fp8_ring<WG_STAGES>();
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    const int m0 = blockIdx.y * F8_BM, n0 = blockIdx.x * F8_BN;
    const int ktiles = (K + F8_BK - 1) / F8_BK;

    // Producer: one thread issues every load; a stage is refilled once both consumers let it go.
    if (!fp8_consumer(ring, wg, [&] { fp8_produce(ring, &map_a, &map_b, m0, n0, ktiles); })) return;

    const int c = wg - 1, warp = (tid >> 5) & 3;
    const int row0 = m0 + 64 * c + 16 * warp + (lane >> 2);
    const StepScales scales(a_scales, b_scales, row0, n0, M, ktiles);

    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    consume(acc, ring, c * 64 * F8_BK, scales, ktiles);
    store_m64_bias<128>(acc, out, bias, row0, n0, M, N);
}

// The persistent stages' tile order: this block's tiles are blockIdx.x, + gridDim.x, ... of the
// row-major order over the output's BM x BN tiles (columns fastest: the order a 2-D grid of stage 2
// launches its blocks in). Each yields its row and column origin.
template <int BM = F8_BM, int BN = F8_BN>
struct Fp8TileStride {
    static constexpr int ROWS = BM, COLS = BN;
    int n_tiles, tiles;
    __device__ __forceinline__ Fp8TileStride(int M, int N)
        : n_tiles((N + BN - 1) / BN), tiles(((M + BM - 1) / BM) * n_tiles) {}
    __device__ __forceinline__ int first() const { return blockIdx.x; }
    __device__ __forceinline__ int next(int t) const { return t + gridDim.x; }
    __device__ __forceinline__ bool done(int t) const { return t >= tiles; }
    __device__ __forceinline__ int m0(int t) const { return (t / n_tiles) * BM; }
    __device__ __forceinline__ int n0(int t) const { return (t % n_tiles) * BN; }
};

// Stage 7's tile order: the same stride over a walk that takes GROUP row panels at a time, column by
// column (linear-bf16's GroupedOrder), so a W tile is read by the group's row panels while it is in
// L2. With a group of every row panel, W comes from DRAM once; the host fits GROUP to the L2.
template <int BM, int GROUP, int BN = F8_BN>
struct Fp8TileGrouped {
    static_assert(GROUP >= 1, "the walk takes at least one row panel at a time");
    static constexpr int ROWS = BM, COLS = BN;
    int m_tiles, n_tiles, tiles;
    __device__ __forceinline__ Fp8TileGrouped(int M, int N)
        : m_tiles((M + BM - 1) / BM), n_tiles((N + BN - 1) / BN), tiles(m_tiles * n_tiles) {}
    __device__ __forceinline__ int first() const { return blockIdx.x; }
    __device__ __forceinline__ int next(int t) const { return t + gridDim.x; }
    __device__ __forceinline__ bool done(int t) const { return t >= tiles; }
    // Tile t's group starts at row panel `top` and holds `panels` of them (fewer in the last group).
    __device__ __forceinline__ int m0(int t) const {
        const int top = (t / (GROUP * n_tiles)) * GROUP, panels = min(m_tiles - top, GROUP);
        return (top + (t % (GROUP * n_tiles)) % panels) * BM;
    }
    __device__ __forceinline__ int n0(int t) const {
        const int top = (t / (GROUP * n_tiles)) * GROUP, panels = min(m_tiles - top, GROUP);
        return ((t % (GROUP * n_tiles)) / panels) * BN;
    }
};

// The persistent stages' producer (one thread): every K step of this block's tiles, the ring's
// positions counting on from tile to tile.
template <int STAGES, int BM, int BN, class Tiles>
__device__ __forceinline__ void fp8_produce_tiles(const Fp8Ring<STAGES, BM, BN>& ring, const Tiles& tiles,
                                                  const TmaMap* map_a, const TmaMap* map_b, int ktiles) {
    int first = 0;
    for (int t = tiles.first(); !tiles.done(t); t = tiles.next(t), first += ktiles)
        fp8_produce(ring, map_a, map_b, tiles.m0(t), tiles.n0(t), ktiles, first);
}

// Stage 4's epilogue part: a warpgroup's 64 x 128 tile (acc in wgmma's layout) plus the bias, then
// TAIL (MM_TAIL_GELU: GELU in the SFU's tanh form; MM_TAIL_RESIDUAL: plus the residual, of type Out,
// read with predicated loads, so it may be out itself), as Out (float, or __nv_bfloat16 rounded to
// nearest even), written into its shared memory in the
// TMA's 128-byte swizzle: slabs of 64 rows x 128 bytes (32 fp32 or 64 bf16 columns), row r's
// 16-byte chunk q at chunk q ^ (r % 8), so a warp's writes of one column pair hit distinct chunks.
// One thread stores the slabs with TMA stores, which write nothing past M or N. Straight-line code
// with predicated stores, so it can run inside an open wgmma group.
template <class Out, int TAIL>
struct Fp8StagedStore {
    using Side = const Out*;  // the residual (read by the residual tail only)
    static constexpr int SLAB_COLS = 128 / sizeof(Out), SLABS = F8_BN / SLAB_COLS;
    static constexpr unsigned BYTES = SLABS * 64 * 128;  // a warpgroup's staging
    unsigned staging;  // 1024-byte aligned
    int barrier;       // the warpgroup's named barrier (128 threads)
    bool elected;      // the warpgroup's thread 0, which issues and waits for the stores

    // Columns col and col + 1 of local row r (x, y): 8 bytes of fp32 or 4 of bf16.
    __device__ __forceinline__ void put(int r, int col, float x, float y) const {
        const int slab = col / SLAB_COLS, byte = (col % SLAB_COLS) * (int)sizeof(Out);
        const unsigned at = staging + slab * (64 * 128) + r * 128 + (((byte >> 4) ^ (r & 7)) << 4) + (byte & 15);
        if constexpr (sizeof(Out) == 4)
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(x), "f"(y) : "memory");
        else
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(pack_bf16x2(x, y)) : "memory");
    }

    // Columns col and col + 1 of row `row` of the residual where `pred` holds, else zeros.
    __device__ __forceinline__ float2 residual_pair(const Out* residual, int row, int col, int N, bool pred) const {
        const Out* p = residual + (size_t)row * N + col;
        if constexpr (sizeof(Out) == 4) {
            float2 v;
            asm volatile(
                "{\n.reg .pred q;\nsetp.ne.b32 q, %3, 0;\nmov.f32 %0, 0f00000000;\nmov.f32 %1, 0f00000000;\n"
                "@q ld.global.v2.f32 {%0, %1}, [%2];\n}\n"
                : "=f"(v.x), "=f"(v.y)
                : "l"(p), "r"((int)pred));
            return v;
        } else {
            unsigned u;
            asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\nmov.b32 %0, 0;\n@q ld.global.b32 %0, [%1];\n}\n"
                         : "=r"(u)
                         : "l"(p), "r"((int)pred));
            return unpack_bf16x2(u);
        }
    }

    // The tail of one biased pair of columns (x, y) at `row` (inside M: `row_in`) and `col`.
    __device__ __forceinline__ float2 tail(float x, float y, const Out* residual, int row, int col, int N,
                                           bool row_in) const {
        if constexpr (TAIL == MM_TAIL_GELU) return make_float2(mm_gelu_tanh_approx(x), mm_gelu_tanh_approx(y));
        if constexpr (TAIL == MM_TAIL_RESIDUAL) {
            const float2 r = residual_pair(residual, row, col, N, row_in && col < N);
            return make_float2(x + r.x, y + r.y);
        }
        return make_float2(x, y);
    }

    // The tile at rows m0.. (the warpgroup's 64) and columns n0.. of out; stored only if `store`.
    // acc is zeroed for the next tile. N % (16 / sizeof(Out)) == 0, so a pair is in or out whole.
    __device__ __forceinline__ void operator()(float (&acc)[64], const TmaMap* map_out, const float* bias,
                                               const Out* residual, int m0, int n0, int M, int N,
                                               bool store) const {
        const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
        const int r = 16 * warp + (lane >> 2), t = lane & 3;
        // The previous stores from this buffer have read it; then every thread may write it.
        tma_store_wait_read();
        named_barrier(barrier, 128);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int col = 8 * j + 2 * t;
            const bool in = bias != nullptr && n0 + col < N;
            const float b0 = in ? bias[n0 + col] : 0.0f, b1 = in ? bias[n0 + col + 1] : 0.0f;
            const float2 p0 = tail(acc[4 * j] + b0, acc[4 * j + 1] + b1, residual, m0 + r, n0 + col, N, m0 + r < M);
            const float2 p1 =
                tail(acc[4 * j + 2] + b0, acc[4 * j + 3] + b1, residual, m0 + r + 8, n0 + col, N, m0 + r + 8 < M);
            put(r, col, p0.x, p0.y);
            put(r + 8, col, p1.x, p1.y);
        }
        fence_proxy_async();
        named_barrier(barrier, 128);
#pragma unroll
        for (int slab = 0; slab < SLABS; ++slab)
            tma_store_if(map_out, staging + slab * (64 * 128), n0 + SLAB_COLS * slab, m0,
                         store && elected && n0 + SLAB_COLS * slab < N);
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    }
};

// Stage 7's e4m3 output (out = 8): the tile plus the bias, then TAIL (none or GELU), quantized into
// matmul::fp8's activation format, so the linear that reads it needs no quantizer pass (the fp8
// plan's MLP up, whose GELU output the MLP down reads). Each value is first rounded to bf16, as
// Fp8StagedStore's bf16 out rounds it, and the bf16 pairs replace the accumulator: 32 registers
// where the fp32 tile needs 64, beside the 64 of the next tile's first step in flight (the 192-row
// tile's three consumers have 128 registers a thread). The tile's 128 columns of a row are one of
// its scale groups, quantized with quantize-fp8's arithmetic (matmul_fp8_quantize.cuh) on those
// bf16 values: amax over the finite magnitudes, the scale amax / 448 to `scales[row][n0 / 128]`,
// each code e4m3(x * (448 / amax)); so the codes and scales are quantize-fp8's of the bf16 out. A
// column past N adds nothing to its row's amax (its accumulator is 0: W's rows past N load as
// zeros; its bias 0; GELU(0) = 0). In wgmma's layout a row's 128 columns are held by the four lanes
// of a quad, so its amax is two shuffles. The codes go into the warpgroup's 64 x 128-byte staging
// in the TMA's 128-byte swizzle (one slab) and leave with one TMA store. Straight-line code with
// predicated stores, as Fp8StagedStore.
template <int TAIL>
struct Fp8QuantizedStore {
    static_assert(TAIL == MM_TAIL_NONE || TAIL == MM_TAIL_GELU, "a residual sum stays fp32 (the stream)");
    using Side = float*;  // the row scales written, [M, ceil(N / 128)]
    static constexpr unsigned BYTES = 64 * 128;
    unsigned staging;  // 1024-byte aligned
    int barrier;       // the warpgroup's named barrier (128 threads)
    bool elected;      // the warpgroup's thread 0, which issues and waits for the store

    // Codes of columns col and col + 1 of local row r (two bytes, the first in the low byte).
    __device__ __forceinline__ void put(int r, int col, unsigned pair) const {
        const unsigned at = staging + r * 128 + (((col >> 4) ^ (r & 7)) << 4) + (col & 15);
        asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(at), "h"((unsigned short)pair) : "memory");
    }

    // Row `row`'s scale of the group at n0, where `pred` holds.
    __device__ __forceinline__ static void put_scale(float* scales, int row, int n0, int N, float amax, bool pred) {
        float* p = scales + (size_t)row * ((N + F8_BN - 1) / F8_BN) + n0 / F8_BN;
        asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\n@q st.global.f32 [%0], %1;\n}\n" ::"l"(p),
                     "f"(__fdiv_rn(amax, QF8_MAX)), "r"((int)pred)
                     : "memory");
    }

    // The tile at rows m0.. (the warpgroup's 64) and columns n0.. as codes and scales; stored only if
    // `store` (and nothing where n0 >= N: stage 8's right half past the last column). acc is zeroed
    // for the next tile. N % 16 == 0, so a pair is in or out whole.
    __device__ __forceinline__ void operator()(float (&acc)[64], const TmaMap* map_out, const float* bias,
                                               float* scales, int m0, int n0, int M, int N, bool store) const {
        const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
        const int r = 16 * warp + (lane >> 2), t = lane & 3;
        unsigned pairs[32];  // pair 2j + h: columns 8j + 2t and + 1 of row r + 8h, as bf16
        float amax[2] = {QF8_AMAX_FLOOR, QF8_AMAX_FLOOR};
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int col = 8 * j + 2 * t;
            const bool in = bias != nullptr && n0 + col < N;
            const float b0 = in ? bias[n0 + col] : 0.0f, b1 = in ? bias[n0 + col + 1] : 0.0f;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float x = acc[4 * j + 2 * h] + b0, y = acc[4 * j + 2 * h + 1] + b1;
                if constexpr (TAIL == MM_TAIL_GELU) x = mm_gelu_tanh_approx(x), y = mm_gelu_tanh_approx(y);
                pairs[2 * j + h] = pack_bf16x2(x, y);
                const float2 v = unpack_bf16x2(pairs[2 * j + h]);
                amax[h] = fmaxf(amax[h], fmaxf(qf8_mag(v.x), qf8_mag(v.y)));
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
            amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
        }
        const float mul[2] = {__fdiv_rn(QF8_MAX, amax[0]), __fdiv_rn(QF8_MAX, amax[1])};
        // The previous store from this buffer has read it; then every thread may write it.
        tma_store_wait_read();
        named_barrier(barrier, 128);
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float2 v = unpack_bf16x2(pairs[2 * j + h]);
                put(r + 8 * h, 8 * j + 2 * t, qf8_pair(v.x, v.y, mul[h]));
            }
#pragma unroll
        for (int h = 0; h < 2; ++h)
            put_scale(scales, m0 + r + 8 * h, n0, N, amax[h], store && t == 0 && m0 + r + 8 * h < M && n0 < N);
        fence_proxy_async();
        named_barrier(barrier, 128);
        tma_store_if(map_out, staging, n0, m0, store && elected && n0 < N);
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    }
};

// The consumer side of the staged-store stages (4 on): CONSUMERS warpgroups of 64 rows sharing a
// tile of HALVES x 128 columns; how a block splits into them and its producer (`enter`: false for
// the producer's threads, one of which has run produce(); `consumer()`: a consumer thread's
// warpgroup among the consumers); and their K loop (`consume`, one signature for every recipe: the
// tile's accumulator, its halves' scales, and `under_first_step(h)`, run while step 0 is in flight
// and before half h of acc is promoted into).
//
// A producer warpgroup first, giving its registers to the consumers (setmaxnreg). The entry's
// register count is the launch bound's (65536 / THREADS: 168 at 384 threads, 128 at 512); ptxas
// lets the code after the consumers' setmaxnreg.inc use CONSUMER_REGS (stage 8's halves need 192
// for their two tiles, and spill nothing at 240).
template <int CONSUMERS_, int PRODUCER_REGS, int CONSUMER_REGS>
struct Fp8ProducerWarpgroup {
    static constexpr int CONSUMERS = CONSUMERS_, THREADS = 128 * (1 + CONSUMERS);
    template <class Ring, class Produce>
    __device__ __forceinline__ static bool enter(const Ring& ring, Produce produce) {
        return fp8_consumer<CONSUMERS, PRODUCER_REGS, CONSUMER_REGS>(ring, threadIdx.x >> 7, produce);
    }
    __device__ __forceinline__ static int consumer() { return (threadIdx.x >> 7) - 1; }
};
// Stage 4: two warpgroups, a 128 x 128 tile, the promotion overlapped (fp8_consume_overlapped).
struct TwoOverlapped : Fp8ProducerWarpgroup<2, 40, 232> {
    static constexpr int HALVES = 1;
    template <class Ring, class UnderFirstStep>
    __device__ __forceinline__ static void consume(float (&acc)[1][64], const Ring& ring, unsigned a_row_bytes,
                                                   const StepScales (&scales)[1], int ktiles, int first,
                                                   UnderFirstStep under_first_step) {
        fp8_consume_overlapped(acc[0], ring, a_row_bytes, scales[0], ktiles, first, [&] { under_first_step(0); });
    }
};
// Stage 5: three warpgroups, a 192 x 128 tile, in 512 threads: no registers for a second partial
// tile, so each step waited for (fp8_consume_waited_staged).
struct ThreeWaited : Fp8ProducerWarpgroup<3, 24, 160> {
    static constexpr int HALVES = 1;
    template <class Ring, class UnderFirstStep>
    __device__ __forceinline__ static void consume(float (&acc)[1][64], const Ring& ring, unsigned a_row_bytes,
                                                   const StepScales (&scales)[1], int ktiles, int first,
                                                   UnderFirstStep under_first_step) {
        fp8_consume_waited_staged(acc[0], ring, a_row_bytes, scales[0], ktiles, first, [&] { under_first_step(0); });
    }
};
// Stage 8: two warpgroups, a 128 x 256 tile in two halves of 128 columns (fp8_consume_halves: 128
// accumulator and 64 partial registers a thread), the producer left 24 registers so each consumer
// has 240.
struct TwoHalvesWaited : Fp8ProducerWarpgroup<2, 24, 240> {
    static constexpr int HALVES = 2;
    template <class Ring, class UnderFirstStep>
    __device__ __forceinline__ static void consume(float (&acc)[2][64], const Ring& ring, unsigned a_row_bytes,
                                                   const StepScales (&scales)[2], int ktiles, int first,
                                                   UnderFirstStep under_first_step) {
        fp8_consume_halves(acc, ring, a_row_bytes, scales, ktiles, first, under_first_step);
    }
};
// The consumers of a tile of ROWS x COLS (stage 6 takes the rows per shape, stage 8 also the columns).
template <int ROWS, int COLS = F8_BN>
struct Fp8ConsumersOfTile;
template <>
struct Fp8ConsumersOfTile<128, 128> {
    using type = TwoOverlapped;
};
template <>
struct Fp8ConsumersOfTile<192, 128> {
    using type = ThreeWaited;
};
template <>
struct Fp8ConsumersOfTile<128, 256> {
    using type = TwoHalvesWaited;
};
template <int ROWS>
using Fp8ConsumersOfRows = Fp8ConsumersOfTile<ROWS, F8_BN>;

// The staged-store stages' kernel: one block an SM walks its tiles in Order (Fp8TileStride, or
// Fp8TileGrouped, of the Consumers' tile); a producer thread runs the ring on across them; each
// consumer warpgroup runs Consumers' K loop over its 64 rows and stores the previous tile (a Store
// call a 128-column half) under the next one's first step, the last after the loop, with Store
// (Fp8StagedStore: fp32 or bf16 out; Fp8QuantizedStore: e4m3 codes). map_out is out's tensor map in
// boxes of 128 bytes x 64 rows; `side` is the Store's other buffer (the residual the residual tail
// reads, or the scales the quantized store writes).
template <class Consumers, class Order, class Store>
__device__ __forceinline__ void fp8_staged_tiles(const TmaMap& map_a, const TmaMap& map_b, const float* a_scales,
                                                 const float* b_scales, const float* bias, int M, int N, int K,
                                                 const TmaMap& map_out, typename Store::Side side) {
    constexpr int TILE_ROWS = 64 * Consumers::CONSUMERS, HALVES = Consumers::HALVES;
    static_assert(Order::ROWS == TILE_ROWS && Order::COLS == F8_BN * HALVES, "the tile order walks the consumers' tiles");
    using Ring = Fp8Ring<WG_STAGES, TILE_ROWS, Order::COLS>;
    const Ring ring = fp8_ring<WG_STAGES, TILE_ROWS, Order::COLS>();
    const unsigned staging = (ring.base + Ring::BYTES + 1023) & ~1023u;
    const Order tiles(M, N);
    const int tid = threadIdx.x, lane = tid & 31;
    const int ktiles = (K + F8_BK - 1) / F8_BK;

    if (!Consumers::enter(ring, [&] { fp8_produce_tiles(ring, tiles, &map_a, &map_b, ktiles); })) return;
    const int c = Consumers::consumer();

    const int warp = (tid >> 5) & 3;
    const Store store{staging + c * Store::BYTES, 1 + c, (tid & 127) == 0};
    float acc[HALVES][64];
#pragma unroll
    for (int h = 0; h < HALVES; ++h)
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[h][i] = 0.0f;
    // The tile whose result acc holds (none before the first: its store is predicated off).
    int prev_m0 = 0, prev_n0 = 0;
    bool have_prev = false;
    int first = 0;
    for (int t = tiles.first(); !tiles.done(t); t = tiles.next(t), first += ktiles) {
        const int m0 = tiles.m0(t) + 64 * c, n0 = tiles.n0(t);
        // Half h's W block is the one at n0 + 128 h; past N, the last block (its columns are zeros,
        // never stored).
        StepScales scales[HALVES];
#pragma unroll
        for (int h = 0; h < HALVES; ++h)
            scales[h] = StepScales(a_scales, b_scales, m0 + 16 * warp + (lane >> 2),
                                   h == 0 ? n0 : min(n0 + F8_BN * h, (N - 1) / F8_BN * F8_BN), M, ktiles);
        const auto store_prev = [&](int h) {
            store(acc[h], &map_out, bias, side, prev_m0, prev_n0 + F8_BN * h, M, N, have_prev);
        };
        Consumers::consume(acc, ring, c * 64 * F8_BK, scales, ktiles, first, store_prev);
        prev_m0 = m0, prev_n0 = n0, have_prev = true;
    }
#pragma unroll
    for (int h = 0; h < HALVES; ++h) store(acc[h], &map_out, bias, side, prev_m0, prev_n0 + F8_BN * h, M, N, have_prev);
    tma_store_wait();
}

// One entry of a staged-store stage with Store (the arguments after Order): `out` is unused (the
// stores go through map_out), so the argument list is every stage's, then out's map and the Store's
// side buffer (the residual, null but for the residual tail; or the quantized store's scales).
#define FP8_STAGED_ENTRY(name, Consumers, Order, ...)                                                                 \
    extern "C" __global__ void __launch_bounds__(Consumers::THREADS, 1)                                               \
        name(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, void* out,                   \
             const float* a_scales, const float* b_scales, const float* bias, int M, int N, int K,                    \
             const __grid_constant__ TmaMap map_out, typename __VA_ARGS__::Side side) {                               \
        fp8_staged_tiles<Consumers, Order, __VA_ARGS__>(map_a, map_b, a_scales, b_scales, bias, M, N, K, map_out,     \
                                                        side);                                                        \
    }

// A staged-store stage's six entries: no tail, GELU, the residual; fp32 out, then bf16 (`_bf16`).
#define FP8_STAGED_ENTRIES(prefix, Consumers, Order)                                                                  \
    FP8_STAGED_ENTRY(prefix, Consumers, Order, Fp8StagedStore<float, MM_TAIL_NONE>)                                   \
    FP8_STAGED_ENTRY(prefix##_gelu, Consumers, Order, Fp8StagedStore<float, MM_TAIL_GELU>)                            \
    FP8_STAGED_ENTRY(prefix##_residual, Consumers, Order, Fp8StagedStore<float, MM_TAIL_RESIDUAL>)                    \
    FP8_STAGED_ENTRY(prefix##_bf16, Consumers, Order, Fp8StagedStore<__nv_bfloat16, MM_TAIL_NONE>)                    \
    FP8_STAGED_ENTRY(prefix##_gelu_bf16, Consumers, Order, Fp8StagedStore<__nv_bfloat16, MM_TAIL_GELU>)               \
    FP8_STAGED_ENTRY(prefix##_residual_bf16, Consumers, Order, Fp8StagedStore<__nv_bfloat16, MM_TAIL_RESIDUAL>)

// Stage 7's two e4m3 entries (Fp8QuantizedStore): no tail and GELU (`_e4m3`, `_gelu_e4m3`).
#define FP8_QUANTIZED_ENTRIES(prefix, Consumers, Order)                                                               \
    FP8_STAGED_ENTRY(prefix##_e4m3, Consumers, Order, Fp8QuantizedStore<MM_TAIL_NONE>)                                \
    FP8_STAGED_ENTRY(prefix##_gelu_e4m3, Consumers, Order, Fp8QuantizedStore<MM_TAIL_GELU>)
