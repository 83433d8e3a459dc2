// Harness, stage 2: the device-side finiteness check of a large output. An element is NaN or ±Inf
// exactly when all its exponent bits are set, so each thread tests its elements' bits against the
// exponent mask, and only a thread that found one touches the result: a clean output costs one
// read of its bytes on the device (about 0.3 ms for an 800 MB LM-head output on an H100), where
// copying it to the host and testing it there took about a second.
// Launch: a grid-stride loop, any grid and block. result[0] must be 0 and result[1] all ones before
// the launch; after it, result[0] is the count of non-finite elements and result[1] the index of the
// first (all ones when there is none).
// Limits: none (indices are 64-bit). Tolerance: exact (an integer count).

template <typename Bits>
__device__ void count_non_finite(const Bits* x, unsigned long long n, Bits exponent,
                                 unsigned long long* result) {
    unsigned long long count = 0, first = ~0ull;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if ((x[i] & exponent) == exponent) {
            // A thread's indices ascend, so its first hit is its smallest.
            if (count == 0) first = i;
            count++;
        }
    }
    if (count != 0) {
        atomicAdd(&result[0], count);
        atomicMin(&result[1], first);
    }
}

extern "C" __global__ void ladder_non_finite_b16(const unsigned short* x, unsigned long long n,
                                                 unsigned int exponent, unsigned long long* result) {
    count_non_finite<unsigned short>(x, n, (unsigned short)exponent, result);
}

extern "C" __global__ void ladder_non_finite_b32(const unsigned int* x, unsigned long long n,
                                                 unsigned int exponent, unsigned long long* result) {
    count_non_finite<unsigned int>(x, n, exponent, result);
}

extern "C" __global__ void ladder_non_finite_b64(const unsigned long long* x, unsigned long long n,
                                                 unsigned long long exponent, unsigned long long* result) {
    count_non_finite<unsigned long long>(x, n, exponent, result);
}
