// Pieces of a Llama decoder layer and of the KV cache in one call each, with the bits of the PyTorch
// operations they replace (models/lean.py and engine/kvcache.py call them; engine/exact_kernel.py
// builds them).
//
//   rotary_qk(q [B, Q, H*D], k [B, Q, Hkv*D], cos [B, Q, D], sin [B, Q, D], D), all bfloat16
//       -> (q [B, H, Q, D], k [B, Hkv, Q, D]), contiguous: transformers' apply_rotary_pos_emb,
//       out = bf16(bf16(x * cos) + bf16(rotate_half(x) * sin)), rotate_half(x) = (-x[D/2:], x[:D/2]).
//   rms_scale(x [..., D] bfloat16, variance [..., 1] float32, weight [D] bfloat16, eps)
//       -> [..., D] bfloat16: the rest of LlamaRMSNorm once the variance is taken,
//       bf16(weight * bf16(float(x) * (1 / sqrt(variance + eps)))).
//   rms_norm(x [..., D] bfloat16, weight [D] bfloat16, eps, lanes) -> [..., D] bfloat16: the whole of
//       LlamaRMSNorm, the variance's sum included, added up in the order PyTorch's vectorised inner
//       reduction adds (its cascade sum over `lanes`-wide vectors, four partial vectors, levels of 16;
//       aten/src/ATen/native/cpu/SumKernel.cpp). That order is PyTorch's, not a contract: models/lean.py
//       uses this only after comparing `variance` (the same sum) with PyTorch's on the model's row
//       width (`norm_lanes`), and keeps rms_scale otherwise.
//   variance(x [..., D] bfloat16, lanes) -> [..., 1] float32: x.float().pow(2).mean(-1, keepdim=True)
//       as rms_norm computes it (compared bit for bit with PyTorch's before rms_norm is used).
//   keep_rows_(buffers: [S, H, T, D] each, contiguous, any dtype; lo, hi, prefix, src [n] int64)
//       in place: in slots lo..hi-1 of every buffer, entries prefix + 0..n-1 take what entries
//       prefix + src[0..n-1] held (all read before any is written, as index_select then a copy does).
//       engine/kvcache.py's compaction of a step's kept entries, every layer's keys and values in one
//       call instead of four PyTorch calls a layer.
//
// PyTorch computes a bfloat16 product or sum in float32 and rounds it to bfloat16 (to nearest, ties to
// even); float32 products, sums, square roots and quotients are correctly rounded, vectorised or not.
// So each element here is the same sequence of correctly rounded operations, and gets the same bits
// (tests/engine/test_lean_forward.py compares them); a sum of many terms (the norm's variance) adds them
// in PyTorch's order. What it saves is calls: ~25 of PyTorch's a layer (views, slices, casts, products,
// reductions) in three, each costing microseconds of dispatch for a few hundred elements.

#include <torch/extension.h>

// Every product and sum below must round by itself, as PyTorch's do: no fused multiply-adds.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

inline float f(at::BFloat16 x) { return static_cast<float>(x); }
inline at::BFloat16 bf(float x) { return at::BFloat16(x); }  // round to nearest, ties to even

// One head's D values x (stride 1) -> out, given the row's cos and sin.
inline void rotate(const at::BFloat16* x, const at::BFloat16* c, const at::BFloat16* s, at::BFloat16* out,
                   int64_t D) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < D; ++i) {
    const float r = i < half ? -f(x[i + half]) : f(x[i - half]);  // negation is exact in bfloat16 too
    out[i] = bf(f(bf(f(x[i]) * f(c[i]))) + f(bf(r * f(s[i]))));
  }
}

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kBFloat16, name, " must be a bfloat16 CPU tensor");
  TORCH_CHECK(t.dim() == 3 && t.stride(2) == 1, name, " must be [B, Q, n] with its last dimension contiguous");
}

// PyTorch's sum of x[0..n) (float32, contiguous) as its vectorised inner reduction computes it with
// vectors of L lanes: whole vectors in four interleaved partial sums (multi_row_sum over rows of four
// vectors, cascaded in levels), the four added in order, then the scalar tail, then the lanes in order.
float cascade_sum(const float* x, int64_t n, int64_t L) {
  constexpr int64_t kRows = 4, kLevels = 4;
  float acc[kLevels][kRows][16] = {};  // [level][partial][lane]
  const int64_t nvec = n / L, size = nvec / kRows;  // whole vectors; "rows" of four vectors
  int64_t log2 = 1;
  if (size > 2) {
    log2 = 0;
    for (uint64_t v = static_cast<uint64_t>(size) - 1; v; v >>= 1) ++log2;  // CeilLog2
  }
  const int64_t power = std::max<int64_t>(4, log2 / kLevels), step = int64_t(1) << power, mask = step - 1;
  auto add_row = [&](int64_t i) {
    for (int64_t k = 0; k < kRows; ++k)
      for (int64_t l = 0; l < L; ++l) acc[0][k][l] += x[(i * kRows + k) * L + l];
  };
  int64_t i = 0;
  while (i + step <= size) {
    for (int64_t j = 0; j < step; ++j, ++i) add_row(i);
    for (int64_t j = 1; j < kLevels; ++j) {
      for (int64_t k = 0; k < kRows; ++k)
        for (int64_t l = 0; l < L; ++l) {
          acc[j][k][l] += acc[j - 1][k][l];
          acc[j - 1][k][l] = 0.0f;
        }
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  for (; i < size; ++i) add_row(i);
  for (int64_t j = 1; j < kLevels; ++j)
    for (int64_t k = 0; k < kRows; ++k)
      for (int64_t l = 0; l < L; ++l) acc[0][k][l] += acc[j][k][l];
  for (int64_t v = size * kRows; v < nvec; ++v)  // whole vectors past the last row of four
    for (int64_t l = 0; l < L; ++l) acc[0][0][l] += x[v * L + l];
  for (int64_t k = 1; k < kRows; ++k)
    for (int64_t l = 0; l < L; ++l) acc[0][0][l] += acc[0][k][l];
  float total = 0.0f;
  for (int64_t t = nvec * L; t < n; ++t) total += x[t];
  for (int64_t l = 0; l < L; ++l) total += acc[0][0][l];
  return total;
}

}  // namespace

std::vector<at::Tensor> rotary_qk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                  const at::Tensor& sin, int64_t D) {
  check_rows(q, "q");
  check_rows(k, "k");
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  const int64_t B = q.size(0), Q = q.size(1);
  TORCH_CHECK(D > 0 && D % 2 == 0 && q.size(2) % D == 0 && k.size(2) % D == 0, "head size must be even and divide q and k");
  TORCH_CHECK(k.size(0) == B && k.size(1) == Q && cos.size(0) == B && cos.size(1) == Q && cos.size(2) == D &&
              sin.sizes() == cos.sizes(), "q, k, cos and sin must agree on [B, Q] (cos, sin: [B, Q, D])");
  const int64_t H = q.size(2) / D, Hkv = k.size(2) / D;
  at::Tensor qo = at::empty({B, H, Q, D}, q.options()), ko = at::empty({B, Hkv, Q, D}, k.options());
  const at::BFloat16 *qp = q.data_ptr<at::BFloat16>(), *kp = k.data_ptr<at::BFloat16>();
  const at::BFloat16 *cp = cos.data_ptr<at::BFloat16>(), *sp = sin.data_ptr<at::BFloat16>();
  at::BFloat16 *qop = qo.data_ptr<at::BFloat16>(), *kop = ko.data_ptr<at::BFloat16>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Q; ++t) {
      const at::BFloat16* c = cp + b * cos.stride(0) + t * cos.stride(1);
      const at::BFloat16* s = sp + b * sin.stride(0) + t * sin.stride(1);
      const at::BFloat16* qr = qp + b * q.stride(0) + t * q.stride(1);
      const at::BFloat16* kr = kp + b * k.stride(0) + t * k.stride(1);
      for (int64_t h = 0; h < H; ++h) rotate(qr + h * D, c, s, qop + ((b * H + h) * Q + t) * D, D);
      for (int64_t h = 0; h < Hkv; ++h) rotate(kr + h * D, c, s, kop + ((b * Hkv + h) * Q + t) * D, D);
    }
  }
  return {qo, ko};
}

at::Tensor rms_scale(const at::Tensor& x, const at::Tensor& variance, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16 &&
              variance.scalar_type() == at::kFloat, "rms_scale takes bfloat16 x and weight, float32 variance, on CPU");
  const int64_t D = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == D && variance.size(-1) == 1 && variance.numel() * D == x.numel(),
              "rms_scale: x [..., D], variance [..., 1], weight [D]");
  const at::Tensor xc = x.contiguous(), vc = variance.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc);
  const at::BFloat16 *xp = xc.data_ptr<at::BFloat16>(), *wp = wc.data_ptr<at::BFloat16>();
  const float* vp = vc.data_ptr<float>();
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  const float e = static_cast<float>(eps);  // PyTorch adds a Python float to a float32 tensor as float32
  const int64_t rows = vc.numel();
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.0f / std::sqrt(vp[r] + e);  // torch.rsqrt: 1 / sqrt, each correctly rounded
    for (int64_t i = 0; i < D; ++i) op[r * D + i] = bf(f(wp[i]) * f(bf(f(xp[r * D + i]) * inv)));
  }
  return out;
}

// x [..., D] bfloat16 -> [..., 1] float32: x.float().pow(2).mean(-1, keepdim=True) as rms_norm takes it.
at::Tensor variance(const at::Tensor& x, int64_t lanes) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16, "variance takes bfloat16 x on CPU");
  TORCH_CHECK(lanes >= 1 && lanes <= 16 && x.size(-1) >= lanes, "variance: 1 to 16 lanes, rows at least that wide");
  const at::Tensor xc = x.contiguous();
  const int64_t D = x.size(-1), rows = xc.numel() / D;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = 1;
  at::Tensor out = at::empty(shape, x.options().dtype(at::kFloat));
  std::vector<float> squares(D);
  const at::BFloat16* xp = xc.data_ptr<at::BFloat16>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < D; ++i) squares[i] = f(xp[r * D + i]) * f(xp[r * D + i]);
    out.data_ptr<float>()[r] = cascade_sum(squares.data(), D, lanes) / static_cast<float>(D);
  }
  return out;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, int64_t lanes) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16,
              "rms_norm takes bfloat16 x and weight on CPU");
  TORCH_CHECK(lanes >= 1 && lanes <= 16, "rms_norm: 1 to 16 lanes");
  const int64_t D = x.size(-1);
  TORCH_CHECK(D >= lanes && weight.dim() == 1 && weight.size(0) == D, "rms_norm: x [..., D] (D >= lanes), weight [D]");
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc);
  const at::BFloat16 *xp = xc.data_ptr<at::BFloat16>(), *wp = wc.data_ptr<at::BFloat16>();
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  const float e = static_cast<float>(eps), n = static_cast<float>(D);
  std::vector<float> squares(D);
  const int64_t rows = xc.numel() / D;
  for (int64_t r = 0; r < rows; ++r) {
    const at::BFloat16* row = xp + r * D;
    for (int64_t i = 0; i < D; ++i) squares[i] = f(row[i]) * f(row[i]);  // x.float().pow(2): x * x
    const float variance = cascade_sum(squares.data(), D, lanes) / n;  // mean: the sum, then / D
    const float inv = 1.0f / std::sqrt(variance + e);
    for (int64_t i = 0; i < D; ++i) op[r * D + i] = bf(f(wp[i]) * f(bf(f(row[i]) * inv)));
  }
  return out;
}

void keep_rows_(const std::vector<at::Tensor>& buffers, int64_t lo, int64_t hi, int64_t prefix, const at::Tensor& src) {
  TORCH_CHECK(src.device().is_cpu() && src.scalar_type() == at::kLong && src.dim() == 1, "src must be a 1-D int64 CPU tensor");
  const at::Tensor idx = src.contiguous();
  const int64_t n = idx.numel();
  const int64_t* at = idx.data_ptr<int64_t>();
  int64_t top = -1;
  for (int64_t j = 0; j < n; ++j) {
    TORCH_CHECK(at[j] >= 0, "src entries must be >= 0");
    top = std::max(top, at[j]);
  }
  std::vector<char> held;
  for (const at::Tensor& b : buffers) {
    TORCH_CHECK(b.device().is_cpu() && b.dim() == 4 && b.is_contiguous(), "buffers must be contiguous [S, H, T, D] CPU tensors");
    const int64_t H = b.size(1), T = b.size(2), row = b.size(3) * b.element_size();
    TORCH_CHECK(0 <= lo && lo <= hi && hi <= b.size(0) && prefix >= 0 && prefix + top < T,
                "keep_rows_: slots or entries out of range");
    held.resize(static_cast<size_t>(n * row));
    char* base = static_cast<char*>(b.data_ptr());
    for (int64_t s = lo; s < hi; ++s)
      for (int64_t h = 0; h < H; ++h) {
        char* head = base + ((s * H + h) * T + prefix) * row;
        for (int64_t j = 0; j < n; ++j) std::memcpy(held.data() + j * row, head + at[j] * row, row);  // read all first
        std::memcpy(head, held.data(), static_cast<size_t>(n * row));
      }
  }
}
