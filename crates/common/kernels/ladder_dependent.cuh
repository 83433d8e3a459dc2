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
// Limits: sm_90 for the instructions (the host refuses a dependent launch below compute capability 9.0).
#pragma once

#if defined(LADDER_DEPENDENT) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900)
__device__ __forceinline__ void ladder_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void ladder_wait_prerequisites() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
#else
__device__ __forceinline__ void ladder_launch_dependents() {}
__device__ __forceinline__ void ladder_wait_prerequisites() {}
#endif
