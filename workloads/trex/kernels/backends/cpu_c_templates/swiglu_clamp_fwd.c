/* y = silu(min(g, L)) * clamp(u, -L, L). d = {rows, cols}, s = {limit}.
   fp32, VEC >= 16, EXP_POLY on AVX-512: one fused streaming pass over the flat array with 512-bit
   intrinsics (rows are contiguous, so the row loop only splits work between threads); masked tail. */
#if HAVE_AVX512 && !DTYPE_BF16 && EXP_POLY && VEC >= 16
static inline __m512 swiglu16(__m512 g, __m512 u, __m512 L) {
  const __m512 gc = _mm512_min_ps(g, L);
  const __m512 uc = _mm512_min_ps(_mm512_max_ps(u, _mm512_sub_ps(_mm512_setzero_ps(), L)), L);
  const __m512 e = expneg_poly16(gc);
  return _mm512_mul_ps(_mm512_mul_ps(gc, inv1p16(e)), uc);
}

void trex_kernel(void **p, const int64_t *d, const double *s) {
  const float *g = p[0], *u = p[1]; float *y = p[2];
  const int64_t R = d[0], C = d[1]; const __m512 L = _mm512_set1_ps((float)s[0]);
  PARFOR
  for (int64_t r = 0; r < R; ++r) {
    const float *restrict gr = g + r * C, *restrict ur = u + r * C; float *restrict yr = y + r * C;
    int64_t c = 0;
    for (; c + 16 <= C; c += 16) _mm512_storeu_ps(yr + c, swiglu16(_mm512_loadu_ps(gr + c), _mm512_loadu_ps(ur + c), L));
    if (c < C) {
      const __mmask16 m = tail_mask(C - c);
      _mm512_mask_storeu_ps(yr + c, m, swiglu16(_mm512_maskz_loadu_ps(m, gr + c), _mm512_maskz_loadu_ps(m, ur + c), L));
    }
  }
}
#else
void trex_kernel(void **p, const int64_t *d, const double *s) {
  const act_t *g = p[0], *u = p[1]; act_t *y = p[2];
  const int64_t R = d[0], C = d[1]; const float L = (float)s[0];
  PARFOR
  for (int64_t r = 0; r < R; ++r) {
    const act_t *gr = g + r * C, *ur = u + r * C; act_t *yr = y + r * C;
    LOOP
    for (int64_t c = 0; c < C; ++c) {
      const float gc = MINF(LD(gr, c), L);
      const float uc = MINF(MAXF(LD(ur, c), -L), L);
      ST(yr, c, gc / (1.0f + EXPF(-gc)) * uc);
    }
  }
}
#endif
