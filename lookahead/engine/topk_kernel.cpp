// The k largest logits of each row in one pass (engine/sampling.py `largest` and the greedy choice call
// it; engine/exact_kernel.py builds it into the same extension as exact_kernel.cpp).
//
//   top_rows(x [R, V] bfloat16 or float32, contiguous, k >= 1)
//       -> (values [R, k] in x's dtype, indices [R, k] int64, nan): per row, its k largest values in
//       descending order, equal values by ascending index (so k = 1 is argmax's first maximum, and
//       which of several values tied across the k-th place are in is the lowest-indexed ones: the
//       first k of a stable descending sort). `nan`: some row held a NaN (its result is then not
//       torch.topk's, which ranks NaN above everything; the caller falls back to it).
//
// Each row is walked once in index order against its current k-th largest value: a value that does not
// exceed it is skipped (with AVX-512, 16 values a compare), one that does is inserted into the k kept in
// order, so a row's result depends on that row alone. Why: a lookahead step reads the top 8 logits of
// every row it computed (recycled successors), and torch.topk over SmolLM2's 49,152 bfloat16 logits took
// ~0.2 ms for a step's ~5-7 rows on 2 Zen 4 cores; the greedy choice without them widened the rows to
// float32 for argmax (~0.1 ms).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

inline float bf16_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The k largest seen so far, descending, equal values in arrival (index) order.
struct Best {
  float* vals;
  int64_t* idx;
  int64_t k, n = 0;
  bool nan = false;

  float threshold() const { return n < k ? -std::numeric_limits<float>::infinity() : vals[k - 1]; }

  inline void offer(float v, int64_t i) {
    if (std::isnan(v)) {
      nan = true;
      return;
    }
    if (n == k && !(v > vals[k - 1])) return;  // not above the k-th: an equal value came later
    int64_t j = n < k ? n++ : k - 1;  // the slot freed (or the last one dropped)
    while (j > 0 && vals[j - 1] < v) {  // strictly less: an equal earlier value stays ahead
      vals[j] = vals[j - 1];
      idx[j] = idx[j - 1];
      --j;
    }
    vals[j] = v;
    idx[j] = i;
  }
};

// Values i0 .. V-1 one at a time (load(i): value i as float): those above the k-th kept, or NaN, are offered.
template <typename Load>
void scan_row(Best& best, int64_t i0, int64_t V, Load load) {
  for (int64_t i = i0; i < V; ++i) {
    const float v = load(i);
    if (v > best.vals[best.k - 1] || std::isnan(v)) best.offer(v, i);
  }
}

void row_float(const float* x, int64_t V, Best& best) {
  int64_t i = 0;
  for (; i < V && best.n < best.k; ++i) best.offer(x[i], i);  // the first k enter whatever they are
#if defined(__AVX512F__)
  for (; i + 16 <= V; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 t = _mm512_set1_ps(best.vals[best.k - 1]);
    __mmask16 m = _mm512_cmp_ps_mask(v, t, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    while (m) {  // in index order; the threshold may rise between them
      const int j = __builtin_ctz(m);
      m &= m - 1;
      const float f = x[i + j];
      if (f > best.vals[best.k - 1] || std::isnan(f)) best.offer(f, i + j);
    }
  }
#endif
  scan_row(best, i, V, [&](int64_t j) { return x[j]; });  // the tail
}

void row_bf16(const uint16_t* x, int64_t V, Best& best) {
  int64_t i = 0;
  for (; i < V && best.n < best.k; ++i) best.offer(bf16_to_float(x[i]), i);
#if defined(__AVX512F__)
  for (; i + 16 <= V; i += 16) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    const __m512 t = _mm512_set1_ps(best.vals[best.k - 1]);
    __mmask16 m = _mm512_cmp_ps_mask(v, t, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    while (m) {
      const int j = __builtin_ctz(m);
      m &= m - 1;
      const float f = bf16_to_float(x[i + j]);
      if (f > best.vals[best.k - 1] || std::isnan(f)) best.offer(f, i + j);
    }
  }
#endif
  scan_row(best, i, V, [&](int64_t j) { return bf16_to_float(x[j]); });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, bool> top_rows(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.is_contiguous(), "top_rows: x must be a contiguous [R, V] CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, "top_rows: x must be bfloat16 or float32");
  const int64_t R = x.size(0), V = x.size(1);
  TORCH_CHECK(k >= 1 && k <= V, "top_rows: k must be in 1..V");
  auto vals = at::empty({R, k}, x.options().dtype(at::kFloat));
  auto idx = at::empty({R, k}, x.options().dtype(at::kLong));
  std::vector<char> nan(R, 0);
  float* vp = vals.data_ptr<float>();
  int64_t* ip = idx.data_ptr<int64_t>();
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const void* base = x.data_ptr();
  at::parallel_for(0, R, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      Best best{vp + r * k, ip + r * k, k};
      if (bf16) {
        const uint16_t* row = static_cast<const uint16_t*>(base) + r * V;
        row_bf16(row, V, best);
      } else {
        const float* row = static_cast<const float*>(base) + r * V;
        row_float(row, V, best);
      }
      nan[r] = best.nan;
    }
  });
  bool any_nan = false;
  for (char c : nan) any_nan = any_nan || c;
  return {bf16 ? vals.to(at::kBFloat16) : vals, idx, any_nan};
}
