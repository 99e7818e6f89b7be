// The exact kernel's scores for bfloat16 on CPUs with AVX-512 BF16 (engine/exact_kernel.py builds it
// into the same extension as exact_kernel.cpp, whose `scores` calls it where it was built).
//
//   dp_scores(query [B, H, Q, D], key [B, Hkv, K, D] bfloat16, mask [B, Q, K] float32 or none (its
//             data and first two strides), scale, out [B, Hkv, G*Q, K] float32),
//             D = 32, 64, 128 or 256, K a multiple of 16:
//       out = (q . k) * scale + mask, where q . k is summed over the D / 2 dimension pairs in four
//       partial sums (pair p goes to sum p mod 4, pairs in order, each pair added as vdpbf16ps adds it:
//       bfloat16 products, exact in float32, into a float32 sum), then (s0 + s1) + (s2 + s3); a key
//       whose mask is -inf gets -inf.
//
// Every key's score is that one fixed sequence of operations on its own query row and key, whatever
// the pass's shape, so a row's scores depend only on its own keys (the property exact_kernel.cpp's
// header states). Why not the lane sums of exact_kernel.cpp's generic `scores_impl`: they convert each
// key to float32 and add a dot product's 16 lanes in a tree, ~110 vector operations per row and 16 keys
// against 32 here. This kernel reads each block of 16 keys in memory order, turns it around once (a
// 16 x 16 transpose of dimension pairs, 64 shuffles per 16 pairs) so that lane j holds key j, and every
// query row then needs D / 2 multiply-adds per block and no tree. Reading a block's keys 64 bytes of
// each in turn instead (the transpose's input order) made one-row passes ~1.5% slower: the keys come
// from memory there, and the prefetcher follows a sequential walk best.
//
// Measured (SmolLM2-135M, 2 Zen 4 threads, docs/results/pair-scores): the scores alone 5-21% faster
// than the lane sums; whole exact passes 1-2.5% faster at 1 to 12 rows over 600 and 1,500 cached keys
// (a pass's time is mostly its linear layers).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <limits>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define LOOKAHEAD_DP_SCORES 1

// r[0..15]: 16 keys' dimension pairs 16t .. 16t+15 (one key a vector); out: those pairs' vectors, lane j
// key j. Four rounds of shuffles: 32-bit, then 64-bit interleaves within 128-bit lanes, then the lanes.
static inline void transpose16(const __m512i r[16], __m512i* out) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // b[4i + m], 128-bit lane L: column 4L + m of rows 4i .. 4i+3
    b[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int m = 0; m < 4; ++m) {  // column 4L + m: lane L of b[m], b[4 + m], b[8 + m], b[12 + m]
    const __m512i c1 = _mm512_shuffle_i32x4(b[m], b[4 + m], 0x44), c2 = _mm512_shuffle_i32x4(b[m], b[4 + m], 0xee);
    const __m512i d1 = _mm512_shuffle_i32x4(b[8 + m], b[12 + m], 0x44);
    const __m512i d2 = _mm512_shuffle_i32x4(b[8 + m], b[12 + m], 0xee);
    out[m] = _mm512_shuffle_i32x4(c1, d1, 0x88);
    out[4 + m] = _mm512_shuffle_i32x4(c1, d1, 0xdd);
    out[8 + m] = _mm512_shuffle_i32x4(c2, d2, 0x88);
    out[12 + m] = _mm512_shuffle_i32x4(c2, d2, 0xdd);
  }
}

// N query rows (their pairs `qp`, P = D / 2 a row) against one transposed block `kt` [P][16 keys]: each
// row's four partial sums, combined in a fixed order. The query pair is broadcast from memory inside the
// multiply-add ({1to16}); GCC 12 loads it into a register first from the intrinsic, one more operation
// each (in one run, 8-row scores took 1.21x the lane sums' time that way, 0.73x this way).
template <int N>
static inline void dots(const uint32_t* const* qp, const __m512i* kt, int64_t P, __m512* out) {
  __m512 s[N][4];
  for (int r = 0; r < N; ++r)
    for (int a = 0; a < 4; ++a) s[r][a] = _mm512_setzero_ps();
  for (int64_t p = 0; p < P; p += 4)
    for (int a = 0; a < 4; ++a)
      for (int r = 0; r < N; ++r)
        asm("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(s[r][a]) : "v"(kt[p + a]), "m"(qp[r][p + a]));
  for (int r = 0; r < N; ++r)
    out[r] = _mm512_add_ps(_mm512_add_ps(s[r][0], s[r][1]), _mm512_add_ps(s[r][2], s[r][3]));
}

static void dp_impl(const at::Tensor& q, const at::Tensor& k, const float* mp, int64_t ms0, int64_t ms1, float scale,
                    at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), Q = q.size(2), D = q.size(3), Hkv = k.size(1), K = k.size(2);
  const int64_t G = H / Hkv, R = G * Q, blocks = K / 16, P = D / 2;
  const uint16_t* qd = reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>());
  const uint16_t* kd = reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>());
  const auto qs = q.strides(), ks = k.strides();
  const bool masked = mp != nullptr;
  float* op = out.data_ptr<float>();
  const __m512 minf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  at::parallel_for(0, B * Hkv * blocks, 4, [&](int64_t lo, int64_t hi) {
    __m512i kt[128], raw[128];  // P <= 128 (head size 256): on the stack, no allocation a call
    std::vector<int64_t> rows(R);
    std::vector<__mmask16> hidden(R);  // [row]: the keys of this block it cannot see
    const uint32_t* qrow[4];
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t bh = i / blocks, b = bh / Hkv, h = bh % Hkv, j0 = (i % blocks) * 16;
      int64_t visible = 0;  // rows that see a key of this block
      for (int64_t r = 0; r < R; ++r) {
        hidden[r] = masked ? _mm512_cmp_ps_mask(_mm512_loadu_ps(mp + b * ms0 + (r % Q) * ms1 + j0), minf, _CMP_EQ_OQ) : 0;
        if (hidden[r] != 0xffff) rows[visible++] = r;
        else _mm512_storeu_ps(op + (bh * R + r) * K + j0, minf);  // a block this row cannot see: no products
      }
      if (!visible) continue;
      const uint16_t* kh = kd + b * ks[0] + h * ks[1] + j0 * ks[2];
      for (int j = 0; j < 16; ++j)  // the block's keys in memory order (each key's pairs, then the next key's)
        for (int64_t t = 0; t < P / 16; ++t) raw[t * 16 + j] = _mm512_loadu_si512(kh + j * ks[2] + 32 * t);
      for (int64_t t = 0; t < P / 16; ++t)  // turned around, 16 pairs at a time
        transpose16(raw + t * 16, kt + 16 * t);
      for (int64_t v = 0; v < visible; v += 4) {
        const int n = (int)std::min<int64_t>(4, visible - v);
        __m512 d[4];
        for (int x = 0; x < n; ++x) {
          const int64_t r = rows[v + x];
          qrow[x] = reinterpret_cast<const uint32_t*>(qd + b * qs[0] + (h * G + r / Q) * qs[1] + (r % Q) * qs[2]);
        }
        if (n == 4) dots<4>(qrow, kt, P, d);
        else if (n == 3) dots<3>(qrow, kt, P, d);
        else if (n == 2) dots<2>(qrow, kt, P, d);
        else dots<1>(qrow, kt, P, d);
        for (int x = 0; x < n; ++x) {
          const int64_t r = rows[v + x];
          float* o = op + (bh * R + r) * K + j0;
          __m512 s = _mm512_mul_ps(d[x], _mm512_set1_ps(scale));
          if (masked)
            s = _mm512_mask_mov_ps(_mm512_add_ps(s, _mm512_loadu_ps(mp + b * ms0 + (r % Q) * ms1 + j0)), hidden[r], minf);
          _mm512_storeu_ps(o, s);
        }
      }
    }
  });
}
#endif

bool dp_scores_supported() {
#ifdef LOOKAHEAD_DP_SCORES
  return true;
#else
  return false;
#endif
}

// Called by exact_kernel.cpp's `scores` with checked shapes (bfloat16, head size 32 .. 256) where
// dp_scores_supported(); the mask as data (null: none) and its first two strides.
void dp_scores(const at::Tensor& q, const at::Tensor& k, const float* mask, int64_t ms0, int64_t ms1, float scale,
               at::Tensor& out) {
#ifdef LOOKAHEAD_DP_SCORES
  dp_impl(q, k, mask, ms0, ms1, scale, out);
#else
  TORCH_CHECK(false, "dp_scores: built without AVX-512 BF16");
#endif
}
