// The exact attention's two products and the softmax between them, written so that every output is one
// fixed sequence of float operations whatever the pass's shape (engine/exact_kernel.py loads it,
// engine/attention.py calls it).
//
//   scores(query [B, H, Q, D], key [B, Hkv, K, D], mask [B, Q, K] float32 or none, scale)
//       -> [B, Hkv, G*Q, K] float32, G = H / Hkv, row g*Q + i = query head Hkv*G.. + g, position i:
//       score = (q . k) * scale + mask, where q . k is summed in 16 lanes (lane l: d = l, l + 16, ...,
//       in order) and the lanes are then added in one fixed tree; a key whose mask is -inf gets -inf.
//       Bfloat16 heads of 32 or more on CPUs with AVX-512 BF16 sum q . k over dimension pairs instead
//       (scores_kernel.cpp, 5-21% faster): one fixed sequence per key there too.
//   softmax_(scores [..., K] float32) in place: per row, the maximum (order-free), exp(score - max) per
//       key, their sum in fixed point (64-bit integers: order-free), each exp times 1 / sum.
//   weighted(probs [B, Hkv, R, K] float32, value [B, Hkv, K, D]) -> [B, Hkv, R, D] in value's dtype:
//       out[d] = sum over keys in order of p * v[d] (float32, one running sum per d; keys of weight 0
//       are skipped: they would add exact zeros).
//
// So a row's result depends only on its own visible keys, in order: not on how many rows share the
// pass, how many keys the pass has, or where masked keys sit between them (a tree branch's ancestors
// with other branches' keys between them come out as the same tokens decoded one at a time).
// Measured against the two oneDNN matmuls it replaces (SmolLM2-135M heads, bf16, 2 Zen 4 threads):
// 1 query row over 512 keys 100 -> 28 us a layer, 8 rows 146 -> 90.
//
// Lanes and blocks are GCC vector extensions: the compiler maps them to the machine's vector width,
// and no reassociation is allowed (no -ffast-math), so every lane's sums run in source order.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <limits>

typedef float v16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef int64_t i64x8 __attribute__((vector_size(64)));

static inline bool all_set(i32x16 m) {  // every lane of a comparison true
  bool all = true;
  for (int l = 0; l < 16; ++l) all = all && m[l];
  return all;
}

static inline v16 load16(const at::BFloat16* p) {  // bfloat16 -> float32 is exact: the bits shifted up
  u16x16 h;
  std::memcpy(&h, p, sizeof h);
  u32x16 w = __builtin_convertvector(h, u32x16) << 16;
  v16 f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}

static inline v16 load16(const float* p) {
  v16 f;
  std::memcpy(&f, p, sizeof f);
  return f;
}

// Step `s` (8, 4, 2, 1) of adding sixteen lane vectors' lanes in a tree: lane l of every vector is added
// to lane l + s. Two vectors in, one out, whose lanes are the two inputs' partial sums interleaved in
// blocks of s; after the four steps lane j holds vector j's total, each added in the same tree.
static inline v16 fold(v16 a, v16 b, int s) {
  v16 lo, hi;
  if (s == 8) {
    lo = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    hi = __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  } else if (s == 4) {
    lo = __builtin_shufflevector(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    hi = __builtin_shufflevector(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  } else if (s == 2) {
    lo = __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    hi = __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  } else {
    lo = __builtin_shufflevector(a, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    hi = __builtin_shufflevector(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  }
  return lo + hi;
}

// scores' mask [B, Q, >=K] float32 as both kernels read it: data (null: no mask) and its first two strides.
struct ScoresMask {
  const float* p;
  int64_t s0, s1;
};

// C = D / 16 lane vectors per head vector. Tasks: (batch, kv head, block of 16 keys); each converts its
// keys once and scores every row of the head against them.
template <typename T, int C>
static void scores_impl(const at::Tensor& q, const at::Tensor& k, const ScoresMask& mask, float scale,
                        at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), Q = q.size(2), Hkv = k.size(1), K = k.size(2);
  const int64_t G = H / Hkv, R = G * Q, blocks = K / 16;
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const auto qs = q.strides();
  const auto ks = k.strides();
  const bool masked = mask.p != nullptr;
  const float* mp = mask.p;
  const int64_t ms0 = mask.s0, ms1 = mask.s1;
  float* op = out.data_ptr<float>();
  const v16 ninf16 = v16{} - std::numeric_limits<float>::infinity();
  at::parallel_for(0, B * Hkv * blocks, 4, [&](int64_t lo, int64_t hi) {
    std::vector<v16> qv(R * C), kb(16 * C);
    int64_t loaded = -1;
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t bh = i / blocks, b = bh / Hkv, h = bh % Hkv, j0 = (i % blocks) * 16;
      if (bh != loaded) {  // this head's G*Q query rows as lane vectors
        for (int64_t r = 0; r < R; ++r) {
          const T* row = qp + b * qs[0] + (h * G + r / Q) * qs[1] + (r % Q) * qs[2];
          for (int c = 0; c < C; ++c) qv[r * C + c] = load16(row + c * 16);
        }
        loaded = bh;
      }
      const T* kh = kp + b * ks[0] + h * ks[1] + j0 * ks[2];
      bool converted = false;
      for (int64_t r = 0; r < R; ++r) {
        const float* m = masked ? mp + b * ms0 + (r % Q) * ms1 + j0 : nullptr;
        float* o = op + (bh * R + r) * K + j0;
        const v16 mv = m ? load16(m) : v16{};
        const i32x16 hidden = mv == ninf16;  // the keys this row cannot see
        if (m && all_set(hidden)) {  // a block this row cannot see: no products
          std::memcpy(o, &ninf16, sizeof ninf16);
          continue;
        }
        if (!converted) {
          for (int j = 0; j < 16; ++j)
            for (int c = 0; c < C; ++c) kb[j * C + c] = load16(kh + j * ks[2] + c * 16);
          converted = true;
        }
        const v16* qr = qv.data() + r * C;
        v16 lanes[16];  // [key]: the 16 lane sums of its dot product
        for (int j = 0; j < 16; ++j) {
          v16 a = qr[0] * kb[j * C];
          for (int c = 1; c < C; ++c) a += qr[c] * kb[j * C + c];
          lanes[j] = a;
        }
        v16 f8[8], f4[4], f2[2];
        for (int j = 0; j < 8; ++j) f8[j] = fold(lanes[j], lanes[j + 8], 8);
        for (int j = 0; j < 4; ++j) f4[j] = fold(f8[j], f8[j + 4], 4);
        for (int j = 0; j < 2; ++j) f2[j] = fold(f4[j], f4[j + 2], 2);
        const v16 dots = fold(f2[0], f2[1], 1);  // lane j: key j0 + j
        const v16 scored = hidden ? ninf16 : dots * scale + mv;
        std::memcpy(o, &scored, sizeof scored);
      }
    }
  });
}

// N rows of one head at once (they share each value row's conversion); every row's sums are the same
// operations in the same order whatever N is.
template <typename T, int C, int N>
static inline void weighted_rows(const float* p, int64_t K, const T* v, int64_t vstride, T* out, int64_t D) {
  v16 acc[N * C];
  for (int x = 0; x < N * C; ++x) acc[x] = v16{};
  for (int64_t j = 0; j < K; ++j) {
    float w[N];
    bool any = false;
    for (int r = 0; r < N; ++r) {
      w[r] = p[r * K + j];
      any = any || w[r] != 0.f;
    }
    if (!any) continue;
    const T* vr = v + j * vstride;
    for (int c = 0; c < C; ++c) {
      const v16 x = load16(vr + c * 16);
      for (int r = 0; r < N; ++r) acc[r * C + c] += w[r] * x;
    }
  }
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c)
      for (int l = 0; l < 16; ++l) out[r * D + c * 16 + l] = static_cast<T>(acc[r * C + c][l]);
}

template <typename T, int C>
static void weighted_impl(const at::Tensor& p, const at::Tensor& v, at::Tensor& out) {
  const int64_t B = p.size(0), H = p.size(1), R = p.size(2), K = p.size(3), D = v.size(3);
  constexpr int N = C >= 8 ? 2 : (C >= 4 ? 4 : 8);  // rows per task: N * C accumulators in registers
  const int64_t rblocks = (R + N - 1) / N;
  const float* pp = p.data_ptr<float>();
  const T* vp = v.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const auto vs = v.strides();
  at::parallel_for(0, B * H * rblocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t bh = i / rblocks, b = bh / H, h = bh % H, r0 = (i % rblocks) * N;
      const int64_t n = std::min<int64_t>(N, R - r0);
      const float* prow = pp + (bh * R + r0) * K;
      const T* vh = vp + b * vs[0] + h * vs[1];
      T* orow = op + (bh * R + r0) * D;
      if (n == N)
        weighted_rows<T, C, N>(prow, K, vh, vs[2], orow, D);
      else
        for (int64_t r = 0; r < n; ++r) weighted_rows<T, C, 1>(prow + r * K, K, vh, vs[2], orow + r * D, D);
    }
  });
}

// exp(x) for 16 lanes, one fixed sequence of float operations per lane: x = n ln2 + r (|r| <= ln2 / 2,
// ln2 in two parts), exp(r) by a degree-6 polynomial (Cephes' expf coefficients, ~1 ulp), times 2^n
// built in the exponent bits. Below -87.33 (where float32's normal range ends) the result is 0, -inf
// included: a masked key weighs exactly 0.
static inline v16 exp16(v16 x) {
  const v16 lo = v16{} - 87.33654f, hi = v16{} + 88.37626f;
  const i32x16 under = x < lo;
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  const v16 t = x * 1.44269504088896341f;
  const i32x16 n = __builtin_convertvector(t + (t >= 0 ? v16{} + 0.5f : v16{} - 0.5f), i32x16);  // round half away
  const v16 nf = __builtin_convertvector(n, v16);
  v16 r = x - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  v16 p = v16{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const u32x16 scale = (u32x16)((n + 127) << 23);
  v16 f;
  std::memcpy(&f, &scale, sizeof f);
  const v16 out = p * f;
  return under ? v16{} : out;
}

// Each row of s [rows, K] (float32, K a multiple of 16) becomes its softmax, in place. The maximum is
// order-free; the exponentials are per key; their sum is taken in fixed point (each term truncated to a
// multiple of 2^-40, added as 64-bit integers, whose sum does not depend on the order), so a row's
// probabilities depend only on its own keys' scores: not on how many keys the pass has or where masked
// ones sit between them. A row whose keys are all masked gets zeros.
static void softmax_rows(float* s, int64_t rows, int64_t K) {
  at::parallel_for(0, rows, 8, [&](int64_t lo, int64_t hi) {
    const float ninf = -std::numeric_limits<float>::infinity();
    const v16 ninf16 = v16{} + ninf;
    for (int64_t r = lo; r < hi; ++r) {
      float* row = s + r * K;
      v16 m = v16{} + ninf;
      for (int64_t j = 0; j < K; j += 16) {
        const v16 x = load16(row + j);
        m = x > m ? x : m;
      }
      float top = ninf;
      for (int l = 0; l < 16; ++l) top = m[l] > top ? m[l] : top;
      if (top == ninf) {
        std::memset(row, 0, K * sizeof(float));
        continue;
      }
      i64x8 acc_lo = i64x8{}, acc_hi = i64x8{};
      for (int64_t j = 0; j < K; j += 16) {
        const v16 x = load16(row + j);
        if (all_set(x == ninf16)) {  // 16 masked keys: weights 0, nothing to add
          std::memset(row + j, 0, sizeof x);
          continue;
        }
        const v16 e = exp16(x - top);
        std::memcpy(row + j, &e, sizeof e);
        const v16 scaled = e * 1099511627776.0f;  // 2^40: exact
        acc_lo += __builtin_convertvector(__builtin_shufflevector(scaled, scaled, 0, 1, 2, 3, 4, 5, 6, 7), i64x8);
        acc_hi += __builtin_convertvector(__builtin_shufflevector(scaled, scaled, 8, 9, 10, 11, 12, 13, 14, 15), i64x8);
      }
      const i64x8 acc = acc_lo + acc_hi;
      int64_t total = 0;
      for (int l = 0; l < 8; ++l) total += acc[l];
      const float inv = 1.0f / (static_cast<float>(total) * 9.094947017729282e-13f);  // 2^-40
      for (int64_t j = 0; j < K; j += 16) {
        const v16 p = load16(row + j) * inv;
        std::memcpy(row + j, &p, sizeof p);
      }
    }
  });
}

at::Tensor softmax_(at::Tensor& s) {
  TORCH_CHECK(s.scalar_type() == at::kFloat && s.is_contiguous() && s.dim() >= 1 && s.size(-1) % 16 == 0,
              "scores: contiguous float32 with a multiple of 16 keys");
  softmax_rows(s.data_ptr<float>(), s.numel() / std::max<int64_t>(s.size(-1), 1), s.size(-1));
  return s;
}

static void check_head(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 4 && t.stride(3) == 1, name, ": expected [B, H, L, D] with contiguous D");
  TORCH_CHECK(t.size(3) % 16 == 0 && t.size(3) <= 256, name, ": head size must be a multiple of 16, at most 256");
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kFloat, name, ": bfloat16 or float32");
}

// scores_kernel.cpp, built into this extension
bool dp_scores_supported();
void dp_scores(const at::Tensor& q, const at::Tensor& k, const float* mask, int64_t ms0, int64_t ms1, float scale,
               at::Tensor& out);

at::Tensor scores(const at::Tensor& q, const at::Tensor& k, const c10::optional<at::Tensor>& mask, double scale) {
  check_head(q, "query");
  check_head(k, "key");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.size(3) == k.size(3) && q.size(0) == k.size(0), "query/key");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "query heads must be a multiple of key heads");
  TORCH_CHECK(k.size(2) % 16 == 0, "key count must be a multiple of 16");
  at::Tensor m;
  if (mask.has_value()) {
    m = *mask;
    TORCH_CHECK(m.scalar_type() == at::kFloat && m.dim() == 3 && m.stride(2) == 1 && m.size(0) == q.size(0) &&
                    m.size(1) == q.size(2) && m.size(2) >= k.size(2),
                "mask: expected float32 [B, Q, >=K] with contiguous keys");
  }
  auto out = at::empty({q.size(0), k.size(1), q.size(1) / k.size(1) * q.size(2), k.size(2)},
                       q.options().dtype(at::kFloat));
  const int64_t C = q.size(3) / 16;
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  const ScoresMask sm{m.defined() ? m.data_ptr<float>() : nullptr, m.defined() ? m.stride(0) : 0,
                      m.defined() ? m.stride(1) : 0};
  if (bf16 && (C == 2 || C == 4 || C == 8 || C == 16) && dp_scores_supported()) {
    dp_scores(q, k, sm.p, sm.s0, sm.s1, (float)scale, out);
    return out;
  }
#define LOOKAHEAD_SCORES(c)                                                   \
  if (C == c) {                                                               \
    if (bf16) scores_impl<at::BFloat16, c>(q, k, sm, (float)scale, out);      \
    else scores_impl<float, c>(q, k, sm, (float)scale, out);                  \
  }
  LOOKAHEAD_SCORES(1) LOOKAHEAD_SCORES(2) LOOKAHEAD_SCORES(4) LOOKAHEAD_SCORES(8) LOOKAHEAD_SCORES(16)
#undef LOOKAHEAD_SCORES
  TORCH_CHECK(C == 1 || C == 2 || C == 4 || C == 8 || C == 16, "head size must be 16, 32, 64, 128 or 256");
  return out;
}

at::Tensor weighted(const at::Tensor& p, const at::Tensor& v) {
  check_head(v, "value");
  TORCH_CHECK(p.scalar_type() == at::kFloat && p.is_contiguous() && p.dim() == 4, "probs: contiguous float32");
  TORCH_CHECK(p.size(0) == v.size(0) && p.size(1) == v.size(1) && p.size(3) == v.size(2), "probs/value shapes");
  auto out = at::empty({p.size(0), p.size(1), p.size(2), v.size(3)}, v.options());
  const int64_t C = v.size(3) / 16;
  const bool bf16 = v.scalar_type() == at::kBFloat16;
#define LOOKAHEAD_WEIGHTED(c)                                 \
  if (C == c) {                                               \
    if (bf16) weighted_impl<at::BFloat16, c>(p, v, out);      \
    else weighted_impl<float, c>(p, v, out);                  \
  }
  LOOKAHEAD_WEIGHTED(1) LOOKAHEAD_WEIGHTED(2) LOOKAHEAD_WEIGHTED(4) LOOKAHEAD_WEIGHTED(8) LOOKAHEAD_WEIGHTED(16)
#undef LOOKAHEAD_WEIGHTED
  TORCH_CHECK(C == 1 || C == 2 || C == 4 || C == 8 || C == 16, "head size must be 16, 32, 64, 128 or 256");
  return out;
}

// The three in one call: weighted(softmax_(scores(q, k, mask, scale)), v) laid out [B, Q, H, D] (row g*Q + i
// of kv head h is query head h*G + g, position i), as transformers' attention functions return it; the same
// operations as the three calls from Python, without a crossing and a reshape each.
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const c10::optional<at::Tensor>& mask,
                  double scale) {
  TORCH_CHECK(v.dim() == 4 && v.size(2) == k.size(2), "value: expected [B, Hkv, K, D] with the keys' K");
  at::Tensor s = scores(q, k, mask, scale);  // [B, Hkv, G*Q, K] float32
  softmax_(s);
  return weighted(s, v).view({q.size(0), q.size(1), q.size(2), v.size(3)}).transpose(1, 2).contiguous();
}

// prefill_kernel.cpp, built into this extension (engine/exact_kernel.py)
bool prefill_supported();
at::Tensor causal_prefill(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                          int64_t window, int64_t past);

// linear_kernel.cpp, likewise
bool linear_supported();
at::Tensor tile_weight(const at::Tensor& weight);
at::Tensor tiled_linear(const at::Tensor& x, const at::Tensor& tiled, const c10::optional<at::Tensor>& bias);

// lean_kernel.cpp, likewise
std::vector<at::Tensor> rotary_qk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                  const at::Tensor& sin, int64_t D);
at::Tensor rms_scale(const at::Tensor& x, const at::Tensor& variance, const at::Tensor& weight, double eps);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, int64_t lanes);
at::Tensor variance(const at::Tensor& x, int64_t lanes);
void keep_rows_(const std::vector<at::Tensor>& buffers, int64_t lo, int64_t hi, int64_t prefix, const at::Tensor& src);

// topk_kernel.cpp, likewise
std::tuple<at::Tensor, at::Tensor, bool> top_rows(const at::Tensor& x, int64_t k);
std::tuple<at::Tensor, bool> sampled_choice(const at::Tensor& x, double temperature, const std::vector<at::Tensor>& noise,
                                            const c10::optional<at::Tensor>& floors);
at::Tensor scaled(const at::Tensor& x, double temperature);
std::tuple<at::Tensor, at::Tensor> top_p_cuts(const at::Tensor& x, const at::Tensor& probs, double top_p, int64_t k);
// uniform_kernel.cpp, likewise
at::Tensor mt_uniform(int64_t seed, int64_t n);
// gumbel_kernel.cpp, likewise
std::tuple<at::Tensor, at::Tensor> gumbel_choice(const at::Tensor& x, double temperature,
                                                 const std::vector<at::Tensor>& uniforms,
                                                 const c10::optional<at::Tensor>& floors);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scores", &scores, "scaled, masked q.k for every row and key (see the file's header)");
  m.def("softmax_", &softmax_, "each row's softmax in place, its sum in fixed point (see softmax_rows)");
  m.def("weighted", &weighted, "probability-weighted value sums, keys in order (see the file's header)");
  m.def("attend", &attend, "scores, softmax and weighted values in one call, out [B, Q, H, D] (see `attend`)");
  m.def("dp_scores_supported", &dp_scores_supported, "do bfloat16 scores sum dimension pairs (scores_kernel.cpp)?");
  m.def("prefill_supported", &prefill_supported, "was causal_prefill built (AVX-512 BF16)?");
  m.def("causal_prefill", &causal_prefill, "a prompt's causal attention over the keys before it and its own (prefill_kernel.cpp)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale"), py::arg("window") = 0, py::arg("past") = 0);
  m.def("linear_supported", &linear_supported, "was tiled_linear built (AVX-512 BF16)?");
  m.def("tile_weight", &tile_weight, "a weight [N, K] in tiled_linear's layout (linear_kernel.cpp)");
  m.def("tiled_linear", &tiled_linear, "x @ weight.T + bias, each row alone in a fixed order (linear_kernel.cpp)",
        py::arg("x"), py::arg("tiled"), py::arg("bias") = py::none());
  m.def("rotary_qk", &rotary_qk, "bfloat16 q and k rotated as apply_rotary_pos_emb does it, per head (lean_kernel.cpp)");
  m.def("rms_scale", &rms_scale, "bfloat16 LlamaRMSNorm after its variance, same bits (lean_kernel.cpp)");
  m.def("keep_rows_", &keep_rows_, "a cache's kept entries moved into place, every buffer in one call (lean_kernel.cpp)");
  m.def("variance", &variance, "bfloat16 rows' mean square as rms_norm sums it (lean_kernel.cpp)");
  m.def("top_rows", &top_rows, "each row's k largest values, descending, ties by index, and their indices (topk_kernel.cpp)");
  m.def("sampled_choice", &sampled_choice, "each row's argmax of x / temperature + noise, PyTorch's values and first maximum (topk_kernel.cpp)");
  m.def("top_p_cuts", &top_p_cuts, "each row's top-p cut among its k best where float32 sums cannot move it (topk_kernel.cpp)");
  m.def("scaled", &scaled, "x.float() / temperature, PyTorch's values (topk_kernel.cpp)");
  m.def("gumbel_choice", &gumbel_choice, "the sampled choice from the rule's uniform draws where bounds decide it (gumbel_kernel.cpp)");
  m.def("mt_uniform", &mt_uniform, "torch.rand(n) from a CPU generator seeded with seed, bit for bit (uniform_kernel.cpp)");
  m.def("rms_norm", &rms_norm, "bfloat16 LlamaRMSNorm whole, its sum in PyTorch's order for `lanes` (lean_kernel.cpp)");
}
