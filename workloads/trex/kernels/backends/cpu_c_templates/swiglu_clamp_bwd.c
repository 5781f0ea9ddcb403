/* dg = dy * uc * silu'(gc) * [g <= L]; du = dy * silu(gc) * [-L <= u <= L]. d = {rows, cols}, s = {limit}.
   fp32, VEC >= 16, EXP_POLY on AVX-512: one fused pass with 512-bit intrinsics, masks for the clamps
   (NaN compares false, as in the scalar path) and for the tail. */
#if HAVE_AVX512 && !DTYPE_BF16 && EXP_POLY && VEC >= 16
static inline void swiglu_bwd16(const float *dy, const float *g, const float *u, float *dg, float *du,
                                __m512 L, __mmask16 m) {
  const __m512 gv = _mm512_maskz_loadu_ps(m, g), uv = _mm512_maskz_loadu_ps(m, u), dyv = _mm512_maskz_loadu_ps(m, dy);
  const __m512 nL = _mm512_sub_ps(_mm512_setzero_ps(), L), one = _mm512_set1_ps(1.0f);
  const __m512 gc = _mm512_min_ps(gv, L), uc = _mm512_min_ps(_mm512_max_ps(uv, nL), L);
  const __m512 sg = inv1p16(expneg_poly16(gc));
  const __m512 dsilu = _mm512_mul_ps(sg, _mm512_fmadd_ps(gc, _mm512_sub_ps(one, sg), one));
  const __mmask16 gin = _mm512_cmp_ps_mask(gv, L, _CMP_LE_OQ);
  const __mmask16 uin = _mm512_cmp_ps_mask(uv, nL, _CMP_GE_OQ) & _mm512_cmp_ps_mask(uv, L, _CMP_LE_OQ);
  _mm512_mask_storeu_ps(dg, m, _mm512_maskz_mov_ps(gin, _mm512_mul_ps(_mm512_mul_ps(dyv, uc), dsilu)));
  _mm512_mask_storeu_ps(du, m, _mm512_maskz_mov_ps(uin, _mm512_mul_ps(_mm512_mul_ps(dyv, gc), sg)));
}

void trex_kernel(void **p, const int64_t *d, const double *s) {
  const float *dy = p[0], *g = p[1], *u = p[2]; float *dg = p[3], *du = p[4];
  const int64_t R = d[0], C = d[1]; const __m512 L = _mm512_set1_ps((float)s[0]);
  PARFOR
  for (int64_t r = 0; r < R; ++r) {
    const int64_t o = r * C;
    int64_t c = 0;
    for (; c + 16 <= C; c += 16)
      swiglu_bwd16(dy + o + c, g + o + c, u + o + c, dg + o + c, du + o + c, L, (__mmask16)0xFFFFu);
    if (c < C) swiglu_bwd16(dy + o + c, g + o + c, u + o + c, dg + o + c, du + o + c, L, tail_mask(C - c));
  }
}
#else
void trex_kernel(void **p, const int64_t *d, const double *s) {
  const act_t *dy = p[0], *g = p[1], *u = p[2]; act_t *dg = p[3], *du = p[4];
  const int64_t R = d[0], C = d[1]; const float L = (float)s[0];
  PARFOR
  for (int64_t r = 0; r < R; ++r) {
    const int64_t o = r * C;
    LOOP
    for (int64_t c = 0; c < C; ++c) {
      const float gv = LD(g, o + c), uv = LD(u, o + c), dyv = LD(dy, o + c);
      const float gc = MINF(gv, L), uc = MINF(MAXF(uv, -L), L);
      const float sg = 1.0f / (1.0f + EXPF(-gc));
      const float dsilu = sg * (1.0f + gc * (1.0f - sg));
      ST(dg, o + c, gv <= L ? dyv * uc * dsilu : 0.0f);
      ST(du, o + c, (uv >= -L && uv <= L) ? dyv * gc * sg : 0.0f);
    }
  }
}
#endif
