// PyTorch's CPU uniform draws, generated without PyTorch's per-value generator calls (engine/sampling.py
// takes them for the seeded sampling rule's noise; engine/exact_kernel.py builds this file into the
// same extension as exact_kernel.cpp).
//
//   mt_uniform(seed >= 0, n >= 0) -> float32 [n]: the values of
//       torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float32), bit for bit.
//
// What PyTorch does there (torch 2.x, CPU generator; tests/engine/test_uniform_kernel.py checks it against
// torch.rand on every seed and length it tries, and engine/sampling.py checks it once per process before
// taking it): the generator is the reference Mersenne Twister MT19937 (Matsumoto and Nishimura, 1998)
// seeded with the seed's low 32 bits by its standard initialisation, and each float32 value is one
// 32-bit output x as (x mod 2^24) * 2^-24, in order. That conversion is exact (an integer below 2^24
// times a power of two), so the values depend on integer arithmetic alone: no rounding, no vector width.
//
// Why: torch.rand calls the generator once per value through a lock; 49,152 values (SmolLM2's vocabulary)
// took ~155 us on 2 Zen 4 cores, more than the two logarithms that turn them into Gumbel noise, and a
// sampled step draws one such row per new position. Here the state is twisted 624 words at a time and
// the outputs tempered and converted in loops the compiler vectorises.

#include <torch/extension.h>

#include <cstdint>

namespace {

constexpr int kN = 624;  // MT19937's state, in 32-bit words
constexpr int kM = 397;  // the middle word's offset
constexpr uint32_t kMatrixA = 0x9908b0dfu;
constexpr uint32_t kUpper = 0x80000000u;
constexpr uint32_t kLower = 0x7fffffffu;

// The standard initialisation from a 32-bit seed (init_genrand).
void seed_state(uint32_t* mt, uint32_t seed) {
  mt[0] = seed;
  for (int i = 1; i < kN; ++i) mt[i] = 1812433253u * (mt[i - 1] ^ (mt[i - 1] >> 30)) + static_cast<uint32_t>(i);
}

inline uint32_t twisted(uint32_t cur, uint32_t next, uint32_t far) {
  const uint32_t y = (cur & kUpper) | (next & kLower);
  return far ^ (y >> 1) ^ ((y & 1u) ? kMatrixA : 0u);
}

// The next 624 words in place. Word i reads words i+1 and i+397 (mod 624) as they stand when it is reached:
// old ones ahead of it, new ones once i+397 wraps past 624 (227 words back), so each loop below runs
// with no dependence closer than 227 words and vectorises.
void twist(uint32_t* mt) {
  int i = 0;
  for (; i < kN - kM; ++i) mt[i] = twisted(mt[i], mt[i + 1], mt[i + kM]);
  for (; i < kN - 1; ++i) mt[i] = twisted(mt[i], mt[i + 1], mt[i + kM - kN]);
  mt[kN - 1] = twisted(mt[kN - 1], mt[0], mt[kM - 1]);
}

inline float tempered_float(uint32_t y) {
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return static_cast<float>(y & 0xffffffu) * (1.0f / 16777216.0f);  // exact: < 2^24 times 2^-24
}

}  // namespace

at::Tensor mt_uniform(int64_t seed, int64_t n) {
  TORCH_CHECK(seed >= 0, "mt_uniform: seed must be >= 0 (as torch.Generator.manual_seed takes it here)");
  TORCH_CHECK(n >= 0, "mt_uniform: n must be >= 0");
  auto out = at::empty({n}, at::TensorOptions().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  alignas(64) uint32_t mt[kN];
  seed_state(mt, static_cast<uint32_t>(static_cast<uint64_t>(seed) & 0xffffffffu));
  for (int64_t done = 0; done < n; done += kN) {  // a fresh state's first draw twists first, as MT19937 does
    twist(mt);
    const int64_t take = n - done < kN ? n - done : kN;
    for (int64_t j = 0; j < take; ++j) op[done + j] = tempered_float(mt[j]);
  }
  return out;
}
