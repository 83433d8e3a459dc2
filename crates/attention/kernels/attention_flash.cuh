// attention_flash.cuh: the tile geometry the FlashAttention-2 prefill stages share. FA_BR query rows
// and FA_BC key columns per tile, one thread per score: FA_BR * FA_BC threads. The values come from
// the stage list as defines.
#pragma once

#if !defined(FA_BR) || !defined(FA_BC)
#error "FA_BR, FA_BC (query rows and key columns of a tile; FA_BR * FA_BC threads) are tunables: the stage list sets them"
#endif
// The thread-to-score mapping and the row reductions are written for 16 x 16 tiles.
static_assert(FA_BR == 16 && FA_BC == 16, "this kernel needs FA_BR = FA_BC = 16");
#define BR FA_BR
#define BC FA_BC
#define NTHREADS (FA_BR * FA_BC)
