// attention_wgmma.cuh: the warpgroup MMAs of the bf16 prefill's wgmma stages (prefill-bf16/02 on),
// with accumulators in the [n-tile][4] layout the mma.sync stages use (attention_flash_bf16.cuh),
// which is wgmma's m64nNk16 accumulator layout per warp: warp w of the warpgroup holds rows
// 16w + g and 16w + g + 8, d[n][0..1] and d[n][2..3] at columns 8n + 2t. So the online-softmax step
// and P's A fragments are the mma.sync stages' own. Needs sm_90a.
#pragma once
#include "ladder_hopper.cuh"

// O += P.V over 16 keys: A (P, 64 x 16) from registers in mma.sync's A-fragment order, B (16 keys
// x 64 dims of V) MN-major in shared memory (transpose flag set).
__device__ __forceinline__ void wgmma_pv_n64(float (&d)[8][4], const unsigned (&a)[4], unsigned long long b) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, p, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// O += P.V over 16 keys: A (P, 64 x 16) from registers in mma.sync's A-fragment order, B (16 keys
// x 128 dims of V) MN-major in shared memory (transpose flag set).
__device__ __forceinline__ void wgmma_pv_n128(float (&d)[16][4], const unsigned (&a)[4], unsigned long long b) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, p, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// S (+)= Q.K^T over 16 dims for 64 keys: wgmma.m64n64k16, both operands K-major in shared memory
// (the 64-key tiles of the HS = 128 entry's two-block switch); `accumulate` 0 overwrites d.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], unsigned long long a, unsigned long long b,
                                                int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "%32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(accumulate));
}

// Pins accumulator registers at this point of the program: the wgmma asm statements name them as
// outputs when issued, but the hardware writes them until wgmma.wait_group returns, so ordinary
// code that reads or scales them must not be scheduled above the wait.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[n][e])::"memory");
}

// ---- The tiles of the wgmma stages (02 on) ----
constexpr int WG_BR = 128;  // query rows per block: two consumer warpgroups of 64
constexpr int WG_BC = 128;  // keys per tile (64 for the HS = 128 entry's two-block switch)
constexpr int TMA_BOX = 64; // a TMA box: 64 rows x 64 columns (128 bytes) of bf16

// The boxes of a [ROWS][D] tile at (global row y0, column x0) into `dst`, laid out as D/64 column
// blocks of [ROWS][64] (each row 128 bytes, swizzled): the layout both descriptors read.
template <int D, int ROWS>
__device__ __forceinline__ void load_tile(unsigned dst, const TmaMap* map, unsigned bar, int x0, int y0) {
#pragma unroll
    for (int cb = 0; cb < D / TMA_BOX; ++cb)
#pragma unroll
        for (int rb = 0; rb < ROWS / TMA_BOX; ++rb)
            tma_load(dst + (cb * ROWS + rb * TMA_BOX) * 128, map, bar, x0 + cb * TMA_BOX, y0 + rb * TMA_BOX);
}

// Shared memory of the wgmma stages from a 1024-byte aligned base (the swizzle's atoms): Q's
// WG_BR rows, then STAGES slots of K and V (BC rows each), then 8-byte mbarriers: Q's, a full one
// per slot, an empty one per slot (used by the stages with a producer).
template <int D, int STAGES, int BC = WG_BC>
struct TileRing {
    static constexpr unsigned Q_BYTES = WG_BR * D * 2, KV_BYTES = BC * D * 2;
    unsigned base;
    __device__ unsigned q() const { return base; }
    __device__ unsigned k(int s) const { return base + Q_BYTES + (unsigned)s * 2 * KV_BYTES; }
    __device__ unsigned v(int s) const { return k(s) + KV_BYTES; }
    __device__ unsigned q_full() const { return base + Q_BYTES + STAGES * 2 * KV_BYTES; }
    __device__ unsigned full(int s) const { return q_full() + 8u * (1 + s); }
    __device__ unsigned empty(int s) const { return q_full() + 8u * (1 + STAGES + s); }
};

template <int D, int STAGES, int BC = WG_BC>
__device__ __forceinline__ TileRing<D, STAGES, BC> tile_ring(unsigned char* smem_raw) {
    return TileRing<D, STAGES, BC>{(smem_u32(smem_raw) + 1023) & ~1023u};
}

// Thread 0 initialises the ring's barriers, the empty ones only for a ring with a producer
// (EMPTY_ARRIVALS > 0 arrivals release a slot); the whole block then waits, so no thread touches a
// barrier before it exists.
template <unsigned EMPTY_ARRIVALS, int D, int STAGES, int BC>
__device__ __forceinline__ void init_ring(const TileRing<D, STAGES, BC>& r) {
    if (threadIdx.x == 0) {
        mbar_init(r.q_full(), 1);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(r.full(s), 1);
            if constexpr (EMPTY_ARRIVALS > 0) mbar_init(r.empty(s), EMPTY_ARRIVALS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
}

// The producer of the stages with one (03 on), run by a single thread: Q at query row q_row, then
// each key tile j (its K at column kx, V at vx, rows from row0 + j * WG_BC) into slot j % STAGES
// once the consumers have released that slot's previous tile.
template <int D, int STAGES>
__device__ __forceinline__ void produce(const TileRing<D, STAGES>& r, const TmaMap* map, int tiles, int qx,
                                        int kx, int vx, int q_row, int row0) {
    mbar_expect_tx(r.q_full(), TileRing<D, STAGES>::Q_BYTES);
    load_tile<D, WG_BR>(r.q(), map, r.q_full(), qx, q_row);
    for (int j = 0; j < tiles; ++j) {
        const int s = j % STAGES;
        if (j >= STAGES) mbar_wait(r.empty(s), (j / STAGES - 1) & 1);
        mbar_expect_tx(r.full(s), 2 * TileRing<D, STAGES>::KV_BYTES);
        load_tile<D, WG_BC>(r.k(s), map, r.full(s), kx, row0 + j * WG_BC);
        load_tile<D, WG_BC>(r.v(s), map, r.full(s), vx, row0 + j * WG_BC);
    }
}

// The block of a warp-specialized stage (03-05): thread tid (warp and lane of its warpgroup), head
// h of sequence b, its 128-row query tile from row q0 (the heaviest tiles first), the C = NH * D
// columns of each of Q, K and V in a row of qkv, the global row of the sequence's token 0, and the
// key tiles the tile walks.
struct WsBlock {
    int tid, warp, lane, h, b, q0, C, row0, tiles;
};
// The block of head h, sequence b and the query tile from row q0, as a tile order picked them.
template <int D>
__device__ __forceinline__ WsBlock ws_block_at(int T, int NH, int causal, int h, int b, int q0) {
    const int tid = threadIdx.x;
    const int tiles = ((causal ? min(q0 + WG_BR, T) : T) + WG_BC - 1) / WG_BC;
    return WsBlock{tid, (tid >> 5) & 3, tid & 31, h, b, q0, NH * D, b * T, tiles};
}
// Stages 03-05: grid (tiles, NH, B), the heaviest query tiles of each head first.
template <int D>
__device__ __forceinline__ WsBlock ws_block(int T, int NH, int causal) {
    return ws_block_at<D>(T, NH, causal, blockIdx.y, blockIdx.z, (gridDim.x - 1 - blockIdx.x) * WG_BR);
}

// Sets up the ring (a slot is released by one arrival per consumer warp) and splits the roles: the
// producer warpgroup (threads 0-127) gives its registers to the consumers and one thread of it
// issues every load; it gets false and leaves. A consumer thread takes 240 registers and gets true.
template <int D, int STAGES>
__device__ __forceinline__ bool ws_consumer(const TileRing<D, STAGES>& r, const TmaMap* map, const WsBlock& k) {
    init_ring<8>(r);
    if (k.tid < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (k.tid == 0)
            produce(r, map, k.tiles, k.h * D, k.C + k.h * D, 2 * k.C + k.h * D, k.row0 + k.q0, k.row0);
        return false;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    return true;
}

// The column-block address of 16 dims kk of the 64 rows of a tile at `base` (`rows` rows a column
// block): 32 bytes along a swizzled 128-byte row, the next 64 dims a column block further.
__device__ __forceinline__ unsigned qk_dims(unsigned base, int rows, int kk) {
    return base + (kk / 4) * rows * 128 + (kk % 4) * 32;
}
// S (+)= Q.K^T over 16 dims kk for BC keys, Q's descriptor `a` and K's tile at k: sc's [n-tile][4]
// is the m64nBC accumulator's registers in order.
template <int BC>
__device__ __forceinline__ void qk_step(float (&sc)[BC / 8][4], unsigned long long a, unsigned k, int kk) {
    const unsigned long long b = wgmma_desc(qk_dims(k, BC, kk));
    if constexpr (BC == 128) {
        wgmma_m64n128k16(reinterpret_cast<float(&)[64]>(sc), a, b, kk > 0);
    } else {
        wgmma_m64n64k16(reinterpret_cast<float(&)[32]>(sc), a, b, kk > 0);
    }
}

// S = Q.K^T of one key tile of BC keys for the warpgroup whose 64 rows of Q start at qa: D/16
// wgmma, 16 dims each.
template <int D, int BC = WG_BC>
__device__ __forceinline__ void issue_qk(float (&sc)[BC / 8][4], unsigned qa, unsigned k) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) qk_step<BC>(sc, wgmma_desc(qk_dims(qa, WG_BR, kk)), k, kk);
}

// The D/16 descriptors of the warpgroup's Q rows at qa that issue_qk reads, made once: a mainloop
// that keeps them live across its turns passes them to issue_qk_with (opaque to the compiler, so
// ptxas keeps them in registers rather than computing them again in every turn).
template <int D>
__device__ __forceinline__ void q_descriptors(unsigned long long (&qd)[D / 16], unsigned qa) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        qd[kk] = wgmma_desc(qk_dims(qa, WG_BR, kk));
        asm volatile("" : "+l"(qd[kk]));
    }
}
// issue_qk with Q's descriptors made by q_descriptors.
template <int D, int BC = WG_BC>
__device__ __forceinline__ void issue_qk_with(float (&sc)[BC / 8][4], const unsigned long long (&qd)[D / 16],
                                              unsigned k) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) qk_step<BC>(sc, qd[kk], k, kk);
}

// O += P.V over keys 16 kk.. of a tile of BC keys: two 8-row atoms (2048 bytes) into the V tile,
// MN-major, the next 64 dims a column block (BC rows x 128 bytes) further.
template <int D, int BC = WG_BC>
__device__ __forceinline__ void issue_pv(float (&o)[D / 8][4], const unsigned (&p)[4], unsigned v, int kk) {
    if constexpr (D == 64) {
        wgmma_pv_n64(o, p, wgmma_desc_mn(v + kk * 2048, BC * 128));
    } else {
        wgmma_pv_n128(o, p, wgmma_desc_mn(v + kk * 2048, BC * 128));
    }
}
