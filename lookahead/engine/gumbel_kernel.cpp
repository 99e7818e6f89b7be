// The seeded sampling rule's choice from its uniform draws, without the noise row (engine/sampling.py
// `TokenChooser` calls it; engine/exact_kernel.py builds it into the same extension as exact_kernel.cpp).
//
//   gumbel_choice(x [R, V] bfloat16 or float32, contiguous, temperature, uniforms: R float32 [V] rows,
//                 floors: [R] float32 or None)
//       -> (indices [R] int64, decided [R] bool): where decided[r], indices[r] is the token the rule
//       picks: the first index of the largest x.float() / temperature + g over the row (values whose
//       x / temperature is below the row's floor count as -inf), g being the rule's noise
//       -log(-log(clamp(u, 1e-20, 1 - 1e-7))) as PyTorch computes it in float32 from the row's uniforms
//       u (sampled_choice in topk_kernel.cpp takes that noise row). Where not decided (too close to call;
//       a NaN logit or draw; x / t overflowing; nothing kept), the caller computes the noise row and asks
//       sampled_choice.
//
// How it decides without PyTorch's logarithms. Each token's noise is computed here in double, gd = -log(-log(uc))
// of the same clamped uc, which is within kSlack (1e-3) of PyTorch's float32 g: two float32 logarithms a few
// units in the last place apart from the true ones move g by ~5e-7 at most (measured: 5.4e-7 over 505
// rows; engine/sampling.py checks 1e-5 once per process before using this). The exact score fl(q + g),
// q = fl(x / t), then lies in [q + gd - err, q + gd + err] with err = kSlack + 2^-23 (|q| + 17) (the
// float32 addition's rounding; |g| < 17). The row's best exact score is at least the largest lower end
// L; a token whose upper end is below L cannot be the first maximum. So if exactly one token's upper end
// reaches L, it is the rule's choice; two or more (exact ties included) leave the row undecided.
//
// Most tokens are ruled out without a logarithm: g is increasing in u, and 1 - u (exact: u is a multiple
// of 2^-24) lies in [2^e, 2^(e+1)) for e = floor(log2(1 - u)), so g <= bound[-e] = gd(1 - 2^e) + kSlack,
// a table of 25 values. A token goes on to its logarithms only if q + bound[-e] reaches L (less a margin
// for the float32 arithmetic of that test); L starts at the best q's lower end and rises with every token
// computed. The expected number computed is small whatever the row: about 2 Z e^-L with Z = sum of e^q,
// and L is near log Z plus a Gumbel draw (505 recorded SmolLM2 chat rows at temperatures 0.7 and 1.0, L
// held at its start: a median of 1 token, 6 at the 90th percentile, 40 at most; docs/results/sampled-draws).
//
// Why: the noise row is two float32 logarithms over the vocabulary (~80 of the ~104 us a position took
// for SmolLM2's 49,152 tokens on 2 Zen 4 cores), and a sampled lookahead step verifies 2-4 positions.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "rows.h"

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

constexpr double kSlack = 1e-3;  // |PyTorch's float32 noise - gd| is assumed below this (checked: 1e-5)
constexpr float kUMin = static_cast<float>(1e-20);  // the rule's clamp, as PyTorch rounds its bounds
constexpr float kUMax = static_cast<float>(1.0 - 1e-7);
constexpr float kInf = std::numeric_limits<float>::infinity();

inline double noise_of(float u) {  // gd: the rule's noise for one uniform value, in double
  const float uc = u < kUMin ? kUMin : (u > kUMax ? kUMax : u);
  return -std::log(-std::log(static_cast<double>(uc)));
}

inline double err_of(double q) { return kSlack + std::ldexp(std::fabs(q) + 17.0, -23); }

// bound[j]: at least the float32 noise of any u with floor(log2(1 - u)) = -j (j = 0..24; 25..31 repeat 24).
struct Bounds {
  alignas(64) float v[32];
  Bounds() {
    for (int j = 0; j < 32; ++j) {
      const int e = j < 1 ? 1 : (j > 24 ? 24 : j);  // j = 0 is u = 0 alone: bound[1] holds it too
      const double g = noise_of(static_cast<float>(1.0 - std::ldexp(1.0, -e))) + kSlack;
      v[j] = std::nextafter(static_cast<float>(g), kInf);  // rounded up
    }
  }
};

// -floor(log2(1 - u)) for u in [0, 1): 0..24. The rule's draws lie there; anything else still gets a bound
// that holds (u < 0 clamps to the least noise, u >= 1 or NaN takes the largest bound).
int exponent_index(float u) {
  if (!(u < 1.0f)) return 31;
  if (u < 0.0f) return 0;
  int e;
  std::frexp(1.0f - u, &e);  // 1 - u = m 2^e, m in [0.5, 1): floor(log2) = e - 1
  return 1 - e;
}

struct Row {
  double low = -std::numeric_limits<double>::infinity();  // L: the largest lower end so far
  std::vector<std::pair<int64_t, double>> upper;  // tokens computed: index, upper end
  bool bad = false;  // a NaN draw seen: PyTorch's noise is NaN there, and its argmax picks NaN

  float screen() const {  // compare q + bound against this (float32 arithmetic's error allowed for)
    const double s = low - kSlack - std::ldexp(std::fabs(low) + 64.0, -20);
    return std::nextafter(static_cast<float>(s), -kInf);
  }
  void take(int64_t i, float q, float u) {
    const double gd = noise_of(u), e = err_of(q);
    const double lo = q + gd - e;
    if (lo > low) low = lo;
    upper.emplace_back(i, q + gd + e);
  }
  std::pair<int64_t, bool> result() const {
    int64_t at = -1;
    for (const auto& c : upper) {
      if (c.second < low) continue;
      if (at >= 0) return {0, false};  // two can reach the best: too close to call
      at = c.first;
    }
    return {at < 0 ? 0 : at, at >= 0 && !bad};
  }
};

// The screen's floor: below the row's floor by more than the product x * (1 / t) can stray from x / t.
inline float screen_floor(float floor) {
  if (std::isinf(floor)) return floor;
  return std::nextafter(static_cast<float>(floor - std::ldexp(std::fabs(static_cast<double>(floor)), -20)), -kInf);
}

// Step 1 for both versions: the row's largest x (first index) starts L, as q = x / t (the largest q: division
// by t > 0 keeps the order). Undecided where x holds a NaN, that q is not finite, or it is below the floor
// (then nothing is kept).
inline bool start(Row& row, float best, int64_t at, bool nan, float t, float floor, const float* u) {
  if (nan || at < 0) return false;
  const float q = best / t;
  if (std::isinf(q) || q < floor) return false;
  row.take(at, q, u[at]);
  return true;
}

// Step 2's test for one token that passed the screen: its exact q, kept, its bound against L; then taken.
inline void offer(Row& row, int64_t i, float x, float t, float floor, const float* u, const Bounds& bounds) {
  const float q = x / t;
  if (q >= floor && q + bounds.v[exponent_index(u[i])] >= row.screen()) row.take(i, q, u[i]);
}

// One row: q_i = x_i / t (float32, as PyTorch divides), kept where q_i >= floor.
template <typename Load>
std::pair<int64_t, bool> decide_row(int64_t V, float t, float floor, const float* u, const Bounds& bounds, Load load) {
  Row row;
  // 1. The largest x.
  float best = -kInf;
  int64_t at = -1;
  bool nan = false;
  for (int64_t i = 0; i < V; ++i) {
    const float x = load(i);
    nan = nan || std::isnan(x);
    if (x > best) { best = x; at = i; }
  }
  if (!start(row, best, at, nan, t, floor, u)) return {0, false};
  // 2. Every other kept token whose noise bound could reach L, in index order.
  for (int64_t i = 0; i < V; ++i) {
    if (std::isnan(u[i])) row.bad = true;
    if (i != at) offer(row, i, load(i), t, floor, u, bounds);
  }
  return row.result();
}

#if defined(__AVX512F__)
// The same with 16 values a compare. Step 2's screen multiplies by 1 / t rather than divide (a few times
// cheaper): the product is within 2^-22 |q| of q, which Row::screen's and screen_floor's margins cover for
// every token that could reach L (|q| <= |L| + 20); lanes that pass are offered one by one in index order.
template <typename Load16, typename Load>
std::pair<int64_t, bool> decide_row16(int64_t V, float t, float floor, const float* u, const Bounds& bounds,
                                      Load16 load16, Load load) {
  // 1. The largest x: each lane's first largest, then the lanes' (lowest index on equal values), then the tail.
  __mmask16 nan = 0;
  int64_t i = 0;
  auto [top, first] = lookahead_rows::first_max16(V, [&](int64_t b) {
    const __m512 x = load16(b);
    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return x;
  }, &i);
  const int64_t body = i;
  bool tail_nan = false;
  for (; i < V; ++i) {
    const float x = load(i);
    tail_nan = tail_nan || std::isnan(x);
    if (x > top) { top = x; first = i; }
  }
  Row row;
  if (!start(row, top, first, nan != 0 || tail_nan, t, floor, u)) return {0, false};
  // 2. The screen: x / t + bound[-floor(log2(1 - u))] against L's margin, the bound looked up by permutation.
  const __m512 rt = _mm512_set1_ps(1.0f / t), fv = _mm512_set1_ps(screen_floor(floor)), one = _mm512_set1_ps(1.0f);
  const __m512 lo_table = _mm512_load_ps(bounds.v), hi_table = _mm512_load_ps(bounds.v + 16);
  __m512 sv = _mm512_set1_ps(row.screen());
  __mmask16 nan_u = 0;
  for (int64_t b = 0; b < body; b += 16) {
    const __m512 q = _mm512_mul_ps(load16(b), rt);
    const __m512 uv = _mm512_loadu_ps(u + b);
    nan_u |= _mm512_cmp_ps_mask(uv, uv, _CMP_UNORD_Q);
    const __m512 e = _mm512_getexp_ps(_mm512_sub_ps(one, uv));  // floor(log2(1 - u)): -24..0 for u in [0, 1)
    const __m512 je = _mm512_max_ps(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), e), _mm512_set1_ps(31.0f)),
                                    _mm512_setzero_ps());  // u < 0: 0 (exponent_index's rules)
    const __m512i j = _mm512_mask_mov_epi32(_mm512_cvttps_epi32(je), _mm512_cmp_ps_mask(uv, one, _CMP_NLT_UQ),
                                            _mm512_set1_epi32(31));  // u >= 1 or NaN: the largest bound
    const __m512 bound = _mm512_permutex2var_ps(lo_table, j, hi_table);
    __mmask16 m = _mm512_cmp_ps_mask(q, fv, _CMP_GE_OQ) & _mm512_cmp_ps_mask(_mm512_add_ps(q, bound), sv, _CMP_GE_OQ);
    if (m == 0) continue;
    while (m) {
      const int64_t c = b + __builtin_ctz(m);
      m &= m - 1;
      if (c != first) offer(row, c, load(c), t, floor, u, bounds);
    }
    sv = _mm512_set1_ps(row.screen());  // L may have risen
  }
  row.bad = nan_u != 0;
  for (int64_t c = body; c < V; ++c) {
    if (std::isnan(u[c])) row.bad = true;
    if (c != first) offer(row, c, load(c), t, floor, u, bounds);
  }
  return row.result();
}
#endif

}  // namespace

std::tuple<at::Tensor, at::Tensor> gumbel_choice(const at::Tensor& x, double temperature,
                                                 const std::vector<at::Tensor>& uniforms,
                                                 const c10::optional<at::Tensor>& floors) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && x.is_contiguous(), "gumbel_choice: x must be a contiguous [R, V] CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, "gumbel_choice: x must be bfloat16 or float32");
  TORCH_CHECK(temperature > 0, "gumbel_choice: temperature must be > 0");
  const int64_t R = x.size(0), V = x.size(1);
  TORCH_CHECK(V >= 1 && static_cast<int64_t>(uniforms.size()) == R, "gumbel_choice: one uniform row per row of x, V >= 1");
  for (const auto& u : uniforms) {
    TORCH_CHECK(u.scalar_type() == at::kFloat && u.is_contiguous() && u.device().is_cpu() && u.numel() == V,
                "gumbel_choice: each uniform row must be a contiguous float32 CPU tensor of V values");
  }
  const float* fp = lookahead_rows::floors_of(floors, R, "gumbel_choice");
  static const Bounds bounds;
  const float t = static_cast<float>(temperature);
  auto out = at::empty({R}, x.options().dtype(at::kLong));
  auto decided = at::empty({R}, x.options().dtype(at::kBool));
  int64_t* op = out.data_ptr<int64_t>();
  bool* dp = decided.data_ptr<bool>();
  lookahead_rows::for_each_row(x, [&](int64_t r, auto load16, auto load) {
    const float* u = uniforms[r].data_ptr<float>();
    const float floor = fp != nullptr ? fp[r] : -kInf;
#if defined(__AVX512F__)
    const auto got = V >= 16 ? decide_row16(V, t, floor, u, bounds, load16, load) : decide_row(V, t, floor, u, bounds, load);
#else
    (void)load16;
    const auto got = decide_row(V, t, floor, u, bounds, load);
#endif
    op[r] = got.first;
    dp[r] = got.second;
  });
  return {out, decided};
}
