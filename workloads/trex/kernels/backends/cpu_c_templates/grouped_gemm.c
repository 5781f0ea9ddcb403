#if ORDER == 3 && defined(__AVX512F__)
#include <immintrin.h>
/* W rows are walked with stride N: prefetch PF_DIST rows ahead (a prefetch past the end is harmless) */
#define PF_DIST 8
/* R x 32 register-blocked micro-kernel over the whole K (R <= 8 a compile-time constant at each call site,
   so the 2R zmm accumulators stay in registers): the leftover rows of a tile after its 8-row blocks. */
static inline __attribute__((always_inline)) void mk_rows(const int R, const float *xs, int64_t K,
                                                          const float *wc, int64_t N, float *out, int64_t ldo) {
  __m512 c0[8], c1[8];
  UNROLL_N(8)
  for (int q = 0; q < R; ++q) { c0[q] = _mm512_setzero_ps(); c1[q] = _mm512_setzero_ps(); }
  for (int64_t k = 0; k < K; ++k) {
    _mm_prefetch((const char *)(wc + (k + PF_DIST) * N), _MM_HINT_T0);
    _mm_prefetch((const char *)(wc + (k + PF_DIST) * N + 16), _MM_HINT_T0);
    const __m512 b0 = _mm512_loadu_ps(wc + k * N), b1 = _mm512_loadu_ps(wc + k * N + 16);
    UNROLL_N(8)
    for (int q = 0; q < R; ++q) {
      const __m512 a = _mm512_set1_ps(xs[q * K + k]);
      c0[q] = _mm512_fmadd_ps(a, b0, c0[q]);
      c1[q] = _mm512_fmadd_ps(a, b1, c1[q]);
    }
  }
  UNROLL_N(8)
  for (int q = 0; q < R; ++q) { _mm512_storeu_ps(out + q * ldo, c0[q]); _mm512_storeu_ps(out + q * ldo + 16, c1[q]); }
}
#endif
/* Grouped GEMM: rows off[e]..off[e+1] of x times W[e] -> y. Tiles of MB rows x NB columns (one expert
   each) are distributed over threads; K is walked in KB slices through a local accumulator tile.
   ORDER 0: i-k-j loop (one row at a time); ORDER 1: four rows share each W row load; ORDER 2: 4 x 32
   register-blocked micro-kernel over the whole K, leftovers i-k-j; ORDER 3: the same blocking with explicit
   AVX-512 intrinsics (8 x 32 blocks, then the leftover rows in one R x 32 pass; ORDER 2 code where AVX-512
   is absent).
   d = {tokens, experts, hidden, out}. */
void trex_kernel(void **p, const int64_t *d, const double *s) {
  const float *x = p[0], *w = p[1]; const int64_t *off = p[2]; float *y = p[3];
  const int64_t E = d[1], K = d[2], N = d[3];
  (void)s;
  const int64_t ncb = (N + NB - 1) / NB;
  int64_t first[E + 1];
  first[0] = 0;
  for (int64_t e = 0; e < E; ++e) first[e + 1] = first[e] + ((off[e + 1] - off[e] + MB - 1) / MB) * ncb;
  const int64_t ntiles = first[E];
  DO_PRAGMA(omp parallel for num_threads(THREADS) schedule(dynamic, 1) if(THREADS > 1))
  for (int64_t tile = 0; tile < ntiles; ++tile) {
    int64_t e = 0;
    while (first[e + 1] <= tile) ++e;
    const int64_t local = tile - first[e];
    const int64_t r0 = off[e] + (local / ncb) * MB, n0 = (local % ncb) * NB;
    const int64_t mb = off[e + 1] - r0 < MB ? off[e + 1] - r0 : MB;
    const int64_t nb = N - n0 < NB ? N - n0 : NB;
    const float *we = w + e * K * N;
    float acc[MB * NB];
    memset(acc, 0, sizeof(acc));
#if ORDER >= 2
    const int64_t mb4 = mb / 4 * 4, nb32 = nb / 32 * 32;
    int64_t i8 = 0;
#if ORDER == 3 && defined(__AVX512F__)
    /* 8 x 32 blocks: sixteen zmm accumulators, each W load feeds eight rows */
    for (; i8 + 8 <= mb; i8 += 8) {
      const float *xs = x + (r0 + i8) * K;
      for (int64_t j0 = 0; j0 < nb32; j0 += 32) {
        __m512 c[8][2];
        for (int q = 0; q < 8; ++q) { c[q][0] = _mm512_setzero_ps(); c[q][1] = _mm512_setzero_ps(); }
        const float *wc8 = we + n0 + j0;
        for (int64_t k = 0; k < K; ++k) {
          _mm_prefetch((const char *)(wc8 + (k + PF_DIST) * N), _MM_HINT_T0);
          _mm_prefetch((const char *)(wc8 + (k + PF_DIST) * N + 16), _MM_HINT_T0);
          const __m512 b0 = _mm512_loadu_ps(wc8 + k * N), b1 = _mm512_loadu_ps(wc8 + k * N + 16);
          for (int q = 0; q < 8; ++q) {
            const __m512 a = _mm512_set1_ps(xs[q * K + k]);
            c[q][0] = _mm512_fmadd_ps(a, b0, c[q][0]);
            c[q][1] = _mm512_fmadd_ps(a, b1, c[q][1]);
          }
        }
        for (int q = 0; q < 8; ++q) {
          _mm512_storeu_ps(acc + (i8 + q) * NB + j0, c[q][0]);
          _mm512_storeu_ps(acc + (i8 + q) * NB + j0 + 16, c[q][1]);
        }
      }
      for (int64_t r = 0; r < 8; ++r)
        for (int64_t k = 0; k < K; ++k) {
          const float a = x[(r0 + i8 + r) * K + k];
          for (int64_t j = nb32; j < nb; ++j) acc[(i8 + r) * NB + j] += a * we[k * N + n0 + j];
        }
    }
    /* the 1..7 leftover rows in one register-blocked pass per 32 columns (uneven expert counts) */
    if (i8 < mb) {
      const int64_t rem = mb - i8;
      const float *xs = x + (r0 + i8) * K;
      for (int64_t j0 = 0; j0 < nb32; j0 += 32) {
        const float *wc = we + n0 + j0; float *o = acc + i8 * NB + j0;
        switch (rem) {
          case 1: mk_rows(1, xs, K, wc, N, o, NB); break;
          case 2: mk_rows(2, xs, K, wc, N, o, NB); break;
          case 3: mk_rows(3, xs, K, wc, N, o, NB); break;
          case 4: mk_rows(4, xs, K, wc, N, o, NB); break;
          case 5: mk_rows(5, xs, K, wc, N, o, NB); break;
          case 6: mk_rows(6, xs, K, wc, N, o, NB); break;
          default: mk_rows(7, xs, K, wc, N, o, NB); break;
        }
      }
      for (int64_t r = 0; r < rem; ++r)
        for (int64_t k = 0; k < K; ++k) {
          const float a = xs[r * K + k];
          for (int64_t j = nb32; j < nb; ++j) acc[(i8 + r) * NB + j] += a * we[k * N + n0 + j];
        }
      i8 = mb;
    }
#endif
    for (int64_t i = i8; i < mb4; i += 4) {
      const float *x0 = x + (r0 + i) * K, *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;
      for (int64_t j0 = 0; j0 < nb32; j0 += 32) {
#if ORDER == 3 && defined(__AVX512F__)
        __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps(), c10 = _mm512_setzero_ps();
        __m512 c11 = _mm512_setzero_ps(), c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps();
        __m512 c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps();
        const float *wc3 = we + n0 + j0;
        for (int64_t k = 0; k < K; ++k) {
          const __m512 b0 = _mm512_loadu_ps(wc3 + k * N), b1 = _mm512_loadu_ps(wc3 + k * N + 16);
          __m512 a = _mm512_set1_ps(x0[k]);
          c00 = _mm512_fmadd_ps(a, b0, c00); c01 = _mm512_fmadd_ps(a, b1, c01);
          a = _mm512_set1_ps(x1[k]);
          c10 = _mm512_fmadd_ps(a, b0, c10); c11 = _mm512_fmadd_ps(a, b1, c11);
          a = _mm512_set1_ps(x2[k]);
          c20 = _mm512_fmadd_ps(a, b0, c20); c21 = _mm512_fmadd_ps(a, b1, c21);
          a = _mm512_set1_ps(x3[k]);
          c30 = _mm512_fmadd_ps(a, b0, c30); c31 = _mm512_fmadd_ps(a, b1, c31);
        }
        float *o3 = acc + i * NB + j0;
        _mm512_storeu_ps(o3, c00); _mm512_storeu_ps(o3 + 16, c01);
        _mm512_storeu_ps(o3 + NB, c10); _mm512_storeu_ps(o3 + NB + 16, c11);
        _mm512_storeu_ps(o3 + 2 * NB, c20); _mm512_storeu_ps(o3 + 2 * NB + 16, c21);
        _mm512_storeu_ps(o3 + 3 * NB, c30); _mm512_storeu_ps(o3 + 3 * NB + 16, c31);
        continue;
#endif
        float c0[32] = {0}, c1[32] = {0}, c2[32] = {0}, c3[32] = {0};
        const float *wc = we + n0 + j0;
        for (int64_t k = 0; k < K; ++k) {
          const float *wr = wc + k * N;
          const float a0 = x0[k], a1 = x1[k], a2 = x2[k], a3 = x3[k];
          LOOP
          for (int64_t j = 0; j < 32; ++j) {
            const float b = wr[j];
            c0[j] += a0 * b; c1[j] += a1 * b; c2[j] += a2 * b; c3[j] += a3 * b;
          }
        }
        float *o = acc + i * NB + j0;
        memcpy(o, c0, sizeof c0);
        memcpy(o + NB, c1, sizeof c1);
        memcpy(o + 2 * NB, c2, sizeof c2);
        memcpy(o + 3 * NB, c3, sizeof c3);
      }
      for (int64_t r = 0; r < 4; ++r)
        for (int64_t k = 0; k < K; ++k) {
          const float a = x[(r0 + i + r) * K + k];
          for (int64_t j = nb32; j < nb; ++j) acc[(i + r) * NB + j] += a * we[k * N + n0 + j];
        }
    }
    for (int64_t i = mb4 > i8 ? mb4 : i8; i < mb; ++i) {
      const float *xi = x + (r0 + i) * K;
      for (int64_t j0 = 0; j0 < nb32; j0 += 32) {
        float c0[32] = {0};
        const float *wc = we + n0 + j0;
        for (int64_t k = 0; k < K; ++k) {
          const float a = xi[k], *wr = wc + k * N;
          LOOP
          for (int64_t j = 0; j < 32; ++j) c0[j] += a * wr[j];
        }
        memcpy(acc + i * NB + j0, c0, sizeof c0);
      }
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = nb32; j < nb; ++j) acc[i * NB + j] += xi[k] * we[k * N + n0 + j];
    }
#else
    for (int64_t k0 = 0; k0 < K; k0 += KB) {
      const int64_t k1 = k0 + KB < K ? k0 + KB : K;
      int64_t i = 0;
#if ORDER == 1
      for (; i + 4 <= mb; i += 4) {
        float *c0 = acc + i * NB, *c1 = c0 + NB, *c2 = c1 + NB, *c3 = c2 + NB;
        for (int64_t k = k0; k < k1; ++k) {
          const float a0 = x[(r0 + i) * K + k], a1 = x[(r0 + i + 1) * K + k];
          const float a2 = x[(r0 + i + 2) * K + k], a3 = x[(r0 + i + 3) * K + k];
          const float *wr = we + k * N + n0;
          LOOP
          for (int64_t j = 0; j < nb; ++j) {
            const float b = wr[j];
            c0[j] += a0 * b; c1[j] += a1 * b; c2[j] += a2 * b; c3[j] += a3 * b;
          }
        }
      }
#endif
      for (; i < mb; ++i) {
        float *ci = acc + i * NB;
        for (int64_t k = k0; k < k1; ++k) {
          const float a = x[(r0 + i) * K + k];
          const float *wr = we + k * N + n0;
          LOOP
          for (int64_t j = 0; j < nb; ++j) ci[j] += a * wr[j];
        }
      }
    }
#endif
    for (int64_t i = 0; i < mb; ++i) memcpy(y + (r0 + i) * N + n0, acc + i * NB, (size_t)nb * sizeof(float));
  }
}
