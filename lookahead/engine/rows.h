// What the kernels that walk rows of logits share (topk_kernel.cpp's sampled_choice, gumbel_kernel.cpp's
// gumbel_choice): reading a bfloat16 or float32 row as float32, one row per task across the cores, and
// merging 16 AVX-512 lanes' first maxima. engine/exact_kernel.py hashes this header with the sources.

#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace lookahead_rows {

inline float bf16_to_float(uint16_t bits) {  // exact: a bfloat16 is a float32's upper half
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The first maximum among 16 lanes' (value, index) pairs: the largest value, the lowest index among equal
// values; lanes with a negative index (nothing seen) or a NaN value are skipped. {-inf, -1} if none is left.
inline std::pair<float, int64_t> first_of_lanes(const float* value, const int32_t* index) {
  float top = -std::numeric_limits<float>::infinity();
  int64_t at = -1;
  for (int j = 0; j < 16; ++j) {
    if (index[j] < 0 || value[j] != value[j]) continue;
    if (at < 0 || value[j] > top || (value[j] == top && index[j] < at)) {
      top = value[j];
      at = index[j];
    }
  }
  return {top, at};
}

#if defined(__AVX512F__)
// The first maximum of value16(i) over the whole vectors i = 0, 16, ... below V: each lane keeps its first
// largest value, then the lanes meet (first_of_lanes). {value, index}, index -1 where no value rose above
// -inf (or every one was NaN); *end is where the vectors stop, the caller walking the tail itself.
template <typename Value16>
std::pair<float, int64_t> first_max16(int64_t V, Value16 value16, int64_t* end) {
  __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512i at = _mm512_set1_epi32(-1), idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  int64_t i = 0;
  for (; i + 16 <= V; i += 16, idx = _mm512_add_epi32(idx, step)) {
    const __m512 v = value16(i);
    const __mmask16 up = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);  // strictly: an equal later value stays behind
    best = _mm512_mask_mov_ps(best, up, v);
    at = _mm512_mask_mov_epi32(at, up, idx);
  }
  *end = i;
  alignas(64) float bv[16];
  alignas(64) int32_t bi[16];
  _mm512_store_ps(bv, best);
  _mm512_store_si512(reinterpret_cast<__m512i*>(bi), at);
  return first_of_lanes(bv, bi);
}
#endif

// fn(r, load16, load) for each row r of x [R, V] (bfloat16 or float32, contiguous), rows spread over the
// cores: load(i) is the row's value i as float32; load16(i) its values i..i+15 (AVX-512 builds; elsewhere
// a placeholder never to be called).
template <typename Fn>
void for_each_row(const at::Tensor& x, Fn fn) {
  const int64_t R = x.size(0), V = x.size(1);
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const void* base = x.data_ptr();
  at::parallel_for(0, R, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      if (bf16) {
        const uint16_t* row = static_cast<const uint16_t*>(base) + r * V;
        auto load = [row](int64_t i) { return bf16_to_float(row[i]); };
#if defined(__AVX512F__)
        auto load16 = [row](int64_t i) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + i));
          return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
        };
#else
        auto load16 = nullptr;
#endif
        fn(r, load16, load);
      } else {
        const float* row = static_cast<const float*>(base) + r * V;
        auto load = [row](int64_t i) { return row[i]; };
#if defined(__AVX512F__)
        auto load16 = [row](int64_t i) { return _mm512_loadu_ps(row + i); };
#else
        auto load16 = nullptr;
#endif
        fn(r, load16, load);
      }
    }
  });
}

// Each row's floor from an optional [R] float32 tensor (nullptr: none), checked; `who` names the caller.
inline const float* floors_of(const c10::optional<at::Tensor>& floors, int64_t R, const char* who) {
  if (!floors.has_value() || !floors->defined()) return nullptr;
  TORCH_CHECK(floors->scalar_type() == at::kFloat && floors->is_contiguous() && floors->device().is_cpu() &&
              floors->numel() == R, who, ": floors must be a contiguous float32 CPU tensor of R values");
  return floors->data_ptr<float>();
}

}  // namespace lookahead_rows
