/* y = x * rsqrt(mean(x^2) + eps) * w, rstd saved for the backward. d = {rows, cols}, s = {eps}.
   fp32 with VEC >= 16 on AVX-512 (and float accumulators): explicit 512-bit intrinsics, four independent
   FMA accumulators for the sum of squares over a row (kept in L1), then one scaling pass; masked tails. */
#if defined(__AVX512F__) && !DTYPE_BF16 && !ACC_DOUBLE && VEC >= 16
#include <immintrin.h>
static inline void row_fwd(const float *restrict xr, const float *restrict w, float *restrict yr,
                           float *restrict rstd, int64_t C, float eps) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 64 <= C; c += 64) {
    const __m512 v0 = _mm512_loadu_ps(xr + c), v1 = _mm512_loadu_ps(xr + c + 16);
    const __m512 v2 = _mm512_loadu_ps(xr + c + 32), v3 = _mm512_loadu_ps(xr + c + 48);
    a0 = _mm512_fmadd_ps(v0, v0, a0); a1 = _mm512_fmadd_ps(v1, v1, a1);
    a2 = _mm512_fmadd_ps(v2, v2, a2); a3 = _mm512_fmadd_ps(v3, v3, a3);
  }
  for (; c + 16 <= C; c += 16) { const __m512 v = _mm512_loadu_ps(xr + c); a0 = _mm512_fmadd_ps(v, v, a0); }
  if (c < C) {
    const __mmask16 m = (__mmask16)((1u << (C - c)) - 1u);
    const __m512 v = _mm512_maskz_loadu_ps(m, xr + c);
    a1 = _mm512_fmadd_ps(v, v, a1);
  }
  const float acc = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  const float rs = 1.0f / sqrtf(acc / (float)C + eps);
  *rstd = rs;
  const __m512 vr = _mm512_set1_ps(rs);
  for (c = 0; c + 16 <= C; c += 16)
    _mm512_storeu_ps(yr + c, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xr + c), vr), _mm512_loadu_ps(w + c)));
  if (c < C) {
    const __mmask16 m = (__mmask16)((1u << (C - c)) - 1u);
    _mm512_mask_storeu_ps(yr + c, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + c), vr),
                                                   _mm512_maskz_loadu_ps(m, w + c)));
  }
}

void trex_kernel(void **p, const int64_t *d, const double *s) {
  const float *x = p[0], *w = p[1]; float *y = p[2]; float *rstd = p[3];
  const int64_t R = d[0], C = d[1]; const float eps = (float)s[0];
  PARFOR
  for (int64_t r = 0; r < R; ++r) row_fwd(x + r * C, w, y + r * C, rstd + r, C, eps);
}
#else
void trex_kernel(void **p, const int64_t *d, const double *s) {
  const act_t *x = p[0], *w = p[1]; act_t *y = p[2]; float *rstd = p[3];
  const int64_t R = d[0], C = d[1]; const float eps = (float)s[0];
  PARFOR
  for (int64_t r = 0; r < R; ++r) {
    const act_t *xr = x + r * C; act_t *yr = y + r * C;
    acc_t acc = 0;
    LOOP_SUM(acc)
    for (int64_t c = 0; c < C; ++c) { float v = LD(xr, c); acc += (acc_t)(v * v); }
    const float rs = 1.0f / sqrtf((float)(acc / (acc_t)C) + eps);
    rstd[r] = rs;
    LOOP
    for (int64_t c = 0; c < C; ++c) ST(yr, c, LD(xr, c) * rs * LD(w, c));
  }
}
#endif
