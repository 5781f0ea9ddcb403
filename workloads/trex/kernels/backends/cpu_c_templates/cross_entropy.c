/* loss = logsumexp(z) - z[target]. FUSED 1: one pass with an online (running max) sum over BLOCK-wide
   slices; FUSED 0: a max pass, then a sum pass. d = {rows, vocab}. */
void trex_kernel(void **p, const int64_t *d, const double *s) {
  const act_t *z = p[0]; const int64_t *tgt = p[1]; float *loss = p[2];
  const int64_t R = d[0], V = d[1];
  (void)s;
  PARFOR
  for (int64_t r = 0; r < R; ++r) {
    const act_t *zr = z + r * V;
    float m = -INFINITY; acc_t sum = 0;
#if FUSED
    for (int64_t v0 = 0; v0 < V; v0 += BLOCK) {
      const int64_t v1 = v0 + BLOCK < V ? v0 + BLOCK : V;
      float bm = -INFINITY;
      LOOP_MAX(bm)
      for (int64_t v = v0; v < v1; ++v) bm = MAXF(bm, LD(zr, v));
      if (bm > m) { sum *= (acc_t)EXPF(m - bm); m = bm; }
      acc_t bs = 0;
      LOOP_SUM(bs)
      for (int64_t v = v0; v < v1; ++v) bs += (acc_t)EXPF(LD(zr, v) - m);
      sum += bs;
    }
#else
    LOOP_MAX(m)
    for (int64_t v = 0; v < V; ++v) m = MAXF(m, LD(zr, v));
    LOOP_SUM(sum)
    for (int64_t v = 0; v < V; ++v) sum += (acc_t)EXPF(LD(zr, v) - m);
#endif
    loss[r] = (float)((acc_t)m + log((double)sum) - (acc_t)LD(zr, tgt[r]));
  }
}
