// Decode GEMV, stage 4: skinny tensor-core GEMM (mma.sync m16n8k16 bf16, W read once for all M rows);
// and stage 5 (GEMV_LN_FOLD): the LayerNorm before it folded in.
// Changed from stage 3: the product is computed transposed, out^T[N, M] = W[N, K] . inp^T[K, M], so W
//   is the 16-row A operand and inp the 8-column B operand of mma.sync.m16n8k16; a block of
//   `split` warps owns 16 rows of W, its warps take interleaved 32-wide steps of K, and partial
//   tiles meet in shared memory. The split is chosen per shape on the host (so that about 2048
//   warps are in flight, 8 to 32 per block, fewer at M > 16 where registers cap the block). Fragments are loaded straight from global memory, with no shared
//   memory or ldmatrix: a dot product does not care in which order K is summed, so each lane takes
//   16 contiguous bytes (8 bf16) of rows g and g + 8 of W and hands them to the mma as the k
//   columns {2t, 2t+1, 2t+8, 2t+9} of two consecutive k16 steps, and takes the same 8 elements of
//   K from inp (two float4, rounded to bf16) for the matching rows of B. Each of a step's 4 loads
//   per lane is issued before any mma (the steps unrolled by GEMV_UNROLL), so a warp has up to
//   GEMV_UNROLL * 1 KiB of W in flight.
// Why it should be faster: stages 1-3 re-read every 16-byte piece of W once per 8 rows of inp
//   (their passes of MT <= 8 rows), and do the M multiply-adds per weight on the FMA pipe; here W
//   is read once for all M <= 64 rows and the multiply-adds go to the tensor cores, so the time
//   should stay near the M = 1 time up to M = 64 (predicted: MLP up at M = 8, 11.7 us at stage 1,
//   to about its M = 1 time, ~6-7 us). At M = 1, 7/8 of each mma is padding, which costs nothing
//   in a kernel bound by reading W: predicted on par with stage 3.
// Stage 5 (GEMV_LN_FOLD) adds the gemv_mma_ln_m* entries: out = LayerNorm(x) . W^T + bias with the
//   LayerNorm's gain folded into the weights and its shift into the bias on the host, once at load
//   (W' = bf16(W * gamma) per column k, bias' = W . beta + bias), so the kernel reads the raw
//   residual stream x (fp32): each block first takes its M rows' mean and rstd (a warp a row, two
//   passes over the row in L2: 3 KB at M = 1), rounds (x - mean) to bf16 for the B fragments, and
//   scales each output by its row's rstd before bias' and the tail. Why: the decode step loses its
//   LayerNorm kernels (two a layer and the final one: 25 of 100 at batch 1, each a launch and a
//   ramp of ~3-5 us on the step's critical path) for a few hundred ns of row statistics per GEMV;
//   predicted 1.2x on the batch-1 step (~510 -> ~420 us). The eps is GPT-2's, GEMV_LN_EPS.
// Stage 6 (GEMV_EARLY_WEIGHTS, LADDER_DEPENDENT) is stage 5 as a link of the decode step's
//   programmatic-dependent chain (ladder_dependent.cuh): the block copies its warps' first pass of
//   W (up to GEMV_UNROLL 32-wide steps a warp: all of W's 16 rows at GPT-2's K = 768 and 3072) into
//   shared memory with cp.async, then waits for the previous kernel, then lets the next one launch;
//   the first pass reads those pieces from shared memory instead of global. Why: the weights
//   never change during a step, so their DRAM latency and most of their bytes move under the previous
//   kernel's tail, and the launch itself under its body; what is left on the chain is the wait, the
//   row statistics from L2, the mma, the reduction and the store. Registers as stage 5 (the pieces
//   wait in shared memory, not in registers: holding them across the statistics in registers took
//   48 -> 72 and halved the occupancy, docs/notes/gpt2.md section 4). Predicted with the other
//   kernels of the step waiting the same way (decode-step stage 6): the batch-1 step from ~405 to
//   ~230 us, ~3 us of the ~5.5 us a kernel now spends off its bytes. Measured (H100): the step 342 /
//   422 / 1165 us at B = 1 / 8 / 32 against 405 / 477 / 1208 (1.18x / 1.13x / 1.04x): the launch and
//   the weights' first round trip left the chain, the wait's release and the kernel's own dependent
//   round trips did not. Alone (no chain) 0.92-0.99x stage 5, 1.10x at the folded LM head.
// Stage 7 (GEMV_STAGED_ROWS): stage 6 with a folded LayerNorm's rows read from memory once. Each warp
//   requests all of its row's float4s (GEMV_STAGED_ROWS a lane) before using any, takes the mean
//   and variance from its registers, and stages the row less its mean as bf16 in shared memory, from
//   which every warp's B fragments are read. Why: the decode step's chain timeline (`ladder timeline
//   gpt2 --op decode-step`, B = 1) puts a folded GEMV's statistics 1.5 us after its wait and its
//   products 1.2 us after that, each wait an L2 round trip (the second pass over the row, then the
//   fragments' fp32 loads); with the row in registers and then shared memory one round trip is left.
//   Predicted: ~1 us off each of the step's 25 folded GEMVs at B = 1 (338 -> ~313 us), more at
//   B = 32 (three rows a warp, each now one trip). Same numerics as stage 6.
// Stage 8 (GEMV_EARLY_OPERANDS): stage 7 with the epilogue's operands (the bias, the residual) read
//   right after the wait, into the registers of the threads that will store, instead of after the
//   reduction. Why: in the decode step's chain (decode-step stage 10, B = 1) the residual GEMVs
//   (attention projection, MLP down) return 1.8 us after their products against 0.9 us for the
//   others: the residual's L2 round trip waits behind the sums. Predicted: ~0.7 us off each of the
//   24 residual GEMVs and a little off the others' bias (~-17 us a step at B = 1); alone, nothing
//   (the trip overlaps other warps' work there, gemv-fp8's notes).
// Stage 9 (GEMV_RESIDENT_TILES): stage 8 with blocks resident over the row tiles. The grid is as many
//   blocks as fit on the GPU at once (at most the tiles, balanced so that every block walks the same
//   number), block b takes tiles b, b + gridDim.x, ..., the first pass of W of the tile after the
//   current one is copied into a second buffer (cp.async) under the current one's products and
//   epilogue, a folded LayerNorm's rows are staged once a block, and a picking store's words are held
//   in registers until the block's last tile (one atomicMax a block and row, not a tile and row). Why:
//   the decode step's LM head (3144 tiles at 8 warps and 60 registers: 4 blocks an SM, six waves) pays
//   each block's own start, row statistics and epilogue with no weights in flight, and a slot passes
//   to the next wave only when its block returns, so every wave starts after the slowest epilogue
//   of the one before (docs/notes/gpt2.md, decode-step 15: 2.3 us of its 23.7 us link at B = 1). A
//   resident block keeps a tile's bytes in flight through all of that. Predicted: the LM head alone
//   1.05-1.10x stage 8, every GEMV of fewer tiles than fit at once (the step's others) the same, and
//   the batch-1 decode step ~3 us less (decode-step 16). Measured (H200): the LM head alone 0.94x
//   (26.3 against 24.7 us; DRAM 65% against 69% of peak, the walk's per-tile block barriers the
//   largest stall), 2.07x at M = 32 (43.8 against 90.6 us: the rows, below), the others 0.98x (the
//   walk's code, not run, costs 6 registers); in the decode step
//   (decode-step 16) the LM head's link after its wait 22.1 -> 20.7 us at B = 1, but its release
//   1.5 -> 2.1 us: the step 1.00x at B = 1 and 8, and 1.04x at B = 32 (876.7 -> 843.2 us), where a
//   tile's 32 staged LayerNorm rows (96 KB read from L2) outweigh its 24 KB of weights and a
//   resident block reads them once for its 24 tiles instead of once a tile.
// GEMV_MERGE_SPLITS (a host switch of stages 7-9, the decode step's attention projection at
//   `decode-step` 14) adds the gemv_mma_merge_m* entries: inp is split-K decode attention's partials
//   (o, m, l per row, head and split), merged by every block into its staged bf16 rows, so the
//   attention needs no ticket or merging block. Constraints: D = K / heads a multiple of 32, splits
//   <= 32.
// GEMV_QKV_APPEND (a host switch of the decode step's QKV linear, `decode-step` stage 7) adds the
//   gemv_mma_ln_qkv_m* entries: the folded QKV linear whose epilogue does kv-append's work (q to a
//   bf16 row, k and v into the cache cell of each row's sequence and position), so the step runs one
//   kernel fewer a layer and the fp32 QKV row never reaches memory.
// GEMV_PICKS (a host switch of a folding stage, the decode step's LM head at `decode-step` 15) adds
//   the gemv_mma_ln_pick_m* entries: the epilogue also takes each row's greedy pick over its first V
//   columns as a 64-bit word (ladder_pick.cuh) and merges it into one of row m's kPickSlots words
//   with one atomicMax a block and row, so the argmax after it reads B rows of 32 words, not B rows
//   of 50257 logits. Why: in the decode
//   step's chain the argmax is a link of ~5-6 us (its own scan, a fence and ticket, the merge); with
//   the picks made by the LM head that link is one L2 read. Constraints: V <= N, picks zero before
//   the launch (the reader resets them), M * kPickSlots * kPickStride of them.
// Launch: gemv_mma_m{8,16,32,64} and gemv_mma_bf16_m{...} (fp32 / bf16 inp; MT = M rounded up to a power of two, >= 8): grid ceil(N / 16)
//   (stage 9: ceil(tiles / ceil(tiles / resident)), resident = the entry's blocks an SM times the SMs),
//   block 32 * split (4 <= split <= 32); dynamic shared memory split * 16 * 8 floats (the partial
//   tiles are reduced one 8-column tile at a time), and with GEMV_EARLY_WEIGHTS split * pieces *
//   1 KiB more (stage 9: twice where the grid is smaller than the tiles), pieces = min(GEMV_UNROLL, ceil(ceil(K / 32) / split)) (each warp's staged first pass),
//   and with GEMV_STAGED_ROWS on a folded entry M rows of staged_row_pitch(K) bf16 after those (the
//   tile's padding rows M .. MT - 1 are never staged or read).
// Constraints: 1 <= M <= 64; K % 8 == 0 (16-byte pieces of W and inp); N * K < 2^31; a folded
//   LayerNorm reads fp32 inp; with GEMV_STAGED_ROWS a folded LayerNorm's K <= 128 * GEMV_STAGED_ROWS
//   (the host sets ceil(K / 128); past 13, K > 1664, the row's registers spill); the QKV entries: N % 3 == 0, seq and pos within the caches (checked by their owner on the
//   host).
// Tolerance: 1e-2 preset (inp is rounded to bf16 here, W already is; fp32 accumulation).
// Limits: M <= 64; N * K < 2^31; K % 8 == 0
#include "matmul_gemv_mma.cuh"
#include "ladder_dependent.cuh"
#include "ladder_split_merge.cuh"
#include "ladder_pick.cuh"

#ifndef GEMV_UNROLL
#define GEMV_UNROLL 4
#endif

// Stage 6's part: the first pass of W staged in shared memory before the dependent-launch wait.
#ifdef GEMV_EARLY_WEIGHTS
constexpr bool kEarlyWeights = true;
#else
constexpr bool kEarlyWeights = false;
#endif

// Stage 7's part: a folded LayerNorm's rows read once and staged in shared memory as bf16 (x - mean);
// GEMV_STAGED_ROWS is the float4 a lane holds of a row (the host's ceil(K / 128)).
#ifdef GEMV_STAGED_ROWS
constexpr int kRowVecs = GEMV_STAGED_ROWS;
#else
constexpr int kRowVecs = 0;
#endif
constexpr bool kStagedRows = kRowVecs > 0;

// Stage 8's part: the epilogue's operands read right after the wait.
#ifdef GEMV_EARLY_OPERANDS
constexpr bool kEarlyOperands = true;
#else
constexpr bool kEarlyOperands = false;
#endif
// Stage 9's part: blocks resident over the row tiles. The host launches as many blocks as fit on the
// GPU at once (no more than the tiles), block b takes tiles b, b + gridDim.x, ..., and the next tile's
// first pass of W is copied into a second buffer while this one's is in use.
#ifdef GEMV_RESIDENT_TILES
constexpr bool kResidentTiles = true;
#else
constexpr bool kResidentTiles = false;
#endif

// A folded entry of stage 7 holds a row's registers besides the fragments'; the bound keeps the
// narrow tiles (MT <= 16, up to 32 warps a block) launchable at 1024 threads and at two blocks of
// 16 warps an SM (64 registers), the wide ones (at most 8 warps) as they are.
#if defined(GEMV_STAGED_ROWS)
#define GEMV_LN_BOUNDS(MT) __launch_bounds__((MT) <= 16 ? 1024 : 256)
#else
#define GEMV_LN_BOUNDS(MT)
#endif
// Stage 9's walk holds a tile's state across the loop (84 registers at MT = 8 unbounded), and the host
// launches the narrow tiles at up to 32 warps: every entry takes the folded ones' bound.
#if defined(GEMV_RESIDENT_TILES)
#define GEMV_BOUNDS(MT) GEMV_LN_BOUNDS(MT)
#else
#define GEMV_BOUNDS(MT)
#endif

// StoreQkvAppend (GEMV_QKV_APPEND, the decode step's QKV linear): kv-append in the epilogue. Row m
// of out is [q | k | v] of C each; q goes to q_out[m] as bf16, k and v as bf16 into cell (seq[m],
// pos[m]) of the contiguous [B, Tmax, C] caches: what kv-append stage 0 does with the fp32 row, the
// same roundings, without the row ever reaching memory.
struct StoreQkvAppend {
    static constexpr bool kPicks = false;
    __nv_bfloat16* q_out;
    __nv_bfloat16* k_cache;
    __nv_bfloat16* v_cache;
    const int* seq;
    const int* pos;
    const float* bias;
    int C, Tmax;
    __device__ __forceinline__ float operator()(int m, int n, float s) const { return (*this)(m, n, s, operands(m, n)); }
    // Stage 8's halves (StoreRows'): the bias read ahead, then the stores.
    __device__ __forceinline__ float2 operands(int, int n) const { return make_float2(bias[n], 0.0f); }
    __device__ __forceinline__ float operator()(int m, int n, float s, float2 ops) const {
        const __nv_bfloat16 x = __float2bfloat16_rn(s + ops.x);
        const int part = n / C, c = n - part * C;
        if (part == 0) {
            q_out[(size_t)m * C + c] = x;
        } else {
            const size_t cell = ((size_t)seq[m] * Tmax + pos[m]) * C + c;
            (part == 1 ? k_cache : v_cache)[cell] = x;
        }
        return __bfloat162float(x);
    }
};

// StorePicking (GEMV_PICKS, the decode step's LM head): StoreRows' stores, and each row m of out's
// greedy pick over its columns n < V merged into row m's pick words (ladder_pick.cuh: the block's
// slot of kPickSlots, zero before the launch): each stored value offered as a word (0: none), the
// words held by the storing threads (HeldPicks), then one atomicMax a block and row, which nothing
// waits for. The kernel after it reads B rows of kPickSlots words instead of scanning B rows of
// logits.
struct StorePicking : StoreRows {
    static constexpr bool kPicks = true;
    unsigned long long* picks;
    int V;
    __device__ __forceinline__ unsigned long long offer(int, int n, bool valid, float v) const {
        return valid && n < V && pick_candidate(v) ? pick_word(v, n) : 0ull;
    }
};

// Where inp's rows come from: as they lie in memory (RowsInMemory; a folded LayerNorm's are then
// staged or read twice, above), or merged from split-K attention's partials (MergedSplits,
// GEMV_MERGE_SPLITS): the decode step's attention projection merges the splits of the attention
// before it, in its own prologue, where the attention's last block would have.
struct RowsInMemory {
    static constexpr bool kMerged = false;
};
struct MergedSplits {
    static constexpr bool kMerged = true;
    // Decode attention's partials of row m * heads + h (ladder_split_merge.cuh's SplitArrays): o
    // [rows][splits][D] unnormalized, m and l [rows][splits], written by the previous kernel.
    const float* o;
    const float* m;
    const float* l;
    int splits, heads;
};

// A warp's row of partials: lane s holds split s's maximum and sum, which the merge takes by
// shuffles. Every warp of every block reads each split's m and l, and as plain loads those are a
// few L2 lines that every warp of the grid asks for at once, a request a split each; this way a warp
// makes two requests (one line of m, one of l), issued with its o loads. All 32 lanes must be in the
// same row and head (D % 32 == 0) and splits <= 32 (checked on the host).
struct WarpSplits {
    const float* o;
    float m_lane, l_lane;
    int D;
    __device__ __forceinline__ float m(int s) const { return __shfl_sync(0xffffffffu, m_lane, s); }
    __device__ __forceinline__ float l(int s) const { return __shfl_sync(0xffffffffu, l_lane, s); }
    // Through L2 (__ldcg): the kernel before wrote them, and this one may have started beside it.
    __device__ __forceinline__ float o_at(int s, int d) const { return __ldcg(o + (size_t)s * D + d); }
    __device__ __forceinline__ static float weight(float ms, float mx) { return __expf(ms - mx); }
    static constexpr bool zeros_when_empty = false;
};

// Rows m < M of the attention output [M, heads * D] merged from the split partials into rows[m *
// pitch ...], as bf16 for the fragments: decode attention's own merge (merge_column_batched, the
// same sums as its 16 splits a round trip for up to 8 splits, as at GPT-2's batch 1, so the same
// bf16 values its last block would have stored). A chunk's loads are requested together: one L2
// round trip. 8, not 16: a 16-split chunk's 48 values took the entry to 128 registers, past what 32
// warps a block can hold. Whole warps take 32 consecutive columns (K % 32 == 0).
constexpr int kMergeChunk = 8;
__device__ __forceinline__ void stage_merged_rows(__nv_bfloat16* staged, const MergedSplits& p, int M, int K) {
    const int pitch = staged_row_pitch(K), D = K / p.heads, lane = threadIdx.x & 31;
    for (int idx = threadIdx.x; idx < M * K; idx += blockDim.x) {
        const int m = idx / K, k = idx - m * K, h = k / D, d = k - h * D;
        const size_t row = (size_t)m * p.heads + h;
        const bool mine = lane < p.splits;
        const WarpSplits split{p.o + row * p.splits * D, mine ? __ldcg(p.m + row * p.splits + lane) : -INFINITY,
                               mine ? __ldcg(p.l + row * p.splits + lane) : 0.0f, D};
        staged[(size_t)m * pitch + k] = __float2bfloat16_rn(merge_column_batched<kMergeChunk>(split, p.splits, d, false).value);
    }
}

template <int MT, bool LN = false, typename In, typename Store, typename Rows = RowsInMemory>
__device__ __forceinline__ void gemv_skinny_mma(const Store& store, const In* inp, const __nv_bfloat16* w, int M,
                                                int N, int K, const Rows& merged = Rows{}) {
    LADDER_CHAIN_BLOCK();
    constexpr int TILES = MT / 8;
    static_assert(!kResidentTiles || kEarlyWeights, "stage 9's walk copies each tile's first pass ahead");
    extern __shared__ float part[];  // [split][16][8]; stage 6: then [buffers][split][pieces][2][32] uint4
    const int split = blockDim.x >> 5;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int steps = (K + 31) / 32;
    // The block's row tiles of 16: blockIdx.x alone, or with stage 9's walk every gridDim.x-th after it.
    const int row_tiles = (N + 15) / 16;
    const int tile_stride = kResidentTiles ? gridDim.x : row_tiles;
    // Stage 6: piece u < pieces of rows g and g + 8 of this warp's first pass (the most steps any
    // warp of the block has in it), lane by lane, in one buffer (stage 9: two, a tile's each).
    const int pieces = min(GEMV_UNROLL, (steps + split - 1) / split);
    uint4* const first_pass = reinterpret_cast<uint4*>(part + split * 128);
    auto buffer = [&](int b) { return first_pass + (b * split + warp) * pieces * 64; };
    // A tile's rows of W (a row past N reads row 0, and its pieces are zero-filled or never loaded).
    struct TileRows {
        int n0;
        bool a, b;
        const __nv_bfloat16* wa;
        const __nv_bfloat16* wb;
    };
    auto tile_rows = [&](int tile) {
        const int n0 = tile * 16;
        const bool a = n0 + g < N, b = n0 + g + 8 < N;
        return TileRows{n0, a, b, w + (size_t)(a ? n0 + g : 0) * K, w + (size_t)(b ? n0 + g + 8 : 0) * K};
    };
    // Stage 6's copy of a tile's first pass into a buffer, one cp.async group a call (empty past the
    // last tile, so that every tile of the walk has its group).
    auto copy_first_pass = [&](uint4* staged, int tile) {
        if (tile < row_tiles) {
            const TileRows r = tile_rows(tile);
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; ++u) {
                if (u < pieces) {
                    const int k = 32 * (warp + u * split) + 8 * t;
                    const bool valid = warp + u * split < steps && k < K;
                    const unsigned a = (unsigned)__cvta_generic_to_shared(staged + (2 * u) * 32 + lane);
                    cp_async_16(a, r.wa + (valid ? k : 0), valid && r.a);
                    cp_async_16(a + 32 * 16, r.wb + (valid ? k : 0), valid && r.b);
                }
            }
        }
        cp_async_commit();
    };
    // Stage 7: the folded LayerNorm's M rows after every warp's pieces (the host reserves no more);
    // the merged rows of attention's splits in the same place. Stage 9 has the second buffer only
    // where a block walks more than one tile (the host's grid: fewer blocks than tiles).
    constexpr bool kRowsStaged = (kStagedRows && LN) || Rows::kMerged;
    const int buffers = kResidentTiles && tile_stride < row_tiles ? 2 : 1;
    __nv_bfloat16* rows =
        reinterpret_cast<__nv_bfloat16*>(first_pass + (kEarlyWeights ? buffers * split * pieces * 64 : 0));
    const int pitch = staged_row_pitch(K);
    int tile = blockIdx.x;
    if constexpr (kEarlyWeights) copy_first_pass(buffer(0), tile);
    // The next kernel may launch once this one runs (not before: a chain launched ahead of itself
    // would hold the SMs and the memory system for kernels far down the step).
    ladder_wait_prerequisites();
    ladder_launch_dependents();
    typename EarlyOperandsFor<kEarlyOperands, MT>::type early{};
    if constexpr (kEarlyOperands) early = early_operands<MT>(store, tile * 16, M, N);
    RowStats<MT, LN> stats;
    if constexpr (LN) {
        __shared__ float mean[MT], rstd[MT];
        if constexpr (kRowsStaged) {
            stage_ln_rows<kRowVecs>(rows, mean, rstd, inp, M, K, MT);
        } else {
            row_stats(mean, rstd, inp, M, K, MT);
        }
        __syncthreads();
        stats = {mean, rstd};
        ladder_chain_mark(0);
    }
    if constexpr (Rows::kMerged) {
        stage_merged_rows(rows, merged, M, K);
        __syncthreads();
        ladder_chain_mark(0);
    }
    // Stage 9: the second tile's copy after the wait and the rows, not before: a block's copies are
    // issued in order, and 48 KB of them ahead of the wait held its first wait left 2 us behind the
    // previous kernel's end in the decode step (the row loads would queue behind them too).
    if constexpr (kResidentTiles) copy_first_pass(buffer(1), tile + tile_stride);
    HeldPicks<MT> held;
    for (int turn = 0; tile < row_tiles; ++turn, tile += tile_stride) {
        const TileRows r = tile_rows(tile);
        if constexpr (kEarlyWeights) {
            // Each lane reads back only the pieces it copied itself: its own wait is enough (and every
            // thread waits, so none leaves with a copy into shared memory in flight). Stage 9 leaves
            // the next tile's group in flight (an empty group past the last tile, so the count holds).
            cp_async_wait<kResidentTiles ? 1 : 0>();
            asm volatile("" ::: "memory");
        }
        float acc[TILES][4];
#pragma unroll
        for (int i = 0; i < TILES; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

        // One pass: GEMV_UNROLL 32-wide steps of K from s0 on, their pieces of W in wa / wb.
        auto pass = [&](const uint4 (&wa)[GEMV_UNROLL], const uint4 (&wb)[GEMV_UNROLL], int s0) {
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; ++u) {
                const int k = 32 * (s0 + u * split) + 8 * t;
                const bool valid = s0 + u * split < steps && k < K;
#pragma unroll
                for (int i = 0; i < TILES; ++i) {
                    unsigned b[2][2];
                    if constexpr (kRowsStaged) {
                        inp_fragments(b, static_cast<const __nv_bfloat16*>(rows), 8 * i + g, M, k, valid, pitch);
                    } else if constexpr (LN) {
                        inp_fragments(b, inp, 8 * i + g, M, k, valid, K, stats.mean(8 * i + g));
                    } else {
                        inp_fragments(b, inp, 8 * i + g, M, k, valid, K);
                    }
                    // k16 step 0 takes elements 0-3 of the piece, step 1 elements 4-7.
                    mma_16816<__nv_bfloat16>(acc[i], wa[u].x, wb[u].x, wa[u].y, wb[u].y, b[0][0], b[0][1]);
                    mma_16816<__nv_bfloat16>(acc[i], wa[u].z, wb[u].z, wa[u].w, wb[u].w, b[1][0], b[1][1]);
                }
            }
        };
        int first = warp;
        if constexpr (kEarlyWeights) {
            const uint4* staged = buffer(turn % 2);
            if (first < steps) {
                uint4 wa[GEMV_UNROLL], wb[GEMV_UNROLL];
#pragma unroll
                for (int u = 0; u < GEMV_UNROLL; ++u) {
                    const uint4 zero = make_uint4(0, 0, 0, 0);
                    wa[u] = u < pieces ? staged[(2 * u) * 32 + lane] : zero;
                    wb[u] = u < pieces ? staged[(2 * u + 1) * 32 + lane] : zero;
                }
                pass(wa, wb, first);
            }
            first += split * GEMV_UNROLL;
            // Stage 9: the buffer's pieces are in the products' registers, so it takes the tile after
            // next, whose copy runs under this tile's remaining passes and epilogue and the next tile.
            if constexpr (kResidentTiles) copy_first_pass(buffer(turn % 2), tile + 2 * tile_stride);
        }
        for (int s0 = first; s0 < steps; s0 += split * GEMV_UNROLL) {
            uint4 wa[GEMV_UNROLL], wb[GEMV_UNROLL];
            // All of this pass's loads of W first: they are what the kernel waits on.
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; ++u) {
                const int k = 32 * (s0 + u * split) + 8 * t;
                const bool valid = s0 + u * split < steps && k < K;
                const uint4 zero = make_uint4(0, 0, 0, 0);
                wa[u] = valid && r.a ? *reinterpret_cast<const uint4*>(r.wa + k) : zero;
                wb[u] = valid && r.b ? *reinterpret_cast<const uint4*>(r.wb + k) : zero;
            }
            pass(wa, wb, s0);
        }
        ladder_chain_mark(1);
        if constexpr (kEarlyOperands) {
            gemv_mma_reduce(acc, part, stats, store, r.n0, M, N, early, &held);
            // Stage 9: the next tile's operands, requested before its products as the first tile's were.
            if (kResidentTiles && tile + tile_stride < row_tiles) {
                early = early_operands<MT>(store, (tile + tile_stride) * 16, M, N);
            }
        } else {
            gemv_mma_reduce(acc, part, stats, store, r.n0, M, N, NoEarlyOperands{}, &held);
        }
        if constexpr (!kResidentTiles) break;  // stages 4-8: the block's one tile
    }
    if constexpr (Store::kPicks) held.merge(store.picks);
}

#define GEMV_MMA_ENTRY(MT)                                                                                  \
    extern "C" __global__ void GEMV_BOUNDS(MT) gemv_mma_m##MT(float* out, const float* inp, const __nv_bfloat16* w,         \
                                              const float* bias, const float* residual, int tail, int M,    \
                                              int N, int K) {                                               \
        gemv_skinny_mma<MT>(StoreRows{out, bias, residual, tail, N}, inp, w, M, N, K);                      \
    }                                                                                                       \
    extern "C" __global__ void GEMV_BOUNDS(MT) gemv_mma_bf16_m##MT(float* out, const __nv_bfloat16* inp,                    \
                                                   const __nv_bfloat16* w, const float* bias,               \
                                                   const float* residual, int tail, int M, int N, int K) {  \
        gemv_skinny_mma<MT>(StoreRows{out, bias, residual, tail, N}, inp, w, M, N, K);                      \
    }
GEMV_MMA_ENTRY(8)
GEMV_MMA_ENTRY(16)
GEMV_MMA_ENTRY(32)
GEMV_MMA_ENTRY(64)

#ifdef GEMV_LN_FOLD
// inp: the raw fp32 residual stream x; w, bias: the LayerNorm-folded W' and bias' (see the header).
#define GEMV_MMA_LN_ENTRY(MT)                                                                               \
    extern "C" __global__ void GEMV_LN_BOUNDS(MT) gemv_mma_ln_m##MT(float* out, const float* inp, const __nv_bfloat16* w,      \
                                                 const float* bias, const float* residual, int tail, int M, \
                                                 int N, int K) {                                            \
        gemv_skinny_mma<MT, true>(StoreRows{out, bias, residual, tail, N}, inp, w, M, N, K);                \
    }
GEMV_MMA_LN_ENTRY(8)
GEMV_MMA_LN_ENTRY(16)
GEMV_MMA_LN_ENTRY(32)
GEMV_MMA_LN_ENTRY(64)
#endif

#if defined(GEMV_MERGE_SPLITS) && defined(GEMV_STAGED_ROWS)
// The attention projection reading decode attention's split partials (MergedSplits): out = merge(o,
// m, l) . W^T + bias, then the tail; K = heads * D.
#define GEMV_MMA_MERGE_ENTRY(MT)                                                                            \
    extern "C" __global__ void GEMV_LN_BOUNDS(MT) gemv_mma_merge_m##MT(float* out, const float* o_part, const float* m_part,   \
                                                    const float* l_part, int splits, int heads,             \
                                                    const __nv_bfloat16* w, const float* bias,              \
                                                    const float* residual, int tail, int M, int N, int K) { \
        const MergedSplits merged{o_part, m_part, l_part, splits, heads};                                   \
        gemv_skinny_mma<MT>(StoreRows{out, bias, residual, tail, N}, (const __nv_bfloat16*)nullptr, w, M, N, \
                            K, merged);                                                                     \
    }
GEMV_MMA_MERGE_ENTRY(8)
GEMV_MMA_MERGE_ENTRY(16)
GEMV_MMA_MERGE_ENTRY(32)
GEMV_MMA_MERGE_ENTRY(64)
#endif

#if defined(GEMV_PICKS) && defined(GEMV_LN_FOLD)
// The LM head with ln_f folded in and the greedy picks in the epilogue (StorePicking): out as
// gemv_mma_ln_m*'s, and picks[m] the word of row m's argmax over its first V columns.
#define GEMV_MMA_PICK_ENTRY(MT)                                                                             \
    extern "C" __global__ void GEMV_LN_BOUNDS(MT) gemv_mma_ln_pick_m##MT(float* out, unsigned long long* picks, int V,        \
                                                      const float* inp, const __nv_bfloat16* w,             \
                                                      const float* bias, const float* residual, int tail,   \
                                                      int M, int N, int K) {                                \
        const StorePicking store{{out, bias, residual, tail, N}, picks, V};                                 \
        gemv_skinny_mma<MT, true>(store, inp, w, M, N, K);                                                  \
    }
GEMV_MMA_PICK_ENTRY(8)
GEMV_MMA_PICK_ENTRY(16)
GEMV_MMA_PICK_ENTRY(32)
GEMV_MMA_PICK_ENTRY(64)
#endif

#if defined(GEMV_QKV_APPEND) && defined(GEMV_LN_FOLD)
// The QKV linear with ln_1 folded in and kv-append in the epilogue (StoreQkvAppend): N = 3C.
#define GEMV_MMA_QKV_ENTRY(MT)                                                                              \
    extern "C" __global__ void GEMV_LN_BOUNDS(MT) gemv_mma_ln_qkv_m##MT(__nv_bfloat16* q_out, __nv_bfloat16* k_cache,          \
                                                     __nv_bfloat16* v_cache, const int* seq, const int* pos, \
                                                     int Tmax, const float* inp, const __nv_bfloat16* w,    \
                                                     const float* bias, int M, int N, int K) {              \
        const StoreQkvAppend store{q_out, k_cache, v_cache, seq, pos, bias, N / 3, Tmax};                   \
        gemv_skinny_mma<MT, true>(store, inp, w, M, N, K);                                                  \
    }
GEMV_MMA_QKV_ENTRY(8)
GEMV_MMA_QKV_ENTRY(16)
GEMV_MMA_QKV_ENTRY(32)
GEMV_MMA_QKV_ENTRY(64)
#endif
