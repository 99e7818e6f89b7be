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
//
//   sampled_choice(x [R, V] bfloat16 or float32, contiguous, temperature, noise: R float32 [V] rows,
//                  floors: [R] float32 or None)
//       -> (indices [R] int64, nan): per row, the first index of the largest x / temperature + noise, the
//       value PyTorch computes for (x.float() / temperature + noise).argmax(-1): the temperature rounded
//       to float32, an IEEE division then an IEEE addition per element (no reciprocal, no fused
//       multiply-add), equal values by ascending index. With `floors`, a value whose x / temperature is
//       below its row's floor counts as -inf: PyTorch's masked_fill(x < floor, -inf) before the noise,
//       which is how the rule's top-k and top-p cuts mask a row (the row's best token always stays). `nan`:
//       some x / temperature + noise was NaN (argmax would pick it; the caller falls back to PyTorch).
//       Why: the seeded sampling rule (engine/sampling.py) chose a step's rows by widening, dividing,
//       masking, stacking the noise, adding and taking argmax, five or six passes over R x 49,152 floats
//       (~0.1 ms a row on 2 Zen 4 cores); this is one.
//
//   top_p_cuts(x [R, V] float32, contiguous, probs [R, V] float32 (softmax(x)), top_p, k in 1..128)
//       -> (cuts [R] float32, found [R] bool): where found[r], row r's top-p cut (engine/sampling.py
//       `nucleus_cut`): in descending order of x, a token is kept while the probability mass before it is
//       below top_p (the first always), and the cut is the last kept token's value. The row's k best are
//       walked as top_rows finds them and their probabilities summed in double. PyTorch sums them in
//       float32 (cumsum, then mass - p), which differs from the double sums by less than k 2^-24 + 2^-24;
//       a row where any rank's mass before it lies within kTopPTolerance (1e-5) of top_p, where the cut
//       lies past the k best, or with a NaN, is not found: the caller's PyTorch path decides it. Why: that
//       path's gather, cumsum, compares and sums cost ~0.1 ms a row in small calls (SmolLM2's logits, 2 Zen 4
//       cores); one walk costs ~0.01.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "rows.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using lookahead_rows::bf16_to_float;

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

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The first index of the largest x[i] / t + g[i] over one row, where values whose x[i] / t is below `lo`
// count as -inf (masked out: the rule's top-k and top-p cut), and whether any x[i] / t + g[i] was NaN.
template <typename Load>
std::pair<int64_t, bool> choice_row(int64_t V, float t, float lo, const float* g, Load load) {
  float best = kNegInf;
  int64_t at = 0;
  bool nan = false;
  for (int64_t i = 0; i < V; ++i) {
    const float q = load(i) / t;
    const float v = q + g[i];
    if (std::isnan(v)) nan = true;
    else {
      const float w = q >= lo ? v : kNegInf;
      if (w > best || (i == 0)) { best = w; at = i; }
    }
  }
  return {at, nan};
}

#if defined(__AVX512F__)
// The same over 16 lanes: each lane keeps its own first maximum, then the lanes' maxima meet (the lowest
// index among the lanes holding the largest), then the scalar tail past whole vectors, whose indices are
// all larger (so only a strictly larger value moves the choice). Requires V >= 16.
template <typename Load16, typename Load>
std::pair<int64_t, bool> choice_row16(int64_t V, float t, float lo, const float* g, Load16 load16, Load load) {
  const __m512 tv = _mm512_set1_ps(t);
  const __m512 lov = _mm512_set1_ps(lo);
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  __mmask16 nan = 0;
  auto value = [&](int64_t i) {  // x / t + g, -inf where x / t < lo; NaN noted before the mask
    const __m512 q = _mm512_div_ps(load16(i), tv);
    const __m512 v = _mm512_add_ps(q, _mm512_loadu_ps(g + i));
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(q, lov, _CMP_GE_OQ), neg_inf, v);
  };
  int64_t i = 0;
  auto [top, choice] = lookahead_rows::first_max16(V, value, &i);  // NaN lanes skipped: NaN is reported below
  if (choice < 0) choice = 0;  // every value -inf (masked): argmax's first
  for (; i < V; ++i) {
    const float q = load(i) / t;
    const float v = q + g[i];
    if (std::isnan(v)) nan = 1;
    else if (q >= lo && v > top) { top = v; choice = i; }
  }
  return {choice, nan != 0};
}
#endif

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

std::tuple<at::Tensor, bool> sampled_choice(const at::Tensor& x, double temperature, const std::vector<at::Tensor>& noise,
                                            const c10::optional<at::Tensor>& floors) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.is_contiguous(), "sampled_choice: x must be a contiguous [R, V] CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, "sampled_choice: x must be bfloat16 or float32");
  const int64_t R = x.size(0), V = x.size(1);
  TORCH_CHECK(V >= 1 && static_cast<int64_t>(noise.size()) == R, "sampled_choice: one noise row per row of x, V >= 1");
  for (const auto& n : noise) {
    TORCH_CHECK(n.scalar_type() == at::kFloat && n.is_contiguous() && n.device().is_cpu() && n.numel() == V,
                "sampled_choice: each noise row must be a contiguous float32 CPU tensor of V values");
  }
  const float* fp = lookahead_rows::floors_of(floors, R, "sampled_choice");  // each row's floor, or none
  const float t = static_cast<float>(temperature);  // what PyTorch divides a float32 tensor by
  auto out = at::empty({R}, x.options().dtype(at::kLong));
  int64_t* op = out.data_ptr<int64_t>();
  std::vector<char> nan(R, 0);
  lookahead_rows::for_each_row(x, [&](int64_t r, auto load16, auto load) {
    const float* g = noise[r].data_ptr<float>();
    const float l = fp != nullptr ? fp[r] : kNegInf;
#if defined(__AVX512F__)
    const auto got = V >= 16 ? choice_row16(V, t, l, g, load16, load) : choice_row(V, t, l, g, load);
#else
    (void)load16;
    const auto got = choice_row(V, t, l, g, load);
#endif
    op[r] = got.first;
    nan[r] = got.second;
  });
  bool any_nan = false;
  for (char c : nan) any_nan = any_nan || c;
  return {out, any_nan};
}

std::tuple<at::Tensor, at::Tensor> top_p_cuts(const at::Tensor& x, const at::Tensor& probs, double top_p, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.is_contiguous() && x.scalar_type() == at::kFloat,
              "top_p_cuts: x must be a contiguous float32 [R, V] CPU tensor");
  TORCH_CHECK(probs.sizes() == x.sizes() && probs.device().is_cpu() && probs.is_contiguous() &&
              probs.scalar_type() == at::kFloat, "top_p_cuts: probs must be a contiguous float32 CPU tensor shaped as x");
  const int64_t R = x.size(0), V = x.size(1);
  TORCH_CHECK(k >= 1 && k <= 128 && k <= V, "top_p_cuts: k must be in 1..min(128, V)");
  constexpr double kTopPTolerance = 1e-5;  // > 128 * 2^-24 + 2^-24: float32 sums of up to 128 ranks
  auto cuts = at::empty({R}, x.options());
  auto found = at::zeros({R}, x.options().dtype(at::kBool));
  float* cp = cuts.data_ptr<float>();
  bool* fp = found.data_ptr<bool>();
  const float* xp = x.data_ptr<float>();
  const float* pp = probs.data_ptr<float>();
  at::parallel_for(0, R, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> vals(k);
    std::vector<int64_t> idx(k);
    for (int64_t r = lo; r < hi; ++r) {
      Best best{vals.data(), idx.data(), k};
      row_float(xp + r * V, V, best);
      cp[r] = vals[0];
      if (best.nan) continue;
      const float* p = pp + r * V;
      double mass = p[idx[0]];  // the first token is always kept
      int64_t kept = 1;
      bool settled = false, close = false;
      for (; kept < best.n; ++kept) {  // rank `kept`: kept while the mass before it is below top_p
        close = close || std::fabs(mass - top_p) <= kTopPTolerance;
        if (mass >= top_p) { settled = true; break; }
        mass += p[idx[kept]];
      }
      if (!settled) {  // every walked rank kept: the next one is not only if the k's mass reaches top_p
        close = close || (best.n < V && std::fabs(mass - top_p) <= kTopPTolerance);
        settled = best.n == V || mass >= top_p;
      }
      cp[r] = vals[kept - 1];
      fp[r] = settled && !close && !std::isnan(mass);
    }
  });
  return {cuts, found};
}

at::Tensor scaled(const at::Tensor& x, double temperature) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.is_contiguous(), "scaled: x must be a contiguous [R, V] CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, "scaled: x must be bfloat16 or float32");
  const float t = static_cast<float>(temperature);
  auto out = at::empty(x.sizes(), x.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  const int64_t n = x.numel();
  if (x.scalar_type() == at::kBFloat16) {
    const uint16_t* in = static_cast<const uint16_t*>(x.data_ptr());
    for (int64_t i = 0; i < n; ++i) op[i] = bf16_to_float(in[i]) / t;
  } else {
    const float* in = x.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) op[i] = in[i] / t;
  }
  return out;
}
