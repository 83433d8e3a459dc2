// ladder_recipe.cuh: how a kernel file whose rungs are recipes of typed parts reads the stage
// list's switches. A switch is a -D define set to 1 (Rust's `Define::on`), absent when off.
//   LADDER_SWITCH(X)   whether switch X is on, as a constant (no #ifdef needed where it is read);
//   Pick<ON, T, F>     part T where ON is nonzero, else part F: a recipe's line per role, e.g.
//                      using Epilogue = Pick<LADDER_SWITCH(EPI_STAGED), EpiStaged, EpiBiasSmem>;
// A last rung that picks each part by its switch gets its leave-one-out rows (one switch off) as
// its recipe with that part swapped for its predecessor.
#pragma once

#define LADDER_STRINGIFY_(x) #x
#define LADDER_STRINGIFY(x) LADDER_STRINGIFY_(x)
#define LADDER_SWITCH(x) ladder_switch_on(LADDER_STRINGIFY(x))
// The expansion of a switch's name: "1" when it is on; the name itself when it is not defined.
__host__ __device__ constexpr bool ladder_switch_on(const char* expansion) {
    return expansion[0] == '1' && expansion[1] == '\0';
}

template <int ON, class T, class F>
struct PickPart {
    using type = T;
};
template <class T, class F>
struct PickPart<0, T, F> {
    using type = F;
};
template <int ON, class T, class F>
using Pick = typename PickPart<ON, T, F>::type;
