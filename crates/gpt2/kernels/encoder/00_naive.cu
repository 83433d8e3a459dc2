// GPT-2 encoder (token + position embedding), stage 0: naive.
// Changed from previous: - (baseline).
// What it does: out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :]; one thread per output element, the
//   token id re-read by every one of the C threads of its row.
// Why it is the baseline: scalar 4-byte accesses; the floor is reading one wte row and one wpe row
//   and writing one out row per token (12 bytes per element).
// Launch: encoder_forward: grid ceil(B*T*C/ENC_THREADS), block ENC_THREADS; encoder_at (one
//   position per row, below): grid ceil(R*C/ENC_THREADS), block ENC_THREADS (tunable: 256 declared;
//   swept over 27..1000, the thread counts of the report's 3x3x3..10x10x10 blocks).
// Constraints: B*T*C < 2^31; T <= rows of wpe (checked in Rust); 0 <= tokens < V, checked on the
//   host when the ids are uploaded: `TokenIds::upload` is the only way to make the ids the Rust API
//   takes. Tolerance: exact (fp32 add), checked at 1e-5.
// Limits: B * T * C < 2^31
#ifndef ENC_THREADS
#error "ENC_THREADS (threads per block) is the stage's tunable: the Rust plan passes it"
#endif

extern "C" __global__ void __launch_bounds__(ENC_THREADS)
    encoder_forward(float* out, const int* tokens, const float* wte, const float* wpe, int B, int T, int C) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * T * C) return;
    int c = idx % C;
    int bt = idx / C;
    int t = bt % T;
    int token = tokens[bt];
    out[idx] = wte[(size_t)token * C + c] + wpe[(size_t)t * C + c];
}

// The same with each row's position given (a decode step: one row per sequence, each at its own
// position): out[r,:] = wte[tokens[r], :] + wpe[positions[r], :], positions checked on the host.
extern "C" __global__ void __launch_bounds__(ENC_THREADS)
    encoder_at(float* out, const int* tokens, const int* positions, const float* wte, const float* wpe, int R, int C) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= R * C) return;
    int c = idx % C, r = idx / C;
    out[idx] = wte[(size_t)tokens[r] * C + c] + wpe[(size_t)positions[r] * C + c];
}
