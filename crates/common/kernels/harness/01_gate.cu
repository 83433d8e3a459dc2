// Harness, stage 1: the gate. One thread spins until the host sets a flag in mapped page-locked
// memory, so the launches queued behind it on the stream start back to back once the host has
// enqueued them all: events recorded between them then time the device, not the host's launch rate
// (`ladder run gpt2 --op model`'s per-op breakdown of a decode step).
// Launch: grid 1, block 1. Tolerance: nothing is verified.
// Limits: none (the host must open the gate: `common::timing::Gate` does on every path).

extern "C" __global__ void ladder_gate(const volatile unsigned int* flag) {
    while (*flag == 0) {
        __nanosleep(2000);
    }
}
