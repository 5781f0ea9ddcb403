/* KL(P||Q) = A/Sp - (mp + log Sp) + (mq + log Sq) with Sp = sum e^(p-mp), Sq = sum e^(q-mq),
   A = sum e^(p-mp) (p - q). FUSED 1: one pass, running maxima per BLOCK slice (sums rescaled when a
   maximum grows); FUSED 0: a max pass then a sum pass. d = {rows, vocab}. */
void trex_kernel(void **p, const int64_t *d, const double *s) {
  const act_t *pl = p[0], *ql = p[1]; float *kl = p[2];
  const int64_t R = d[0], V = d[1];
  (void)s;
  PARFOR
  for (int64_t r = 0; r < R; ++r) {
    const act_t *pr = pl + r * V, *qr = ql + r * V;
    float mp = -INFINITY, mq = -INFINITY; acc_t sp = 0, sq = 0, a = 0;
#if FUSED
    for (int64_t v0 = 0; v0 < V; v0 += BLOCK) {
      const int64_t v1 = v0 + BLOCK < V ? v0 + BLOCK : V;
      float bp = -INFINITY, bq = -INFINITY;
      LOOP_MAX(bp)
      for (int64_t v = v0; v < v1; ++v) bp = MAXF(bp, LD(pr, v));
      LOOP_MAX(bq)
      for (int64_t v = v0; v < v1; ++v) bq = MAXF(bq, LD(qr, v));
      if (bp > mp) { const acc_t f = (acc_t)EXPF(mp - bp); sp *= f; a *= f; mp = bp; }
      if (bq > mq) { sq *= (acc_t)EXPF(mq - bq); mq = bq; }
      acc_t bs = 0, ba = 0, bsq = 0;
      LOOP_SUM2(bs, ba)
      for (int64_t v = v0; v < v1; ++v) {
        const float pv = LD(pr, v), e = EXPF(pv - mp);
        bs += (acc_t)e; ba += (acc_t)(e * (pv - LD(qr, v)));
      }
      LOOP_SUM(bsq)
      for (int64_t v = v0; v < v1; ++v) bsq += (acc_t)EXPF(LD(qr, v) - mq);
      sp += bs; a += ba; sq += bsq;
    }
#else
    LOOP_MAX(mp)
    for (int64_t v = 0; v < V; ++v) mp = MAXF(mp, LD(pr, v));
    LOOP_MAX(mq)
    for (int64_t v = 0; v < V; ++v) mq = MAXF(mq, LD(qr, v));
    LOOP_SUM2(sp, a)
    for (int64_t v = 0; v < V; ++v) {
      const float pv = LD(pr, v), e = EXPF(pv - mp);
      sp += (acc_t)e; a += (acc_t)(e * (pv - LD(qr, v)));
    }
    LOOP_SUM(sq)
    for (int64_t v = 0; v < V; ++v) sq += (acc_t)EXPF(LD(qr, v) - mq);
#endif
    kl[r] = (float)((double)a / (double)sp - ((double)mp + log((double)sp)) + ((double)mq + log((double)sq)));
  }
}
