/* dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd; dw = sum_rows dy * xhat.
   dw is reduced through per-thread partial rows (no atomics; one thread accumulates into dw itself); the per-row work lives in a helper with
   restrict pointers so the loops vectorise. d = {rows, cols}. */
#if HAVE_AVX512 && !DTYPE_BF16 && !ACC_DOUBLE && VEC >= 16
#define ROW_TILE 4
/* fp32 AVX-512, tiles of up to four rows (nr a compile-time constant at each call site). Pass 1: the
   rows' dot products in one sweep, each w load shared by the tile's rows, two accumulators per row.
   Pass 2: one sweep writing dx for every row and adding the rows' dy * xhat into the thread's dw partial
   row (w and the partial row loaded once per tile, not once per row), while the next tile's rows are
   prefetched into L2 so its first pass does not wait on L3. Masked tails. */
static inline __attribute__((always_inline)) void tile_bwd(const int nr, const float *restrict dy,
                                                           const float *restrict x, const float *restrict w,
                                                           float *restrict dx, float *restrict pw,
                                                           const float *restrict rstd, int64_t C) {
  __m512 a0[4], a1[4], vr[4], vm[4];
  UNROLL_N(4)
  for (int q = 0; q < nr; ++q) { a0[q] = _mm512_setzero_ps(); a1[q] = _mm512_setzero_ps(); }
  int64_t c = 0;
  for (; c + 32 <= C; c += 32) {
    const __m512 w0 = _mm512_loadu_ps(w + c), w1 = _mm512_loadu_ps(w + c + 16);
    UNROLL_N(4)
    for (int q = 0; q < nr; ++q) {
      const float *dq = dy + q * C + c, *xq = x + q * C + c;
      a0[q] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(dq), w0), _mm512_loadu_ps(xq), a0[q]);
      a1[q] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(dq + 16), w1), _mm512_loadu_ps(xq + 16), a1[q]);
    }
  }
  for (; c < C; c += 16) {
    const __mmask16 m = C - c >= 16 ? (__mmask16)0xFFFFu : tail_mask(C - c);
    const __m512 w0 = _mm512_maskz_loadu_ps(m, w + c);
    UNROLL_N(4)
    for (int q = 0; q < nr; ++q)
      a0[q] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, dy + q * C + c), w0),
                              _mm512_maskz_loadu_ps(m, x + q * C + c), a0[q]);
  }
  UNROLL_N(4)
  for (int q = 0; q < nr; ++q) {
    vr[q] = _mm512_set1_ps(rstd[q]);
    vm[q] = _mm512_set1_ps(_mm512_reduce_add_ps(_mm512_add_ps(a0[q], a1[q])) * rstd[q] / (float)C);
  }
  for (c = 0; c < C; c += 16) {
    const __mmask16 m = C - c >= 16 ? (__mmask16)0xFFFFu : tail_mask(C - c);
    /* the next tile's rows towards L2 (a prefetch past the end of the arrays is harmless) */
    UNROLL_N(4)
    for (int q = 0; q < 4; ++q) {
      _mm_prefetch((const char *)(dy + (4 + q) * C + c), _MM_HINT_T1);
      _mm_prefetch((const char *)(x + (4 + q) * C + c), _MM_HINT_T1);
    }
    const __m512 wv = _mm512_maskz_loadu_ps(m, w + c);
    __m512 acc = _mm512_maskz_loadu_ps(m, pw + c);
    UNROLL_N(4)
    for (int q = 0; q < nr; ++q) {
      const __m512 xh = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + q * C + c), vr[q]);
      const __m512 g = _mm512_maskz_loadu_ps(m, dy + q * C + c);
      _mm512_mask_storeu_ps(dx + q * C + c, m, _mm512_mul_ps(vr[q], _mm512_fnmadd_ps(xh, vm[q], _mm512_mul_ps(g, wv))));
      acc = _mm512_fmadd_ps(g, xh, acc);
    }
    _mm512_mask_storeu_ps(pw + c, m, acc);
  }
}

static inline void rows_bwd(const act_t *dy, const act_t *x, const act_t *w, act_t *dx, float *pw,
                            const float *rstd, int64_t t, int64_t R, int64_t C) {
  const int64_t r = t * ROW_TILE, o = r * C;
  switch (R - r >= 4 ? 4 : R - r) {
    case 4: tile_bwd(4, dy + o, x + o, w, dx + o, pw, rstd + r, C); break;
    case 3: tile_bwd(3, dy + o, x + o, w, dx + o, pw, rstd + r, C); break;
    case 2: tile_bwd(2, dy + o, x + o, w, dx + o, pw, rstd + r, C); break;
    default: tile_bwd(1, dy + o, x + o, w, dx + o, pw, rstd + r, C); break;
  }
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
  /* one thread accumulates straight into dw; several reduce their partial rows afterwards */
  float *part = nt > 1 ? calloc((size_t)nt * (size_t)C, sizeof(float)) : dw;
  if (nt == 1) memset(dw, 0, (size_t)C * sizeof(float));
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
  if (nt == 1) return;
  for (int64_t c = 0; c < C; ++c) {
    float acc = 0.0f;
    for (int t = 0; t < nt; ++t) acc += part[(size_t)t * (size_t)C + c];
    dw[c] = acc;
  }
  free(part);
}
