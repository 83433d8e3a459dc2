// ladder_dependent.cuh: programmatic dependent launch (sm_90) for kernels that run in a chain (the
// decode step's GEMVs, kv-append, decode attention, argmax).
// With LADDER_DEPENDENT defined, the host launches the kernel as a programmatic dependent of the
// kernel before it in the stream (`Gpu::prepare_launch` sets the launch attribute from the same
// define, so the two cannot disagree), and:
//   - ladder_launch_dependents() lets the next kernel's blocks start as soon as every block of this
//     one has executed it (a hint: nothing of this kernel's output is visible to them yet);
//   - ladder_wait_prerequisites() blocks until the previous grid has completed and its memory
//     operations are visible. Every thread calls it before it reads anything an earlier kernel of
//     the step writes and before it writes anything an earlier kernel reads; what it may do before:
//     read memory nothing in the chain writes (weights). Since every kernel of a chain waits, the
//     wait orders it after all earlier kernels, not only the last.
// Order: the wait, then the trigger. Triggered before its own wait, a kernel lets the next one launch
// and trigger too, so the whole chain comes resident ahead of the kernel that runs, holding
// registers and shared memory and prefetching far ahead (measured on the decode step: 0.89-0.90x
// stage 0 at B = 8 and 32). After the wait at most one kernel is waiting behind the running one.
// Without the define both are nothing: a stage's ordinary build is unchanged.
//
// The chain's timeline (`ladder timeline` on a composed stage; the host adds LADDER_CHAIN_TIMELINE
// to every dependent build): a chain kernel declares LADDER_CHAIN_BLOCK() at the top of its body
// and may mark two points of its own with ladder_chain_mark(0 or 1). Thread 0 of each block stamps
// %globaltimer (ns, one clock for every SM) when the block starts, when it enters and leaves the
// wait, at the marks and when it returns (the object's destructor: every return path), then takes
// the module's next ticket and writes its record there. Blocks of one launch take consecutive
// tickets: a later launch of the same module passes its wait only after this one has completed.
// Without the define the three are nothing.
// Limits: sm_90 for the instructions (the host refuses a dependent launch below compute capability 9.0).
#pragma once

#if defined(LADDER_DEPENDENT) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)
#define LADDER_DEPENDENT_ON 1
#endif

#if defined(LADDER_DEPENDENT_ON) && defined(LADDER_CHAIN_TIMELINE)
// A block's record: start, wait entered, wait left, mark 0, mark 1, return (ns; 0 where not
// reached), the launch's blocks, the block's SM.
#define LADDER_CHAIN_RECORDS 65536
#define LADDER_CHAIN_FIELDS 8
__device__ unsigned ladder_chain_tickets;
__device__ unsigned long long ladder_chain[LADDER_CHAIN_RECORDS * LADDER_CHAIN_FIELDS];
// Thread 0's stamps between the start and the return: wait entered, wait left, mark 0, mark 1.
__shared__ unsigned long long ladder_chain_stamps[4];

__device__ __forceinline__ unsigned long long ladder_chain_now() {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns)::"memory");
    return ns;
}
__device__ __forceinline__ bool ladder_chain_stamper() { return (threadIdx.x | threadIdx.y | threadIdx.z) == 0; }
__device__ __forceinline__ void ladder_chain_stamp(int i) {
    if (ladder_chain_stamper()) ladder_chain_stamps[i] = ladder_chain_now();
}

struct LadderChainBlock {
    unsigned long long start;
    __device__ LadderChainBlock() : start(ladder_chain_now()) {
        if (ladder_chain_stamper()) {
#pragma unroll
            for (int i = 0; i < 4; ++i) ladder_chain_stamps[i] = 0;
        }
    }
    __device__ ~LadderChainBlock() {
        if (!ladder_chain_stamper()) return;
        const unsigned long long done = ladder_chain_now();
        const unsigned t = atomicAdd(&ladder_chain_tickets, 1u);
        if (t >= LADDER_CHAIN_RECORDS) return;  // the host sees the count pass the records
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        unsigned long long* r = ladder_chain + (size_t)t * LADDER_CHAIN_FIELDS;
        r[0] = start;
#pragma unroll
        for (int i = 0; i < 4; ++i) r[1 + i] = ladder_chain_stamps[i];
        r[5] = done;
        r[6] = (unsigned long long)gridDim.x * gridDim.y * gridDim.z;
        r[7] = smid;
    }
};
#define LADDER_CHAIN_BLOCK() const LadderChainBlock ladder_chain_block_
#define ladder_chain_mark(i) ladder_chain_stamp(2 + (i))
#else
#define LADDER_CHAIN_BLOCK() ((void)0)
#define ladder_chain_mark(i) ((void)0)
#define ladder_chain_stamp(i) ((void)0)
#endif

#ifdef LADDER_DEPENDENT_ON
__device__ __forceinline__ void ladder_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void ladder_wait_prerequisites() {
    ladder_chain_stamp(0);
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    ladder_chain_stamp(1);
}
#else
__device__ __forceinline__ void ladder_launch_dependents() {}
__device__ __forceinline__ void ladder_wait_prerequisites() {}
#endif
