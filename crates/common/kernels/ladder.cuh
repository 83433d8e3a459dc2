// ladder.cuh: the base header every kernel may include. NVRTC compiles without the host C library,
// so the few constants the kernels need are defined here.
#pragma once

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
