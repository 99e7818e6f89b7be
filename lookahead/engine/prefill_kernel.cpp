// A prompt's causal attention over its own keys, for bfloat16 on CPUs with AVX-512 BF16 (engine/
// exact_kernel.py builds it into the same extension as exact_kernel.cpp; engine/attention.py calls it
// from the prefill's fused branch, `causal_prompt`).
//
//   causal_prefill(query [1, H, n, D], key [1, Hkv, >=past+n, D], value [1, Hkv, >=past+n, D], scale,
//                  window, past)
//       -> [1, n, H, D] bfloat16: row i of head h sits at position past + i and attends to keys 0..past+i
//       of kv head h / (H / Hkv), or with a sliding window (window > 0) to keys past+i-window+1..past+i
//       only (transformers' sliding-window layers: a key is seen while q - k < window). `past`: keys
//       already cached before these rows (a prompt whose first tokens came from the prefix cache,
//       engine/prefix_cache.py); 0 for a prompt into an empty cache.
//
// Why: PyTorch's CPU flash attention ran SmolLM2's prompts at 65-140 GFLOP/s on 2 Zen 4 cores (531 to
// 6,500 tokens), a third of what the linears reach, so long prompts spent most of their prefill in it.
// This kernel multiplies bfloat16 pairs straight into float32 sums (vdpbf16ps): keys are repacked once
// into blocks of 16 keys by dimension pairs, values into key pairs, and each task takes 8 query rows of
// one head through the keys they see in chunks of 128 with an online softmax (running maximum and sum,
// float32; the probabilities are rounded to bfloat16 for the value products, as PyTorch's kernel does).
// Tasks pair the query tiles i and last - i, so both threads get the same work under the causal mask.
// Under a sliding window a tile starts at the 16-key block holding its first row's first key, so its
// work is the window's, not the prompt's (Gemma 3's local layers past 512 tokens).
//
// Not exact in engine/attention.py's sense and not meant to be: no logit of a prefill is read, and every
// strategy, alone or batched, caches a prompt through this same pass, so every decoding step sees the
// same prompt keys and values. Its rows match a float64 reference as closely as PyTorch's kernel does
// (tests/engine/test_prefill.py). But a row's result depends only on its own position, its visible keys
// and the absolute chunk grid (chunks of 128 keys from key 0, or from the 16-key block of its tile's
// first key under a window; keys a row does not see add exact zeros): so a prompt split at a multiple
// of 8 tokens (`past`: whole 8-row tiles before it) gives every row the bits of the one-pass prefill,
// which is what lets the prefix cache reuse a stored prefix without changing a token.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define LOOKAHEAD_PREFILL 1

static inline __m512 exp16(__m512 x) {  // x <= 0; lanes below -87 give exactly 0
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
  r = _mm512_fnmadd_ps(n, ln2_lo, r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_maskz_mov_ps(~tiny, _mm512_scalef_ps(p, n));
}

static inline uint16_t to_bf16(float f) {  // round to nearest even (no NaNs here)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

constexpr int TQ = 8;    // query rows per task tile (one head)
constexpr int KC = 128;  // keys per online-softmax chunk

// q [1, H, n, D], k/v [1, Hkv, >=n, D] bfloat16 (last dim contiguous) -> out [1, n, H, D] bfloat16
static at::Tensor prefill_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale_d,
                               int64_t window, int64_t past) {
  const int64_t H = q.size(1), n = q.size(2), D = q.size(3), Hkv = k.size(1), G = H / Hkv;
  const int64_t nk = past + n;  // keys any row sees: the cached ones and these rows' own
  const int64_t DP = D / 2, nb = (nk + 15) / 16, np = (nk + 1) / 2;
  const float scale = (float)scale_d;
  // Keys as 16-key blocks of dimension pairs: kp[h][block][dp][key][2]; values as key pairs: vp[h][pair][d][2].
  std::vector<uint16_t> kp(Hkv * nb * DP * 32, 0), vp(Hkv * np * D * 2, 0);
  const uint16_t* kd = reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>());
  const uint16_t* vd = reinterpret_cast<const uint16_t*>(v.data_ptr<at::BFloat16>());
  const uint16_t* qd = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
  const auto ks = k.strides(), vs = v.strides(), qs = q.strides();
  at::parallel_for(0, Hkv * nb, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t h = i / nb, b = i % nb;
      for (int64_t j = 0; j < 16 && b * 16 + j < nk; ++j) {
        const int64_t key = b * 16 + j;
        const uint16_t* kr = kd + h * ks[1] + key * ks[2];
        uint16_t* dst = kp.data() + ((h * nb + b) * DP) * 32 + j * 2;
        for (int64_t dp = 0; dp < DP; ++dp) {
          dst[dp * 32] = kr[2 * dp];
          dst[dp * 32 + 1] = kr[2 * dp + 1];
        }
        const uint16_t* vr = vd + h * vs[1] + key * vs[2];
        uint16_t* vdst = vp.data() + ((h * np + key / 2) * D) * 2 + (key & 1);
        for (int64_t d = 0; d < D; ++d) vdst[d * 2] = vr[d];
      }
    }
  });
  auto out = at::empty({1, n, H, D}, q.options());
  uint16_t* od = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int64_t tiles = (n + TQ - 1) / TQ;
  const int64_t units = (tiles + 1) / 2;  // tile i with tile tiles-1-i: the same work per unit
  const float ninf = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, H * units, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> o(TQ * D), S(TQ * KC);
    std::vector<uint32_t> P(TQ * KC / 2);
    std::vector<uint32_t> qpair(TQ * DP);
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t hq = u / units, pair = u % units, kvh = hq / G;
      for (int side = 0; side < 2; ++side) {
        const int64_t tile = side == 0 ? pair : tiles - 1 - pair;
        if (side == 1 && tile == pair) break;
        // r0: the tile's first row; a0 its position (row r sits at a0 + r); last: its last row's position
        const int64_t r0 = tile * TQ, rows = std::min<int64_t>(TQ, n - r0), a0 = past + r0, last = a0 + rows - 1;
        for (int r = 0; r < TQ; ++r)
          for (int64_t dp = 0; dp < DP; ++dp) {
            uint32_t w = 0;
            if (r < rows) std::memcpy(&w, qd + hq * qs[1] + (r0 + r) * qs[2] + 2 * dp, 4);
            qpair[r * DP + dp] = w;
          }
        std::fill(o.begin(), o.end(), 0.f);
        float m[TQ], l[TQ];
        for (int r = 0; r < TQ; ++r) m[r] = ninf, l[r] = 0.f;
        // the first key any row of the tile sees, rounded down to its 16-key block (no 16-key boundary
        // falls inside an 8-row tile, so every chunk starts at or before the tile's first row)
        const int64_t first = window > 0 ? std::max<int64_t>(0, a0 - window + 1) / 16 * 16 : 0;
        for (int64_t c0 = first; c0 <= last; c0 += KC) {
          const int64_t width = std::min<int64_t>(KC, last + 1 - c0);  // keys of this chunk any row sees
          const int64_t blocks = (width + 15) / 16;
          for (int64_t kb = 0; kb < blocks; ++kb) {
            const int64_t key0 = c0 + kb * 16;
            const uint16_t* kblk = kp.data() + ((kvh * nb + key0 / 16) * DP) * 32;
            __m512 acc[TQ];
            for (int r = 0; r < TQ; ++r) acc[r] = _mm512_setzero_ps();
            for (int64_t dp = 0; dp < DP; ++dp) {
              const __m512i kv = _mm512_loadu_si512(kblk + dp * 32);
              for (int r = 0; r < TQ; ++r)
                acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)kv, (__m512bh)_mm512_set1_epi32(qpair[r * DP + dp]));
            }
            for (int r = 0; r < TQ; ++r) {
              __m512 s = _mm512_mul_ps(acc[r], _mm512_set1_ps(scale));
              const int64_t pos = a0 + r;  // keys after pos are hidden, and under a window keys before lo
              const int64_t visible = pos - key0 + 1, before = window > 0 ? pos - window + 1 - key0 : 0;
              if (visible < 16 || before > 0) {
                uint32_t keep = visible <= 0 ? 0u : visible >= 16 ? 0xffffu : (1u << visible) - 1;
                if (before > 0) keep &= before >= 16 ? 0u : ~((1u << before) - 1);
                s = _mm512_mask_mov_ps(_mm512_set1_ps(ninf), (__mmask16)keep, s);
              }
              _mm512_storeu_ps(S.data() + r * KC + kb * 16, s);
            }
          }
          const int64_t cols = blocks * 16;
          for (int r = 0; r < TQ; ++r) {
            float* sr = S.data() + r * KC;
            __m512 mx = _mm512_set1_ps(ninf);
            for (int64_t j = 0; j < cols; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(sr + j));
            const float cmax = _mm512_reduce_max_ps(mx);
            const float mnew = std::max(m[r], cmax);
            if (mnew == ninf) {  // a padding row (past n), or a chunk before the row's window: nothing visible
              for (int64_t j = 0; j < cols / 2; ++j) P[r * (KC / 2) + j] = 0;
              continue;
            }
            const float corr = m[r] == ninf ? 0.f : std::exp(m[r] - mnew);
            __m512 sum = _mm512_setzero_ps();
            const __m512 mb = _mm512_set1_ps(mnew);
            for (int64_t j = 0; j < cols; j += 16) {
              const __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(sr + j), mb));
              sum = _mm512_add_ps(sum, p);
              _mm512_storeu_ps(sr + j, p);
            }
            l[r] = l[r] * corr + _mm512_reduce_add_ps(sum);
            m[r] = mnew;
            if (corr != 1.f)
              for (int64_t d = 0; d < D; ++d) o[r * D + d] *= corr;
            for (int64_t j = 0; j < cols / 2; ++j)
              P[r * (KC / 2) + j] = (uint32_t)to_bf16(sr[2 * j]) | ((uint32_t)to_bf16(sr[2 * j + 1]) << 16);
          }
          const int64_t pairs = cols / 2;
          for (int64_t c = 0; c < D / 16; ++c) {
            __m512 oa[TQ];
            for (int r = 0; r < TQ; ++r) oa[r] = _mm512_loadu_ps(o.data() + r * D + c * 16);
            const uint16_t* vbase = vp.data() + ((kvh * np + c0 / 2) * D + c * 16) * 2;
            for (int64_t jp = 0; jp < pairs && c0 / 2 + jp < np; ++jp) {
              const __m512i vv = _mm512_loadu_si512(vbase + jp * D * 2);
              for (int r = 0; r < TQ; ++r)
                oa[r] = _mm512_dpbf16_ps(oa[r], (__m512bh)vv, (__m512bh)_mm512_set1_epi32(P[r * (KC / 2) + jp]));
            }
            for (int r = 0; r < TQ; ++r) _mm512_storeu_ps(o.data() + r * D + c * 16, oa[r]);
          }
        }
        for (int64_t r = 0; r < rows; ++r) {
          const float inv = 1.f / l[r];
          uint16_t* dst = od + ((r0 + r) * H + hq) * D;
          for (int64_t d = 0; d < D; ++d) dst[d] = to_bf16(o[r * D + d] * inv);
        }
      }
    }
  });
  return out;
}
#endif

bool prefill_supported() {
#ifdef LOOKAHEAD_PREFILL
  return true;
#else
  return false;
#endif
}

at::Tensor causal_prefill(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                          int64_t window, int64_t past) {
  TORCH_CHECK(prefill_supported(), "causal_prefill: built without AVX-512 BF16 (use PyTorch's attention)");
  for (const at::Tensor* t : {&q, &k, &v})
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->dim() == 4 && t->size(0) == 1 && t->stride(3) == 1,
                "causal_prefill: expected bfloat16 [1, heads, tokens, head size] with contiguous head size");
  TORCH_CHECK(q.size(3) == k.size(3) && k.sizes() == v.sizes() && q.size(3) % 16 == 0 && q.size(3) <= 256,
              "causal_prefill: head size must be the same, a multiple of 16, at most 256");
  TORCH_CHECK(past >= 0, "causal_prefill: past must be >= 0 (keys cached before the rows)");
  TORCH_CHECK(q.size(1) % k.size(1) == 0 && k.size(2) >= past + q.size(2), "causal_prefill: heads or keys do not match");
  TORCH_CHECK(window >= 0, "causal_prefill: window must be >= 0 (0: none)");
#ifdef LOOKAHEAD_PREFILL
  return prefill_impl(q, k, v, scale, window, past);
#else
  return at::Tensor();
#endif
}
