// matmul_wmma_m3.cuh: linear stage 4's WMMA GEMM (flat and block-tiled), shared with the epilogue
// stages. Its launch geometry (MM_M3_WARPS, MM_BT_*) comes from the stage list as defines.
#pragma once
#include "matmul_wmma.cuh"

// ---- Stage 4 (wmma-m3). ----
// Toggles (cumulative, leave-one-out in the ablation):
//   BLOCK_TILE     the block-tiled kernel (mm_wmma_m3_bt below): a 128 x 128 output tile per block
//                  of 8 warps, 4 side by side along N and 2 along M, each warp 64 x 32 (4 x 2 WMMA
//                  tiles, so every fragment loaded feeds 2 or 4 mma_sync), operands staged in
//                  shared memory by 16-byte cp.async. Without it: the report's literal M3
//                  (mm_wmma_m3_flat), 32 warps along N, one 16 x 16 tile each, fragments from L1/L2;
//   LAUNCH_BOUNDS  __launch_bounds__(threads, min blocks): the compiler targets exactly this launch
//                  (block-tiled: 256 threads, 2 blocks per SM, i.e. <= 128 registers);
//   DOUBLE_BUFFER  block-tiled: a 3-stage cp.async pipeline (tiles t+1 and t+2 in flight during the
//                  mma of tile t) instead of load-wait-compute; flat: two fragment sets, the loads of
//                  k-step t+1 issued before the mma of step t;
//   FUSED_PREP     (read by the Rust launcher) one transpose-and-convert kernel for the weights
//                  instead of a transpose then a conversion.

// ---- Flat variant (no BLOCK_TILE): MM_M3_WARPS warps per block, side by side along N. ----
// Block (32, MM_M3_WARPS): warp y of block (bx, by) computes the output tile (bx, by*WARPS + y).
// All warps of a block share the same 16-row strip of `a`, so after the first warp reads a
// fragment the others find it in L1.
#ifndef MM_M3_WARPS
#error "MM_M3_WARPS (warps per block of the flat variant) is a tunable: the stage list sets it"
#endif

template <int EPI>
__device__ __forceinline__ void mm_wmma_m3_flat(float* out, const __half* a, const __half* bt, const float* bias,
                                                const float* residual, int M, int N, int Kp, int Np, float* stage) {
    using namespace nvcuda;
    const int tm = blockIdx.x;
    const int tn = blockIdx.y * MM_M3_WARPS + threadIdx.y;
    if (tn * 16 >= Np) return;  // whole warp leaves; the kernel has no block-wide barrier
    // Offset pointers: the start of this tile's operands, advanced by a constant each k-step.
    const __half* ap = a + (size_t)tm * 16 * Kp;
    const __half* bp = bt + (size_t)tn * 16;
    const size_t bstep = (size_t)16 * Np;
    const int tiles = Kp / 16;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#ifdef DOUBLE_BUFFER
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a0, a1;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b0, b1;
    wmma::load_matrix_sync(a0, ap, Kp);
    wmma::load_matrix_sync(b0, bp, Np);
    int t = 0;
    for (; t + 1 < tiles; t += 2) {
        wmma::load_matrix_sync(a1, ap + 16, Kp);
        wmma::load_matrix_sync(b1, bp + bstep, Np);
        wmma::mma_sync(acc, a0, b0, acc);
        ap += 32;
        bp += 2 * bstep;
        if (t + 2 < tiles) {
            wmma::load_matrix_sync(a0, ap, Kp);
            wmma::load_matrix_sync(b0, bp, Np);
        }
        wmma::mma_sync(acc, a1, b1, acc);
    }
    if (t < tiles) wmma::mma_sync(acc, a0, b0, acc);
#else
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> af;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> bf;
    for (int t = 0; t < tiles; t++) {
        wmma::load_matrix_sync(af, ap, Kp);
        wmma::load_matrix_sync(bf, bp, Np);
        wmma::mma_sync(acc, af, bf, acc);
        ap += 16;
        bp += bstep;
    }
#endif
    wmma::store_matrix_sync(stage, acc, 16, wmma::mem_row_major);
    __syncwarp();
    mm_store_tile<EPI>(stage, out, bias, residual, tm * 16, tn * 16, M, N);
}

// ---- Block-tiled variant (BLOCK_TILE). ----
// Block tile BM x BN, k-tile BK; 8 warps as WARPS_M x WARPS_N, warp tile (BM/WARPS_M) x (BN/WARPS_N)
// = FM x FN WMMA tiles. Shared memory per pipeline stage: the A tile (BM rows of BK halves, rows
// padded to LDA) and the B tile (BK rows of BN halves, padded to LDB); the 8-half (16-byte) row
// padding puts the 8 rows read by one ldmatrix phase in 8 different 16-byte bank groups. Every
// fragment base is a multiple of 32 bytes (WMMA's alignment rule): row strides 80 B and 272 B
// times 16 rows, column offsets multiples of 16 halves. Launch: grid ceil(M/BM) * ceil(Np/BN)
// (1-D, M tiles fastest so neighbouring blocks share one weight tile in L2), block 256, dynamic
// shared memory MM_BT_SMEM_BYTES (the Rust plan computes it from the same tunables:
// gemm::m3_block_tile_smem_bytes; the kernel traps if it got less).
#if !defined(MM_BT_BM) || !defined(MM_BT_BN) || !defined(MM_BT_BK) || !defined(MM_BT_WARPS_M) || !defined(MM_BT_WARPS_N)
#error "MM_BT_BM, MM_BT_BN, MM_BT_BK, MM_BT_WARPS_M, MM_BT_WARPS_N are tunables: the stage list sets them"
#endif
#define MM_BT_LDA (MM_BT_BK + 8)
#define MM_BT_LDB (MM_BT_BN + 8)
#define MM_BT_THREADS (MM_BT_WARPS_M * MM_BT_WARPS_N * 32)
#define MM_BT_FM (MM_BT_BM / MM_BT_WARPS_M / 16)
#define MM_BT_FN (MM_BT_BN / MM_BT_WARPS_N / 16)
#define MM_BT_A_HALVES (MM_BT_BM * MM_BT_LDA)
#define MM_BT_STAGE_HALVES (MM_BT_A_HALVES + MM_BT_BK * MM_BT_LDB)
#ifdef DOUBLE_BUFFER
#define MM_BT_STAGES 3
#else
#define MM_BT_STAGES 1
#endif
#define MM_BT_SMEM_BYTES (MM_BT_STAGES * MM_BT_STAGE_HALVES * 2)

static_assert(MM_BT_THREADS == 256, "the tile loader assumes 256 threads");
static_assert(MM_BT_BM * MM_BT_BK / 8 == 2 * MM_BT_THREADS, "A tile: two 16-byte chunks per thread");
static_assert(MM_BT_BK * MM_BT_BN / 8 == 2 * MM_BT_THREADS, "B tile: two 16-byte chunks per thread");
static_assert((MM_BT_STAGE_HALVES * 2) % 128 == 0, "stage bases stay 128-byte aligned");
static_assert(MM_BT_WARPS_M * MM_BT_WARPS_N * 256 * 4 <= MM_BT_SMEM_BYTES, "epilogue stages fit");

// Copies one operand's part of a k-tile into a pipeline stage: a tile of COLS halves a row, LD a
// shared row, whose corner is (row0, col0) of the padded row-major operand g (rows x cols). Each
// thread moves two 16-byte chunks with cp.async; a chunk outside the operand is zero-filled by a
// plain shared store instead. cols is a multiple of 16, so a chunk is either wholly inside or wholly
// outside.
template <int COLS, int LD>
__device__ __forceinline__ void mm_bt_load_operand(__half* s, const __half* g, int row0, int col0, int rows,
                                                   int cols) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int c = threadIdx.x + i * MM_BT_THREADS;
        const int r = c / (COLS / 8), cc = (c % (COLS / 8)) * 8;
        __half* dst = s + r * LD + cc;
        const int gr = row0 + r, gc = col0 + cc;
        if (gr < rows && gc < cols) {
            __pipeline_memcpy_async(dst, g + (size_t)gr * cols + gc, 16);
        } else {
            *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

// Issues the copies of k-tile k0 into one pipeline stage (sa: A tile, sb: B tile), zero outside the
// padded operands (rows >= Mp, k >= Kp, columns >= Np).
__device__ __forceinline__ void mm_bt_load_tile(__half* sa, __half* sb, const __half* a, const __half* bt, int m0,
                                                int n0, int k0, int Mp, int Kp, int Np) {
    mm_bt_load_operand<MM_BT_BK, MM_BT_LDA>(sa, a, m0, k0, Mp, Kp);
    mm_bt_load_operand<MM_BT_BN, MM_BT_LDB>(sb, bt, k0, n0, Kp, Np);
}

// The mma of one k-tile held in shared memory: per 16-wide k-step, the warp loads its FN B
// fragments once, then each of its FM A fragments and FN mma_sync with it.
__device__ __forceinline__ void mm_bt_compute_tile(
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> (&acc)[MM_BT_FM][MM_BT_FN],
    const __half* sa, const __half* sb) {
    using namespace nvcuda;
#pragma unroll
    for (int kk = 0; kk < MM_BT_BK; kk += 16) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> bf[MM_BT_FN];
#pragma unroll
        for (int j = 0; j < MM_BT_FN; j++) wmma::load_matrix_sync(bf[j], sb + kk * MM_BT_LDB + j * 16, MM_BT_LDB);
#pragma unroll
        for (int i = 0; i < MM_BT_FM; i++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> af;
            wmma::load_matrix_sync(af, sa + i * 16 * MM_BT_LDA + kk, MM_BT_LDA);
#pragma unroll
            for (int j = 0; j < MM_BT_FN; j++) wmma::mma_sync(acc[i][j], af, bf[j], acc[i][j]);
        }
    }
}

template <int EPI>
__device__ __forceinline__ void mm_wmma_m3_bt(float* out, const __half* a, const __half* bt, const float* bias,
                                              const float* residual, int M, int N, int Kp, int Np,
                                              unsigned char* smem) {
    using namespace nvcuda;
    unsigned dyn_smem;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_smem));
    if (dyn_smem < MM_BT_SMEM_BYTES) __trap();  // launcher and kernel disagree on the tile sizes
    __half* const sbase = reinterpret_cast<__half*>(smem);
    const int Mp = (M + 15) & ~15;
    const int mtiles = (M + MM_BT_BM - 1) / MM_BT_BM;
    const int m0 = (int)(blockIdx.x % mtiles) * MM_BT_BM;
    const int n0 = (int)(blockIdx.x / mtiles) * MM_BT_BN;
    const int warp = threadIdx.x >> 5;
    const int wm = warp / MM_BT_WARPS_N, wn = warp % MM_BT_WARPS_N;
    // Offset pointers: this warp's first A row and B column inside a stage.
    const int a_off = wm * (MM_BT_BM / MM_BT_WARPS_M) * MM_BT_LDA;
    const int b_off = MM_BT_A_HALVES + wn * (MM_BT_BN / MM_BT_WARPS_N);

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MM_BT_FM][MM_BT_FN];
#pragma unroll
    for (int i = 0; i < MM_BT_FM; i++)
#pragma unroll
        for (int j = 0; j < MM_BT_FN; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    const int ktiles = (Kp + MM_BT_BK - 1) / MM_BT_BK;
#if MM_BT_STAGES > 1
    // Prologue: tiles 0 .. STAGES-2 in flight, one commit group each (empty groups past the end
    // keep the count regular).
#pragma unroll
    for (int s = 0; s < MM_BT_STAGES - 1; s++) {
        if (s < ktiles) {
            __half* st = sbase + s * MM_BT_STAGE_HALVES;
            mm_bt_load_tile(st, st + MM_BT_A_HALVES, a, bt, m0, n0, s * MM_BT_BK, Mp, Kp, Np);
        }
        __pipeline_commit();
    }
    for (int t = 0; t < ktiles; t++) {
        // Groups committed so far: STAGES-1+t; leaving STAGES-2 pending means tile t has landed
        // (for this thread's copies; the barrier makes every thread's copies visible, and also
        // guarantees that all warps are done with tile t-1, whose stage is refilled next).
        __pipeline_wait_prior(MM_BT_STAGES - 2);
        __syncthreads();
        const int nt = t + MM_BT_STAGES - 1;
        if (nt < ktiles) {
            __half* st = sbase + (nt % MM_BT_STAGES) * MM_BT_STAGE_HALVES;
            mm_bt_load_tile(st, st + MM_BT_A_HALVES, a, bt, m0, n0, nt * MM_BT_BK, Mp, Kp, Np);
        }
        __pipeline_commit();
        const __half* st = sbase + (t % MM_BT_STAGES) * MM_BT_STAGE_HALVES;
        mm_bt_compute_tile(acc, st + a_off, st + b_off);
    }
    __pipeline_wait_prior(0);
#else
    for (int t = 0; t < ktiles; t++) {
        __syncthreads();  // all warps are done with the previous tile
        mm_bt_load_tile(sbase, sbase + MM_BT_A_HALVES, a, bt, m0, n0, t * MM_BT_BK, Mp, Kp, Np);
        __pipeline_commit();
        __pipeline_wait_prior(0);
        __syncthreads();
        mm_bt_compute_tile(acc, sbase + a_off, sbase + b_off);
    }
#endif
    __syncthreads();  // the operand stages are reused as the per-warp epilogue stages

    float* stage = reinterpret_cast<float*>(smem) + warp * 256;
    const int row_w = m0 + wm * (MM_BT_BM / MM_BT_WARPS_M), col_w = n0 + wn * (MM_BT_BN / MM_BT_WARPS_N);
#pragma unroll
    for (int i = 0; i < MM_BT_FM; i++) {
#pragma unroll
        for (int j = 0; j < MM_BT_FN; j++) {
            const int row0 = row_w + i * 16, col0 = col_w + j * 16;
            if (row0 < M && col0 < N) {  // warp-uniform
                wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);
                __syncwarp();
                mm_store_tile<EPI>(stage, out, bias, residual, row0, col0, M, N);
                __syncwarp();
            }
        }
    }
}

// The launch bounds of an entry point with LAUNCH_BOUNDS: the block tile's 256 threads, two blocks an
// SM (BLOCK_TILE); else WARPS warps, one block.
#ifdef LAUNCH_BOUNDS
#ifdef BLOCK_TILE
#define MM_M3_BOUNDS __launch_bounds__(MM_BT_THREADS, 2)
#else
#define MM_M3_BOUNDS __launch_bounds__(MM_M3_WARPS * 32, 1)
#endif
#else
#define MM_M3_BOUNDS
#endif

// The signature of every stage-4 entry point.
#define MM_WMMA_M3_ENTRY(NAME)                                                                              \
    extern "C" __global__ void MM_M3_BOUNDS NAME(float* out, const __half* a, const __half* bt,              \
                                                 const float* bias, const float* residual, int M, int N,     \
                                                 int Kp, int Np)

#ifdef BLOCK_TILE
// An entry point of the stage-4 GEMM with epilogue EPI. Launch: grid ceil(M/128) * ceil(Np/128),
// block 256, dynamic shared memory MM_BT_SMEM_BYTES.
#define MM_DEFINE_WMMA_M3(NAME, EPI)                                                                        \
    MM_WMMA_M3_ENTRY(NAME) {                                                                                 \
        extern __shared__ __align__(128) unsigned char mm_bt_smem[];                                         \
        mm_wmma_m3_bt<EPI>(out, a, bt, bias, residual, M, N, Kp, Np, mm_bt_smem);                            \
    }
#else
// An entry point of the stage-4 GEMM with epilogue EPI. Launch: grid (Mp/16, ceil(Np/16/WARPS)),
// block (32, WARPS), 1 KiB of static shared memory per warp.
#define MM_DEFINE_WMMA_M3(NAME, EPI)                                                                        \
    MM_WMMA_M3_ENTRY(NAME) {                                                                                 \
        __shared__ __align__(32) float stage[MM_M3_WARPS][256];                                              \
        mm_wmma_m3_flat<EPI>(out, a, bt, bias, residual, M, N, Kp, Np, stage[threadIdx.y]);                  \
    }
#endif
