// ladder_timeline.cuh: phase stamps written by a kernel itself, read by `ladder timeline`.
// With LADDER_TIMELINE defined (the instrument compiles the stage with -DLADDER_TIMELINE=1),
// ladder_stamp(slot) writes %globaltimer (nanoseconds, one clock for every SM) into
// ladder_timeline[blockIdx.x][slot]. Without it ladder_stamp is nothing, so a stage's own build is
// the same with or without its stamps. The instrument zeroes the array before every run: a slot left
// 0 was not reached. A stamp records when its thread issued the instruction, not when memory
// operations before it completed. A kernel that stamps names its slots on one `// Timeline:` line of
// its sources ("0 first phase; 1 next phase; ..."), which the instrument reads.
// Limits: blocks past LADDER_TIMELINE_BLOCKS are not stamped; slots 0 .. LADDER_TIMELINE_SLOTS - 1.
#pragma once

#define LADDER_TIMELINE_SLOTS 32
#define LADDER_TIMELINE_BLOCKS 1024

#ifdef LADDER_TIMELINE
__device__ unsigned long long ladder_timeline[LADDER_TIMELINE_BLOCKS * LADDER_TIMELINE_SLOTS];

__device__ __forceinline__ void ladder_stamp(int slot) {
    unsigned long long ns;
    // The clobber keeps the compiler from moving memory accesses across the stamp.
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns)::"memory");
    if (blockIdx.x < LADDER_TIMELINE_BLOCKS) ladder_timeline[blockIdx.x * LADDER_TIMELINE_SLOTS + slot] = ns;
}
#else
#define ladder_stamp(slot) ((void)0)
#endif
