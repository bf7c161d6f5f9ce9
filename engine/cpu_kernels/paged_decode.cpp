// Paged decode attention on the CPU: one query token per sequence, read straight from the block cache.
//
// The torch reference gathers every sequence's context into a padded tensor before attending; this
// kernel reads each K and V row once, in place, through the block table. Work is split over
// sequences on torch's intra-op thread pool; one pass over a token's K (then V) row serves every
// query head, GQA included. Scores and accumulation are in float32 whatever the
// storage dtype (float32, bfloat16, float16).
//
//   out[s, h, :] = softmax(scale * q[s, h, :] . K[s, t, h / g, :] over t in the window) @ V
//
// q: [S, Hq, D], each row's heads contiguous (a row stride is allowed: q sliced from a fused q|k); cache: [2, num_blocks, block_size, Hkv, D] contiguous (0 = K, 1 = V);
// block_tables: int32 [S, W]; context_lens: int32 [S] (the query is the last token of its context);
// window > 0 keeps only the last `window` keys (sliding-window attention), 0 = all of them.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#include <vector>

namespace {

// exp(x) for x <= 0 (softmax after subtracting the maximum), Cephes' expf: range reduction by
// ln 2 and a degree-6 polynomial, about 1 ulp. Unlike std::exp it vectorises, and the scores'
// exponentials are a large share of the kernel's work.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);  // exp(-87) is below float's normal range, and 0 in effect beside exp(0) = 1
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

#if defined(__AVX2__) && defined(__FMA__)
// exp_nonpositive on eight floats at once (the same steps, so the same results).
inline __m256 exp_nonpositive8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                                 _mm256_set1_ps(0.5f)));
  const __m256 r = _mm256_add_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f))),
                                 _mm256_mul_ps(n, _mm256_set1_ps(2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
#endif

// HD > 0 fixes the head size at compile time (the common sizes), so the per-head loops are fully
// unrolled and vectorised; HD == 0 takes it from `head_dim_arg`.
template <typename T, int64_t HD>
void decode_rows(const T* q, int64_t q_row_stride, const T* cache, const int32_t* tables, const int32_t* context_lens, T* out,
                 int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim_arg,
                 int64_t block_size, int64_t table_width, int64_t num_blocks, float scale, int64_t window) {
  const int64_t head_dim = HD > 0 ? HD : head_dim_arg;
  const int64_t group = num_heads / num_kv_heads;
  const int64_t row = num_kv_heads * head_dim;  // one token's K (or V) across the KV heads, contiguous
  const int64_t v_offset = num_blocks * block_size * row;
  const int64_t width = num_heads * head_dim;
  at::parallel_for(0, num_seqs, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(width), acc(width), top(num_heads), total(num_heads), scores;
    for (int64_t s = begin; s < end; ++s) {
      const int64_t len = context_lens[s];
      const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const int64_t n = len - first;
      const int32_t* table = tables + s * table_width;
      for (int64_t i = 0; i < width; ++i) qf[i] = static_cast<float>(q[s * q_row_stride + i]) * scale;
      scores.resize(num_heads * n);
      std::fill(top.begin(), top.end(), -INFINITY);
      // Pass 1: every query head's score against each key; a token's K row (all KV heads) is read
      // once. Tokens are walked block by block: no division per token.
      for (int64_t b = first / block_size, t = first; t < len; ++b) {
        const T* k_block = cache + static_cast<int64_t>(table[b]) * block_size * row;
        const int64_t stop = std::min(len, (b + 1) * block_size);
        for (; t < stop; ++t) {
          const T* k = k_block + (t - b * block_size) * row;
          int64_t hq = 0;
#if defined(__AVX2__) && defined(__FMA__)
          if constexpr (std::is_same_v<T, float> && HD > 0 && HD % 8 == 0) {
            // Four query heads at a time: their dot products finished by one horizontal-add tree.
            for (; hq + 4 <= num_heads; hq += 4) {
              __m256 dots[4];
              for (int u = 0; u < 4; ++u) {
                const float* qh = qf.data() + (hq + u) * HD;
                const float* kh = k + ((hq + u) / group) * HD;
                __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qh), _mm256_loadu_ps(kh));
                for (int64_t c = 8; c < HD; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + c), _mm256_loadu_ps(kh + c), acc);
                dots[u] = acc;
              }
              const __m256 pair = _mm256_hadd_ps(_mm256_hadd_ps(dots[0], dots[1]), _mm256_hadd_ps(dots[2], dots[3]));
              alignas(16) float four[4];
              _mm_store_ps(four, _mm_add_ps(_mm256_castps256_ps128(pair), _mm256_extractf128_ps(pair, 1)));
              for (int u = 0; u < 4; ++u) {
                scores[(hq + u) * n + (t - first)] = four[u];
                top[hq + u] = std::max(top[hq + u], four[u]);
              }
            }
          }
#endif
          for (; hq < num_heads; ++hq) {
            const float* qh = qf.data() + hq * head_dim;
            const T* kh = k + (hq / group) * head_dim;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * static_cast<float>(kh[d]);
            scores[hq * n + (t - first)] = dot;
            top[hq] = std::max(top[hq], dot);
          }
        }
      }
      for (int64_t hq = 0; hq < num_heads; ++hq) {
        float* sh = scores.data() + hq * n;
        const float m = top[hq];
        float sum = 0.f;
        int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
        __m256 sums = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) {
          const __m256 e = exp_nonpositive8(_mm256_sub_ps(_mm256_loadu_ps(sh + i), _mm256_set1_ps(m)));
          _mm256_storeu_ps(sh + i, e);
          sums = _mm256_add_ps(sums, e);
        }
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, sums);
        for (float lane : lanes) sum += lane;
#endif
        for (; i < n; ++i) {
          sh[i] = exp_nonpositive(sh[i] - m);
          sum += sh[i];
        }
        total[hq] = sum;
      }
      // Pass 2: the probability-weighted sum of V rows.
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t b = first / block_size, t = first; t < len; ++b) {
        const T* v_block = cache + v_offset + static_cast<int64_t>(table[b]) * block_size * row;
        const int64_t stop = std::min(len, (b + 1) * block_size);
        for (; t < stop; ++t) {
          const T* v = v_block + (t - b * block_size) * row;
          for (int64_t h = 0, hq = 0; h < num_kv_heads; ++h) {
            const T* vh = v + h * head_dim;
            for (int64_t j = 0; j < group; ++j, ++hq) {
              const float p = scores[hq * n + (t - first)];
              float* a = acc.data() + hq * head_dim;
#pragma omp simd
              for (int64_t d = 0; d < head_dim; ++d) a[d] += p * static_cast<float>(vh[d]);
            }
          }
        }
      }
      for (int64_t hq = 0; hq < num_heads; ++hq) {
        const float inv = total[hq] > 0.f ? 1.f / total[hq] : 0.f;
        T* dst = out + s * width + hq * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<T>(acc[hq * head_dim + d] * inv);
      }
    }
  });
}

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& cache, const at::Tensor& block_tables,
                        const at::Tensor& context_lens, double scale, int64_t window) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2),
              "q must be [S, Hq, D] with each row's heads contiguous (rows may be strided)");
  TORCH_CHECK(cache.dim() == 5 && cache.size(0) == 2 && cache.is_contiguous(),
              "the cache must be a contiguous [2, num_blocks, block_size, Hkv, D] tensor");
  TORCH_CHECK(cache.scalar_type() == q.scalar_type(), "q and the cache must have the same dtype");
  TORCH_CHECK(cache.size(4) == q.size(2), "q and the cache disagree on the head size");
  TORCH_CHECK(q.size(1) % cache.size(3) == 0, "the query heads must be a multiple of the KV heads");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.dim() == 2 && block_tables.is_contiguous() &&
                  block_tables.size(0) == q.size(0), "block_tables must be a contiguous int32 [S, W] tensor");
  TORCH_CHECK(context_lens.scalar_type() == at::kInt && context_lens.dim() == 1 && context_lens.is_contiguous() &&
                  context_lens.size(0) == q.size(0), "context_lens must be a contiguous int32 [S] tensor");
  TORCH_CHECK(q.device().is_cpu() && cache.device().is_cpu(), "paged_decode runs on CPU tensors");
  auto out = at::empty(q.sizes(), q.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    auto run = [&](auto head_dim_constant) {
      decode_rows<scalar_t, decltype(head_dim_constant)::value>(
          q.data_ptr<scalar_t>(), q.stride(0), cache.data_ptr<scalar_t>(), block_tables.data_ptr<int32_t>(),
          context_lens.data_ptr<int32_t>(), out.data_ptr<scalar_t>(), q.size(0), q.size(1), cache.size(3),
          q.size(2), cache.size(2), block_tables.size(1), cache.size(1), static_cast<float>(scale), window);
    };
    switch (q.size(2)) {
      case 16: run(std::integral_constant<int64_t, 16>{}); break;
      case 32: run(std::integral_constant<int64_t, 32>{}); break;
      case 64: run(std::integral_constant<int64_t, 64>{}); break;
      case 128: run(std::integral_constant<int64_t, 128>{}); break;
      default: run(std::integral_constant<int64_t, 0>{});
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(switchyard_cpu, m) {
  m.def("paged_decode(Tensor q, Tensor cache, Tensor block_tables, Tensor context_lens, float scale, int window) -> Tensor");
}

TORCH_LIBRARY_IMPL(switchyard_cpu, CPU, m) { m.impl("paged_decode", &paged_decode); }
