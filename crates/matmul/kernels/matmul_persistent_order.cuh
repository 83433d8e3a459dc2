// matmul_persistent_order.cuh: the persistent GEMM's tile order (which tile a block takes next).
// A part has one signature: coords(tile, tiles_m, tiles_n, tm, tn), the (row, column) of the walk's
// tile `tile`.
#pragma once
#include "matmul_persistent_tile.cuh"

// WS_GROUP_M row panels at a time, column by column, so a W tile is reused by the group's row panels
// while it is in L2. WS_GROUP_M is a tunable (8 declared) or, where the host fits it per shape to
// the L2 (stage 16's host switch WS_GROUP_FIT, `group_fit`), a define: the kernel reads only it.
struct GroupedOrder {
    __device__ __forceinline__ static void coords(int tile, int tiles_m, int tiles_n, int& tm, int& tn) {
        const int per_group = WS_GROUP_M * tiles_n;
        const int first = (tile / per_group) * WS_GROUP_M;
        const int rows = min(tiles_m - first, WS_GROUP_M);
        const int in_group = tile % per_group;
        tm = first + in_group % rows;
        tn = in_group / rows;
    }
};
