// Linear layers for bfloat16 on CPUs with AVX-512 BF16: y = x @ W.T + b, every output one fixed sequence of
// float operations whatever the number of rows (models/packing.py packs the weights and calls it;
// engine/exact_kernel.py builds it into the same extension as exact_kernel.cpp).
//
//   tile_weight(W [N, K] bfloat16) -> [N/16, K/2, 16, 2]: block j holds output columns 16j..16j+15, and
//       for every pair of inputs (2k, 2k+1) their 16 x 2 weights, the layout vdpbf16ps reads in one load.
//   tiled_linear(x [..., K] bfloat16, tiled, bias [N] bfloat16 or none) -> [..., N] bfloat16:
//       out[m, n] = bf16(acc + bias[n]), acc = 0, then for k = 0, 2, 4, ..: acc = dpbf16(acc, x[m, k..k+1],
//       W[n, k..k+1]) (one vdpbf16ps lane: float32, the pair's products added to the running sum).
//
// So a row's outputs depend only on that row and the weights: not on how many rows share the call, which
// register tile computes them or how the columns are split between threads. That is what lookahead's
// exactness needs of a pass (README, "Lossless, exactly"); the bits differ from oneDNN's (another
// summation order), as a model runs them either way for every strategy alike.
//
// Why: a decode pass is a few rows against every weight, and oneDNN's small-row kernels ran SmolLM2-135M's
// linears at well under the memory bandwidth on 2 Zen 4 cores (4 rows: ~10 ms for 212 MB of weights).
// Here each weight is read once per call and the rows are applied to it from registers: the register
// tile is up to 8 column blocks by 3 rows, 4 by 6, 3 by 8 or 2 by 12 (24 float32 accumulators), widest
// for the fewest rows, and rows beyond a tile's take further passes over the same weights, from cache.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

namespace {

// `R` rows by `C` column blocks: x rows [R, K] (row stride ldx), the blocks' weights from wp (block
// stride bstride elements), out [R, 16 C] (row stride ldo), bias [16 C] or null.
template <int R, int C>
inline void tile(const at::BFloat16* x, int64_t ldx, const at::BFloat16* wp, int64_t pairs, int64_t bstride,
                 at::BFloat16* out, int64_t ldo, const at::BFloat16* bias) {
  __m512 acc[R][C];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < pairs; kp++) {
    __m512bh w[C];
    for (int c = 0; c < C; c++) w[c] = (__m512bh)_mm512_loadu_si512((const void*)(wp + c * bstride + kp * 32));
    for (int r = 0; r < R; r++) {
      int32_t pair;  // x[r, 2kp], x[r, 2kp + 1], broadcast to every lane
      std::memcpy(&pair, x + r * ldx + 2 * kp, sizeof pair);
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
      for (int c = 0; c < C; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xb, w[c]);
    }
  }
  for (int c = 0; c < C; c++) {
    __m512 b = _mm512_setzero_ps();
    if (bias != nullptr)  // bfloat16 -> float32 is exact: the bits shifted up
      b = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(bias + 16 * c))), 16));
    for (int r = 0; r < R; r++) {
      const __m512 v = bias != nullptr ? _mm512_add_ps(acc[r][c], b) : acc[r][c];
      _mm256_storeu_si256((__m256i*)(out + r * ldo + 16 * c), (__m256i)_mm512_cvtneps_pbh(v));
    }
  }
}

// Every row of x [M, K] against C column blocks, in tiles of the most rows that fit beside them.
template <int C>
void column_blocks(const at::BFloat16* x, int64_t M, int64_t K, const at::BFloat16* wp, int64_t pairs,
                   at::BFloat16* out, int64_t N, const at::BFloat16* bias) {
  constexpr int ROWS = C >= 8 ? 3 : C >= 4 ? 6 : C == 3 ? 8 : 12;  // <= 24 accumulators
  const int64_t bstride = pairs * 32;
  int64_t r = 0;
  for (; r + ROWS <= M; r += ROWS) tile<ROWS, C>(x + r * K, K, wp, pairs, bstride, out + r * N, N, bias);
  switch (M - r) {  // the remaining rows, one tile
#define LOOKAHEAD_TAIL(n) \
  case n:                 \
    if constexpr (n < ROWS) tile<n, C>(x + r * K, K, wp, pairs, bstride, out + r * N, N, bias); \
    break;
    LOOKAHEAD_TAIL(1) LOOKAHEAD_TAIL(2) LOOKAHEAD_TAIL(3) LOOKAHEAD_TAIL(4) LOOKAHEAD_TAIL(5) LOOKAHEAD_TAIL(6)
    LOOKAHEAD_TAIL(7) LOOKAHEAD_TAIL(8) LOOKAHEAD_TAIL(9) LOOKAHEAD_TAIL(10) LOOKAHEAD_TAIL(11)
#undef LOOKAHEAD_TAIL
    default:
      break;
  }
}

}  // namespace

bool linear_supported() { return true; }

at::Tensor tiled_linear(const at::Tensor& x, const at::Tensor& tiled, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && tiled.scalar_type() == at::kBFloat16 && tiled.dim() == 4 &&
                  tiled.size(2) == 16 && tiled.size(3) == 2 && tiled.is_contiguous(),
              "tiled_linear: bfloat16 x [..., K] and a tile_weight layout [N/16, K/2, 16, 2]");
  const int64_t K = x.size(-1), blocks = tiled.size(0), pairs = tiled.size(1), N = blocks * 16;
  TORCH_CHECK(K == 2 * pairs, "tiled_linear: x has ", K, " inputs, the weight ", 2 * pairs);
  const at::Tensor rows = x.reshape({-1, K}).contiguous();
  const int64_t M = rows.size(0);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = N;
  at::Tensor out = at::empty({M, N}, x.options());
  const at::BFloat16* b = nullptr;
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kBFloat16 && bias->numel() == N, "tiled_linear: bias must be bfloat16 [N]");
    bias_c = bias->contiguous();
    b = bias_c.data_ptr<at::BFloat16>();
  }
  if (M == 0) return out.view(sizes);
  const at::BFloat16* xp = rows.data_ptr<at::BFloat16>();
  const at::BFloat16* w = tiled.data_ptr<at::BFloat16>();
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  // The widest tile the rows allow; the threads split the column blocks (a unit: up to C blocks).
  const int C = M <= 3 ? 8 : M <= 6 ? 4 : M <= 8 ? 3 : 2;
  at::parallel_for(0, (blocks + C - 1) / C, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo * C; j < std::min(blocks, hi * C);) {
      const int64_t left = std::min<int64_t>(blocks, hi * C) - j;
      const at::BFloat16* wj = w + j * pairs * 32;
      at::BFloat16* oj = op + j * 16;
      const at::BFloat16* bj = b != nullptr ? b + j * 16 : nullptr;
      if (C == 8 && left >= 8) { column_blocks<8>(xp, M, K, wj, pairs, oj, N, bj); j += 8; }
      else if (C == 4 && left >= 4) { column_blocks<4>(xp, M, K, wj, pairs, oj, N, bj); j += 4; }
      else if (C == 3 && left >= 3) { column_blocks<3>(xp, M, K, wj, pairs, oj, N, bj); j += 3; }
      else if (C == 2 && left >= 2) { column_blocks<2>(xp, M, K, wj, pairs, oj, N, bj); j += 2; }
      else { column_blocks<1>(xp, M, K, wj, pairs, oj, N, bj); j += 1; }
    }
  });
  return out.view(sizes);
}

#else  // no AVX-512 BF16: models/packing.py keeps oneDNN's kernels

bool linear_supported() { return false; }

at::Tensor tiled_linear(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&) {
  TORCH_CHECK(false, "tiled_linear: built without AVX-512 BF16 (models/packing.py uses oneDNN)");
  return at::Tensor();
}

#endif

at::Tensor tile_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) % 16 == 0 && weight.size(1) % 2 == 0,
              "tile_weight: a weight [N, K] with N a multiple of 16 and K even");
  const int64_t N = weight.size(0), K = weight.size(1);
  return weight.contiguous().view({N / 16, 16, K / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}
