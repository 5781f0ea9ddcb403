/* Shared prelude of every cpu-c kernel. Tunables arrive as -D style #defines rendered above this text:
   THREADS (OpenMP threads), CHUNK (rows per scheduling chunk), VEC (0 = scalar loop with GCC unroll,
   8/16 = omp simd with that vector length), UNROLL, ACC_DOUBLE (double accumulators), EXP_POLY
   (vectorisable polynomial exp instead of libm expf), DTYPE_BF16 (activations stored as bfloat16). */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ternary min/max: libm fminf/fmaxf are calls under strict IEEE and block vectorisation */
#define MINF(a, b) ((a) < (b) ? (a) : (b))
#define MAXF(a, b) ((a) > (b) ? (a) : (b))
#define DO_PRAGMA(x) _Pragma(#x)
#define UNROLL_N(n) DO_PRAGMA(GCC unroll n)
#define SIMDLEN_N(n) DO_PRAGMA(omp simd simdlen(n))
#define SIMDSUM_N(n, v) DO_PRAGMA(omp simd simdlen(n) reduction(+:v))
#define SIMDMAX_N(n, v) DO_PRAGMA(omp simd simdlen(n) reduction(max:v))
#define SIMDSUM2_N(n, v, w) DO_PRAGMA(omp simd simdlen(n) reduction(+:v, w))
#if VEC
#define LOOP SIMDLEN_N(VEC)
#define LOOP_SUM(v) SIMDSUM_N(VEC, v)
#define LOOP_SUM2(v, w) SIMDSUM2_N(VEC, v, w)
#define LOOP_MAX(v) SIMDMAX_N(VEC, v)
#else
#define LOOP UNROLL_N(UNROLL)
#define LOOP_SUM(v) UNROLL_N(UNROLL)
#define LOOP_SUM2(v, w) UNROLL_N(UNROLL)
#define LOOP_MAX(v) UNROLL_N(UNROLL)
#endif
#define PARFOR DO_PRAGMA(omp parallel for num_threads(THREADS) schedule(static, CHUNK) if(THREADS > 1))

#if ACC_DOUBLE
typedef double acc_t;
#else
typedef float acc_t;
#endif

#if DTYPE_BF16
typedef uint16_t act_t;
static inline float LD(const act_t *p, int64_t i) {
  uint32_t u = ((uint32_t)p[i]) << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline void ST(act_t *p, int64_t i, float f) {
  uint32_t u; memcpy(&u, &f, 4); u += 0x7FFFu + ((u >> 16) & 1u); p[i] = (uint16_t)(u >> 16);
}
#else
typedef float act_t;
static inline float LD(const act_t *p, int64_t i) { return p[i]; }
static inline void ST(act_t *p, int64_t i, float f) { p[i] = f; }
#endif

/* Cephes-style expf: range reduction by ln2 and a degree-6 polynomial; ~2 ulp, vectorises under omp simd. */
static inline float exp_poly(float x) {
  x = MINF(MAXF(x, -87.3f), 88.7f);
  float n = floorf(fmaf(x, 1.44269504088896341f, 0.5f));
  float r = fmaf(n, -0.693359375f, x);
  r = fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  p = fmaf(p, r * r, r) + 1.0f;
  uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
  float sc; memcpy(&sc, &bits, 4);
  return p * sc;
}
/* Cephes-style logf for normal x > 0: mantissa in [sqrt(1/2), sqrt(2)), degree-8 polynomial. */
static inline float log_poly(float x) {
  uint32_t u; memcpy(&u, &x, 4);
  int32_t e = (int32_t)(u >> 23) - 127;
  u = (u & 0x007FFFFFu) | 0x3F800000u;
  float m; memcpy(&m, &u, 4);
  const int big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  const float fe = (float)(e + big);
  const float f = m - 1.0f, z = f * f;
  float y = 7.0376836292e-2f;
  y = fmaf(y, f, -1.1514610310e-1f);
  y = fmaf(y, f, 1.1676998740e-1f);
  y = fmaf(y, f, -1.2420140846e-1f);
  y = fmaf(y, f, 1.4249322787e-1f);
  y = fmaf(y, f, -1.6668057665e-1f);
  y = fmaf(y, f, 2.0000714765e-1f);
  y = fmaf(y, f, -2.4999993993e-1f);
  y = fmaf(y, f, 3.3333331174e-1f);
  y = y * f * z;
  y = fmaf(-2.12194440e-4f, fe, y);
  y = fmaf(-0.5f, z, y);
  return fmaf(0.693359375f, fe, f + y);
}
/* log1p(t) for t >= 0 without cancellation: log(u) * t / (u - 1) with u = 1 + t. */
static inline float log1p_poly(float t) {
  const float u = 1.0f + t, dd = u - 1.0f;
  return dd == 0.0f ? t : log_poly(u) * (t / dd);
}
#if EXP_POLY
#define EXPF exp_poly
#else
#define EXPF expf
#endif

void trex_kernel(void **p, const int64_t *d, const double *s);

#if defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_AVX512 1
/* expf on 16 lanes as 2^t, t = x log2(e): n = round(t), 2^(t - n) by its degree-6 Taylor polynomial on
   [-1/2, 1/2] (truncation < 2e-7 relative), 2^n applied with scalef. Same input clamp as exp_poly; four
   fewer vector operations than the Cephes reduction, which matters where exp bounds the kernel (SwiGLU). */
static inline __m512 exp_poly16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 q = _mm512_set1_ps(1.5403530393381608e-4f);
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(1.3333558146428443e-3f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(9.6181291076284772e-3f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(5.5504108664821580e-2f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(2.4022650695910071e-1f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(6.9314718055994531e-1f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(q, n);
}
/* exp(-x) on 16 lanes for the sigmoid paths: t = -x log2(e) capped at 127 (2^t stays finite, so
   1 / (1 + e) never meets inf * 0), no lower clamp (scalef flushes 2^-large to 0), and a degree-5
   near-minimax polynomial for 2^f on [-1/2, 1/2] (2.4e-7 relative in fp32): three vector operations
   fewer than exp_poly16 on a negated input, which is what bounds SwiGLU on one core. */
static inline __m512 expneg_poly16(__m512 x) {
  const __m512 t = _mm512_min_ps(_mm512_mul_ps(x, _mm512_set1_ps(-1.44269504088896341f)), _mm512_set1_ps(127.0f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 q = _mm512_set1_ps(1.3276471291e-03f);
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(9.6755409613e-03f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(5.5507130921e-02f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(2.4022120237e-01f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(6.9314694405e-01f));
  q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(1.0000001192e+00f));
  return _mm512_scalef_ps(q, n);
}
/* 1 / (1 + e) for finite e >= 0: rcp14 refined by one Newton step (~1e-7 relative), cheaper than a divide. */
static inline __m512 inv1p16(__m512 e) {
  const __m512 dd = _mm512_add_ps(_mm512_set1_ps(1.0f), e), r = _mm512_rcp14_ps(dd);
  return _mm512_mul_ps(r, _mm512_fnmadd_ps(dd, r, _mm512_set1_ps(2.0f)));
}
/* lanes [0, k) of a 16-lane tail */
static inline __mmask16 tail_mask(int64_t k) { return (__mmask16)((1u << k) - 1u); }
#else
#define HAVE_AVX512 0
#endif
