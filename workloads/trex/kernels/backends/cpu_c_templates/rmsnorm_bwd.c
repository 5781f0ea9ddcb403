/* dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd; dw = sum_rows dy * xhat.
   dw is reduced through per-thread partial rows (no atomics); the per-row work lives in a helper with
   restrict pointers so the loops vectorise. d = {rows, cols}. */
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
    for (int64_t r = 0; r < R; ++r) row_bwd(dy + r * C, x + r * C, w, dx + r * C, pw, rstd[r], C);
  }
  for (int64_t c = 0; c < C; ++c) {
    float acc = 0.0f;
    for (int t = 0; t < nt; ++t) acc += part[(size_t)t * (size_t)C + c];
    dw[c] = acc;
  }
  free(part);
}
