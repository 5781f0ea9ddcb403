/* dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd; dw = sum_rows dy * xhat.
   dw is reduced through per-thread partial rows (no atomics); the per-row work lives in a helper with
   restrict pointers so the loops vectorise. d = {rows, cols}. */
#if HAVE_AVX512 && !DTYPE_BF16 && !ACC_DOUBLE && VEC >= 16
#define ROW_TILE 2
/* fp32 AVX-512, two rows per tile: per row the dot product with four FMA accumulators, then one pass over
   both rows writing dx and adding both rows' dy * xhat into the thread's dw partial row (w and the
   partial row are loaded once per tile); masked tails. */
static inline float row_dot(const float *restrict dyr, const float *restrict xr, const float *restrict w, int64_t C) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 64 <= C; c += 64) {
    a0 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(dyr + c), _mm512_loadu_ps(w + c)), _mm512_loadu_ps(xr + c), a0);
    a1 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(dyr + c + 16), _mm512_loadu_ps(w + c + 16)),
                         _mm512_loadu_ps(xr + c + 16), a1);
    a2 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(dyr + c + 32), _mm512_loadu_ps(w + c + 32)),
                         _mm512_loadu_ps(xr + c + 32), a2);
    a3 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(dyr + c + 48), _mm512_loadu_ps(w + c + 48)),
                         _mm512_loadu_ps(xr + c + 48), a3);
  }
  for (; c < C; c += 16) {
    const __mmask16 m = C - c >= 16 ? (__mmask16)0xFFFFu : tail_mask(C - c);
    a0 = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, dyr + c), _mm512_maskz_loadu_ps(m, w + c)),
                         _mm512_maskz_loadu_ps(m, xr + c), a0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* rows r and (when two) r + 1; `two` is a compile-time constant at each call site */
static inline void tile_bwd(const float *restrict dy, const float *restrict x, const float *restrict w,
                            float *restrict dx, float *restrict pw, const float *restrict rstd, int64_t C,
                            const int two) {
  const float rs0 = rstd[0], rs1 = two ? rstd[1] : 0.0f;
  const __m512 vr0 = _mm512_set1_ps(rs0), vm0 = _mm512_set1_ps(row_dot(dy, x, w, C) * rs0 / (float)C);
  const __m512 vr1 = _mm512_set1_ps(rs1), vm1 = _mm512_set1_ps(two ? row_dot(dy + C, x + C, w, C) * rs1 / (float)C : 0.0f);
  for (int64_t c = 0; c < C; c += 16) {
    const __mmask16 m = C - c >= 16 ? (__mmask16)0xFFFFu : tail_mask(C - c);
    const __m512 wv = _mm512_maskz_loadu_ps(m, w + c);
    const __m512 xh0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + c), vr0), g0 = _mm512_maskz_loadu_ps(m, dy + c);
    _mm512_mask_storeu_ps(dx + c, m, _mm512_mul_ps(vr0, _mm512_fnmadd_ps(xh0, vm0, _mm512_mul_ps(g0, wv))));
    __m512 acc = _mm512_fmadd_ps(g0, xh0, _mm512_maskz_loadu_ps(m, pw + c));
    if (two) {
      const __m512 xh1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + C + c), vr1);
      const __m512 g1 = _mm512_maskz_loadu_ps(m, dy + C + c);
      _mm512_mask_storeu_ps(dx + C + c, m, _mm512_mul_ps(vr1, _mm512_fnmadd_ps(xh1, vm1, _mm512_mul_ps(g1, wv))));
      acc = _mm512_fmadd_ps(g1, xh1, acc);
    }
    _mm512_mask_storeu_ps(pw + c, m, acc);
  }
}

static inline void rows_bwd(const act_t *dy, const act_t *x, const act_t *w, act_t *dx, float *pw,
                            const float *rstd, int64_t t, int64_t R, int64_t C) {
  const int64_t r = t * ROW_TILE, o = r * C;
  if (r + 1 < R) tile_bwd(dy + o, x + o, w, dx + o, pw, rstd + r, C, 1);
  else tile_bwd(dy + o, x + o, w, dx + o, pw, rstd + r, C, 0);
}
#else
static inline void row_bwd(const act_t *restrict dyr, const act_t *restrict xr, const act_t *restrict w,
                           act_t *restrict dxr, float *restrict pw, float rs, int64_t C) {
  acc_t dot = 0;
  LOOP_SUM(dot)
  for (int64_t c = 0; c < C; ++c) dot += (acc_t)(LD(dyr, c) * LD(w, c) * LD(xr, c) * rs);
  const float m = (float)(dot / (acc_t)C);
  LOOP
  for (int64_t c = 0; c < C; ++c) {
    const float xh = LD(xr, c) * rs, g = LD(dyr, c);
    ST(dxr, c, rs * (g * LD(w, c) - xh * m));
    pw[c] += g * xh;
  }
}

#define ROW_TILE 1
static inline void rows_bwd(const act_t *dy, const act_t *x, const act_t *w, act_t *dx, float *pw,
                            const float *rstd, int64_t t, int64_t R, int64_t C) {
  (void)R;
  row_bwd(dy + t * C, x + t * C, w, dx + t * C, pw, rstd[t], C);
}
#endif

void trex_kernel(void **p, const int64_t *d, const double *s) {
  const act_t *dy = p[0], *x = p[1], *w = p[2]; const float *rstd = p[3];
  act_t *dx = p[4]; float *dw = p[5];
  const int64_t R = d[0], C = d[1];
  (void)s;
  const int nt = THREADS;
  float *part = calloc((size_t)nt * (size_t)C, sizeof(float));
  DO_PRAGMA(omp parallel num_threads(THREADS) if(THREADS > 1))
  {
    int tid = 0;
#ifdef _OPENMP
    tid = omp_get_thread_num();
#endif
    float *pw = part + (size_t)tid * (size_t)C;
    DO_PRAGMA(omp for schedule(static, CHUNK))
    for (int64_t t = 0; t < (R + ROW_TILE - 1) / ROW_TILE; ++t) rows_bwd(dy, x, w, dx, pw, rstd, t, R, C);
  }
  for (int64_t c = 0; c < C; ++c) {
    float acc = 0.0f;
    for (int t = 0; t < nt; ++t) acc += part[(size_t)t * (size_t)C + c];
    dw[c] = acc;
  }
  free(part);
}
